"""``specmeter advise`` (issue 31): the draft-budget curve of a run's summed histograms,
pure (tables and properties), through the command on a loadgen dump checked against a
histogram computed by hand from the dump's records, and from a real broker's metrics topic."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import BatchMetrics, DraftLagMetrics, TaskMetrics, WeightVersionMetrics, encode_metrics
from specmeter.streams.cli import main
from specmeter.streams.cli.advise import (
    AdviceError,
    advise,
    budget_curve,
    engine_settings,
    metrics_from_lines,
    refresh_interval,
)

from .support.tools import run_specmeter
from .test_consume import metrics, publish


def tokens_by_hand(histogram: list[int], k: int) -> Fraction:
    """docs/contract.md §3.5, read literally: a step that accepted i drafts yields 1 + min(i, k) tokens."""
    steps = sum(histogram)
    return Fraction(sum((1 + min(i, k)) * n for i, n in enumerate(histogram)), steps)


def best_by_hand(speedups: list[float]) -> int:
    """The recommended budget by the rule of docs/advise.md, read literally: budget 0 gives
    1.0; the budgets whose speedups print the same as the greatest (3 decimals) tie; the
    smallest of them is recommended."""
    candidates = {0: 1.0, **dict(enumerate(speedups, start=1))}
    top = f"{max(candidates.values()):.3f}"
    return min(k for k, s in candidates.items() if f"{s:.3f}" == top)


def assert_never_loses_to_budget_0(curve) -> None:
    """A recommended budget k >= 1 beats no speculation by a printed digit; one that does not
    is never recommended."""
    if curve.best:
        assert f"{curve.points[curve.best - 1].speedup:.3f}" > "1.000"
    else:
        assert all(f"{p.speedup:.3f}" <= "1.000" for p in curve.points)


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
    # budget 0 (no speculation, 1.0) is a candidate; speedups equal to 3 decimals tie, the smallest wins
    assert curve.best == best_by_hand(speedups)
    assert_never_loses_to_budget_0(curve)


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
    # k=1 gives 1.5 / 1.5 = 1.000×: a tie with no speculation, so speculation off is best (issue 38)
    assert rows[:3] == [
        ["0", "1.000", "1.000×", "◀", "best,", "no", "speculation"],
        ["1", "1.500", "1.000×", "ties", "with", "k=0"],
        ["2", "1.750", "0.875×", "the", "fleet", "ran", "this"],
    ]
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
        ("--refresh-cost", "SPECMETER_ADVISE_REFRESH_COST"),
        ("--plot", "SPECMETER_ADVISE_PLOT"),
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
        assert got[group]["best_budget"] == best_by_hand(speedups)
    # the table says the same, read from stdin
    table = run_specmeter("advise", "-", *args, input=done.stdout)
    assert table.returncode == 0, table.stderr
    first = next(iter(want.values()))
    # one table of budgets shows tokens and speedups; the matrix of groups (--by) the speedups
    assert f"{float(tokens_by_hand(first, 1)) / 1.05:.3f}" in table.stdout
    if by is None:
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


# -- issue 38: budget 0, ties, the edge of the data, engine settings, refusals, the matrix, the
# staleness curve and the refresh interval, the plot; every expected value computed by hand ------


def curve_of(histogram: list[int], draft_cost: float):
    [curve] = advise([batch("step-1", histogram)], draft_cost=draft_cost).curves
    return curve


@pytest.mark.parametrize(
    ("histogram", "draft_cost", "speedups"),
    [
        ([2, 1, 1], 0.6, [1.5 / 1.6, 1.75 / 2.2]),  # 0.9375×, 0.795×: both lose to not speculating
        ([2, 1, 1], 50.0, [1.5 / 51, 1.75 / 101]),  # 0.029×: the "0.031× ◀ best"
        ([5, 0, 0, 0], 0.0, [1.0, 1.0, 1.0]),  # nothing accepted: every budget ties with budget 0
        ([2, 1, 1], 0.5, [1.0, 0.875]),  # k=1 gives exactly 1.000×: a tie with budget 0, not a win
    ],
)
def test_a_budget_that_does_not_beat_budget_0_is_never_recommended(histogram, draft_cost, speedups):
    curve = curve_of(histogram, draft_cost)
    assert [p.speedup for p in curve.points] == pytest.approx(speedups, rel=1e-12)
    assert curve.best == 0 and not curve.recommendation.speculate
    assert curve.recommendation.speedup == 1.0
    assert_never_loses_to_budget_0(curve)
    document = advise([batch("step-1", histogram)], draft_cost=draft_cost).as_document()
    [doc] = document["curves"]
    assert doc["best_budget"] == 0 and doc["no_speculation"] == {"budget": 0, "tokens_per_verify": 1.0, "speedup": 1.0}
    assert doc["recommendation"]["speculate"] is False
    assert "turn speculative decoding off" in doc["recommendation"]["reason"]
    assert doc["recommendation"]["engine_settings"]["vllm"] == "leave out --speculative-config"


def test_the_command_says_to_turn_speculation_off_with_the_engines_settings(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [2, 1, 1])) + b"\n")
    result = CliRunner().invoke(main, ["advise", str(path), "--draft-cost", "0.6"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert rows[0] == ["0", "1.000", "1.000×", "◀", "best,", "no", "speculation"]
    assert rows[1] == ["1", "1.500", f"{1.5 / 1.6:.3f}×"] and "best" not in " ".join(rows[1] + rows[2])
    assert "no budget beats decoding without speculation (the best, k=1, gives 0.938×)" in result.output
    assert "turn speculative decoding off" in result.output
    assert "SGLang: leave out --speculative-algorithm" in result.output


def test_speedups_equal_in_the_printed_precision_tie_and_the_smaller_budget_is_recommended(tmp_path):
    # c = 0.2001: k=1 gives 1.5 / 1.2001 = 1.24990, k=2 gives 1.75 / 1.4002 = 1.24982: both print 1.250
    near = curve_of([2, 1, 1], 0.2001)
    assert 1.5 / 1.2001 != 1.75 / 1.4002 and f"{1.5 / 1.2001:.3f}" == f"{1.75 / 1.4002:.3f}" == "1.250"
    assert (near.best, near.recommendation.tied, near.recommendation.at_edge) == (1, [1, 2], False)
    # an exact tie: E3 = E4 = (4 + 0 + 1 + 2 + 3) / 4 = 2.5 at no draft cost
    exact = curve_of([1, 1, 1, 1, 0], 0.0)
    assert [p.speedup for p in exact.points] == [1.75, 2.25, 2.5, 2.5]
    assert (exact.best, exact.recommendation.tied, exact.recommendation.at_edge) == (3, [3, 4], False)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [1, 1, 1, 1, 0])) + b"\n")
    result = CliRunner().invoke(main, ["advise", str(path), "--draft-cost", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[3:] for line in result.output.splitlines() if line.strip()[:1].isdigit()}
    assert rows["3"] == ["◀", "best"] and rows["4"] == ["ties", "with", "k=3,", "the", "fleet", "ran", "this"]
    text = " ".join(result.output.split())
    assert "k=3 and k=4 tie at 2.500× (equal within the printed precision)" in text
    assert "the smaller, k=3, gives the same speedup for fewer draft tokens per step" in text
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in text


def test_the_largest_budget_measured_is_recommended_as_the_edge_of_the_data():
    # [0, 0, 4] at c = 0.25: k=1 gives 2 / 1.25 = 1.6, k=2 gives 3 / 1.5 = 2.0, the budget the fleet ran
    curve = curve_of([0, 0, 4], 0.25)
    assert (curve.best, curve.budget_ran, curve.recommendation.at_edge) == (2, 2, True)
    assert curve.recommendation.speedup == pytest.approx(2.0)
    assert (
        "beyond the data"
        in advise([batch("step-1", [0, 0, 4])], draft_cost=0.25).as_document()["curves"][0]["recommendation"]["reason"]
    )


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_the_engine_settings_of_a_budget(budget):
    settings = engine_settings(budget)
    # SGLang (server_args.py): with --speculative-eagle-topk 1, num_draft_tokens = num_steps + 1
    assert settings["sglang"] == (
        f"--speculative-num-steps {budget} --speculative-eagle-topk 1 --speculative-num-draft-tokens {budget + 1}"
    )
    assert f'"num_speculative_tokens": {budget}}}' in settings["vllm"] and "--speculative-config" in settings["vllm"]
    assert settings["tensorrt_llm"].startswith(f"max_draft_len={budget} ")
    off = engine_settings(0)
    assert "leave out --speculative-algorithm" in off["sglang"] and off["vllm"] == "leave out --speculative-config"
    with pytest.raises(ValueError):
        engine_settings(-1)


@pytest.mark.parametrize("flag", ["--draft-cost", "--refresh-cost"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "-0.5"])
def test_non_finite_or_negative_costs_are_refused_in_one_line(tmp_path, flag, value):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [2, 1, 1])) + b"\n")
    result = run_specmeter("advise", str(path), "--by", "draft_lag", f"{flag}={value}")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line == f"specmeter advise: {flag} must be a finite number >= 0, not {float(value)!r}"


def test_the_other_refusals(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [2, 1, 1])) + b"\n")
    needs_lag = run_specmeter("advise", str(path), "--refresh-cost", "10")
    assert needs_lag.returncode == 2 and needs_lag.stderr.splitlines() == [
        "specmeter advise: --refresh-cost needs --by draft_lag (the staleness curve it is weighed against)"
    ]
    png = run_specmeter("advise", str(path), "--plot", str(tmp_path / "x.png"))
    assert png.returncode == 2 and len(png.stderr.splitlines()) == 1 and ".svg" in png.stderr
    for cost in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="draft_cost must be a finite number >= 0"):
            advise([batch("step-1", [2, 1, 1])], draft_cost=cost)
        with pytest.raises(ValueError, match="refresh_cost must be a finite number >= 0"):
            advise([batch("step-1", [2, 1, 1])], by="draft_lag", refresh_cost=cost)
    with pytest.raises(ValueError, match="refresh_cost needs by='draft_lag'"):
        advise([batch("step-1", [2, 1, 1])], refresh_cost=1.0)


def version(name: str, histogram: list[int]) -> WeightVersionMetrics:
    return WeightVersionMetrics(weight_version=name, metrics={}, accept_histogram=histogram)


def test_many_groups_read_as_one_matrix_with_the_best_marked_per_row(tmp_path):
    """Issue 38: 23 weight versions printed 23 stacked tables (170 lines)."""
    histograms = {f"v{i:02d}": [10 + i, 10, 10 - i % 5, i % 7] for i in range(23)}
    published = [
        batch(f"step-{i}", [1, 1, 1, 1], by_weight_version=[version(name, h)])
        for i, (name, h) in enumerate(histograms.items())
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in published))
    args = ["advise", str(path), "--last", "0", "--by", "weight_version", "--draft-cost", "0.1"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) < 50, len(lines)
    assert sum("k=0" in line and "k=3" in line for line in lines) == 1, "one header: one matrix"
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in histograms}
    assert sorted(rows) == sorted(histograms)
    for name, histogram in histograms.items():
        speedups = [float(tokens_by_hand(histogram, k)) / (1 + 0.1 * k) for k in range(1, 4)]
        best = best_by_hand(speedups)
        cells = rows[name][2:6]
        assert cells == [f"{s:.3f}" + ("*" if k == best else "") for k, s in enumerate([1.0, *speedups])], name
        assert rows[name][6] == "3"  # the budget the fleet ran


def lag(draft_lag: int | None, accepted: int, proposed: int, completion: int, verify: int, histogram=None):
    return DraftLagMetrics(
        draft_lag=draft_lag,
        metrics={
            "spec/paired_accepted_total": accepted,
            "spec/paired_proposed_total": proposed,
            "spec/paired_completion_total": completion,
            "spec/paired_verify_total": verify,
        },
        accept_histogram=histogram,
    )


def lag_batches() -> list[BatchMetrics]:
    """Three batches whose lags sum, by hand, to T(0) = 300/100 = 3.0, T(1) = 250/100 = 2.5,
    T(2) = 150/75 = 2.0, T(3) = 150/100 = 1.5 tokens per verify step and accept rates 90/100,
    70/100, 37/75, 30/100; the unknown lag 50/25 = 2.0 and 10/25. Tokens per update G: the
    batches' completion totals 300, 400 and 200, on average 300."""
    rows = {
        "step-1": (
            300,
            [lag(0, 45, 50, 150, 50, [0, 2, 3]), lag(1, 28, 40, 100, 40, [1, 2, 1]), lag(None, 10, 25, 50, 25)],
        ),
        "step-2": (
            400,
            [lag(0, 45, 50, 150, 50, [0, 1, 4]), lag(1, 42, 60, 150, 60), lag(2, 25, 50, 100, 50, [3, 2, 0])],
        ),
        "step-3": (200, [lag(2, 12, 25, 50, 25), lag(3, 30, 100, 150, 100, [6, 3, 1])]),
    }
    return [
        msgspec.structs.replace(
            batch(batch_id, [1, 1, 1]),
            metrics={"spec/completion_total": total},
            by_draft_lag=entries,
        )
        for batch_id, (total, entries) in rows.items()
    ]


