"""Invariants of the core on random batches (hypothesis), on each core (the Python
reference and the native one: the ``core`` fixture).

The result must not change under reordering, under redelivery of any subset,
or when records are split by session into k partitions and the partials merged;
and it must equal a naive reading of the metric definitions (tests/support/reference.py),
by_weight_version, by_task, by_draft_lag, accept_rate_by_position and
tokens_per_verify_by_budget (batch and per entry), the inconsistent count and the spread
of tokens per verify step included: the entries of each breakdown add up to the batch.
Records carry tasks and draft lags, and histograms that agree with their counters or
deliberately contradict them.
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import GenerationRecord
from specmeter.streams import batch_metrics_dict, build_batch_metrics, merge_partials

from .support.golden_cases import (
    assert_by_draft_lag_equal,
    assert_by_task_equal,
    assert_by_weight_version_equal,
    assert_metrics_equal,
    assert_positions_equal,
)
from .support.reference import (
    reference_accept_rate_by_position,
    reference_by_draft_lag,
    reference_by_task,
    reference_by_weight_version,
    reference_histogram,
    reference_metrics,
    reference_tokens_per_verify_by_budget,
    reference_tokens_per_verify_distribution,
)

# small values collide often (redeliveries, conflicts); the edges of the native core's
# packed delta form (20-bit counters, 24-bit completion) and beyond force the wide form
small_counter = st.one_of(
    st.none(), st.integers(0, 6), st.sampled_from([2**20 - 2, 2**20 - 1, 2**24 - 2, 2**24 - 1, 2**32 - 1])
)
record_dicts = st.fixed_dictionaries(
    {
        "batch_id": st.just("b"),
        "session_id": st.sampled_from(["s1", "s2", "s3", "s4"]),
        "generation_id": st.sampled_from(["g1", "g2", "g3", "g4", "g5"]),
        "sample_id": st.one_of(st.none(), st.sampled_from(["t1", "t2", "t3"])),
        "state_hash": st.one_of(st.none(), st.just("h1")),
        "accepted": small_counter,
        "proposed": small_counter,
        "verify": small_counter,
        "completion": small_counter,
        # up to five bins: four draft positions (accept_rate_by_position, docs/contract.md §3.3)
        "accept_histogram": st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=1, max_size=5)),
        "producer_id": st.sampled_from(["p0", "p1"]),
        "weight_version": st.one_of(st.none(), st.sampled_from(["v1", "v2", "v10"])),
        "task": st.one_of(st.none(), st.sampled_from(["gsm8k", "chat", "swe-bench"])),
        # (revision 5) 2 before 10 numerically, not as strings; the largest lag the wire takes
        "draft_lag": st.one_of(st.none(), st.sampled_from([0, 1, 2, 10, 2**32 - 1])),
    }
)


def _shaped(record: dict[str, Any], shape: str) -> dict[str, Any]:
    """A record whose histogram agrees with its counters (SPEC §3.5: verify = sum(H),
    accepted = sum(i * H[i])), or contradicts one of them by one step or one draft;
    "as-is" keeps the random counters (mostly contradicting, or unknown)."""
    histogram = record["accept_histogram"]
    if histogram is None or shape == "as-is":
        return record
    steps, drafts = sum(histogram), sum(i * count for i, count in enumerate(histogram))
    out = dict(record, verify=steps, accepted=drafts)
    if shape == "verify off":
        out["verify"] = steps + 1
    elif shape == "accepted off":
        out["accepted"] = drafts + 1
    return out


record_dicts = st.builds(_shaped, record_dicts, st.sampled_from(["as-is", "consistent", "verify off", "accepted off"]))
batches = st.lists(record_dicts, min_size=0, max_size=30)
algorithms = st.one_of(st.none(), st.just("EAGLE"))


def _records(dicts):
    return [GenerationRecord(**d) for d in dicts]


class Result(NamedTuple):
    """What the edge publishes of a batch, as builtins (compared whole)."""

    metrics: dict
    histogram: list[int] | None
    versions: list | None
    positions: list[float] | None
    tasks: list | None
    budget: list[float] | None
    lags: list | None
    distribution: list[int] | None


def _metrics(core, records, algorithm=None, invalid=0, partitions=1) -> Result:
    states = {}
    for r in records:
        p = zlib.crc32(r.session_id.encode()) % partitions
        states.setdefault(p, core.BatchState("b")).add(r)
    states.setdefault(0, core.BatchState("b"))
    for _ in range(invalid):
        states[0].add_invalid("p0")
    if algorithm:
        states[0].add_algorithm(algorithm)
    partials = [s.partial(partition=p) for p, s in states.items()]
    merged = merge_partials(partials)
    # the message as the edge builds it: the curves are derived there, once
    out = build_batch_metrics(
        partials, revision=0, close_reason="markers", closed_at=0.0, partitions_expected=len(partials)
    )
    assert out.metrics == batch_metrics_dict(merged) and out.accept_histogram == (
        merged.accept_histogram if out.speculative else None
    )
    return Result(
        out.metrics,
        out.accept_histogram,
        msgspec.to_builtins(out.by_weight_version),
        out.accept_rate_by_position,
        msgspec.to_builtins(out.by_task),
        out.tokens_per_verify_by_budget,
        msgspec.to_builtins(out.by_draft_lag),
        out.tokens_per_verify_distribution,
    )


def metrics_are_order_independent(core, dicts, permutation, algorithm):
    records = _records(dicts)
    shuffled = [records[i] for i in permutation]
    return _metrics(core, records, algorithm) == _metrics(core, shuffled, algorithm)


@settings(max_examples=300, deadline=None)
@given(batches, st.randoms(use_true_random=False), algorithms)
def test_reordering_changes_nothing(core, dicts, rnd, algorithm):
    permutation = list(range(len(dicts)))
    rnd.shuffle(permutation)
    assert metrics_are_order_independent(core, dicts, permutation, algorithm)


@settings(max_examples=300, deadline=None)
@given(batches, st.data(), algorithms)
def test_redelivering_any_subset_changes_nothing(core, dicts, data, algorithm):
    records = _records(dicts)
    again = data.draw(st.lists(st.sampled_from(records), max_size=20)) if records else []
    position = data.draw(st.integers(0, len(records)))
    redelivered = records[:position] + again + records[position:]
    assert _metrics(core, records, algorithm) == _metrics(core, redelivered, algorithm)


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 5), algorithms, st.integers(0, 2))
def test_split_by_session_and_merged_is_exact(core, dicts, k, algorithm, invalid):
    records = _records(dicts)
    split = _metrics(core, records, algorithm, invalid, partitions=k)
    assert split == _metrics(core, records, algorithm, invalid, partitions=1)


@settings(max_examples=500, deadline=None)
@given(batches, algorithms, st.integers(0, 2), st.integers(1, 4))
def test_core_agrees_with_naive_reading_of_spec(core, dicts, algorithm, invalid, k):
    got = _metrics(core, _records(dicts), algorithm, invalid, partitions=k)
    assert_metrics_equal(got.metrics, reference_metrics(dicts, algorithm, invalid), "random batch")
    # each entry's curves too (the reference's entries carry them)
    assert_by_weight_version_equal(got.versions, reference_by_weight_version(dicts, algorithm), "random batch")
    assert_by_task_equal(got.tasks, reference_by_task(dicts, algorithm), "random batch")
    assert_by_draft_lag_equal(got.lags, reference_by_draft_lag(dicts, algorithm), "random batch")
    assert got.distribution == reference_tokens_per_verify_distribution(dicts, algorithm)
    assert got.histogram == reference_histogram(dicts, algorithm)
    assert_positions_equal(got.positions, reference_accept_rate_by_position(got.histogram), "random batch")
    assert_positions_equal(
        got.budget,
        reference_tokens_per_verify_by_budget(got.histogram),
        "random batch",
        name="tokens_per_verify_by_budget",
    )


TOTALS = (
    "spec/unique_generation_count",
    "spec/accepted_total",
    "spec/proposed_total",
    "spec/verify_total",
    "spec/completion_total",
    "spec/paired_accepted_total",
    "spec/paired_proposed_total",
    "spec/accept_covered_count",
    "spec/paired_completion_total",
    "spec/paired_verify_total",
    "spec/verify_covered_count",
)


def entries_add_up_to_the_batch(metrics, entries, histogram) -> bool:
    """Every total and paired total of a breakdown's entries sums to the batch's over
    G \\ C, and their histograms to the batch's."""
    if entries is None:
        return True
    clean = metrics["spec/unique_generation_count"] - metrics["spec/conflicting_generation_count"]
    for key in TOTALS:
        want = clean if key == "spec/unique_generation_count" else metrics[key]
        if sum(entry["metrics"][key] for entry in entries) != want:
            return False
    summed = [0] * max((len(e["accept_histogram"] or ()) for e in entries), default=0)
    for entry in entries:
        for i, count in enumerate(entry["accept_histogram"] or ()):
            summed[i] += count
    return summed == (histogram or [])


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 4), algorithms)
def test_breakdown_entries_add_up_to_the_batch(core, dicts, k, algorithm):
    got = _metrics(core, _records(dicts), algorithm, partitions=k)
    assert entries_add_up_to_the_batch(got.metrics, got.versions, got.histogram)
    assert entries_add_up_to_the_batch(got.metrics, got.tasks, got.histogram)
    assert entries_add_up_to_the_batch(got.metrics, got.lags, got.histogram)
    if got.distribution is not None:  # §3.7: the covered keys less those with verify 0
        assert len(got.distribution) == 64
        assert sum(got.distribution) <= got.metrics["spec/verify_covered_count"]


