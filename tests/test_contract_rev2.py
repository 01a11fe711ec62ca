"""Revision 2 of the contract without Kafka: run identity, the wire limits, invalid
markers, and records counted under their publisher (docs/contract.md)."""

from __future__ import annotations

import json

import msgspec
import pytest

from specmeter.schemas import (
    MAX_BINS,
    MAX_COUNTER,
    MAX_ID,
    BatchMarker,
    GenerationRecord,
    RecordBatch,
    decode_json_line,
    decode_records_message,
    encode_partial,
    encode_records_message,
)
from specmeter.streams import OfflineAggregator, build_batch_metrics
from specmeter.streams.core.layout import batch_hash
from specmeter.streams.core.stage1 import PartitionProcessor


def _rec(**fields) -> dict:
    base = {
        "type": "record",
        "batch_id": "step-1",
        "session_id": "s",
        "generation_id": "g",
        "accepted": 1,
        "proposed": 2,
        "verify": 1,
        "completion": 3,
    }
    return {**base, **fields}


def _wire(obj: dict) -> bytes:
    return msgspec.msgpack.encode(obj)


def _aggregate(lines: list[dict]) -> dict:
    aggregator = OfflineAggregator()
    aggregator.feed_lines(json.dumps(line) for line in lines)
    return {(m.run_id, m.batch_id): m for m in aggregator.results()}


# -- run identity ---------------------------------------------------------------------
def test_two_runs_with_equal_batch_ids_never_merge():
    """A job restarted from a checkpoint regenerates step-1 under a new run_id."""
    lines = [
        _rec(generation_id="g1", accepted=1, proposed=4),
        _rec(generation_id="g1", accepted=3, proposed=4, run_id="attempt-2"),  # same key, other run: no conflict
        _rec(generation_id="g2", accepted=2, proposed=4, run_id="attempt-2"),
        {"type": "marker", "batch_id": "step-1", "producer_id": "p", "speculative_algorithm": "EAGLE"},
        {"type": "marker", "batch_id": "step-1", "producer_id": "p", "run_id": "attempt-2"},
    ]
    out = _aggregate(lines)
    assert set(out) == {(None, "step-1"), ("attempt-2", "step-1")}
    old, new = out[(None, "step-1")], out[("attempt-2", "step-1")]
    assert old.metrics["spec/accepted_total"] == 1 and old.metrics["spec/conflicting_generation_count"] == 0
    assert new.metrics["spec/accepted_total"] == 5 and new.metrics["spec/unique_generation_count"] == 2
    assert old.run_id is None and new.run_id == "attempt-2"
    assert json.loads(msgspec.json.encode(new))["run_id"] == "attempt-2"
    assert "run_id" in json.loads(msgspec.json.encode(old))  # null, next to batch_id


def test_a_marker_closes_only_its_own_run(core):
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    records = [
        GenerationRecord(
            batch_id="step-1",
            session_id="s",
            generation_id=f"g{i}",
            accepted=1,
            proposed=2,
            producer_id="p",
            run_id=run,
        )
        for i, run in enumerate([None, "r2"])
    ]
    messages = [(i, encode_records_message(r)) for i, r in enumerate(records)]
    messages.append(
        (2, encode_records_message(BatchMarker(batch_id="step-1", producer_id="p", run_id="r2", records_sent=1)))
    )
    effects = p.process(messages, now_ms=1000)
    assert [(x.run_id, x.batch_id) for x in effects.partials] == [("r2", "step-1")]
    assert effects.partials[0].record_count == 1
    assert {(k, b.closed) for k, b in p.batches.items()} == {((None, "step-1"), False), (("r2", "step-1"), True)}


