"""Stage 1's state bytes (issue 21 point 4): deltas are written compressed, in one
format both cores write and read (LZ4 block, size first, behind a byte msgpack never
starts with), and the plain deltas older workers wrote still restore."""

from __future__ import annotations

import dataclasses

import cramjam
import msgspec

from specmeter.schemas import RecordBatch, decode_records_message, encode_records_message
from specmeter.streams.core import cores
from specmeter.streams.core.layout import (
    COMPRESSED,
    compress_state,
    decode_delta,
    encode_state,
    state_key_prefix,
)
from specmeter.streams.core.stage1 import PartitionProcessor, _digest
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet


def _fleet_messages(batches: int = 3, sessions: int = 40, spec: FleetSpec | None = None) -> list[tuple[int, bytes]]:
    """One partition's input: records packed 100 a message, each batch's markers after them."""
    if spec is None:
        spec = FleetSpec(batches=batches, sessions_per_batch=sessions, producers=2, max_turns=6, seed=21)
    out: list[bytes] = []
    pending: list = []
    for event in synthetic_fleet(spec):
        if event.kind == "record":
            pending.append(event.payload)
            if len(pending) == 100:
                out.append(encode_records_message(RecordBatch(records=pending)))
                pending = []
        elif event.kind == "marker":
            if pending:
                out.append(encode_records_message(RecordBatch(records=pending)))
                pending = []
            out.append(encode_records_message(event.payload))
    return list(enumerate(out))


def _processor(core) -> PartitionProcessor:
    return PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=10**9, grace_ms=10**9)


def _is_delta(key: bytes) -> bool:
    return key[len(state_key_prefix(0)) : len(state_key_prefix(0)) + 1] in (b"d", b"D")


def _changelog(core, messages, chunk: int = 8) -> tuple[dict[bytes, bytes], list]:
    p = _processor(core)
    live: dict[bytes, bytes] = {}
    partials = []
    for i in range(0, len(messages), chunk):
        effects = p.process(messages[i : i + chunk], now_ms=i)
        partials += effects.partials
        for key, value in effects.changelog:
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value
    return live, partials


def test_deltas_are_written_compressed_and_restore_in_either_core(core):
    messages = _fleet_messages()
    live, partials = _changelog(core, messages)
    deltas = {k: v for k, v in live.items() if _is_delta(k)}
    assert deltas and all(v[0] == COMPRESSED for v in deltas.values())
    plain = {k: encode_state(decode_delta(v)) for k, v in deltas.items()}
    # ids repeat: compressed they are a fraction of what the plain msgpack took
    assert sum(map(len, deltas.values())) * 3 < sum(map(len, plain.values()))
    built = [cores.PYTHON] + ([cores.NATIVE] if cores.NATIVE is not None else [])
    want = sorted(_digest(p) for p in partials)
    for reader in built:
        restored = _processor(reader)
        again = restored.restore(list(live.items()), now_ms=10**6)
        assert sorted(_digest(p) for p in again.partials) == want, reader.name


def test_the_compressed_format_is_an_lz4_block_with_its_size_first(core):
    """Readable by any LZ4 implementation: byte 0xC1, then LZ4's ``store_size`` layout
    (4 bytes little-endian, then the block) of the msgpack ``BatchDelta``."""
    live, _ = _changelog(core, _fleet_messages(batches=1))
    for key, value in live.items():
        if _is_delta(key):
            raw = bytes(cramjam.lz4.decompress_block(value[1:]))
            assert int.from_bytes(value[1:5], "little") == len(raw)
            assert msgspec.msgpack.decode(raw)[0] == decode_delta(value).batch_id
            assert encode_state(decode_delta(value)) == encode_state(decode_delta(raw))