@pytest.mark.parametrize("field", ["weight_version", "task", "draft_lag"])
def test_more_than_64_known_keys_give_no_breakdown(core, field):
    dicts = [
        {
            "batch_id": "b",
            "session_id": f"s{i}",
            "generation_id": "g",
            "accepted": 1,
            "proposed": 2,
            field: i if field == "draft_lag" else f"k{i}",
        }
        for i in range(65)
    ]
    entries = {"weight_version": "versions", "task": "tasks", "draft_lag": "lags"}[field]
    for k in (1, 3):  # also when no single partition holds more than 64
        got = _metrics(core, [GenerationRecord(**d) for d in dicts], "EAGLE", partitions=k)
        assert getattr(got, entries) is None and got.metrics["spec/accepted_total"] == 65
    got = _metrics(core, [GenerationRecord(**d) for d in dicts[:64]], "EAGLE", partitions=3)
    assert len(getattr(got, entries)) == 64


@settings(max_examples=100, deadline=None)
@given(batches, st.integers(1, 4))
def test_batch_metrics_envelope_counts_every_delivery(core, dicts, k):
    records = _records(dicts)
    states = {}
    for r in records:
        states.setdefault(zlib.crc32(r.session_id.encode()) % k, core.BatchState("b")).add(r)
    if not states:
        return
    out = build_batch_metrics(
        [s.partial(partition=p) for p, s in states.items()],
        revision=0,
        close_reason="markers",
        closed_at=0.0,
        partitions_expected=len(states),
    )
    assert out.record_count == len(records)
    assert out.partitions_reported == len(states)


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.integers(1, 7), min_size=1, max_size=10), st.booleans())
def test_add_many_equals_add_one_by_one(core, dicts, chunk_sizes, late):
    """The worker's bulk path must be the same function as the reference path."""
    records = _records(dicts)
    one, many = core.BatchState("b"), core.BatchState("b")
    one.start_journal()
    many.start_journal()
    for r in records:
        one.add(r, late=late)
    i = 0
    for size in chunk_sizes * (len(records) + 1):
        if i >= len(records):
            break
        many.add_many(records[i : i + size], late=late)
        i += size
    assert many.partial() == one.partial()
    assert many.record_count == one.record_count and many.late_record_count == one.late_record_count
    assert many.conflicting_record_count == one.conflicting_record_count


