"""Late for the whole life of a run (issue 21, SPEC §4 Late records), without Kafka, on each core.

A partition used to remember its last 10,000 expired batches in every checkpoint: a
straggler for an older one opened it again (a second revision 0), and every
checkpoint wrote the whole list again. Expired (and overflowed) batches are now
remembered by a 64-bit hash for a retention horizon, written once when they go.
"""

from __future__ import annotations

import pytest

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, encode_records_message
from specmeter.streams.core.expired import GENERATIONS_PER_HORIZON, GoneIds
from specmeter.streams.core.layout import (
    Checkpoint,
    batch_hash,
    checkpoint_key,
    decode_checkpoint,
    decode_gone,
    delta_key,
    encode_state,
    expired_key,
    state_key_prefix,
    unpack_hashes,
)
from specmeter.streams.core.stage1 import PartitionProcessor

GRACE_MS = 10
HORIZON_MS = 7 * 24 * 3600 * 1000


def _processor(core, **kw) -> PartitionProcessor:
    kw.setdefault("expired_retention_ms", HORIZON_MS)
    return PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=GRACE_MS, **kw)


def _batch_id(i: int) -> str:
    return f"step-{i:05d}"


def _record(i: int, session: str = "s") -> bytes:
    return encode_records_message(
        GenerationRecord(batch_id=_batch_id(i), session_id=session, generation_id="g", accepted=1, proposed=2)
    )


def _marker(i: int) -> bytes:
    return encode_records_message(
        BatchMarker(batch_id=_batch_id(i), producer_id="p", records_sent=1, expected_producers=1)
    )


class _Log:
    """A compacted changelog: every write kept in order, and the live entries."""

    def __init__(self) -> None:
        self.writes: list[tuple[bytes, bytes | None]] = []
        self.live: dict[bytes, bytes] = {}

    def apply(self, effects) -> None:
        """A call's writes, then the deletions they made safe (sent once they are acknowledged)."""
        for key, value in [*effects.changelog, *((key, None) for key in effects.verified_deletions)]:
            self.writes.append((key, value))
            if value is None:
                self.live.pop(key, None)
            else:
                self.live[key] = value


def _run(p: PartitionProcessor, log: _Log, batches: int, per_tick: int = 1_000, now_ms: int = 0) -> tuple[int, int]:
    """``batches`` one-record batches, each closed by its marker and expired after grace,
    ``per_tick`` of them per chunk and tick. Returns (the next offset, the time)."""
    offset = 0
    for first in range(0, batches, per_tick):
        messages = []
        for i in range(first, min(batches, first + per_tick)):
            messages += [(offset, _record(i)), (offset + 1, _marker(i))]
            offset += 2
        now_ms += 1
        effects = p.process(messages, now_ms)
        assert len(effects.partials) == len(messages) // 2 and not effects.dead_letters
        log.apply(effects)
        now_ms += GRACE_MS
        log.apply(p.tick(now_ms))
        assert not p.batches
    return offset, now_ms


def _straggler(p: PartitionProcessor, i: int, offset: int, now_ms: int):
    """A record and a marker for batch ``i``, long after it expired."""
    return p.process([(offset, _record(i, session="stuck")), (offset + 1, _marker(i))], now_ms)