def test_plain_deltas_an_older_worker_wrote_still_restore(core):
    """Upgraded mid-run: the changelog holds uncompressed deltas (and the new worker's
    compressed ones after them); both restore to the same partials."""
    messages = _fleet_messages()
    live, partials = _changelog(core, messages)
    old = {k: (encode_state(decode_delta(v)) if _is_delta(k) else v) for k, v in live.items()}
    assert all(v[0] != COMPRESSED for k, v in old.items() if _is_delta(k))
    restored = _processor(core)
    again = restored.restore(list(old.items()), now_ms=10**6)
    assert sorted(_digest(p) for p in again.partials) == sorted(_digest(p) for p in partials)
    mixed = dict(old)
    mixed.update({k: v for i, (k, v) in enumerate(live.items()) if i % 2})
    assert sorted(_digest(p) for p in _processor(core).restore(list(mixed.items()), now_ms=10**6).partials) == sorted(
        _digest(p) for p in partials
    )


def test_a_value_compression_would_not_shrink_is_written_plain():
    tiny = encode_state(decode_delta(msgspec.msgpack.encode(["b", 0, 0, 0])))
    assert compress_state(tiny) == tiny and tiny[0] != COMPRESSED
    assert decode_delta(tiny).batch_id == "b"
    repetitive = msgspec.msgpack.encode(["b", 0, 0, 0, [["session-1", f"gen-{i}"] for i in range(50)]])
    packed = compress_state(repetitive)
    assert packed[0] == COMPRESSED and len(packed) < len(repetitive)
    assert bytes(cramjam.lz4.decompress_block(packed[1:])) == repetitive


def test_either_core_keeps_a_delta_compressed_only_when_smaller(core):
    from specmeter.schemas import GenerationRecord

    for n in (1, 3, 30, 300):
        state = core.BatchState("b")
        state.start_journal()
        for i in range(n):
            state.add(GenerationRecord(batch_id="b", session_id=f"s-{i % 7}", generation_id=f"g-{i}", accepted=i))
        encoded = state.take_delta_encoded(first_offset=0, last_offset=0, last_input_ms=0)
        plain = encode_state(decode_delta(encoded))
        assert (encoded[0] == COMPRESSED and len(encoded) < len(plain)) or encoded == plain, n
        if n in (1, 300):  # a single record's delta does not shrink, 300 records' does
            assert (encoded[0] == COMPRESSED) is (n == 300), n


#: the benchmarks' fleet (bench/_pipeline.py FLEET_SHAPE), smaller: agentic sessions of up
#: to 8 trajectories and 24 turns, 20 % redeliveries, 1 % conflicts, 5 % missing counters
_BENCH_SHAPE = {
    "producers": 4,
    "max_samples_per_session": 8,
    "max_turns": 24,
    "redelivery_rate": 0.2,
    "conflict_rate": 0.01,
    "missing_rate": 0.05,
    "invalid_rate": 0.0,
    "seed": 1,
}


def _bytes_per_record(core, spec: FleetSpec) -> tuple[float, int]:
    """What the processor writes to its changelog (keys and values, tombstones as their
    key: bench/stage1_core.py's measure) per record, and the records."""
    messages = _fleet_messages(spec=spec)
    records = sum(len(m.records) for _, data in messages if (m := decode_records_message(data)).marker is None)
    p = _processor(core)
    written = 0
    for i in range(0, len(messages), 8):
        for key, value in p.process(messages[i : i + 8], now_ms=i).changelog:
            written += len(key) + len(value or b"")
    return written / records, records


def test_state_bytes_per_record_stay_under_21_with_draft_lags_and_tasks(core):
    """Issue 21's target (<= 21 B of state per record) holds at revision 5, on records that
    name their task and their draft lag (a wide entry's eleventh and twelfth items): what a
    lag adds is a small int per generation, and compressed, close to nothing."""
    spec = FleetSpec(batches=4, sessions_per_batch=30, **_BENCH_SHAPE)
    first = next(e.payload for e in synthetic_fleet(spec) if e.kind == "record")
    assert first.task is not None and first.draft_lag is not None
    with_lags, records = _bytes_per_record(core, spec)
    without, _ = _bytes_per_record(core, dataclasses.replace(spec, draft_lags=False))
    assert records > 10_000
    assert with_lags <= 21, f"{with_lags:.2f} B per record"
    assert with_lags - without < 1, (with_lags, without)
