"""The Prometheus series of published batches, without a broker: counters that add up
over revisions and workers (acceptance by draft position and by version age too, issue
#23), label sets that do not grow with the batches published (issue #24), and a valid
exposition (issue #13)."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specmeter.schemas import BatchMetrics, DraftLagMetrics, TaskMetrics, WeightVersionMetrics
from specmeter.streams.core.counts import WorkerCounters
from specmeter.streams.core.merge import accept_rate_by_position
from specmeter.streams.report.counters import (
    MAX_EXPORTED_POSITION,
    OTHER_TASKS,
    PUBLISHED_QUANTITIES,
    SLOTS,
    TASK_COUNTERS,
    UNKNOWN_TASK,
    PublishedTotals,
)
from specmeter.streams.report.prometheus import EXPORTED_METRICS, render

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
    histogram: list[int] | None = None,
    closed_at: float | None = None,
    complete: bool = True,
    by_task: list[TaskMetrics] | None = None,
    inconsistent: int = 0,
    by_draft_lag: list[DraftLagMetrics] | None = None,
    distribution: list[int] | None = None,
) -> BatchMetrics:
    histogram = [1, 2, 3] if histogram is None else histogram
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
        "spec/inconsistent_generation_count": inconsistent,
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
        closed_at=1000.0 + revision if closed_at is None else closed_at,
        speculative=True,
        complete=complete,
        partitions_reported=4,
        partitions_expected=4,
        record_count=records,
        invalid_record_count=0,
        missing_record_count=0,
        late_record_count=revision,
        accept_histogram=histogram or None,
        metrics=metrics,
        speculative_algorithm=algorithm,
        run_id=run_id,
        by_weight_version=by_weight_version,
        accept_rate_by_position=accept_rate_by_position(histogram or None),
        by_task=by_task,
        by_draft_lag=by_draft_lag,
        tokens_per_verify_distribution=distribution,
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
    assert not any(t.retracted)


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
    totals = PublishedTotals(max_label_sets=3, latest_label_sets=2, forget_after_s=10.0, max_remembered=5)
    for i in range(6):
        totals.observe(batch(f"b{i}", run_id=f"run-{i}"), float(i))
    assert list(totals.totals) == [("EAGLE3", "run-3"), ("EAGLE3", "run-4"), ("EAGLE3", "run-5")]
    assert list(totals.latest) == [("EAGLE3", "run-4"), ("EAGLE3", "run-5")]
    assert [m.batch_id for m in totals.latest.values()] == ["b4", "b5"]
    assert len(totals.remembered) == 5
    totals.observe(batch("late", run_id="run-5"), 100.0)  # everything else is older than forget_after_s
    assert totals.remembered == [("run-5", "late")]


def slot_net(totals: PublishedTotals, labels=("EAGLE3", "run-a")) -> dict[tuple, int]:
    """total - retracted of every exported counter series of one label set, by (stem, extra label value)."""
    t = totals.totals[labels]
    return {(SLOTS[i].stem, SLOTS[i].value): t.added[i] - t.retracted[i] for i in t.present}


def versions(*entries: tuple[str | None, int, int, list[int] | None]) -> list[WeightVersionMetrics]:
    """by_weight_version entries from (version, paired accepted, paired proposed, histogram)."""
    return [
        WeightVersionMetrics(
            weight_version=v,
            metrics={
                "spec/unique_generation_count": 2,
                "spec/paired_accepted_total": a,
                "spec/paired_proposed_total": p,
                "spec/accept_covered_count": 1,
                **({"spec/accept_rate": a / p} if p else {}),
                "spec/accept_count_coverage": 0.5,
            },
            accept_histogram=h,
            accept_rate_by_position=accept_rate_by_position(h),
        )
        for v, a, p, h in entries
    ]


#: versions whose order a test knows without the worker's rule: the number after "v"
VERSION_NAMES = ["v1", "v2", "v9", "v10", "v11", "v100", None]


def lags(*entries: tuple[int | None, int, int]) -> list[DraftLagMetrics]:
    """by_draft_lag entries from (draft lag, paired accepted, paired proposed); paired
    completion and verify made of them (accepted + proposed, proposed)."""
    return [
        DraftLagMetrics(
            draft_lag=lag,
            metrics={
                "spec/unique_generation_count": 1,
                "spec/paired_accepted_total": a,
                "spec/paired_proposed_total": p,
                "spec/paired_completion_total": a + p,
                "spec/paired_verify_total": p,
            },
            accept_histogram=None,
        )
        for lag, a, p in entries
    ]


#: the spread histogram's upper bounds, bucket by bucket (docs/prometheus.md): 1.25 .. 16.75, +Inf
SPREAD_LE = [f"{1 + (b + 1) / 4:g}" for b in range(63)] + ["+Inf"]


def naive_slots(m: BatchMetrics) -> dict[tuple, int]:
    """What one batch adds to each series, read from docs/prometheus.md: steps that accepted
    at least k drafts for k = 1..min(len(H) - 1, 16); paired tokens by how many versions the
    generation's version is behind the batch's newest (4 or more: "4+", null: "unknown");
    (revision 5) paired sums by draft lag (8 or more: "8+", null or no breakdown:
    "unknown") and the spread's bucket counts, each under its le."""
    out: dict[tuple, int] = {}
    h = m.accept_histogram or []
    out[("position_verify_steps", None)] = sum(h)
    for k in range(1, min(len(h) - 1, 16) + 1):
        out[("position_accepted_steps", str(k))] = sum(n for accepted, n in enumerate(h) if accepted >= k)
    named = sorted((e.weight_version for e in m.by_weight_version or () if e.weight_version), key=lambda v: -int(v[1:]))
    for e in m.by_weight_version or [
        WeightVersionMetrics(weight_version=None, metrics=m.metrics, accept_histogram=None)
    ]:
        age = "unknown" if e.weight_version is None else str(min(named.index(e.weight_version), 4))
        age = "4+" if age == "4" else age
        for stem, key in (("accepted", "spec/paired_accepted_total"), ("proposed", "spec/paired_proposed_total")):
            slot = (f"version_age_paired_{stem}_tokens", age)
            out[slot] = out.get(slot, 0) + e.metrics[key]
    whole = DraftLagMetrics(draft_lag=None, metrics=m.metrics, accept_histogram=None)
    for e in m.by_draft_lag or [whole]:
        lag = "unknown" if e.draft_lag is None else "8+" if e.draft_lag >= 8 else str(e.draft_lag)
        for stem in ("accepted_tokens", "proposed_tokens", "completion_tokens", "verify_steps"):
            slot = (f"draft_lag_paired_{stem}", lag)
            out[slot] = out.get(slot, 0) + e.metrics[f"spec/paired_{stem.split('_')[0]}_total"]
    for le, n in zip(SPREAD_LE, m.tokens_per_verify_distribution or (), strict=False):
        out[("generation_tokens_per_verify", le)] = n
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 3),
            st.integers(0, 50),
            st.integers(0, 50),
            st.sampled_from(["r1", "r2", None]),
            st.lists(st.integers(0, 5), max_size=20),
            st.lists(
                st.tuples(st.sampled_from(VERSION_NAMES), st.integers(0, 9), st.integers(0, 9)),
                max_size=6,
                unique_by=lambda t: t[0],
            ),
            st.one_of(
                st.none(),
                st.lists(
                    st.tuples(st.sampled_from([0, 1, 7, 8, 30, None]), st.integers(0, 9), st.integers(0, 9)),
                    min_size=1,
                    max_size=5,
                    unique_by=lambda t: t[0],
                ),
            ),
            st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=64, max_size=64)),
        ),
        max_size=40,
    ),
    st.integers(1, 3),
)
def test_net_counters_equal_the_sum_over_the_latest_revisions(publications, workers):
    """Whatever the order, repeats, decreases and the worker each batch lands on, the
    fleet's total - retracted is the sum over each batch's latest revision: the plain
    counters, acceptance by draft position, paired tokens by version age and by draft
    lag, and the spread's buckets alike."""
    fleet = [PublishedTotals() for _ in range(workers)]
    latest: dict[tuple, BatchMetrics] = {}
    for n, (b, revision, accepted, proposed, run_id, histogram, split, lag_split, spread) in enumerate(publications):
        entries = versions(*((v, a, p, None) for v, a, p in split)) if split else None
        if entries:  # a breakdown adds up to the batch
            accepted, proposed = sum(a for _, a, _ in split), sum(p for _, _, p in split)
        m = batch(
            f"b{b}",
            revision,
            run_id=run_id,
            accepted=accepted,
            proposed=proposed,
            histogram=histogram,
            by_weight_version=entries,
            by_draft_lag=lags(*lag_split) if lag_split else None,
            distribution=spread,
        )
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
    got: dict[tuple, int] = {}
    for w in fleet:
        for labels in w.totals:
            for slot, value in slot_net(w, labels).items():
                if slot[0] not in STEMS:
                    got[slot] = got.get(slot, 0) + value
    want: dict[tuple, int] = {}
    for m in latest.values():
        for slot, value in naive_slots(m).items():
            want[slot] = want.get(slot, 0) + value
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}
    assert all(int(slot[1]) <= MAX_EXPORTED_POSITION for slot in got if slot[0] == "position_accepted_steps")