def test_a_straggler_for_a_batch_expired_25000_batches_ago_is_late_and_restored_workers_know_it(core):
    batches = 25_000  # more than the 10,000 the checkpoint used to hold
    p, log = _processor(core), _Log()
    offset, now_ms = _run(p, log, batches)
    assert p.counters.batches_expired == batches and len(p.expired) == batches

    late = _straggler(p, 0, offset, now_ms + 1)
    assert [d.reason for d in late.dead_letters] == ["late", "late"]  # the record and the marker
    assert [d.batch_id for d in late.dead_letters] == [_batch_id(0)] * 2
    assert not late.partials and not p.batches, "the batch must never open again (no second revision 0)"
    assert p.counters.dead_letters == {"late": 2}
    opened = [k for k, v in late.changelog if v is not None]
    assert not [k for k in opened if b"\x1fd\x1f" in k or b"\x1fs\x1f" in k]

    # each id is written once, when its batch expires
    written = [h for key, value in log.writes if value is not None and b"\x1fx\x1f" in key for h in _hashes(value)]
    assert len(written) == batches and set(written) == {batch_hash((None, _batch_id(i))) for i in range(batches)}
    # the checkpoint carries the offset only: constant size however many batches expired
    checkpoints = [value for key, value in log.writes if key == checkpoint_key(0)]
    assert checkpoints and all(value is not None and len(value) <= 12 for value in checkpoints)
    assert decode_checkpoint(checkpoints[-1]) == Checkpoint(offset=offset - 1)
    # no state of an expired batch is left in the changelog: only its id
    kinds = {key[len(state_key_prefix(0)) : len(state_key_prefix(0)) + 1] for key in log.live}
    assert kinds == {b"c", b"x"}

    # a restarted (or rebalanced) worker knows every one of them at once
    restored = _processor(core)
    effects = restored.restore(list(log.live.items()), now_ms + 2)
    assert not effects.changelog and not effects.partials and restored.checkpoint == offset - 1
    assert set(restored.expired.hashes()) == set(written)
    for i in (0, 1, batches // 2, batches - 1):
        again = _straggler(restored, i, offset + 2, now_ms + 3)
        assert [d.reason for d in again.dead_letters] == ["late", "late"] and not again.partials, i
        offset += 2
    assert not restored.batches


def _hashes(value: bytes) -> list[int]:
    return list(unpack_hashes(decode_gone(value).hashes))


def test_a_new_batch_still_opens_among_many_expired_ones(core):
    p, log = _processor(core), _Log()
    offset, now_ms = _run(p, log, 3_000)
    fresh = p.process([(offset, _record(3_000)), (offset + 1, _marker(3_000))], now_ms + 1)
    assert [(x.batch_id, x.revision) for x in fresh.partials] == [(_batch_id(3_000), 0)]
    assert not fresh.dead_letters


def test_expired_ids_are_forgotten_and_tombstoned_once_the_horizon_has_passed(core):
    horizon_ms = 64_000  # generations of 1 s
    p, log = _processor(core, expired_retention_ms=horizon_ms), _Log()
    offset, now_ms = _run(p, log, 5, per_tick=5)
    (x_key,) = [key for key in log.live if b"\x1fx\x1f" in key]
    assert (None, _batch_id(0)) in p.expired
    # within the horizon: still late (and a restore then knows it)
    log.apply(p.tick(now_ms + horizon_ms - 1))
    assert (None, _batch_id(0)) in p.expired and x_key in log.live
    within = _processor(core, expired_retention_ms=horizon_ms)
    within.restore(list(log.live.items()), now_ms + horizon_ms - 1)
    assert (None, _batch_id(0)) in within.expired
    # past it (at most one generation, horizon / 64, later): forgotten and its key tombstoned
    past = now_ms + horizon_ms + horizon_ms // GENERATIONS_PER_HORIZON
    log.apply(p.tick(past))
    assert (None, _batch_id(0)) not in p.expired and len(p.expired) == 0
    assert x_key not in log.live and (x_key, None) in log.writes
    # (and input for it is then a new batch's: the horizon is the setting that bounds this)
    reopened = _straggler(p, 0, offset, past)
    assert not reopened.dead_letters and [x.batch_id for x in reopened.partials] == [_batch_id(0)]
    # a restore past the horizon tombstones what it finds instead of loading it
    stale = _Log()
    stale.live = {k: v for k, v in log.writes if v is not None}
    late_restore = _processor(core, expired_retention_ms=horizon_ms)
    effects = late_restore.restore(list(stale.live.items()), past)
    assert (x_key, None) in effects.changelog and len(late_restore.expired) == 0


def test_an_upgraded_worker_restores_the_lists_an_older_checkpoint_holds_and_keeps_them(core):
    """A worker before issue 21 wrote the expired and overflowed batches into every
    checkpoint (and its deltas uncompressed): the upgraded one restores them, writes
    them again in the new form, and keeps knowing them after its own checkpoint
    (which no longer carries them) replaced the old one."""
    old_checkpoint = Checkpoint(offset=41, expired=["old-0", ["r1", "old-1"]], overflowed=["flooded"])
    live = {checkpoint_key(0): encode_state(old_checkpoint)}
    p, log = _processor(core), _Log()
    log.live = dict(live)
    log.apply(p.restore(list(live.items()), now_ms=1_000))
    for key in ((None, "old-0"), ("r1", "old-1")):
        assert key in p.expired
    assert (None, "flooded") in p.overflowed
    assert any(b"\x1fx\x1f" in k for k, _ in log.writes) and any(b"\x1fy\x1f" in k for k, _ in log.writes)
    log.apply(p.process([(42, _record(7))], now_ms=1_001))  # its own checkpoint, the offset only
    assert decode_checkpoint(log.live[checkpoint_key(0)]) == Checkpoint(offset=42)

    restored = _processor(core)
    restored.restore(list(log.live.items()), now_ms=1_002)
    assert (None, "old-0") in restored.expired and ("r1", "old-1") in restored.expired
    assert (None, "flooded") in restored.overflowed
    effects = restored.process(
        [
            (
                43,
                encode_records_message(
                    GenerationRecord(batch_id="old-1", session_id="s", generation_id="g", run_id="r1")
                ),
            ),
            (44, encode_records_message(GenerationRecord(batch_id="flooded", session_id="s", generation_id="g"))),
        ],
        now_ms=1_003,
    )
    assert [d.reason for d in effects.dead_letters] == ["late", "overflow"] and not effects.partials


def test_a_restore_deletes_the_deltas_and_status_a_crash_left_of_an_expired_batch(core):
    """The expired ids are written before the batch's state is deleted: a crash in
    between leaves deltas that a restore knows are stale."""
    p, log = _processor(core), _Log()
    log.apply(p.process([(0, _record(0)), (1, _marker(0))], now_ms=1))
    tick = p.tick(now_ms=1 + GRACE_MS)
    writes = tick.changelog
    assert writes[0][0].startswith(b"0\x1fx\x1f") and all(v is None for _, v in writes[1:])
    durable = dict(log.live)
    durable[writes[0][0]] = writes[0][1]  # the crash: only the id reached the broker
    restored = _processor(core)
    effects = restored.restore(list(durable.items()), now_ms=2 + GRACE_MS)
    deleted = {k for k, v in effects.changelog if v is None}
    assert delta_key(0, (None, _batch_id(0)), 1) in deleted and not restored.batches
    assert (None, _batch_id(0)) in restored.expired


def _flood(i: int, n: int) -> bytes:
    records = [GenerationRecord(batch_id="flood", session_id=f"s{i}-{k}", generation_id="g") for k in range(n)]
    return encode_records_message(RecordBatch(records=records))


def test_a_crash_anywhere_in_an_overflowing_chunk_recovers_the_same_outcome(core):
    """The overflowed ids go under a key named by the chunk's last offset, before its
    checkpoint: durable without the checkpoint they are stale (the chunk is replayed and
    overflows again), so what is sent after any crash matches the uncrashed run."""
    from specmeter.streams.core.stage1 import _digest

    messages = [(i, _flood(i, 20)) for i in range(6)]
    reference = _processor(core, max_open_generations=50)
    closing = reference.process(messages, now_ms=1)
    (want,) = closing.partials
    want_letters = sorted(len(d.raw) for d in closing.dead_letters)
    assert want.close_reason == "incomplete" and (None, "flood") in reference.overflowed
    y_keys = [k for k, _ in closing.changelog if b"\x1fy\x1f" in k]
    assert y_keys == [b"0\x1fy\x1f" + b"%020d" % 5]
    for cut in range(len(closing.changelog) + 1):
        log: dict[bytes, bytes] = {}
        for key, value in closing.changelog[:cut]:
            if value is None:
                log.pop(key, None)
            else:
                log[key] = value
        p = _processor(core, max_open_generations=50)
        sent = p.restore(list(log.items()), now_ms=2)
        replay = p.process([m for m in messages if m[0] > p.checkpoint], now_ms=3)
        partials = [*sent.partials, *replay.partials]
        assert partials and _digest(partials[-1]) == _digest(want), cut
        if p.checkpoint < 5 or not replay.dead_letters:
            letters = replay.dead_letters if replay.dead_letters else closing.dead_letters
            assert sorted(len(d.raw) for d in letters) == want_letters, cut
        assert (None, "flood") in p.overflowed, cut
        more = p.process([(6, _flood(6, 1))], now_ms=4)
        assert [d.reason for d in more.dead_letters] == ["overflow"], cut


def test_gone_ids_lookups_and_generations():
    ids = GoneIds(horizon_ms=6_400)  # generations of 100 ms
    ids.add([1, 2, 3], at_ms=0, key_number=10)
    ids.add([4], at_ms=50, key_number=11)
    ids.add([5, 2**64 - 1], at_ms=150, key_number=12)  # a new generation freezes the first
    ids.add([6], at_ms=20, key_number=13)  # an older one (a clock behind): still found
    assert all(ids.has_hash(h) for h in (1, 2, 3, 4, 5, 6, 2**64 - 1)) and not ids.has_hash(7)
    assert sorted(ids.hashes()) == [1, 2, 3, 4, 5, 6, 2**64 - 1] and len(ids) == 7
    assert ids.forget(6_499) == [] and ids.forget(6_500) == [10, 11, 13]
    assert not ids.has_hash(1) and ids.has_hash(5) and ids.forget(6_600) == [12] and len(ids) == 0
    with pytest.raises(ValueError, match="positive"):
        GoneIds(0)


def test_expired_key_numbers_stay_unique_when_ticks_share_a_millisecond(core):
    p, log = _processor(core), _Log()
    for i in range(3):
        log.apply(p.process([(2 * i, _record(i)), (2 * i + 1, _marker(i))], now_ms=0))
        log.apply(p.tick(now_ms=GRACE_MS))  # the same time each tick
    keys = [k for k in log.live if b"\x1fx\x1f" in k]
    assert len(keys) == 3 and keys[0] == expired_key(0, GRACE_MS)
    restored = _processor(core)
    restored.restore(list(log.live.items()), now_ms=GRACE_MS)
    assert all((None, _batch_id(i)) in restored.expired for i in range(3))