def test_the_staleness_curve_sums_each_lag_over_the_batches():
    advice = advise(lag_batches(), by="draft_lag", draft_cost=0.1)
    points = [(p.draft_lag, p.verify_steps, p.accept_rate, p.tokens_per_verify) for p in advice.staleness.points]
    assert points == [
        (0, 100, pytest.approx(0.9), pytest.approx(3.0)),
        (1, 100, pytest.approx(0.7), pytest.approx(2.5)),
        (2, 75, pytest.approx(37 / 75), pytest.approx(2.0)),
        (3, 100, pytest.approx(0.3), pytest.approx(1.5)),
        (None, 25, pytest.approx(0.4), pytest.approx(2.0)),
    ]
    # the per-lag budget curves (the matrix's rows), from the lags' summed histograms
    assert [(c.group, c.histogram) for c in advice.curves] == [
        (0, [0, 3, 7]),
        (1, [1, 2, 1]),
        (2, [3, 2, 0]),
        (3, [6, 3, 1]),
    ]
    assert advice.staleness.refresh is None


@pytest.mark.parametrize(
    ("refresh_cost", "averages", "every"),
    [
        # c(L) = G / T(L) = 300 / [3, 2.5, 2, 1.5] = [100, 120, 150, 200] verify steps per update;
        # A(N) = (R + c(0) + ... + c(N-1)) / N
        (100.0, [200.0, 160.0, 470 / 3, 167.5], 3),
        (0.0, [100.0, 110.0, 370 / 3, 142.5], 1),
        (1000.0, [1100.0, 610.0, 1370 / 3, 392.5], 4),  # the longest interval measured: the edge of the data
        (40.0, [140.0, 130.0, 410 / 3, 152.5], 2),
    ],
)
def test_the_refresh_interval_minimises_the_average_cost_per_update(refresh_cost, averages, every):
    plan = refresh_interval([3.0, 2.5, 2.0, 1.5], 300.0, refresh_cost)
    assert plan.update_costs == pytest.approx([100.0, 120.0, 150.0, 200.0])
    assert plan.averages == pytest.approx(averages)
    assert (plan.every, plan.at_edge) == (every, every == 4)
    # the same through advise(): the lags 0 .. 3 of the batches, G their mean completion total
    stale = advise(lag_batches(), by="draft_lag", refresh_cost=refresh_cost).staleness
    assert stale.refresh.tokens_per_update == pytest.approx(300.0)
    assert stale.refresh.averages == pytest.approx(averages) and stale.refresh.every == every