def _shell(published: PublishedTotals) -> SimpleNamespace:
    return SimpleNamespace(
        counters=WorkerCounters(),
        processors={
            0: SimpleNamespace(open_generations=5, checkpoint=41),
            3: SimpleNamespace(open_generations=0, checkpoint=-1),
        },
        last_event_at={0: 124.0},
        started_at=123.0,
        input_offsets_missing=0,
        published=published,
    )


def _families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _values(families: dict, name: str, *labels: str) -> dict:
    samples = families[name].samples
    return {tuple(s.labels[label] for label in labels): s.value for s in samples if not s.name.endswith("_created")}


def test_exposition_has_counters_the_newest_batch_by_version_age_and_standard_collectors():
    totals = PublishedTotals(latest_label_sets=2)
    split = versions(("v1", 1, 2, [1, 1]), (None, 2, 2, [0, 2, 1]))
    totals.observe(batch("b1", accepted=3, proposed=4, by_weight_version=split, closed_at=1.0), 1.0)
    totals.observe(batch("b2", accepted=5, proposed=6, closed_at=2.0), 2.0)
    totals.observe(batch("b3", accepted=7, proposed=8, run_id=None, closed_at=3.0), 3.0)
    shell = _shell(totals)
    body = render(shell)
    families = _families(body)
    accepted = _values(families, "specmeter_paired_accepted_tokens", "algorithm", "run_id")
    assert accepted == {("EAGLE3", "run-a"): 8.0, ("EAGLE3", ""): 7.0}
    # one newest batch per (run_id, algorithm): b2 replaced b1; no batch label anywhere
    assert _values(families, "specmeter_batch_accept_rate_ratio", "run_id", "algorithm") == {
        ("run-a", "EAGLE3"): 5 / 6,
        ("", "EAGLE3"): 7 / 8,
    }
    assert _values(families, "specmeter_batch_closed_timestamp_seconds", "run_id") == {("run-a",): 2.0, ("",): 3.0}
    assert not any("batch_id" in s.labels or "weight_version" in s.labels for f in families.values() for s in f.samples)
    assert not families["specmeter_weight_version_accept_rate_ratio"].samples, "b2 and b3 have no breakdown"
    assert _values(families, "specmeter_batch_position_accept_rate_ratio", "run_id", "position") == {
        ("run-a", "1"): 5 / 6,
        ("run-a", "2"): 3 / 6,
        ("", "1"): 5 / 6,
        ("", "2"): 3 / 6,
    }
    assert _values(families, "specmeter_partition_applied_offset", "partition") == {("0",): 41.0, ("3",): -1.0}
    assert _values(families, "specmeter_partition_last_event_timestamp_seconds", "partition") == {
        ("0",): 124.0,
        ("3",): 123.0,
    }
    assert any(name.startswith("process_") for name in families), "process collector"
    assert any(name.startswith("python_") for name in families), "platform / gc collectors"
    exported = set(EXPORTED_METRICS)
    for sample in (s for f in families.values() for s in f.samples if s.name.startswith("specmeter_")):
        assert sample.name in exported or any(
            sample.name.endswith(x) and sample.name[: -len(x)] in exported
            for x in ("_bucket", "_count", "_sum", "_info")
        ), f"{sample.name} is exported but not listed in EXPORTED_METRICS"

    totals = PublishedTotals()
    totals.observe(batch("b1", accepted=3, proposed=4, by_weight_version=split), 1.0)
    families = _families(render(_shell(totals)))
    assert _values(families, "specmeter_weight_version_accept_rate_ratio", "version_age") == {
        ("0",): 0.5,
        ("unknown",): 1.0,
    }
    assert _values(families, "specmeter_weight_version_position_accept_rate_ratio", "version_age", "position") == {
        ("0", "1"): 0.5,
        ("unknown", "1"): 1.0,
        ("unknown", "2"): 1 / 3,
    }
    assert families["specmeter_partition_last_event_timestamp_seconds"].type == "gauge"

    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_closes_per_partition_are_named_as_batch_partitions():
    """Issue 33: a batch closes once on each records partition, and the counter of those
    closes was named specmeter_batches_closed_total, as if it counted batches."""
    shell = _shell(PublishedTotals())
    shell.counters.batch_partitions_closed.update({"markers": 8, "timeout": 1})
    families = _families(render(shell))
    assert _values(families, "specmeter_batch_partitions_closed", "reason") == {("markers",): 8.0, ("timeout",): 1.0}
    assert "specmeter_batches_closed" not in families
    assert "batch" in families["specmeter_batch_partitions_closed"].documentation