@settings(max_examples=200, deadline=None)
@given(batches, st.integers(1, 6))
def test_deltas_replayed_rebuild_the_same_state(core, dicts, chunk):
    """What stage 1 writes to its changelog rebuilds exactly what it had in memory."""
    from specmeter.streams.core.layout import decode_delta, encode_state

    records = _records(dicts)
    live = core.BatchState("b")
    live.start_journal()
    deltas = []
    for i in range(0, len(records), chunk):
        live.add_many(records[i : i + chunk])
        delta = live.take_delta(first_offset=i, last_offset=i + chunk - 1, last_input_ms=0)
        if delta is not None:
            deltas.append(decode_delta(encode_state(delta)))
    rebuilt = core.BatchState("b")
    for delta in deltas:
        rebuilt.apply_delta(delta)
    assert _canonical(rebuilt.partial()) == _canonical(live.partial())


@settings(max_examples=100, deadline=None)
@given(batches, st.integers(1, 6))
def test_deltas_written_before_weight_versions_still_restore(core, dicts, chunk):
    """A changelog from before weight versions (six-item entries, no packed_versioned)
    restores: a worker upgraded mid-run keeps its state."""
    from specmeter.streams.core.layout import decode_delta

    records = [msgspec.structs.replace(r, weight_version=None, task=None, draft_lag=None) for r in _records(dicts)]
    live = core.BatchState("b")
    live.start_journal()
    rebuilt = core.BatchState("b")
    for i in range(0, len(records), chunk):
        live.add_many(records[i : i + chunk])
        delta = live.take_delta(first_offset=i, last_offset=i + chunk - 1, last_input_ms=0)
        if delta is None:
            continue
        old = msgspec.structs.replace(delta, entries=[tuple(e[:9]) for e in delta.entries])
        encoded = msgspec.msgpack.encode(old)
        # the old layout: an array without the fields appended since
        fields = msgspec.msgpack.decode(encoded)[:15]
        rebuilt.apply_delta(decode_delta(msgspec.msgpack.encode(fields)))
    assert _canonical(rebuilt.partial()) == _canonical(live.partial())


