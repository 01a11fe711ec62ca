"""``specmeter advise`` (issue 31): the draft-budget curve of a run's summed histograms,
pure (tables and properties), through the command on a loadgen dump checked against a
histogram computed by hand from the dump's records, and from a real broker's metrics topic."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import BatchMetrics, TaskMetrics, WeightVersionMetrics, encode_metrics
from specmeter.streams.cli import main
from specmeter.streams.cli.advise import AdviceError, advise, budget_curve, metrics_from_lines

from .support.tools import run_specmeter
from .test_consume import metrics, publish


def tokens_by_hand(histogram: list[int], k: int) -> Fraction:
    """docs/contract.md §3.5, read literally: a step that accepted i drafts yields 1 + min(i, k) tokens."""
    steps = sum(histogram)
    return Fraction(sum((1 + min(i, k)) * n for i, n in enumerate(histogram)), steps)


def batch(
    batch_id: str,
    histogram: list[int] | None,
    *,
    revision: int = 0,
    run_id: str | None = "run-a",
    by_task: list[TaskMetrics] | None = None,
    by_weight_version: list[WeightVersionMetrics] | None = None,
) -> BatchMetrics:
    return msgspec.structs.replace(
        metrics(batch_id, revision, run_id),
        accept_histogram=histogram,
        by_task=by_task,
        by_weight_version=by_weight_version,
    )


def task(name: str | None, histogram: list[int] | None) -> TaskMetrics:
    return TaskMetrics(task=name, metrics={}, accept_histogram=histogram)


@pytest.mark.parametrize(
    ("histogram", "draft_cost", "tokens", "speedups"),
    [
        ([2, 1, 1], None, [1.5, 1.75], [None, None]),  # the contract's example
        ([2, 1, 1], 0.5, [1.5, 1.75], [1.5 / 1.5, 1.75 / 2.0]),
        ([0, 0, 4], 0.25, [2.0, 3.0], [2.0 / 1.25, 3.0 / 1.5]),  # every step accepted both drafts
        ([5, 0, 0, 0], 0.0, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),  # nothing ever accepted
        ([1], None, [], []),  # one bin: no budget to speak for
        ([0, 0], None, [], []),  # no step
    ],
)
def test_the_budget_curve_of_a_histogram(histogram, draft_cost, tokens, speedups):
    points = budget_curve(histogram, draft_cost)
    assert [p.budget for p in points] == list(range(1, len(tokens) + 1))
    assert [p.tokens_per_verify for p in points] == pytest.approx(tokens, rel=1e-12)
    if draft_cost is None:
        assert all(p.speedup is None for p in points)
    else:
        assert [p.speedup for p in points] == pytest.approx(speedups, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), min_size=2, max_size=8), min_size=1, max_size=6),
    st.floats(0, 2),
    st.integers(0, 7),
)
def test_advise_sums_the_histograms_it_never_averages_curves(histograms, draft_cost, last):
    """The curve of several batches is the curve of their summed histogram (a batch weighs its
    steps), the best budget has the greatest speedup (the smallest of equals), and --last reads
    the last batches in natural order of their ids."""
    batches = [batch(f"step-{i}", h) for i, h in enumerate(histograms)]
    read = histograms[-last:] if last else histograms
    summed = [sum(h[i] for h in read if i < len(h)) for i in range(max(map(len, read)))]
    if sum(summed) == 0:
        with pytest.raises(AdviceError, match="no verify step"):
            advise(reversed(batches), last=last, draft_cost=draft_cost)
        return
    advice = advise(reversed(batches), last=last, draft_cost=draft_cost)
    assert advice.batches == [f"step-{i}" for i in range(len(histograms))][-last if last else 0 :]
    [curve] = advice.curves
    assert curve.histogram == summed and curve.budget_ran == len(summed) - 1
    want = [tokens_by_hand(summed, k) for k in range(1, len(summed))]
    assert [p.tokens_per_verify for p in curve.points] == pytest.approx([float(t) for t in want], rel=1e-12)
    speedups = [float(t) / (1 + draft_cost * k) for k, t in enumerate(want, start=1)]
    assert [p.speedup for p in curve.points] == pytest.approx(speedups, rel=1e-12)
    best = max(range(len(want)), key=lambda i: (round(speedups[i], 9), -i)) + 1
    assert round(curve.points[curve.best - 1].speedup, 9) == round(speedups[best - 1], 9)


def test_one_big_batch_outweighs_a_small_one():
    """Averaging the two curves would give 1.5 at budget 1; the summed histogram gives ~1.01."""
    advice = advise([batch("step-1", [0, 10]), batch("step-2", [990, 0])])
    assert advice.curves[0].points[0].tokens_per_verify == pytest.approx(1010 / 1000)


def test_the_newest_revision_of_each_batch_and_natural_order():
    published = [
        batch("step-10", [1, 1, 1]),
        batch("step-2", [0, 0, 9], revision=1),  # a late record's revision, published before ...
        batch("step-2", [9, 0, 0]),  # ... an older revision read later (a repeat after a crash)
        batch("step-9", [4, 0, 0]),
        batch("step-1", [100, 0, 0]),
    ]
    advice = advise(published, last=3)
    assert advice.batches == ["step-2", "step-9", "step-10"]
    assert advice.curves[0].histogram == [0 + 4 + 1, 0 + 0 + 1, 9 + 0 + 1]
    assert advise(published, last=0).batches == ["step-1", "step-2", "step-9", "step-10"]


def test_one_run_is_chosen_or_asked_for():
    published = [batch("step-1", [1, 1]), batch("step-1", [3, 1], run_id="run-b"), batch("step-1", [0, 1], run_id=None)]
    with pytest.raises(AdviceError, match="3 runs: \\(default run\\), run-a, run-b") as raised:
        advise(published)
    assert "--run-id" in raised.value.fix
    assert advise(published, run_id="run-b").curves[0].histogram == [3, 1]
    assert advise(published, run_id=None).curves[0].histogram == [0, 1]
    assert advise(published[:1]).run_id == "run-a", "a single run needs no --run-id"
    with pytest.raises(AdviceError, match=r"no batch of run 'run-c'.*runs there: \(default run\), run-a, run-b"):
        advise(published, run_id="run-c")
    with pytest.raises(AdviceError, match="no published batch") as raised:
        advise([])
    assert "aggregate" in raised.value.fix


def test_a_curve_per_task_or_version_from_the_breakdown_entries():
    published = [
        batch("step-1", [3, 3, 3], by_task=[task("chat", [2, 1, 0]), task("gsm8k", [1, 1, 1]), task(None, [0, 1, 2])]),
        batch("step-2", [5, 5], by_task=[task("gsm8k", [5, 5]), task("swe", None)]),
        batch(
            "step-3",
            [1, 1],
            by_weight_version=[
                WeightVersionMetrics(weight_version="v2", metrics={}, accept_histogram=[1, 1]),
            ],
        ),
    ]
    advice = advise(published, by="task", draft_cost=0.1)
    assert [(c.group, c.histogram) for c in advice.curves] == [
        ("chat", [2, 1, 0]),
        ("gsm8k", [6, 6, 1]),
        (None, [0, 1, 2]),  # the unknown task last
    ]
    assert advice.skipped == [("swe", "no acceptance histogram")]
    gsm8k = advice.curves[1]
    assert [p.tokens_per_verify for p in gsm8k.points] == pytest.approx([7 / 13 + 1, 8 / 13 + 1])
    document = advice.as_document()
    assert [c["task"] for c in document["curves"]] == ["chat", "gsm8k", None]
    assert document["skipped"] == [{"task": "swe", "reason": "no acceptance histogram"}]
    assert "upper bound for tree drafters" in document["caveat"]
    [version] = advise(published, by="weight_version").curves
    assert (version.group, version.histogram) == ("v2", [1, 1])


def test_errors_say_what_is_missing_and_what_to_do():
    with pytest.raises(AdviceError, match="none of the 1 batch") as raised:
        advise([batch("step-1", [1, 1])], by="task")
    assert "task" in raised.value.fix
    with pytest.raises(AdviceError, match="no acceptance histogram") as raised:
        advise([batch("step-1", None), batch("step-2", None)])
    assert "SGLang 0.5.9" in raised.value.fix and "--last" in raised.value.fix
    with pytest.raises(AdviceError, match="histograms of one bin"):
        advise([batch("step-1", [7])])
    with pytest.raises(ValueError, match="by must be one of"):
        advise([batch("step-1", [1, 1])], by="sample")


def test_metrics_are_read_from_json_lines_or_one_json_list():
    ms = [batch("step-1", [1, 1]), batch("step-2", [2, 1])]
    lines = [encode_metrics(m) + b"\n" for m in ms]
    assert list(metrics_from_lines([b"\n", *lines])) == ms
    document = b"[\n" + b",\n".join(encode_metrics(m) for m in ms) + b"\n]\n"
    assert list(metrics_from_lines(document.splitlines(keepends=True))) == ms
    record = b'{"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g"}\n'
    with pytest.raises(AdviceError, match=r"dump\.jsonl, line 2, is not a BatchMetrics JSON object") as raised:
        list(metrics_from_lines([lines[0], record], "dump.jsonl"))
    assert "aggregate --format jsonl" in raised.value.fix


def test_the_command_prints_a_table_or_json_and_one_line_errors(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in (batch("step-1", [2, 1, 1]), batch("step-2", None))))
    result = CliRunner().invoke(main, ["advise", str(path), "--draft-cost", "0.5"])
    assert result.exit_code == 0, result.output
    assert "run run-a, 2 batch(es) (step-1 .. step-2)" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert rows[:2] == [["1", "1.500", "1.000×", "◀", "best"], ["2", "1.750", "0.875×", "the", "fleet", "ran", "this"]]
    assert "upper bound for tree drafters" in " ".join(result.output.split())
    result = CliRunner().invoke(main, ["advise", str(path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["curves"][0]["budgets"][1] == {"budget": 2, "tokens_per_verify": 1.75, "speedup": None}
    result = CliRunner().invoke(main, ["advise", str(path), "--by", "task"])
    assert result.exit_code == 1
    assert "has a by_task breakdown" in result.output and "give the records a task" in result.output
    assert "Traceback" not in result.output


def test_the_help_explains_every_flag_and_names_its_variable():
    result = CliRunner().invoke(main, ["advise", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for flag, variable in (
        ("--broker", "KAFKA_BOOTSTRAP_SERVERS"),
        ("--topic", "SPECMETER_ADVISE_TOPIC"),
        ("--run-id", "SPECMETER_RUN_ID"),
        ("--last", "SPECMETER_ADVISE_LAST"),
        ("--by", "SPECMETER_ADVISE_BY"),
        ("--draft-cost", "SPECMETER_ADVISE_DRAFT_COST"),
        ("--json", "SPECMETER_ADVISE_JSON"),
    ):
        assert flag in result.output and variable in result.output, flag
    assert "profile" in result.output, "--draft-cost says how to measure it"


# -- end to end: loadgen --dump -> aggregate -> advise, against the dump's records by hand -------
#: the fields of a generation's value (docs/contract.md §3): one key seen with two is conflicting
VALUE = ("state_hash", "accepted", "proposed", "verify", "completion", "accept_histogram", "weight_version", "task")


def histograms_by_hand(dump: Path, run_id: str, last: int, by: str | None) -> dict[str | None, list[int]]:
    """The summed histograms of the run's last batches, read straight from the dump: records
    with a negative counter or bin are invalid (the loadgen's invalid ones), a key seen with two
    values is conflicting and left out, every other key's histogram counts once."""
    values: dict[tuple, set[str]] = defaultdict(set)
    for line in dump.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") != "record" or record.get("run_id") != run_id:
            continue
        numbers = [record.get(f) for f in ("accepted", "proposed", "verify", "completion")]
        numbers += record.get("accept_histogram") or []
        if any(n is not None and n < 0 for n in numbers):
            continue
        key = (record["batch_id"], record["session_id"], record["generation_id"])
        values[key].add(json.dumps([record.get(f) for f in VALUE]))
    batches = sorted({key[0] for key in values})[-last:]
    out: dict[str | None, list[int]] = {}
    for key, seen in values.items():
        if key[0] not in batches or len(seen) != 1:
            continue
        value = dict(zip(VALUE, json.loads(next(iter(seen))), strict=True))
        histogram = value["accept_histogram"]
        if histogram is None:
            continue
        summed = out.setdefault(value[by] if by else None, [])
        summed.extend([0] * (len(histogram) - len(summed)))
        for i, n in enumerate(histogram):
            summed[i] += n
    return out


@pytest.mark.parametrize("by", [None, "task", "weight_version"])
def test_loadgen_dump_aggregate_advise_gives_the_curve_of_the_records_histograms(tmp_path, by):
    dump, aggregated = tmp_path / "dump.jsonl", tmp_path / "metrics.jsonl"
    made = run_specmeter(
        "loadgen", "--dump", str(dump), "--batches", "6", "--sessions-per-batch", "40", "--run-id", "grpo-3"
    )
    assert made.returncode == 0, made.stderr
    done = run_specmeter("aggregate", str(dump), "--format", "jsonl", "--quiet")
    assert done.returncode == 0, done.stderr
    aggregated.write_text(done.stdout)
    args = ["--last", "4", "--draft-cost", "0.05", *(["--by", by] if by else [])]
    advised = run_specmeter("advise", str(aggregated), *args, "--json")
    assert advised.returncode == 0, advised.stderr
    document = json.loads(advised.stdout)
    want = histograms_by_hand(dump, "grpo-3", 4, by)
    assert len(want) >= (3 if by else 1), want
    assert document["batches"] == [f"step-{i:05d}" for i in range(2, 6)]
    got = {c.get(by) if by else None: c for c in document["curves"]}
    assert {group: c["accept_histogram"] for group, c in got.items()} == want
    for group, histogram in want.items():
        tokens = [tokens_by_hand(histogram, k) for k in range(1, len(histogram))]
        budgets = got[group]["budgets"]
        assert [b["tokens_per_verify"] for b in budgets] == pytest.approx([float(t) for t in tokens], rel=1e-12)
        speedups = [float(t) / (1 + 0.05 * k) for k, t in enumerate(tokens, start=1)]
        assert [b["speedup"] for b in budgets] == pytest.approx(speedups, rel=1e-12)
        assert got[group]["best_budget"] == 1 + max(range(len(speedups)), key=speedups.__getitem__)
    # the table says the same, read from stdin
    table = run_specmeter("advise", "-", *args, input=done.stdout)
    assert table.returncode == 0, table.stderr
    first = next(iter(want.values()))
    assert f"{float(tokens_by_hand(first, 1)):.3f}" in table.stdout


# -- from a real broker's metrics topic --------------------------------------------------------
@pytest.mark.kafka
def test_advise_reads_a_run_from_the_metrics_topic(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=3)
    published: list[BatchMetrics | bytes] = [
        batch("step-1", [4, 2, 2]),
        batch("step-2", [1, 1, 0]),
        batch("step-1", [4, 2, 2]),  # a repeat after a crash
        b"not json",
        batch("step-2", [1, 1, 6], revision=1),  # late records
        batch("step-3", [9, 9, 9], run_id="run-b"),  # another run, same ids
        batch("step-3", [0, 0, 8]),
    ]
    asyncio.run(publish(kafka_bootstrap, topic, published))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    advised = run_specmeter("advise", "--topic", topic, "--run-id", "run-a", "--last", "2", "--json", env=env)
    assert advised.returncode == 0, advised.stderr
    document = json.loads(advised.stdout)
    assert document["batches"] == ["step-2", "step-3"]
    [curve] = document["curves"]
    assert curve["accept_histogram"] == [1, 1, 6 + 8]
    assert [b["tokens_per_verify"] for b in curve["budgets"]] == pytest.approx([1 + 15 / 16, 1 + 29 / 16])
    # two runs and none named: it says which to pick; a mistyped topic is never created
    both = run_specmeter("advise", "--topic", topic, env=env)
    assert both.returncode == 1 and "2 runs: run-a, run-b" in both.stderr and "--run-id" in both.stderr
    other = run_specmeter("advise", "--topic", topic, "--run-id", "run-c", env=env)
    assert other.returncode == 1 and "no batch of run 'run-c' in the metrics (runs there: run-a, run-b)" in other.stderr
    missing = run_specmeter("advise", "--topic", topic + "x", env=env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr


def test_reading_records_instead_of_metrics_says_what_to_give(tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(msgspec.json.encode({"type": "record", "batch_id": "b", "session_id": "s"}) + b"\n")
    result = run_specmeter("advise", str(dump))
    assert result.returncode == 1
    assert "line 1, is not a BatchMetrics JSON object" in result.stderr and "aggregate --format jsonl" in result.stderr