def test_a_late_revision_of_an_older_batch_does_not_replace_the_newest():
    totals = PublishedTotals()
    totals.observe(batch("step-1", 0, accepted=1, closed_at=10.0), 1.0)
    totals.observe(batch("step-2", 0, accepted=2, closed_at=20.0), 2.0)
    totals.observe(batch("step-1", 1, accepted=3, closed_at=10.0), 3.0)  # late records for step-1
    assert [(m.batch_id, m.revision) for m in totals.latest.values()] == [("step-2", 0)]
    totals.observe(batch("step-2", 1, accepted=4, closed_at=20.0), 4.0)
    assert [(m.batch_id, m.revision) for m in totals.latest.values()] == [("step-2", 1)]
    totals.observe(batch("step-2", 2, algorithm="NGRAM", closed_at=20.0), 5.0)  # it moves label set
    assert list(totals.latest) == [("NGRAM", "run-a")]


def test_positions_past_16_and_ages_past_3_are_folded_or_dropped_exactly():
    """A 20-bin histogram exports positions 1..16 (each exact) and acceptance-length bins
    0..15 plus 16 = "16 or more"; six versions give ages 0, 1, 2, 3 and one 4+ whose gauges
    come from the two oldest versions' summed counts."""
    histogram = [1] * 20
    split = versions(
        ("v7", 1, 2, [1, 0]),
        ("v6", 2, 2, [0, 1]),
        ("v12", 3, 4, None),
        ("v10", 1, 4, None),
        ("v9", 1, 1, None),
        ("v11", 5, 5, [1, 1, 1]),
    )
    totals = PublishedTotals()
    totals.observe(batch("b1", histogram=histogram, by_weight_version=split, accepted=13, proposed=18), 1.0)
    net = slot_net(totals)
    assert net[("position_verify_steps", None)] == 20
    assert {k: v for (stem, k), v in net.items() if stem == "position_accepted_steps"} == {
        str(k): 20 - k for k in range(1, 17)
    }
    accepted = {k: v for (stem, k), v in net.items() if stem == "version_age_paired_accepted_tokens"}
    assert accepted == {"0": 3, "1": 5, "2": 1, "3": 1, "4+": 3}
    shell = _shell(totals)
    render(shell)
    families = _families(render(shell))
    bins = _values(families, "specmeter_batch_acceptance_length_steps", "accepted")
    assert bins == {**{(str(i),): 1.0 for i in range(16)}, ("16",): 4.0}
    positions = _values(families, "specmeter_batch_position_accept_rate_ratio", "position")
    assert positions == {(str(k),): (20 - k) / 20 for k in range(1, 17)}
    rates = _values(families, "specmeter_weight_version_accept_rate_ratio", "version_age")
    assert rates == {("0",): 3 / 4, ("1",): 1.0, ("2",): 1 / 4, ("3",): 1.0, ("4+",): 3 / 4}
    oldest = _values(families, "specmeter_weight_version_position_accept_rate_ratio", "version_age", "position")
    assert oldest[("4+", "1")] == 1 / 2, "v6 and v7's histograms summed: [1, 1]"
    assert _values(families, "specmeter_weight_version_generations", "version_age")[("4+",)] == 4
    counters = _values(families, "specmeter_position_accepted_steps", "position")
    assert counters == {(str(k),): 20.0 - k for k in range(1, 17)}
    assert "position" in families["specmeter_position_accepted_steps"].documentation or "16" in (
        families["specmeter_position_accepted_steps"].documentation
    )


