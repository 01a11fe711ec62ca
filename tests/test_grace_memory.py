"""Closed batches wait out their grace compacted (issue #16).

A minute of closed batches at 18k records/s held ~450k generations at ~1 KB each
in the Python core (dicts, sets and tuples: 96 % of the fleet's records carry a
histogram), and the garbage collector's full collections walked all of it. The
worker now compacts a batch once it is closed (the Python core pickles its state,
the native one gives back its arenas' spare capacity); a late record applies exactly
as before, on either core.
"""

from __future__ import annotations

import gc
import tracemalloc

import msgspec

from specmeter.schemas import RecordBatch, encode_records_message
from specmeter.streams.core.stage1 import PartitionProcessor
from specmeter.streams.core.state import BatchState as PythonBatchState
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet
from specmeter.streams.worker.app import _compact_closed


def _fleet_messages(batches: int = 2, sessions: int = 30) -> list[bytes]:
    """One partition's input: each batch's records packed 50 a message, then its markers."""
    spec = FleetSpec(
        batches=batches,
        sessions_per_batch=sessions,
        producers=2,
        max_samples_per_session=4,
        max_turns=8,
        invalid_rate=0.0,
        seed=16,
    )
    out, pending = [], []
    for event in synthetic_fleet(spec):
        if event.kind == "marker":
            if pending:
                out.append(encode_records_message(RecordBatch(records=pending)))
                pending = []
            out.append(encode_records_message(event.payload))
        else:
            pending.append(event.payload)
            if len(pending) == 50:
                out.append(encode_records_message(RecordBatch(records=pending)))
                pending = []
    return out


def _processor(core) -> PartitionProcessor:
    return PartitionProcessor(0, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, core=core)


def test_a_late_record_after_compaction_gives_the_same_revision_and_changelog(core):
    messages = _fleet_messages()
    plain, compacted = _processor(core), _processor(core)
    for p in (plain, compacted):
        p.process(list(enumerate(messages)), 1_000)
    assert all(b.closed for b in compacted.batches.values()) and len(compacted.batches) == 2
    largest = max(b.state.generation_count for b in compacted.batches.values())
    assert _compact_closed([compacted], 2_000, min_generations=largest + 1) == 0  # too small to be worth it
    assert _compact_closed([compacted], 1_500, min_generations=0) == 0  # closed less than a second ago: not yet
    assert _compact_closed([compacted], 2_000, budget_s=0.0, min_generations=0) == 1  # one at a time out of budget
    assert _compact_closed([compacted], 2_000, min_generations=0) == 1
    assert all(b.state.compacted for b in compacted.batches.values())
    assert compacted.open_generations == plain.open_generations
    # late input within grace: a redelivery, a new occurrence and a conflict of batch 0
    first = msgspec.msgpack.decode(messages[0], type=RecordBatch).records
    late = [
        first[0],
        msgspec.structs.replace(first[1], sample_id="late-sample"),
        msgspec.structs.replace(first[2], accepted=(first[2].accepted or 0) + 7),
    ]
    message = [(len(messages), encode_records_message(RecordBatch(records=late)))]
    effects = [p.process(message, 2_000) for p in (plain, compacted)]
    assert effects[0].changelog == effects[1].changelog
    assert [msgspec.to_builtins(x) for x in effects[0].partials] == [
        msgspec.to_builtins(x) for x in effects[1].partials
    ]
    assert len(effects[1].partials) == 1 and effects[1].partials[0].revision == 1
    assert compacted.open_generations == plain.open_generations
    touched = [b for (_, batch_id), b in compacted.batches.items() if batch_id == first[0].batch_id]
    assert len(touched) == 1 and not touched[0].state.compacted  # the late record thawed it


def test_a_compacted_python_state_holds_a_fraction_of_the_memory():
    records = []
    for event in synthetic_fleet(
        FleetSpec(
            batches=1,
            sessions_per_batch=200,
            producers=1,
            max_samples_per_session=8,
            max_turns=24,
            invalid_rate=0.0,
            seed=3,
        )
    ):
        if event.kind == "record":
            records.append(event.payload)
    gc.collect()
    tracemalloc.start()
    state = PythonBatchState("b")
    state.start_journal()
    state.add_many(records)
    state.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    del records
    gc.collect()
    live, _ = tracemalloc.get_traced_memory()
    state.compact()
    gc.collect()
    compact, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert state.generation_count > 5_000
    assert compact < live / 3, (live / state.generation_count, compact / state.generation_count)


def test_the_worker_times_every_garbage_collection():
    """Collector pauses stop the event loop (a marker waits meanwhile): the worker
    counts them per generation, longest included, on /specmeter/stats."""
    from specmeter.streams.core.counts import WorkerCounters
    from specmeter.streams.worker.run import _gc_timer

    counters = WorkerCounters()
    timer = _gc_timer(counters)
    gc.callbacks.append(timer)
    try:
        gc.collect(0)
        gc.collect()
    finally:
        gc.callbacks.remove(timer)
    assert counters.gc_collections[0] >= 1 and counters.gc_collections[2] >= 1
    assert counters.gc_max_seconds[2] > 0 and counters.gc_seconds[2] >= counters.gc_max_seconds[2]
    assert counters.as_dict()["gc_collections"] == counters.gc_collections
