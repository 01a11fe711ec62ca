"""Stage 2 without Kafka: when a batch is published, revisions, replays, restore."""

from __future__ import annotations

from specmeter.schemas import GenerationRecord
from specmeter.streams import BatchState
from specmeter.streams._layout import decode_stage2_checkpoint, stage2_checkpoint_key
from specmeter.streams._stage2 import BatchMerger

TIMEOUT_MS, GRACE_MS = 1_000, 5_000


def _merger() -> BatchMerger:
    return BatchMerger(0, partitions_expected=2, batch_timeout_ms=TIMEOUT_MS, grace_ms=GRACE_MS)


def _partial(
    partition: int,
    accepted: int,
    *,
    revision: int = 0,
    batch: str = "b",
    run: str | None = None,
    reason: str = "markers",
):
    state = BatchState(batch, run)
    state.add(
        GenerationRecord(
            batch_id=batch,
            session_id=f"s{partition}",
            generation_id="g",
            accepted=accepted,
            proposed=10,
            weight_version="v1",
        )
    )
    return state.partial(partition=partition, revision=revision, close_reason=reason, closed_at_ms=100)


def _log(log: dict, effects) -> None:
    for key, value in effects.changelog:
        if value is None:
            log.pop(key, None)
        else:
            log[key] = value


def test_published_once_every_partition_reported():
    m = _merger()
    assert m.process([(0, _partial(0, 3))], now_ms=0).published == []
    (out,) = m.process([(1, _partial(1, 4))], now_ms=10).published
    assert (out.revision, out.complete, out.close_reason) == (0, True, "markers")
    assert out.metrics["spec/accepted_total"] == 7 and out.partitions_reported == 2
    assert [e.weight_version for e in out.by_weight_version] == ["v1"]


def test_a_replayed_or_stale_partial_publishes_nothing():
    m = _merger()
    m.process([(0, _partial(0, 3)), (1, _partial(1, 4))], now_ms=0)
    assert m.on_partial(_partial(1, 4), now_ms=1).published == []  # same revision again
    assert m.on_partial(_partial(1, 9, revision=0), now_ms=2).published == []  # not newer
    # a newer revision with the same content publishes nothing either
    assert m.on_partial(_partial(1, 4, revision=1), now_ms=3).published == []
    (late,) = m.on_partial(_partial(1, 5, revision=2), now_ms=4).published
    assert late.revision == 1 and late.metrics["spec/accepted_total"] == 8


def test_timeout_publishes_incomplete_and_the_missing_partition_completes_it():
    m = _merger()
    m.process([(0, _partial(0, 3))], now_ms=0)
    assert m.tick(now_ms=TIMEOUT_MS - 1).published == []
    (first,) = m.tick(now_ms=TIMEOUT_MS).published
    assert (first.complete, first.close_reason, first.partitions_reported) == (False, "timeout", 1)
    (second,) = m.process([(1, _partial(1, 4))], now_ms=TIMEOUT_MS + 5).published
    assert (second.revision, second.complete, second.close_reason) == (1, True, "markers")


def test_a_merge_timed_out_long_after_its_last_partial_still_takes_the_missing_one():
    """Restored after downtime, a merge times out at once; grace runs from that
    publication (as stage 1's from a close), so the partition that was still catching
    up completes it instead of finding it forgotten."""
    m = _merger()
    m.process([(0, _partial(0, 3))], now_ms=0)
    later = GRACE_MS + TIMEOUT_MS + 10_000  # the worker was down meanwhile
    (first,) = m.tick(now_ms=later).published
    assert (first.revision, first.complete) == (0, False)
    assert m.tick(now_ms=later + 1).published == [] and m.entries  # not forgotten at once
    (second,) = m.process([(1, _partial(1, 4))], now_ms=later + 100).published
    assert (second.revision, second.complete) == (1, True)


def test_runs_merge_apart_even_with_equal_batch_ids():
    m = _merger()
    out = m.process(
        [(0, _partial(0, 3, run="r1")), (1, _partial(0, 1)), (2, _partial(1, 4, run="r1"))], now_ms=0
    ).published
    assert [(x.run_id, x.metrics["spec/accepted_total"]) for x in out] == [("r1", 7)]
    assert set(m.entries) == {("r1", "b"), (None, "b")}


def test_forgotten_after_grace_and_timeout():
    m = _merger()
    m.process([(0, _partial(0, 3)), (1, _partial(1, 4))], now_ms=0)
    log: dict = {}
    _log(log, m.tick(now_ms=GRACE_MS + TIMEOUT_MS - 1))
    assert m.entries
    _log(log, m.tick(now_ms=GRACE_MS + TIMEOUT_MS))
    assert m.entries == {}


def test_restore_rebuilds_entries_and_repeats_the_last_publication():
    m = _merger()
    log: dict = {}
    _log(log, m.process([(0, _partial(0, 3)), (1, _partial(1, 4, run="r"))], now_ms=0))
    effects = m.process([(2, _partial(1, 4))], now_ms=1)
    _log(log, effects)
    (published,) = effects.published
    assert decode_stage2_checkpoint(log[stage2_checkpoint_key(0)]).offset == 2
    restored = _merger()
    again = restored.restore(log.items())
    assert again == [published] and restored.checkpoint == 2
    assert set(restored.entries) == {(None, "b"), ("r", "b")}
    assert restored.process([(2, _partial(1, 4))], now_ms=5).published == []  # at the checkpoint: skipped


def test_restore_reads_the_checkpoint_written_before_it_was_a_struct():
    m = _merger()
    m.restore([(stage2_checkpoint_key(0), b"41")])
    assert m.checkpoint == 41