def test_the_refresh_interval_stops_at_the_first_unmeasured_lag_and_needs_lag_0():
    without_2 = [
        msgspec.structs.replace(m, by_draft_lag=[e for e in m.by_draft_lag if e.draft_lag != 2]) for m in lag_batches()
    ]
    plan = advise(without_2, by="draft_lag", refresh_cost=1000.0).staleness.refresh
    assert plan.update_costs == pytest.approx([100.0, 120.0]) and (plan.every, plan.at_edge) == (2, True)
    without_0 = [
        msgspec.structs.replace(m, by_draft_lag=[e for e in m.by_draft_lag if e.draft_lag != 0]) for m in lag_batches()
    ]
    stale = advise(without_0, by="draft_lag", refresh_cost=10.0).staleness
    assert stale.refresh is None and "draft lag 0" in stale.no_refresh
    with pytest.raises(ValueError):
        refresh_interval([], 300.0, 1.0)
    # a lag whose steps gave no token has no cost to weigh: the interval stops before it
    no_tokens = lag_batches()
    no_tokens[1] = msgspec.structs.replace(
        no_tokens[1], by_draft_lag=[*no_tokens[1].by_draft_lag[:2], lag(2, 0, 50, 0, 50)]
    )
    no_tokens[2] = msgspec.structs.replace(no_tokens[2], by_draft_lag=no_tokens[2].by_draft_lag[1:])
    plan = advise(no_tokens, by="draft_lag", refresh_cost=1000.0).staleness.refresh
    assert plan.update_costs == pytest.approx([100.0, 120.0]) and plan.at_edge


