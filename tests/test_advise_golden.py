"""``specmeter advise`` byte for byte (issue 45): the text, the JSON document and the
``--plot`` SVG of a set of inputs, written to tests/golden/advise/ by the code before
advice moved out of the command line (``streams/advice/``) and its picture into the one
chart module (``streams/chart.py``); a refactor that changes a byte fails here.

Regenerate only for an intended change of output: ``SPECMETER_WRITE_GOLDEN=1 pytest
tests/test_advise_golden.py``, and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from specmeter.schemas import BatchMetrics, encode_metrics
from specmeter.streams.cli import main

from .test_advise import batch, lag, lag_batches, task, version

GOLDEN = Path(__file__).parent / "golden" / "advise"
WRITE = os.environ.get("SPECMETER_WRITE_GOLDEN") == "1"


def _whole() -> list[BatchMetrics]:
    return [batch(f"step-{i}", [10 + i, 20, 30 - i, 5 + i]) for i in range(1, 6)]


def _off() -> list[BatchMetrics]:
    return [batch("step-1", [90, 8, 2])]


def _tie() -> list[BatchMetrics]:
    return [batch("step-1", [0, 0, 4])]


def _tasks() -> list[BatchMetrics]:
    entries = [task("gsm8k", [5, 10, 20]), task("math", [30, 10, 2]), task(None, [3, 3, 3]), task("empty", None)]
    return [batch("step-1", [1, 1, 1], by_task=entries), batch("step-2", [2, 2, 2], by_task=entries[:2])]


def _versions() -> list[BatchMetrics]:
    histograms = {f"v{i:02d}": [10 + i, 10, 10 - i % 5, i % 7] for i in range(23)}
    return [
        batch(f"step-{i}", [1, 1, 1, 1], by_weight_version=[version(name, h)])
        for i, (name, h) in enumerate(histograms.items())
    ]


def _lags_no_lag0() -> list[BatchMetrics]:
    out = lag_batches()
    return [msgspec.structs.replace(m, by_draft_lag=[e for e in m.by_draft_lag if e.draft_lag != 0]) for m in out]


def _lags_no_histograms() -> list[BatchMetrics]:
    entries = [lag(0, 45, 50, 150, 50), lag(1, 28, 40, 100, 40)]
    return [msgspec.structs.replace(batch("step-1", [1, 1, 1]), by_draft_lag=entries)]


#: name -> (metrics, advise's arguments after the file)
CASES = {
    "whole": (_whole, []),
    "whole-cost": (_whole, ["--draft-cost", "0.05"]),
    "whole-last2": (_whole, ["--last", "2", "--draft-cost", "0.2"]),
    "off": (_off, ["--draft-cost", "0.5"]),
    "tie": (_tie, ["--draft-cost", "0.5"]),
    "edge": (_tie, ["--draft-cost", "0.01"]),
    "tasks": (_tasks, ["--by", "task"]),
    "tasks-cost": (_tasks, ["--by", "task", "--draft-cost", "0.1"]),
    "versions": (_versions, ["--last", "0", "--by", "weight_version", "--draft-cost", "0.1"]),
    "lags": (lag_batches, ["--by", "draft_lag"]),
    "lags-cost": (lag_batches, ["--by", "draft_lag", "--draft-cost", "0.1"]),
    "lags-refresh": (lag_batches, ["--by", "draft_lag", "--draft-cost", "0.1", "--refresh-cost", "100"]),
    "lags-refresh-huge": (lag_batches, ["--by", "draft_lag", "--refresh-cost", "1e300"]),
    "lags-refresh-zero": (lag_batches, ["--by", "draft_lag", "--draft-cost", "0", "--refresh-cost", "0"]),
    "lags-no-lag0": (_lags_no_lag0, ["--by", "draft_lag", "--refresh-cost", "10"]),
    "lags-no-histograms": (_lags_no_histograms, ["--by", "draft_lag", "--draft-cost", "0.1"]),
}


def _outputs(tmp_path: Path, name: str) -> dict[str, bytes]:
    """The case's text, JSON document and SVG, as the command writes them."""
    make, args = CASES[name]
    path, svg = tmp_path / "metrics.jsonl", tmp_path / "advice.svg"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in make()))
    env = {"COLUMNS": "200"}
    text = CliRunner().invoke(main, ["advise", str(path), *args, "--plot", str(svg)], env=env)
    assert text.exit_code == 0, text.output
    document = CliRunner().invoke(main, ["advise", str(path), *args, "--json"], env=env)
    assert document.exit_code == 0, document.output
    printed = text.output.replace(str(svg), "ADVICE.svg")
    return {"txt": printed.encode(), "json": document.output.encode(), "svg": svg.read_bytes()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_advise_prints_and_draws_byte_for_byte_what_it_did(tmp_path, name):
    for suffix, data in _outputs(tmp_path, name).items():
        golden = GOLDEN / f"{name}.{suffix}"
        if WRITE:
            golden.write_bytes(data)
        assert data == golden.read_bytes(), f"{golden.name} changed"