def test_a_version_named_unknown_is_an_age_like_any_other():
    totals = PublishedTotals()
    split = versions(("unknown", 1, 2, None), (None, 2, 2, None))
    totals.observe(batch("b1", by_weight_version=split, accepted=3, proposed=4), 1.0)
    families = _families(render(_shell(totals)))
    assert _values(families, "specmeter_weight_version_accept_rate_ratio", "version_age") == {
        ("0",): 0.5,
        ("unknown",): 1.0,
    }


def _series(body: bytes) -> set[tuple]:
    """Every specmeter series of one scrape, as (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if s.name.startswith("specmeter_")
    }


def test_the_series_do_not_grow_with_the_batches_published():
    """Issue #24: every training step used to make new series (a batch_id label on the
    latest-batch gauges, a weight_version label on their breakdown). A run of 200 steps,
    each with new policy versions, now exports the same series after step 200 as after
    step 3."""
    totals = PublishedTotals()
    shell = _shell(totals)
    seen: list[set[tuple]] = []
    for step in range(200):
        split = versions(
            (f"v{step + 10}", 3, 4, [1, 2, 3]), (f"v{step + 9}", 2, 4, [2, 1, 1]), (f"v{step + 5}", 1, 4, [1, 1])
        )
        m = batch(f"step-{step}", accepted=6, proposed=12, by_weight_version=split, closed_at=float(step))
        totals.observe(m, float(step))
        if step in (2, 199):
            seen.append(_series(render(shell)))
    assert seen[0] == seen[1]
    assert len(seen[1]) < 300, len(seen[1])


def test_every_scrape_shows_the_totals_as_they_are_the_first_one_too():
    """Issue 33: the first scrape showed every new series at 0 and the second its total,
    so a curl while debugging saw zeros and took the zero Prometheus was meant to see."""
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
    assert scrapes == [[3.0], [7.0]]

    def specmeter(body: bytes) -> dict:
        return {name: f for name, f in _families(body).items() if name.startswith("specmeter_")}

    assert specmeter(render(shell)) == specmeter(render(shell)), "a scrape changes nothing"
    totals.observe(batch("b3", accepted=5, run_id="run-b"), 3.0)
    families = _families(render(shell))
    by_run = {
        s.labels["run_id"]: s.value
        for s in families["specmeter_paired_accepted_tokens"].samples
        if s.name.endswith("_total")
    }
    assert by_run == {"run-a": 7.0, "run-b": 5.0}


def test_a_new_position_or_version_age_shows_its_total_from_its_first_scrape_too():
    """The same for a series that appears later in a label set's life: a longer histogram
    (a new draft position) or an older version age."""
    totals = PublishedTotals()
    totals.observe(batch("b1", histogram=[1, 1, 1]), 1.0)
    shell = _shell(totals)
    families = _families(render(shell))
    assert _values(families, "specmeter_position_accepted_steps", "position") == {("1",): 2.0, ("2",): 1.0}
    totals.observe(batch("b2", histogram=[0, 0, 0, 2], by_weight_version=versions(("v1", 3, 4, None))), 2.0)
    families = _families(render(shell))
    assert _values(families, "specmeter_position_accepted_steps", "position") == {
        ("1",): 4.0,
        ("2",): 3.0,
        ("3",): 2.0,  # born now, with its total
    }
    ages = _values(families, "specmeter_version_age_paired_accepted_tokens", "version_age")
    assert ages == {("unknown",): 3.0, ("0",): 3.0}


# -- per-task counters and the inconsistent-generation counter (issue 31) ---------------------
TASK_KEYS = [key for _, key, _ in TASK_COUNTERS]
TASK_STEMS = [stem for stem, _, _ in TASK_COUNTERS]


def tasks(*entries: tuple[str | None, int, int, int, int]) -> list[TaskMetrics]:
    """by_task entries from (task, paired accepted, proposed, completion, verify)."""
    return [
        TaskMetrics(task=t, metrics=dict(zip(TASK_KEYS, values, strict=True)), accept_histogram=None)
        for t, *values in entries
    ]


def with_tasks(batch_id: str, revision: int = 0, *entries: tuple, **kwargs) -> BatchMetrics:
    """A batch whose totals are those of its by_task entries."""
    split = tasks(*entries)
    acc, prop, comp, ver = (sum(e[i] for e in entries) for i in range(1, 5))
    return batch(
        batch_id, revision, accepted=acc, proposed=prop, completion=comp, verify=ver, by_task=split or None, **kwargs
    )


def task_net(totals: PublishedTotals, labels=("EAGLE3", "run-a")) -> dict[str, tuple[int, ...]]:
    """total - retracted of every task label of one label set, per TASK_COUNTERS family."""
    t = totals.totals[labels]
    return {
        task: tuple(a - r for a, r in zip(t.task_added[task], t.task_retracted[task], strict=True))
        for task in t.task_added
    }


def test_task_counters_add_up_over_revisions_and_name_the_unknown_task():
    totals = PublishedTotals()
    totals.observe(with_tasks("b1", 0, ("gsm8k", 3, 4, 10, 5), (None, 1, 2, 3, 1)), 1.0)
    totals.observe(with_tasks("b2", 0, ("chat", 2, 2, 4, 2), ("gsm8k", 1, 1, 2, 1)), 2.0)
    # late records: gsm8k of b1 loses a key to a conflict, chat appears in b1
    totals.observe(with_tasks("b1", 1, ("chat", 5, 5, 6, 1), ("gsm8k", 1, 2, 4, 2), (None, 1, 2, 3, 1)), 3.0)
    totals.observe(batch("b3", accepted=7, proposed=8, completion=9, verify=3), 4.0)  # no breakdown
    assert task_net(totals) == {
        "gsm8k": (1 + 1, 2 + 1, 4 + 2, 2 + 1),
        "chat": (2 + 5, 2 + 5, 4 + 6, 2 + 1),
        UNKNOWN_TASK: (1 + 7, 2 + 8, 3 + 9, 1 + 3),
    }
    t = totals.totals[("EAGLE3", "run-a")]
    assert t.task_retracted["gsm8k"] == [2, 2, 6, 3], "what b1's revision took back from gsm8k"
    # the tasks add up to the batches' paired totals
    for i, stem in enumerate(("paired_accepted_tokens", "paired_proposed_tokens")):
        assert sum(v[i] for v in task_net(totals).values()) == net(totals, stem)


def test_tasks_past_the_bound_are_summed_under_other_and_keep_their_label_across_revisions():
    totals = PublishedTotals(max_tasks=2)
    totals.observe(with_tasks("b1", 0, ("a", 1, 1, 1, 1), ("b", 2, 2, 2, 2), ("c", 3, 3, 3, 3)), 1.0)
    totals.observe(with_tasks("b2", 0, ("d", 4, 4, 4, 4), (UNKNOWN_TASK, 5, 5, 5, 5), (None, 6, 6, 6, 6)), 2.0)
    assert task_net(totals) == {
        "a": (1,) * 4,
        "b": (2,) * 4,
        OTHER_TASKS: (3 + 4 + 5,) * 4,  # c and d past the bound; a task named "(unknown)" is not the unknown one
        UNKNOWN_TASK: (6,) * 4,
    }
    # a revision of b1 that drops c: it is taken back from "(other)", where it was counted
    totals.observe(with_tasks("b1", 1, ("a", 1, 1, 1, 1), ("b", 2, 2, 2, 2)), 3.0)
    assert task_net(totals)[OTHER_TASKS] == (9,) * 4
    assert totals.totals[("EAGLE3", "run-a")].task_retracted[OTHER_TASKS] == [3] * 4
    # another run has its own tasks
    totals.observe(with_tasks("b1", 0, ("x", 1, 1, 1, 1), ("y", 1, 1, 1, 1), run_id="run-b"), 4.0)
    assert set(task_net(totals, ("EAGLE3", "run-b"))) == {"x", "y"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 3),
            st.sampled_from(["r1", None]),
            st.integers(0, 5),
            st.one_of(
                st.none(),
                st.lists(
                    st.tuples(
                        st.sampled_from(["a", "b", "c", None, UNKNOWN_TASK]), *(st.integers(0, 9) for _ in TASK_KEYS)
                    ),
                    max_size=5,
                    unique_by=lambda t: t[0],
                ),
            ),
        ),
        max_size=40,
    ),
    st.integers(1, 3),
    st.integers(0, 4),
)
def test_task_counters_equal_the_sum_over_the_latest_revisions(publications, workers, max_tasks):
    """Whatever the order, revisions and owners: summed over its labels, each task family's
    total - retracted is the sum over each batch's latest revision of its by_task entries (the
    whole batch when it has none); a label set names at most max_tasks tasks; and when the
    bound holds every task, each task's counters are exactly its own."""
    fleet = [PublishedTotals(max_tasks=max_tasks) for _ in range(workers)]
    latest: dict[tuple, BatchMetrics] = {}
    for n, (b, revision, run_id, inconsistent, split) in enumerate(publications):
        m = with_tasks(f"b{b}", revision, *(split or ()), run_id=run_id, inconsistent=inconsistent)
        fleet[hash((b, run_id)) % workers].observe(m, float(n))
        key = (run_id, m.batch_id)
        if key not in latest or revision > latest[key].revision:
            latest[key] = m
    want: dict[str, list[int]] = defaultdict(lambda: [0] * len(TASK_KEYS))
    for m in latest.values():
        for entry in m.by_task or [TaskMetrics(task=None, metrics=m.metrics, accept_histogram=None)]:
            name = {None: UNKNOWN_TASK, UNKNOWN_TASK: OTHER_TASKS}.get(entry.task, entry.task)
            for i, key in enumerate(TASK_KEYS):
                want[name][i] += entry.metrics[key]
    got: dict[str, list[int]] = defaultdict(lambda: [0] * len(TASK_KEYS))
    for w in fleet:
        for labels, t in w.totals.items():
            assert sum(task not in (UNKNOWN_TASK, OTHER_TASKS) for task in t.task_added) <= max_tasks
            for task, values in task_net(w, labels).items():
                got[task] = [g + v for g, v in zip(got[task], values, strict=True)]
    for i in range(len(TASK_KEYS)):
        assert sum(v[i] for v in got.values()) == sum(v[i] for v in want.values())
    if max_tasks >= 3:
        assert {k: v for k, v in got.items() if any(v)} == {k: v for k, v in want.items() if any(v)}
    i = STEMS.index("inconsistent_generations")
    assert sum(t.added[i] - t.retracted[i] for w in fleet for t in w.totals.values()) == sum(
        m.metrics["spec/inconsistent_generation_count"] for m in latest.values()
    )