def test_envelope_run_applies_to_its_records_and_another_run_inside_is_invalid(core):
    batch = RecordBatch(
        run_id="r1",
        producer_id="p",
        records=[
            GenerationRecord(batch_id="b", session_id="s", generation_id="g1", accepted=1, proposed=2),
            GenerationRecord(batch_id="b", session_id="s", generation_id="g2", accepted=1, proposed=2, run_id="r1"),
            GenerationRecord(batch_id="b", session_id="s", generation_id="g3", accepted=1, proposed=2, run_id="r9"),
        ],
    )
    decoded = decode_records_message(encode_records_message(batch))
    assert decoded.run_id == "r1" and len(decoded.records) == 2
    (bad,) = decoded.invalid
    assert (bad.run_id, bad.batch_id) == ("r1", "b") and "run_id" in bad.detail and "'r9'" in bad.detail
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    p.process([(0, encode_records_message(batch))], now_ms=0)
    (state,) = [b.state for b in p.batches.values()]
    assert (state.run_id, state.record_count, state.invalid_record_count) == ("r1", 3, 1)


@pytest.mark.parametrize("run_id", ["", "x" * (MAX_ID + 1), 7, ["r"]])
def test_a_record_with_an_unreadable_run_is_counted_in_no_batch(run_id):
    for data in (
        _wire(_rec(run_id=run_id)),
        _wire({"type": "batch", "records": [_rec(run_id=run_id)]}),
        _wire({"type": "batch", "run_id": run_id, "records": [_rec()]}),
    ):
        decoded = decode_records_message(data)
        assert decoded.records == []
        assert [bad.batch_id for bad in decoded.invalid] == [None]
    line = decode_json_line(json.dumps(_rec(run_id=run_id)))
    assert line.batch_id is None


def test_stage1_restores_named_runs_from_its_changelog(core):
    """State, statuses and the checkpoint's expired list key on (run_id, batch_id)."""
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=1_000, grace_ms=5_000)
    log: dict[bytes, bytes] = {}

    def apply(effects):
        for key, value in effects.changelog:
            if value is None:
                log.pop(key, None)
            else:
                log[key] = value
        return effects

    for offset, run in enumerate([None, "r1", "r2", "r1"]):
        record = GenerationRecord(
            batch_id="step-1",
            session_id=f"s{offset}",
            generation_id="g",
            accepted=offset,
            proposed=9,
            weight_version=f"v{offset % 2}",
            producer_id="p",
            run_id=run,
        )
        apply(p.process([(offset, encode_records_message(record))], now_ms=0))
    marker = BatchMarker(batch_id="step-1", producer_id="p", run_id="r1", records_sent=2)
    closed = apply(p.process([(4, encode_records_message(marker))], now_ms=10))
    assert [(x.run_id, x.record_count) for x in closed.partials] == [("r1", 2)]
    assert any(key.startswith(b"0\x1fD\x1f2:r1step-1") for key in log)  # a named run's keys
    assert any(key.startswith(b"0\x1fd\x1fstep-1\x1f") for key in log)  # the default run's, as before runs

    restored = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=1_000, grace_ms=5_000)
    again = restored.restore(list(log.items()), now_ms=20)
    assert set(restored.batches) == set(p.batches)
    for key, batch in p.batches.items():
        assert encode_partial(restored.batches[key].state.partial()) == encode_partial(batch.state.partial()), key
    assert [(x.run_id, x.batch_id, x.revision) for x in again.partials] == [("r1", "step-1", 0)]

    apply(p.tick(now_ms=10_000))  # r1 expires after grace; the others time out
    apply(p.tick(now_ms=20_000))
    # remembered by hash (issue 21): exactly these three, nothing else
    want = {(None, "step-1"), ("r1", "step-1"), ("r2", "step-1")}
    assert set(p.expired.hashes()) == {batch_hash(k) for k in want} and all(k in p.expired for k in want)
    late = p.process(
        [
            (
                5,
                encode_records_message(
                    GenerationRecord(batch_id="step-1", session_id="z", generation_id="g", run_id="r1")
                ),
            )
        ],
        now_ms=20_001,
    )
    assert [(d.reason, d.run_id) for d in late.dead_letters] == [("late", "r1")]
    restored = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=1_000, grace_ms=5_000)
    restored.restore(list(log.items()), now_ms=20_002)
    assert set(restored.expired.hashes()) == set(p.expired.hashes()) and restored.batches == {}


