"""The ownership protocol over schedules (``tests/support/ownership_model.py``), and the
reproductions of issue 37 that runs did not find.

``SPECMETER_MODEL_SCHEDULES`` sets how many schedules the CI test runs (10,000 by
default, in about 40 s on two cores); ``bench/ownership_model.py`` runs many more.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from specmeter.streams.core import ownership
from specmeter.streams.core.layout import REWRITTEN_KINDS
from specmeter.streams.core.ownership import (
    ChangelogView,
    RewrittenKeys,
    Takeover,
    encode_takeover,
    is_confirmation,
    is_takeover,
    takeover_key,
)
from specmeter.streams.core.stage1 import PartitionProcessor
from specmeter.streams.delivery import writes
from specmeter.streams.delivery.writes import OwnedWrites

from .support.ownership_model import Violation, input_messages, run_schedule

SCHEDULES = int(os.environ.get("SPECMETER_MODEL_SCHEDULES", "10000"))
CHUNKS = 10


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_no_schedule_breaks_an_invariant(chunk):
    """Freezes, crashes, missed rebalances, cancelled rounds, compaction at any point:
    one content per (batch, revision), restores never go back, the state stays exact."""
    per_chunk = -(-SCHEDULES // CHUNKS)
    for seed in range(chunk * per_chunk, (chunk + 1) * per_chunk):
        run_schedule(seed)


def _first_violation(limit: int = 3000) -> str | None:
    for seed in range(limit):
        try:
            run_schedule(seed)
        except Violation as exc:
            return str(exc)
    return None


def test_the_model_finds_item_1_when_its_fix_is_reverted(monkeypatch):
    """Every write under one key per owner, and restore deletions sent at once: a stale
    owner's late checkpoint replaces its valid one, and a re-take finds deltas without it."""
    monkeypatch.setattr(RewrittenKeys, "rewrite", lambda self, key, value: (key, None))
    monkeypatch.setattr(writes, "_physical", lambda keys, sent, held: (sent + [(k, None) for k in held], []))
    assert _first_violation() is not None


def test_the_model_finds_item_2_when_its_fix_is_reverted(monkeypatch):
    """Every takeover counts, whatever its generation: a stale member's late record
    becomes the epoch, and the rightful owner's state stops counting."""
    monkeypatch.setattr(ownership, "counts_after", lambda takeover, before: True)
    monkeypatch.setattr(writes, "counts_after", lambda takeover, before: True)
    assert _first_violation() is not None


def test_a_stray_fence_inside_a_writers_task_fails_the_schedule(monkeypatch):
    """Issue 43: the model's worker raises its ``Violation`` inside an ``OwnedWrites`` task
    (the gap check that fences it), whose failure ``OwnedWrites._done`` only logged: with
    the writer's generation check reverted (a stray takeover fences the owner), the stray
    fences were swallowed. A failed completion now stops the worker (the output fails),
    and the model fails the schedule with the violation itself."""
    monkeypatch.setattr(writes, "counts_after", lambda takeover, before: True)
    found = _first_violation(400)
    assert found is not None and "a stray takeover fenced" in found, found


# -- the reproductions of issue 37, item 1 --------------------------------------------------
def _view(log):
    view = ChangelogView()
    for offset, (key, value) in enumerate(log):
        view.add(offset, key, value)
    return view.result()


def _owner_writes(log, keys, effects_changelog):
    for key, value in effects_changelog:
        physical, _ = keys.rewrite(key, value)
        log.append((physical, value))


def test_a_stale_owners_late_chunk_does_not_cost_a_retake_its_checkpoint():
    """A owns and writes deltas and its checkpoint; B appends its takeover and is cancelled
    before its restore writes; A wakes and applies one more chunk (landing after B's
    takeover); B takes over again: it restores A's checkpoint, not -1."""
    messages = input_messages(random.Random(7))
    log: list = [(takeover_key(0, "a"), encode_takeover(Takeover(token="a", generation=1)))]
    a = PartitionProcessor(0, source_topic="r", batch_timeout_ms=10**6, grace_ms=10**9, owner_epoch=0)
    a.restore([], 0)
    a_keys = RewrittenKeys(0, 0, REWRITTEN_KINDS)
    _owner_writes(log, a_keys, a.process(messages[:3], 1).changelog)
    log.append((takeover_key(0, "b"), encode_takeover(Takeover(token="b", generation=2))))
    _owner_writes(log, a_keys, a.process(messages[3:5], 2).changelog)  # lands after B's takeover
    log.append((takeover_key(0, "b2"), encode_takeover(Takeover(token="b2", generation=2))))
    valid = _view(log)
    assert valid.epoch == len(log) - 1
    b2 = PartitionProcessor(0, source_topic="r", batch_timeout_ms=10**6, grace_ms=10**9, owner_epoch=valid.epoch)
    b2.restore(valid.entries, 3)
    assert b2.checkpoint == 2, "the re-take restores A's last checkpoint that counts"