def test_task_series_are_exported_bounded_and_with_their_totals_from_their_first_scrape():
    """A run of 200 steps, each with new task names, exports the same series after step 200
    as after step 3: two named tasks (the bound), "(other)" and "(unknown)"; a task label
    shows its total from its first scrape on, as every series (issue 33)."""
    totals = PublishedTotals(max_tasks=2)
    shell = _shell(totals)
    totals.observe(with_tasks("step-0", 0, ("t0", 3, 4, 5, 2)), 0.0)
    families = _families(render(shell))
    assert _values(families, "specmeter_task_paired_accepted_tokens", "task") == {("t0",): 3.0}
    families = _families(render(shell))
    assert _values(families, "specmeter_task_paired_accepted_tokens", "task") == {("t0",): 3.0}
    assert _values(families, "specmeter_task_paired_verify_steps", "algorithm", "run_id", "task") == {
        ("EAGLE3", "run-a", "t0"): 2.0
    }
    seen = []
    for step in range(1, 200):
        totals.observe(with_tasks(f"step-{step}", 0, (f"t{step}", 1, 2, 3, 1), (None, 1, 1, 1, 1)), float(step))
        if step in (3, 199):
            seen.append(_series(render(shell)))
    assert seen[0] == seen[1]
    families = _families(render(shell))
    assert _values(families, "specmeter_task_paired_accepted_tokens", "task") == {
        ("t0",): 3.0,
        ("t1",): 1.0,
        (OTHER_TASKS,): 198.0,  # t2 .. t199
        (UNKNOWN_TASK,): 199.0,
    }
    retracted = _values(families, "specmeter_task_paired_accepted_tokens_retracted", "task")
    assert set(retracted) == {("t0",), ("t1",), (OTHER_TASKS,), (UNKNOWN_TASK,)}