@settings(max_examples=100, deadline=None)
@given(batches, batches, st.integers(1, 6))
def test_a_worker_upgraded_to_tasks_restores_what_the_older_one_wrote(core, before, after, chunk):
    """Before tasks, a worker read no task (``before``'s records reach it without one) and
    wrote wide entries of ten items (and, the native core, the packed forms); the
    upgraded worker goes on with ``after``'s records, tasks and all. What both wrote
    restores the state that saw the same: a value without a task is still written in
    ten items (its bytes are what they were), one with a task in eleven."""
    from specmeter.streams.core.layout import decode_delta, encode_state

    older = [msgspec.structs.replace(r, task=None, draft_lag=None) for r in _records(before)]
    live = core.BatchState("b")
    live.start_journal()
    deltas = []
    for records in (older, _records(after)):
        for i in range(0, len(records), chunk):
            live.add_many(records[i : i + chunk])
            delta = live.take_delta(first_offset=len(deltas), last_offset=len(deltas), last_input_ms=0)
            if delta is not None:
                deltas.append(decode_delta(encode_state(delta)))
    for delta in deltas:
        for entry in delta.entries:
            task = entry[10] if len(entry) > 10 else None
            lag = entry[11] if len(entry) > 11 else None
            assert len(entry) == (12 if lag is not None else 11 if task is not None else 10), entry
    rebuilt = core.BatchState("b")
    for delta in deltas:
        rebuilt.apply_delta(delta)
    assert _canonical(rebuilt.partial()) == _canonical(live.partial())


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 6), st.data())
def test_compacting_a_state_anywhere_changes_nothing(core, dicts, chunk, data):
    """A closed batch waits out its grace compacted (issue #16); late records thaw it.
    Compacting between any chunks gives the same deltas (the changelog), the same
    generation count and the same partial as a state never compacted."""
    records = _records(dicts)
    live, compacted = core.BatchState("b"), core.BatchState("b")
    live.start_journal()
    compacted.start_journal()
    for i in range(0, len(records), chunk):
        for state in (live, compacted):
            state.add_many(records[i : i + chunk], late=i > 0)
        deltas = [s.take_delta(first_offset=i, last_offset=i + chunk - 1, last_input_ms=0) for s in (live, compacted)]
        assert msgspec.to_builtins(deltas[0]) == msgspec.to_builtins(deltas[1])
        if data.draw(st.booleans()):
            compacted.compact()
            assert compacted.compacted and compacted.generation_count == live.generation_count
            if data.draw(st.booleans()):  # a closed batch is asked for its partial again (restore)
                assert _canonical(compacted.partial()) == _canonical(live.partial())
                compacted.compact()
    assert compacted.generation_count == live.generation_count
    assert _canonical(compacted.partial()) == _canonical(live.partial())
    assert compacted.record_count == live.record_count and compacted.late_record_count == live.late_record_count


