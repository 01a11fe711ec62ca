"""The Prometheus series of published batches, without a broker: counters that add up
over revisions and workers, bounded label sets, and a valid exposition (issue #13)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specmeter.schemas import BatchMetrics, WeightVersionMetrics
from specmeter.streams._counters import PUBLISHED_QUANTITIES, PublishedTotals, WorkerCounters
from specmeter.streams._prometheus import EXPORTED_METRICS, render

from .support.tools import find_tool

STEMS = [stem for stem, _, _ in PUBLISHED_QUANTITIES]


def batch(
    batch_id: str,
    revision: int = 0,
    *,
    run_id: str | None = "run-a",
    algorithm: str | None = "EAGLE3",
    accepted: int = 3,
    proposed: int = 4,
    completion: int = 10,
    verify: int = 5,
    records: int = 7,
    by_weight_version: list[WeightVersionMetrics] | None = None,
) -> BatchMetrics:
    metrics = {
        "spec/paired_accepted_total": accepted,
        "spec/paired_proposed_total": proposed,
        "spec/paired_completion_total": completion,
        "spec/paired_verify_total": verify,
        "spec/accepted_total": accepted + 1,
        "spec/proposed_total": proposed + 1,
        "spec/completion_total": completion,
        "spec/verify_total": verify,
        "spec/accept_covered_count": 2,
        "spec/verify_covered_count": 2,
        "spec/unique_generation_count": 3,
        "spec/conflicting_generation_count": 0,
        "spec/sample_count": 2,
        "spec/record_occurrence_count": 3,
        "spec/invalid_record_count": 0,
    }
    if proposed:
        metrics["spec/accept_rate"] = accepted / proposed
    if verify:
        metrics["spec/tokens_per_verify"] = completion / verify
    return BatchMetrics(
        batch_id=batch_id,
        revision=revision,
        close_reason="markers",
        closed_at=1000.0 + revision,
        speculative=True,
        complete=True,
        partitions_reported=4,
        partitions_expected=4,
        record_count=records,
        invalid_record_count=0,
        missing_record_count=0,
        late_record_count=revision,
        accept_histogram=[1, 2, 3],
        metrics=metrics,
        speculative_algorithm=algorithm,
        run_id=run_id,
        by_weight_version=by_weight_version,
    )


def net(totals: PublishedTotals, stem: str, labels=("EAGLE3", "run-a")) -> int:
    i = STEMS.index(stem)
    t = totals.totals[labels]
    return t.added[i] - t.retracted[i]


def test_a_revision_adds_only_its_difference_and_repeats_add_nothing():
    totals = PublishedTotals()
    totals.observe(batch("b1", 0, accepted=3, proposed=4), 1.0)
    totals.observe(batch("b2", 0, accepted=5, proposed=10), 2.0)
    totals.observe(batch("b1", 1, accepted=6, proposed=9), 3.0)  # late records: +3 / +5
    totals.observe(batch("b1", 1, accepted=6, proposed=9), 4.0)  # the same revision again
    totals.observe(batch("b1", 0, accepted=3, proposed=4), 5.0)  # an older one
    assert net(totals, "paired_accepted_tokens") == 6 + 5
    assert net(totals, "paired_proposed_tokens") == 9 + 10
    assert net(totals, "batches") == 2
    t = totals.totals[("EAGLE3", "run-a")]
    assert t.retracted == [0] * len(STEMS)


def test_a_decrease_goes_to_the_retracted_twin():
    totals = PublishedTotals()
    totals.observe(batch("b1", 0, accepted=6, proposed=8), 1.0)
    totals.observe(batch("b1", 1, accepted=2, proposed=3), 2.0)  # a late conflict took a key out
    t = totals.totals[("EAGLE3", "run-a")]
    i = STEMS.index("paired_accepted_tokens")
    assert (t.added[i], t.retracted[i]) == (6, 4)
    assert net(totals, "paired_proposed_tokens") == 3


def test_a_batch_whose_algorithm_is_named_later_moves_to_its_label_set():
    totals = PublishedTotals()
    totals.observe(batch("b1", 0, algorithm=None, accepted=2), 1.0)
    totals.observe(batch("b1", 1, algorithm="NGRAM", accepted=5), 2.0)
    assert net(totals, "paired_accepted_tokens", ("unknown", "run-a")) == 0
    assert net(totals, "batches", ("unknown", "run-a")) == 0
    assert net(totals, "paired_accepted_tokens", ("NGRAM", "run-a")) == 5
    assert net(totals, "batches", ("NGRAM", "run-a")) == 1


def test_a_republication_after_a_rebalance_is_not_counted_again():
    # worker A published revision 0; the partition moved to B, which republishes it on
    # restore (seed) and later publishes revision 1: the fleet counts the batch once
    a, b = PublishedTotals(), PublishedTotals()
    a.observe(batch("b1", 0, accepted=3), 1.0)
    b.seed([batch("b1", 0, accepted=3)], 2.0)
    b.observe(batch("b1", 1, accepted=7), 3.0)
    assert net(a, "paired_accepted_tokens") + net(b, "paired_accepted_tokens") == 7
    assert net(a, "batches") + net(b, "batches") == 1


def test_label_sets_batches_and_memory_are_bounded():
    totals = PublishedTotals(max_label_sets=3, latest_batches=2, forget_after_s=10.0, max_remembered=5)
    for i in range(6):
        totals.observe(batch(f"b{i}", run_id=f"run-{i}"), float(i))
    assert list(totals.totals) == [("EAGLE3", "run-3"), ("EAGLE3", "run-4"), ("EAGLE3", "run-5")]
    assert list(totals.latest) == [("run-4", "b4"), ("run-5", "b5")]
    assert len(totals._last) == 5
    totals.observe(batch("late", run_id="run-5"), 100.0)  # everything else is older than forget_after_s
    assert list(totals._last) == [("run-5", "late")]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 3),
            st.integers(0, 50),
            st.integers(0, 50),
            st.sampled_from(["r1", "r2", None]),
        ),
        max_size=40,
    ),
    st.integers(1, 3),
)
def test_net_counters_equal_the_sum_over_the_latest_revisions(publications, workers):
    """Whatever the order, repeats, decreases and the worker each batch lands on, the
    fleet's total - retracted is the sum over each batch's latest revision."""
    fleet = [PublishedTotals() for _ in range(workers)]
    latest: dict[tuple, BatchMetrics] = {}
    for n, (b, revision, accepted, proposed, run_id) in enumerate(publications):
        m = batch(f"b{b}", revision, run_id=run_id, accepted=accepted, proposed=proposed)
        owner = fleet[hash((b, run_id)) % workers]  # one stage-2 owner per batch
        owner.observe(m, float(n))
        key = (run_id, m.batch_id)
        if key not in latest or revision > latest[key].revision:
            latest[key] = m
    for stem, source in (
        ("paired_accepted_tokens", "spec/paired_accepted_total"),
        ("paired_proposed_tokens", "spec/paired_proposed_total"),
    ):
        i = STEMS.index(stem)
        got = sum(t.added[i] - t.retracted[i] for w in fleet for t in w.totals.values())
        assert got == sum(m.metrics[source] for m in latest.values())
        assert all(t.added[i] >= 0 and t.retracted[i] >= 0 for w in fleet for t in w.totals.values())


def _shell(published: PublishedTotals) -> SimpleNamespace:
    return SimpleNamespace(
        counters=WorkerCounters(),
        processors={},
        last_event_at={},
        started_at=123.0,
        gap_fills=0,
        idle_catch_ups=0,
        published=published,
    )


def _families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_exposition_has_counters_latest_batches_by_version_and_standard_collectors():
    totals = PublishedTotals(latest_batches=2)
    versions = [
        WeightVersionMetrics(
            weight_version="v1",
            metrics={"spec/accept_rate": 0.5, "spec/paired_accepted_total": 1, "spec/paired_proposed_total": 2},
            accept_histogram=None,
        ),
        WeightVersionMetrics(
            weight_version=None,
            metrics={"spec/accept_rate": 1.0, "spec/paired_accepted_total": 2, "spec/paired_proposed_total": 2},
            accept_histogram=None,
        ),
    ]
    totals.observe(batch("b1", accepted=3, proposed=4, by_weight_version=versions), 1.0)
    totals.observe(batch("b2", accepted=5, proposed=6), 2.0)
    totals.observe(batch("b3", accepted=7, proposed=8, run_id=None), 3.0)
    shell = _shell(totals)
    render(shell)  # the first scrape shows new label sets at 0 (see the next test)
    body = render(shell)
    families = _families(body)
    accepted = {
        (s.labels["algorithm"], s.labels["run_id"]): s.value
        for s in families["specmeter_paired_accepted_tokens"].samples
        if s.name.endswith("_total")
    }
    assert accepted == {("EAGLE3", "run-a"): 8.0, ("EAGLE3", ""): 7.0}
    # only the last two batches have gauges: b1's series (and its versions) are gone
    rates = {
        (s.labels["run_id"], s.labels["batch_id"]): s.value
        for s in families["specmeter_batch_accept_rate_ratio"].samples
    }
    assert rates == {("run-a", "b2"): 5 / 6, ("", "b3"): 7 / 8}
    assert not families["specmeter_weight_version_accept_rate_ratio"].samples
    assert any(name.startswith("process_") for name in families), "process collector"
    assert any(name.startswith("python_") for name in families), "platform / gc collectors"
    exported = set(EXPORTED_METRICS)
    for sample in (s for f in families.values() for s in f.samples if s.name.startswith("specmeter_")):
        assert sample.name in exported or any(
            sample.name.endswith(x) and sample.name[: -len(x)] in exported
            for x in ("_bucket", "_count", "_sum", "_info")
        ), f"{sample.name} is exported but not listed in EXPORTED_METRICS"

    totals = PublishedTotals(latest_batches=2)
    totals.observe(batch("b1", accepted=3, proposed=4, by_weight_version=versions), 1.0)
    families = _families(render(_shell(totals)))
    by_version = {
        s.labels["weight_version"]: s.value for s in families["specmeter_weight_version_accept_rate_ratio"].samples
    }
    assert by_version == {"v1": 0.5, "unknown": 1.0}
    assert {s.labels["batch_id"] for s in families["specmeter_weight_version_paired_proposed_tokens"].samples} == {"b1"}
    assert families["specmeter_partition_last_event_timestamp_seconds"].type == "gauge"

    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_null_version_label_does_not_collide_with_a_version_named_unknown():
    versions = [
        WeightVersionMetrics(weight_version="unknown", metrics={"spec/accept_rate": 0.5}, accept_histogram=None),
        WeightVersionMetrics(weight_version=None, metrics={"spec/accept_rate": 1.0}, accept_histogram=None),
    ]
    totals = PublishedTotals()
    totals.observe(batch("b1", by_weight_version=versions), 1.0)
    families = _families(render(_shell(totals)))
    by_version = {
        s.labels["weight_version"]: s.value for s in families["specmeter_weight_version_accept_rate_ratio"].samples
    }
    assert by_version == {"unknown": 0.5, "unknown (null)": 1.0}


def test_a_new_label_set_is_zero_on_its_first_scrape_so_rate_counts_the_first_batches():
    """Prometheus 2 takes a counter's first sample as its start: born at 3, the first
    batch would never be in rate() or increase()."""
    totals = PublishedTotals()
    totals.observe(batch("b1", accepted=3), 1.0)
    shell = _shell(totals)
    scrapes = []
    for _ in range(2):
        families = _families(render(shell))
        scrapes.append(
            [s.value for s in families["specmeter_paired_accepted_tokens"].samples if s.name.endswith("_total")]
        )
        totals.observe(batch("b2", accepted=4), 2.0)
    assert scrapes == [[0.0], [7.0]]
    totals.observe(batch("b3", accepted=5, run_id="run-b"), 3.0)
    families = _families(render(shell))
    by_run = {
        s.labels["run_id"]: s.value
        for s in families["specmeter_paired_accepted_tokens"].samples
        if s.name.endswith("_total")
    }
    assert by_run == {"run-a": 7.0, "run-b": 0.0}