def test_the_inconsistent_generation_counter_is_exported():
    totals = PublishedTotals()
    totals.observe(batch("b1", inconsistent=2), 1.0)
    totals.observe(batch("b1", 1, inconsistent=1), 2.0)  # a late record made one key conflicting
    totals.observe(batch("b2", inconsistent=4), 3.0)
    shell = _shell(totals)
    render(shell)
    families = _families(render(shell))
    assert _values(families, "specmeter_inconsistent_generations", "run_id") == {("run-a",): 6.0}
    assert _values(families, "specmeter_inconsistent_generations_retracted", "run_id") == {("run-a",): 1.0}


def test_the_staleness_curve_and_the_spread_are_exported_with_bounded_labels():
    """Revision 5: paired sums by draft lag under a fixed label set (0..7, 8+, unknown:
    the lags a fleet reports never grow it; a batch without a breakdown counts under
    unknown), and the spread of tokens per verify step as a histogram whose cumulative
    buckets are the quarter-token counts, net of a later revision's retraction in the
    twin; the exposition passes promtool."""
    totals = PublishedTotals()
    spread = [0] * 64
    spread[1], spread[6], spread[63] = 2, 1, 1  # 1.25-1.5 twice, 2.5-2.75 once, 16.75 and up once
    split = lags((0, 8, 10), (3, 4, 10), (9, 1, 10), (40, 1, 10), (None, 2, 10))
    totals.observe(batch("b1", accepted=16, proposed=50, by_draft_lag=split, distribution=spread), 1.0)
    totals.observe(batch("b2", accepted=5, proposed=6), 2.0)  # no breakdown, no spread
    less = list(spread)
    less[63] = 0  # a late conflict took that generation out
    totals.observe(batch("b1", 1, accepted=15, proposed=40, by_draft_lag=split[:4], distribution=less), 3.0)
    body = render(_shell(totals))
    families = _families(body)
    accepted = _values(families, "specmeter_draft_lag_paired_accepted_tokens", "draft_lag")
    assert accepted == {("0",): 8.0, ("3",): 4.0, ("8+",): 2.0, ("unknown",): 2.0 + 5.0}
    assert _values(families, "specmeter_draft_lag_paired_accepted_tokens_retracted", "draft_lag") == {
        ("0",): 0.0,
        ("3",): 0.0,
        ("8+",): 0.0,
        ("unknown",): 2.0,
    }
    assert set(_values(families, "specmeter_draft_lag_paired_verify_steps", "draft_lag")) <= {
        (lag,) for lag in ("0", "1", "2", "3", "4", "5", "6", "7", "8+", "unknown")
    }
    buckets = _values(families, "specmeter_generation_tokens_per_verify", "le")
    assert [buckets[(le,)] for le in ("1.25", "1.5", "2.5", "2.75", "16.75", "+Inf")] == [0, 2, 2, 3, 3, 4]
    assert len(buckets) == 64
    retracted = _values(families, "specmeter_generation_tokens_per_verify_retracted", "le")
    assert retracted[("16.75",)] == 0 and retracted[("+Inf",)] == 1
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