@settings(max_examples=100, deadline=None)
@given(batches, batches, st.integers(1, 6))
def test_a_worker_upgraded_to_draft_lags_restores_what_the_older_one_wrote(core, before, after, chunk):
    """Before revision 5, a worker read no draft lag and wrote wide entries of ten or
    eleven items; the upgraded worker goes on with ``after``'s records, lags and all.
    What both wrote restores the state that saw the same, in either core: a value without
    a lag is still written as before (its bytes are what they were), one with a lag in
    twelve items (its task null when it has none)."""
    from specmeter.streams.core import cores
    from specmeter.streams.core.layout import decode_delta, encode_state

    older = [msgspec.structs.replace(r, draft_lag=None) for r in _records(before)]
    live = core.BatchState("b")
    live.start_journal()
    deltas = []
    for records in (older, _records(after)):
        for i in range(0, len(records), chunk):
            live.add_many(records[i : i + chunk])
            delta = live.take_delta(first_offset=len(deltas), last_offset=len(deltas), last_input_ms=0)
            if delta is not None:
                deltas.append(decode_delta(encode_state(delta)))
    built = [cores.PYTHON] + ([cores.NATIVE] if cores.NATIVE is not None else [])
    for reader in built:
        rebuilt = reader.BatchState("b")
        for delta in deltas:
            rebuilt.apply_delta(delta)
        assert _canonical(rebuilt.partial()) == _canonical(live.partial()), reader.name


def test_compact_waits_for_changes_to_be_taken_as_a_delta():
    """Changes not yet in a delta would be lost to the changelog: the Python core's
    compact() (which pickles the state) leaves the state live."""
    from specmeter.streams.core.state import BatchState

    state = BatchState("b")
    state.start_journal()
    state.add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=1, proposed=2))
    state.compact()
    assert not state.compacted
    assert state.take_delta(first_offset=0, last_offset=0, last_input_ms=0) is not None
    state.compact()
    assert state.compacted and state.generation_count == 1
    state.add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=2, proposed=2))  # a conflict
    assert not state.compacted and state.partial().conflicting_generation_count == 1


def _canonical(partial) -> dict:
    """A partial with its ratio sums as exact rationals: the expansion terms depend on
    the order samples are folded in (live and restored states iterate differently),
    their exact sum does not."""
    import msgspec

    from specmeter.streams.core.exact import exact_sum

    out = msgspec.structs.asdict(partial)
    out["accept_ratio_parts"] = exact_sum(partial.accept_ratio_parts)
    out["length_ratio_parts"] = exact_sum(partial.length_ratio_parts)
    return out