def test_the_command_prints_the_staleness_curve_and_the_refresh_interval(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in lag_batches()))
    args = ["advise", str(path), "--by", "draft_lag", "--draft-cost", "0.1", "--refresh-cost", "100"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
    staleness_rows = [r for r in rows if len(r) == 4]
    assert staleness_rows == [
        ["0", "100", "0.900", "3.000"],
        ["1", "100", "0.700", "2.500"],
        ["2", "75", "0.493", "2.000"],
        ["3", "100", "0.300", "1.500"],
    ]
    text = " ".join(result.output.split())
    assert "Refresh the draft every 3 policy update(s)" in text
    assert "at 156.7 verify steps per update on average (every update: 200.0; every 4: 167.5)" in text
    document = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert document["staleness"]["refresh"]["refresh_every_updates"] == 3
    assert document["staleness"]["refresh"]["average_cost_by_interval"] == pytest.approx([200.0, 160.0, 470 / 3, 167.5])
    assert [p["tokens_per_verify"] for p in document["staleness"]["points"]] == pytest.approx([3.0, 2.5, 2.0, 1.5, 2.0])


def plotted(svg: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Every panel's series read back from the SVG into data values, by the panel's ranges."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    panels = {}
    for g in ET.fromstring(svg).iter(f"{ns}g"):
        if g.get("class") != "panel":
            continue
        a = {
            k: float(g.get(f"data-{k}")) for k in ("x-min", "x-max", "y-min", "y-max", "left", "right", "top", "bottom")
        }
        series = {}
        for line in g.iter(f"{ns}polyline"):
            points = []
            for pair in line.get("points").split():
                px, py = map(float, pair.split(","))
                x = a["x-min"] + (px - a["left"]) / (a["right"] - a["left"]) * (a["x-max"] - a["x-min"])
                y = a["y-min"] + (a["bottom"] - py) / (a["bottom"] - a["top"]) * (a["y-max"] - a["y-min"])
                points.append((x, y))
            series[line.get("data-name")] = points
        panels[g.get("data-title")] = series
    return panels


def test_the_plot_draws_the_speedups_per_group_and_the_staleness_curve(tmp_path):
    path, svg = tmp_path / "metrics.jsonl", tmp_path / "advice.svg"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in lag_batches()))
    args = ["advise", str(path), "--by", "draft_lag", "--draft-cost", "0.1", "--plot", str(svg)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    panels = plotted(svg.read_text())
    speedup = panels["speedup at draft cost c=0.1 by budget"]
    want = {
        str(group): [(0, 1.0)] + [(k, float(tokens_by_hand(h, k)) / (1 + 0.1 * k)) for k in range(1, len(h))]
        for group, h in ((0, [0, 3, 7]), (1, [1, 2, 1]), (2, [3, 2, 0]), (3, [6, 3, 1]))
    }
    assert sorted(speedup) == sorted(want)
    for name, points in want.items():
        assert speedup[name] == [(pytest.approx(x, abs=0.01), pytest.approx(y, abs=0.01)) for x, y in points], name
    tokens = panels["staleness: tokens per verify step by draft lag"]["tokens per verify step"]
    assert tokens == [
        (pytest.approx(x, abs=0.01), pytest.approx(y, abs=0.01)) for x, y in [(0, 3.0), (1, 2.5), (2, 2.0), (3, 1.5)]
    ]
    rates = panels["staleness: accept rate by draft lag"]["accept rate"]
    assert rates == [
        (pytest.approx(x, abs=0.01), pytest.approx(y, abs=0.002))
        for x, y in [(0, 0.9), (1, 0.7), (2, 37 / 75), (3, 0.3)]
    ]


# -- issue 47.5: the rough edges ---------------------------------------------------------------
def test_a_plot_into_a_missing_folder_is_refused_before_anything_is_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [2, 1, 1])) + b"\n")
    missing = tmp_path / "no" / "such" / "x.svg"
    result = run_specmeter("advise", str(path), "--draft-cost", "0.1", "--plot", str(missing))
    assert result.returncode == 2, result.stderr
    assert result.stdout == "", "refused before the advice"
    assert result.stderr.splitlines() == [
        f"specmeter advise: --plot {missing}: the folder {missing.parent} does not exist",
        "  create it first, or give a FILE.svg in another folder",
    ]
    # before the work: no broker is asked (nothing listens at port 9 of this machine)
    result = run_specmeter("advise", "--broker", "127.0.0.1:9", "--plot", str(missing))
    assert result.returncode == 2 and "does not exist" in result.stderr and "broker" not in result.stderr