# -- limits ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"accepted": MAX_COUNTER}, True),
        ({"accepted": MAX_COUNTER + 1}, False),
        ({"completion": 2**63 - 1}, False),
        ({"accept_histogram": [MAX_COUNTER] * MAX_BINS}, True),
        ({"accept_histogram": [0] * (MAX_BINS + 1)}, False),
        ({"accept_histogram": [MAX_COUNTER + 1]}, False),
        ({"session_id": "s" * MAX_ID}, True),
        ({"session_id": "s" * (MAX_ID + 1)}, False),
        ({"weight_version": "v" * MAX_ID}, True),
        ({"weight_version": "v" * (MAX_ID + 1)}, False),
        ({"weight_version": ""}, False),
        ({"weight_version": 12}, False),  # only meta_info normalises an int version
        ({"run_id": "r" * MAX_ID}, True),
    ],
)
def test_wire_limits(fields, valid):
    decoded = decode_records_message(_wire(_rec(**fields)))
    assert (len(decoded.records), len(decoded.invalid)) == ((1, 0) if valid else (0, 1))
    if not valid:
        assert decoded.invalid[0].batch_id == "step-1"  # identity readable: counted in its batch


def test_a_batch_id_past_the_limit_is_counted_nowhere():
    decoded = decode_records_message(_wire(_rec(batch_id="b" * (MAX_ID + 1))))
    (bad,) = decoded.invalid
    assert bad.batch_id is None and "length <= 1024" in bad.detail and "$.batch_id" in bad.detail


def test_records_near_the_64_bit_limit_no_longer_reach_a_partial(core):
    """Three such records used to make the partial unencodable and jam the partition."""
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    messages = [(i, _wire(_rec(generation_id=f"g{i}", accepted=2**63 - 1, proposed=2**63 - 1))) for i in range(3)]
    messages.append((3, _wire({"type": "marker", "batch_id": "step-1", "producer_id": "p"})))
    effects = p.process(messages, now_ms=0)
    assert [d.reason for d in effects.dead_letters] == ["invalid"] * 3
    (partial,) = effects.partials
    assert (partial.record_count, partial.invalid_record_count, partial.unique_generation_count) == (3, 3, 0)
    encode_partial(partial)


def test_sums_at_the_limits_stay_inside_64_bits(core):
    """The worker holds at most --max-open-generations per partition; with counters
    and bins at MAX_COUNTER every sum still encodes."""
    state = core.BatchState("b")
    hist = [MAX_COUNTER] * MAX_BINS
    state.add_many(
        [
            GenerationRecord(
                batch_id="b",
                session_id=f"s{i}",
                generation_id="g",
                accepted=MAX_COUNTER,
                proposed=MAX_COUNTER,
                verify=MAX_COUNTER,
                completion=MAX_COUNTER,
                accept_histogram=hist,
                weight_version=f"v{i % 3}",
            )
            for i in range(2000)
        ]
    )
    partial = state.partial()
    assert partial.accepted_total == 2000 * MAX_COUNTER < 2**63
    encode_partial(partial)
    msgspec.json.encode(
        build_batch_metrics([partial], revision=0, close_reason="markers", closed_at=0.0, partitions_expected=1)
    )


# -- markers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "marker",
    [
        {"type": "marker", "batch_id": "step-1" + "x" * MAX_ID, "producer_id": "p"},
        {"type": "marker", "batch_id": "step-1", "producer_id": "p", "records_sent": -1},
        {"type": "marker", "batch_id": "step-1", "producer_id": ""},
        {"type": "marker", "batch_id": "step-1", "producer_id": "p", "run_id": ""},
    ],
)
def test_an_invalid_marker_is_dead_lettered_and_counted_in_no_batch(core, marker):
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    messages = [(i, _wire(_rec(generation_id=f"g{i}", producer_id="p"))) for i in range(3)]
    messages.append((3, _wire(marker)))
    effects = p.process(messages, now_ms=0)
    assert [(d.reason, d.batch_id) for d in effects.dead_letters] == [("invalid", None)]
    (batch,) = p.batches.values()
    assert (batch.state.record_count, batch.state.invalid_record_count) == (3, 0)
    out = _aggregate([_rec(generation_id=f"g{i}") for i in range(3)] + [marker])
    assert out[(None, "step-1")].record_count == 3 and out[(None, "step-1")].invalid_record_count == 0


