"""`specmeter aggregate` as a person meets it (issue 24, point 4): it fails when nothing
in its input could be read (an empty file included), reads a file with a UTF-8
byte-order mark like the same file without one, and has a table view and a
one-document JSON view besides JSON lines. Every case runs the real command."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmeter.streams.cli import main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "streams" / "data" / "sample_rollout.jsonl"
LINES = [
    {"batch_id": "step-2", "session_id": "s1", "generation_id": "g1", "accepted": 3, "proposed": 4},
    {"batch_id": "step-10", "session_id": "s2", "generation_id": "g2", "accepted": 1, "proposed": 4},
    {"type": "marker", "batch_id": "step-2", "producer_id": "p", "speculative_algorithm": "EAGLE3"},
]
BOM = b"\xef\xbb\xbf"


def dump(tmp_path: Path, data: bytes, name: str = "dump.jsonl") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def aggregate(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["aggregate", *args], env=env)


def without_clock(stdout: str) -> list[dict]:
    out = [json.loads(line) for line in stdout.splitlines()]
    for m in out:
        m.pop("closed_at")
    return out


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(bytes(range(256)) * 4, id="random-bytes"),
        pytest.param(b'{"batch_id": "b", "session_id": "s", "gen\n{"batch_id": "b", "sess\n', id="truncated"),
        pytest.param(b"[1, 2, 3]\n42\n", id="json-but-no-record"),
    ],
)
def test_nothing_readable_exits_non_zero(tmp_path, content):
    result = aggregate(dump(tmp_path, content))
    assert result.exit_code == 1, result.output
    assert "could be read" in result.stderr and "dump.jsonl" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", BOM], ids=["empty", "blank-lines", "only-a-bom"])
def test_an_empty_file_is_named_empty(tmp_path, content):
    result = aggregate(dump(tmp_path, content))
    assert result.exit_code == 1
    assert "dump.jsonl is empty" in result.stderr, result.stderr
    assert result.stdout == ""


def test_some_bad_lines_still_exit_zero(tmp_path):
    result = aggregate(dump(tmp_path, jsonl(LINES) + b"{not json\n"))
    assert result.exit_code == 0, result.output
    assert "1 bad line(s)" in result.stderr


def test_a_byte_order_mark_reads_like_the_same_file_without_it(tmp_path):
    plain = aggregate(dump(tmp_path, jsonl(LINES), "plain.jsonl"))
    with_bom = aggregate(dump(tmp_path, BOM + jsonl(LINES), "bom.jsonl"))
    assert with_bom.exit_code == 0 and with_bom.stderr == "", with_bom.stderr
    assert without_clock(with_bom.stdout) == without_clock(plain.stdout)
    joined = aggregate(dump(tmp_path, BOM + jsonl(LINES[:1]) + BOM + jsonl(LINES[1:]), "cat.jsonl"))
    assert without_clock(joined.stdout) == without_clock(plain.stdout), "files joined with cat keep their marks"


def test_a_utf16_file_is_named_as_such(tmp_path):
    result = aggregate(dump(tmp_path, jsonl(LINES).decode().encode("utf-16")))
    assert result.exit_code == 1
    assert "UTF-16" in result.stderr and "UTF-8" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 2


def test_json_is_one_document_json_tool_reads(tmp_path):
    result = aggregate("--format", "json", dump(tmp_path, jsonl(LINES)))
    assert result.exit_code == 0, result.output
    tool = subprocess.run(
        [sys.executable, "-m", "json.tool"], input=result.stdout, capture_output=True, text=True, check=False
    )
    assert tool.returncode == 0, tool.stderr
    batches = json.loads(result.stdout)
    assert [b["batch_id"] for b in batches] == ["step-2", "step-10"], "in order of first appearance"
    empty = CliRunner().invoke(main, ["aggregate", "--format", "json", "-"], input="")
    assert empty.exit_code == 1 and json.loads(empty.stdout) == [], "still one document, and a failure"


def test_jsonl_stays_what_a_pipe_gets(tmp_path):
    path = dump(tmp_path, jsonl(LINES))
    piped = aggregate(path)
    assert [json.loads(line)["batch_id"] for line in piped.stdout.splitlines()] == ["step-2", "step-10"]
    assert without_clock(aggregate("--format", "jsonl", path).stdout) == without_clock(piped.stdout)
    from_env = aggregate(path, env={"SPECMETER_AGGREGATE_FORMAT": "json"})
    assert isinstance(json.loads(from_env.stdout), list)


def test_table_view(tmp_path):
    result = aggregate("--format", "table", str(SAMPLE))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80, result.stdout
    header = next(line for line in lines if line.startswith("batch"))
    for column in ("accept", "tok/v", "cov", "c/i/l", "close", "drift"):
        assert column in header
    by_task = next(i for i, line in enumerate(lines) if line.strip() == "by task")
    rows = [line.split()[0] for line in lines[:by_task] if line.startswith("step-")]
    assert rows == ["step-00000", "step-00001", "step-00002"]
    # the by-task view (revision 4): a row per batch and task, the batch named on its first
    task_header = lines[by_task + 1]
    for column in ("batch", "task", "accept", "tok/v", "cov", "gens", "tok/v by budget"):
        assert column in task_header, task_header
    by_lag = next(i for i, line in enumerate(lines) if line.strip() == "by draft lag")
    task_rows = [line.split() for line in lines[by_task + 3 : by_lag] if line.strip() and not line.startswith(" ?")]
    assert len(task_rows) == 9 and [r[0] for r in task_rows if r[0].startswith("step-")] == rows
    assert {r[1] if r[0].startswith("step-") else r[0] for r in task_rows} == {"chat", "gsm8k", "swe-bench"}
    # the by-draft-lag view (revision 5): a row per batch and lag, in numeric order
    spread = next(i for i, line in enumerate(lines) if line.strip() == "spread of tokens per verify step")
    for column in ("batch", "lag", "accept", "tok/v", "cov", "gens"):
        assert column in lines[by_lag + 1], lines[by_lag + 1]
    lag_rows = [line.split() for line in lines[by_lag + 3 : spread] if line[:1] in ("s", " ") and "·" not in line]
    lag_rows = [r for r in lag_rows if r and (r[0].startswith("step-") or r[0].isdigit())]
    assert [r[0] for r in lag_rows if r[0].startswith("step-")] == rows
    lags = [r[1] if r[0].startswith("step-") else r[0] for r in lag_rows]
    assert lags == ["0", "1", "0", "1", "2", "1", "2", "3"]  # the lags the bundled sample names per batch
    # the spread (§3.7): a row per batch, its quartiles' buckets and the share under 1.25
    assert all(column in lines[spread + 1] for column in ("gens", "p25", "p50", "p75", "<1.25"))
    assert [line.split()[0] for line in lines[spread + 3 :] if line.startswith("step-")] == rows


def test_the_json_lines_carry_revision_5s_fields():
    """by_draft_lag (numeric order) and tokens_per_verify_distribution (64 counts, one per
    generation with completion and verify > 0) in every speculative batch of the sample."""
    result = aggregate("--format", "jsonl", str(SAMPLE))
    for line in result.stdout.splitlines():
        m = json.loads(line)
        lags = [e["draft_lag"] for e in m["by_draft_lag"]]
        assert lags and lags == sorted(lags)
        spread = m["tokens_per_verify_distribution"]
        assert len(spread) == 64 and 0 < sum(spread) <= m["metrics"]["spec/verify_covered_count"]


def test_table_rows_are_in_natural_order(tmp_path):
    result = aggregate("--format", "table", dump(tmp_path, jsonl(LINES)))
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("step-")]
    assert rows == ["step-2", "step-10"]


def test_a_terminal_gets_the_table(tmp_path):
    """`auto` (the default): a table on a terminal, JSON lines when piped."""
    path = dump(tmp_path, jsonl(LINES))
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECMETER_")} | {"COLUMNS": "100"}
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "aggregate", path],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        timeout=60,
        check=False,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    shown = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, proc.stderr
    assert "accept" in shown and "step-10" in shown and '"batch_id"' not in shown, shown


def test_the_spreads_quartiles_name_their_bucket():
    """The spread view's quantile is the lower edge of the bucket that holds the ranked
    generation (SPEC §3.7's example: buckets 1, 1 and 6 -> 1.25, 1.25, 2.5)."""
    from specmeter.streams.cli.tables import spread_quantile

    counts = [0, 2, 0, 0, 0, 0, 1] + [0] * 57
    assert [spread_quantile(counts, q) for q in (0.25, 0.5, 0.75, 1.0)] == [1.25, 1.25, 2.5, 2.5]
    assert spread_quantile([0] * 63 + [4], 0.5) == 16.75


def test_staleness_text_is_the_curve_lag_0_first():
    """The demo's staleness column: accept rate per draft lag in the breakdown's (numeric)
    order, the unknown lag as ``?``, cut with "…" to its width."""
    from specmeter.schemas import DraftLagMetrics
    from specmeter.streams.cli.tables import staleness_text

    entries = [
        DraftLagMetrics(draft_lag=lag, metrics={"spec/accept_rate": rate}, accept_histogram=None)
        for lag, rate in ((0, 0.75), (2, 0.5), (10, 0.25), (None, 0.5))
    ]
    assert staleness_text(entries, 80) == "0:.75 2:.50 10:.25 ?:.50"
    assert staleness_text(entries, 14) == "0:.75 2:.50 …"
    assert staleness_text(None, 20) == "-"


@pytest.mark.parametrize(
    ("output_format", "strict", "status"),
    [("jsonl", False, 0), ("json", False, 0), ("table", False, 0), ("jsonl", True, 1)],
)
def test_a_reader_that_leaves_early_ends_the_output_quietly(tmp_path, output_format, strict, status):
    """Issue 47.7: `aggregate big | head -1` exited 1, the README's 'no line could be read'.
    The reader leaving changes nothing: the status is what was read says (0 here; 1 with
    --strict, the dump having invalid records), and no traceback."""
    from specmeter.streams.fleet.publish import write_dump
    from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

    path = tmp_path / "big.jsonl"
    with path.open("wb") as out:  # 60 batches: about 400 KB of metrics, past any pipe's buffer
        write_dump(synthetic_fleet(FleetSpec(batches=60, sessions_per_batch=4, seed=1, invalid_rate=0.02)), out)
    args = ["aggregate", str(path), "--format", output_format, "--quiet", *(["--strict"] if strict else [])]
    env = {**os.environ, "COLUMNS": "200"}
    with subprocess.Popen(
        [sys.executable, "-m", "specmeter.streams.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline()  # `head -1`: one line, then the pipe closes
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=90) == status, stderr
    assert "Traceback" not in stderr and "Broken pipe" not in stderr
    assert ("--strict" in stderr) == strict