@pytest.mark.parametrize("columns", ["80", "40"])
def test_engine_command_lines_are_never_wrapped_in_a_file_or_pipe(tmp_path, columns):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", [10, 10, 10, 10, 30])) + b"\n")
    result = run_specmeter("advise", str(path), "--draft-cost", "0.01", env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  SGLang: --speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5" in lines
    assert "  vLLM: --speculative-config '{..., \"num_speculative_tokens\": 4}' (keep your method and model)" in lines
    assert any(line.startswith("  TensorRT-LLM: max_draft_len=4 in speculative_config (e.g. Eagle3") for line in lines)


def test_a_huge_refresh_cost_is_printed_in_scientific_notation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in lag_batches()))
    args = ["advise", str(path), "--by", "draft_lag", "--refresh-cost", "1e300"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # A(4) = (1e300 + 570) / 4, A(1) = 1e300 + 100: the longest interval the lags allow
    assert "at 2.5e+299 verify steps per update on average (every update: 1e+300; every 4: 2.5e+299)" in text
    assert max(len(run) for run in re.findall(r"[\d,]+", text)) < 20, "no 300-digit number"
    # an ordinary cost prints as it did
    ordinary = CliRunner().invoke(main, [*args[:-1], "100"], env={"COLUMNS": "200"})
    assert "at 156.7 verify steps per update on average (every update: 200.0; every 4: 167.5)" in " ".join(
        ordinary.output.split()
    )


def test_the_matrix_and_the_staleness_table_say_which_verify_steps_they_count(tmp_path):
    """Issue 47.5: at lag 0 the matrix said 4,234 verify steps and the staleness table 4,218.
    The matrix counts the steps in the lags' histograms (lag 0: [0, 2, 3] + [0, 1, 4], 10
    steps), the staleness table spec/paired_verify_total (50 + 50): two quantities, each named."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in lag_batches()))
    result = CliRunner().invoke(main, ["advise", str(path), "--by", "draft_lag"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["draft", "lag"] and "accept rate" in line)
    assert "paired verify steps" in header
    rows = [line.split() for line in lines if line.split()[:1] == ["0"]]
    assert [row[1] for row in rows] == ["10", "100"], "the matrix's row, then the staleness table's"
    text = " ".join(result.output.split())
    assert "the matrix counts the steps in the acceptance histograms" in text
    assert "paired verify steps are spec/paired_verify_total" in text
    # advice without a staleness table has no such note
    plain = CliRunner().invoke(main, ["advise", str(path)], env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and "paired verify" not in plain.output


def test_metrics_on_stdin_are_read_without_a_dash(tmp_path):
    """Issue 47.5: `specmeter advise < metrics.jsonl` ignored stdin and asked the default broker."""
    metrics = b"".join(encode_metrics(m) + b"\n" for m in (batch("step-1", [2, 1, 1]), batch("step-2", [4, 2, 2])))
    piped = run_specmeter("advise", "--json", input=metrics.decode())
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["curves"][0]["accept_histogram"] == [6, 3, 3]
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(metrics)
    with path.open("rb") as redirected:
        result = subprocess.run(
            [sys.executable, "-m", "specmeter.streams.cli", "advise", "--json"],
            stdin=redirected,
            capture_output=True,
            timeout=90,
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["batches"] == ["step-1", "step-2"]
    # a broker named: the topic is read, stdin is not (nothing listens at port 9)
    named = run_specmeter("advise", "--broker", "127.0.0.1:9", input=metrics.decode())
    assert named.returncode == 1 and "no Kafka broker answers at 127.0.0.1:9" in named.stderr


def test_the_plot_rings_each_recommended_budget_and_names_the_lags(tmp_path):
    import xml.etree.ElementTree as ET

    path, svg = tmp_path / "metrics.jsonl", tmp_path / "advice.svg"
    path.write_bytes(b"".join(encode_metrics(m) + b"\n" for m in lag_batches()))
    args = ["advise", str(path), "--by", "draft_lag", "--draft-cost", "0.1", "--plot", str(svg)]
    assert CliRunner().invoke(main, args).exit_code == 0
    advice = advise(lag_batches(), by="draft_lag", draft_cost=0.1)
    ns = "{http://www.w3.org/2000/svg}"
    panel = next(g for g in ET.fromstring(svg.read_text()).iter(f"{ns}g") if g.get("class") == "panel")
    rings = {c.get("data-name"): c for c in panel.iter(f"{ns}circle") if c.get("class") == "recommended"}
    assert {name: int(c.get("data-budget")) for name, c in rings.items()} == {
        str(c.group): c.best for c in advice.curves
    }
    points = {  # each series' points in pixels
        line.get("data-name"): [tuple(map(float, p.split(","))) for p in line.get("points").split()]
        for line in panel.iter(f"{ns}polyline")
    }
    for name, ring in rings.items():
        at = points[name][int(ring.get("data-budget"))]
        assert (float(ring.get("cx")), float(ring.get("cy"))) == at, "around the recommended budget's point"
    legend = [t.text for t in panel.iter(f"{ns}text") if t.get("class") == "legend"]
    assert legend == ["lag 0", "lag 1", "lag 2", "lag 3", "recommended budget"]