def test_a_late_takeover_of_an_older_generation_fences_nobody():
    """A stray takeover (a member that confirmed generation 1, froze, and appended after
    generation 2's owner) does not count: the owner's later records still do."""
    log = [
        (takeover_key(0, "old"), encode_takeover(Takeover(token="old", generation=1, at_ms=1000))),
        (takeover_key(0, "new"), encode_takeover(Takeover(token="new", generation=2, at_ms=2000))),
        (takeover_key(0, "stray"), encode_takeover(Takeover(token="stray", generation=1, at_ms=1500))),
        (b"0@1.0\x1fc", b"checkpoint"),
    ]
    valid = _view(log)
    assert valid.epoch == 1 and valid.entries == [(b"0@1.0\x1fc", b"checkpoint")]
    assert takeover_key(0, "stray") in valid.deletions


def test_a_group_that_started_again_counts_after_the_clock_skew_bound():
    """Generations start again when a group's metadata expired (no member for the offsets
    retention): a takeover confirmed past the skew bound counts whatever its generation."""
    before = Takeover(token="a", generation=40, at_ms=1_000)
    assert not ownership.counts_after(Takeover(token="b", generation=3, at_ms=1_000 + ownership.CLOCK_SKEW_MS), before)
    assert ownership.counts_after(Takeover(token="b", generation=3, at_ms=2_000 + ownership.CLOCK_SKEW_MS), before)


def test_the_groups_after_a_restore_wait_until_its_deletions_are_handed_over():
    """A restore deletes the deltas past its checkpoint only once its group is verified (a
    stale reader's restore, never verified, deletes nothing), and they must land before a
    newer checkpoint: the chunk submitted meanwhile waits behind them (the long mode of the
    model found both schedules)."""
    from .support.ownership_model import QueuedProducer

    loop = asyncio.new_event_loop()
    producer = QueuedProducer()

    async def read_range(*_: object) -> list:
        return []

    owned = OwnedWrites(producer, read_range, lambda *_: None, owner="w")  # type: ignore[arg-type]

    def land(expected_key: bytes) -> None:
        key, _, on_ack = producer.queue.popleft()
        assert key == expected_key
        loop.call_soon(on_ack, len(landed))
        landed.append(key)
        loop.run_until_complete(asyncio.sleep(0.01))

    landed: list[bytes] = []
    take = loop.create_task(owned.take_over("log", 0, generation=1, confirmed_at_ms=1))
    loop.run_until_complete(asyncio.sleep(0))
    land(takeover := producer.queue[0][0])
    land(confirmation := producer.queue[0][0])  # the confirmation naming the epoch (issue 43)
    assert take.done() and take.result() == 0 and is_takeover(takeover) and is_confirmation(confirmation)

    async def submit() -> None:
        owned.submit("log", 0, [(b"0@0\x1fc", b"restored")], _nothing, [b"0@7\x1fd\x1fb\x1f9"], barrier=True)
        owned.submit("log", 0, [(b"0@0\x1fd\x1fb\x1f12", b"delta"), (b"0@0\x1fc", b"newer")], _nothing)

    loop.run_until_complete(submit())
    assert [k for k, _, _ in producer.queue] == [b"0@0.0\x1fc"], "the chunk waits behind the restore"
    land(b"0@0.0\x1fc")
    assert [k for k, v, _ in producer.queue] == [b"0@7\x1fd\x1fb\x1f9", b"0@0\x1fd\x1fb\x1f12", b"0@0.1\x1fc"]
    assert producer.queue[0][1] is None, "the stale delta's deletion first, then the chunk"
    loop.close()


async def _nothing() -> None:
    pass