# -- whose records --------------------------------------------------------------------
def test_records_without_a_producer_count_under_their_envelope(core):
    """The README's producer snippet publishes records without producer_id: the
    publisher's markers must still find them (complete, nothing missing)."""
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    records = [
        GenerationRecord(batch_id="b", session_id="s", generation_id=f"g{i}", accepted=1, proposed=2) for i in range(5)
    ]
    messages = [
        (0, encode_records_message(RecordBatch(records=records[:3], producer_id="worker-7"))),
        (1, encode_records_message(RecordBatch(records=records[3:], producer_id="worker-7"))),
        (2, encode_records_message(BatchMarker(batch_id="b", producer_id="worker-7", records_sent=5))),
    ]
    (partial,) = p.process(messages, now_ms=0).partials
    metrics = build_batch_metrics([partial], revision=0, close_reason="markers", closed_at=0.0, partitions_expected=1)
    assert metrics.complete and metrics.missing_record_count == 0 and metrics.record_count == 5


def test_log_lines_are_bounded(caplog):
    import logging

    from specmeter.streams.report.log_lines import MAX_LOG_CHARS, bound_log_lines

    factory = logging.getLogRecordFactory()
    bound_log_lines()
    try:
        logging.getLogger("faust.topics").warning("_on_published error message %s", "x" * 1_000_000)
    finally:
        logging.setLogRecordFactory(factory)
    (record,) = caplog.records
    assert len(record.getMessage()) < MAX_LOG_CHARS + 100


def test_the_largest_batch_metrics_the_limits_allow_fits_the_worker_topics():
    """64 weight versions and 64 tasks of 1024-character names and 64 draft lags (revision
    5), each with a 1024-bin histogram whose sums are as large as a million generations
    at MAX_COUNTER make them (and so both curves of 1023 positions in every entry,
    revision 4), and the spread's 64 counts: the message the
    worker must publish passes Kafka's 1 MiB default but stays under what the topics it
    creates accept (2 x --max-message-bytes, 16 MiB by default)."""
    from specmeter.schemas import BreakdownSums, PartialAggregate, encode_metrics

    big = 1_000_000 * MAX_COUNTER
    versions = [
        BreakdownSums(
            key=f"{i:02d}" + "v" * (MAX_ID - 2),
            unique_generation_count=15625,
            accepted_total=big,
            proposed_total=big,
            paired_accepted_total=big,
            paired_proposed_total=big,
            accept_covered_count=15625,
            accept_histogram=[big] * MAX_BINS,
        )
        for i in range(64)
    ]
    partial = PartialAggregate(
        batch_id="b" * MAX_ID,
        run_id="r" * MAX_ID,
        counters_seen=True,
        unique_generation_count=1_000_000,
        accepted_total=64 * big,
        accept_histogram=[64 * big] * MAX_BINS,
        weight_versions=versions,
        tasks=[msgspec.structs.replace(v, key="t" + v.key[:-1]) for v in versions],
        draft_lags=[msgspec.structs.replace(v, key=MAX_COUNTER - i) for i, v in enumerate(versions)],
        tokens_per_verify_distribution=[1_000_000] * 64,
    )
    metrics = build_batch_metrics([partial], revision=0, close_reason="markers", closed_at=0.0, partitions_expected=1)
    assert len(metrics.by_weight_version) == 64 and len(metrics.by_task) == 64 and len(metrics.by_draft_lag) == 64
    assert len(metrics.by_task[0].tokens_per_verify_by_budget) == MAX_BINS - 1
    assert len(metrics.by_draft_lag[0].tokens_per_verify_by_budget) == MAX_BINS - 1
    assert 1_048_576 < len(encode_metrics(metrics)) < 2 * 8 * 1024 * 1024
