"""Stage 2 without Kafka: when a batch is published, revisions, replays, restore."""

from __future__ import annotations

from specmeter.schemas import GenerationRecord, encode_partial
from specmeter.streams import BatchState
from specmeter.streams.core.layout import (
    MergeEntry,
    decode_stage2_checkpoint,
    encode_state,
    merge_key,
    merge_partial_prefixes,
    stage2_checkpoint_key,
)
from specmeter.streams.core.stage2 import BatchMerger

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
    assert m.on_partial(_partial(1, 9, revision=-1), now_ms=2).published == []  # older
    # a newer revision with the same content publishes nothing either
    assert m.on_partial(_partial(1, 4, revision=1), now_ms=3).published == []
    (late,) = m.on_partial(_partial(1, 5, revision=2), now_ms=4).published
    assert late.revision == 1 and late.metrics["spec/accepted_total"] == 8


def test_a_revision_that_arrives_again_with_other_content_replaces_the_one_held():
    """Issue 30: a stage-1 owner restored from a state its predecessor had written past (one
    that crashed between sending a partial and making its status durable) emits the same
    revision with other content; it is the restored truth, and was ignored before."""
    m = _merger()
    m.process([(0, _partial(0, 3)), (1, _partial(1, 4))], now_ms=0)
    (again,) = m.on_partial(_partial(1, 9, revision=0), now_ms=2).published
    assert again.revision == 1 and again.metrics["spec/accepted_total"] == 12
    assert m.on_partial(_partial(1, 9, revision=0), now_ms=3).published == []  # and once only


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
    assert again.published == [published] and again.changelog == [] and restored.checkpoint == 2
    assert set(restored.entries) == {(None, "b"), ("r", "b")}
    assert restored.process([(2, _partial(1, 4))], now_ms=5).published == []  # at the checkpoint: skipped


def _prefix(log: dict, effects, n: int) -> None:
    """The first ``n`` writes of a write group landed, the rest not (its worker stopped
    while sending it)."""
    _log(log, type(effects)(changelog=effects.changelog[:n]))


def test_a_partial_whose_publication_was_lost_with_the_rest_of_its_group_is_published_at_restore():
    m = _merger()
    log: dict = {}
    _log(log, m.process([(0, _partial(0, 3))], now_ms=0))
    effects = m.process([(1, _partial(1, 4))], now_ms=1)
    (published,) = effects.published
    _prefix(log, effects, 1)  # the partial landed; its publication's bookkeeping and the checkpoint did not
    restored = _merger()
    again = restored.restore(log.items())
    assert again.published == [published], "the batch is complete in the restored state: published now"
    assert restored.process([(1, _partial(1, 4))], now_ms=5).published == []  # its input again: nothing new
    log2: dict = dict(log)
    _log(log2, again)
    assert _merger().restore(log2.items()).published == [published]  # and repeated, identical, from then on


def test_a_revision_whose_publication_was_lost_with_the_rest_of_its_group_is_published_at_restore():
    m = _merger()
    log: dict = {}
    _log(log, m.process([(0, _partial(0, 3)), (1, _partial(1, 4))], now_ms=0))
    effects = m.process([(2, _partial(1, 5, revision=1))], now_ms=1)
    (revised,) = effects.published
    assert revised.revision == 1
    _prefix(log, effects, 1)
    again = _merger().restore(log.items())
    assert again.published[-1] == revised and all(p.revision <= 1 for p in again.published)


def test_restore_reads_the_checkpoint_written_before_it_was_a_struct():
    m = _merger()
    m.restore([(stage2_checkpoint_key(0), b"41")])
    assert m.checkpoint == 41


def test_state_writes_are_o1_per_partial_and_o_p_per_batch():
    """A partial is written once, under a key of its own, with the batch's small bookkeeping
    entry: the bytes written for the 64th partial are those of the first (they grew with the
    partials before: the whole entry was written again each time)."""
    partitions = 64
    m = BatchMerger(0, partitions_expected=partitions, batch_timeout_ms=TIMEOUT_MS, grace_ms=GRACE_MS)
    written = []
    for p in range(partitions):
        effects = m.process([(p, _partial(p, 3))], now_ms=p)
        written.append(sum(len(k) + len(v or b"") for k, v in effects.changelog))
    assert max(written[1:-1]) <= written[0] + 16  # (the last one publishes: its digest and revision differ)
    assert len(effects.published) == 1


def test_partials_before_the_publication_are_written_alone():
    """Between a batch's first partial and the one that publishes it, a partial is one write
    (with the checkpoint): the bookkeeping changed only in ``last_change_ms``, which nothing
    reads before the publication (that one writes it)."""
    partitions = 8
    m = BatchMerger(0, partitions_expected=partitions, batch_timeout_ms=TIMEOUT_MS, grace_ms=GRACE_MS)
    entry_key = merge_key(0, (None, "b"))
    books = []
    for p in range(partitions):
        effects = m.process([(p, _partial(p, 3))], now_ms=p)
        books.append(sum(key == entry_key for key, _ in effects.changelog))
        assert len(effects.changelog) == 2 + books[-1]  # the partial, the checkpoint, the bookkeeping or not
    assert books == [1] + [0] * (partitions - 2) + [1]
    assert m.process([(partitions, _partial(0, 4, revision=1))], now_ms=9).changelog[1][0] == entry_key


def test_a_merge_restored_between_any_two_partials_ends_as_the_live_one():
    """A crash after any partial: the restored merger publishes, times out and forgets each
    batch exactly when and as the live one does (one batch completes, one times out)."""
    partitions = 4
    feed = [(0, _partial(0, 1, batch="done")), (1, _partial(0, 2, batch="late")), (2, _partial(1, 3, batch="done"))]
    feed += [(3, _partial(2, 4, batch="done")), (4, _partial(1, 5, batch="late")), (5, _partial(3, 6, batch="done"))]
    feed += [(6, _partial(2, 7, batch="late", revision=1))]
    ticks = [TIMEOUT_MS - 1, TIMEOUT_MS + 10, TIMEOUT_MS + 10 + GRACE_MS + TIMEOUT_MS - 1, 3 * TIMEOUT_MS + GRACE_MS]

    def fresh() -> BatchMerger:
        return BatchMerger(0, partitions_expected=partitions, batch_timeout_ms=TIMEOUT_MS, grace_ms=GRACE_MS)

    def run(crash_after: int | None) -> list:
        """Feed, then tick; ``crash_after``: restore from the changelog after that step."""
        m, log, seen = fresh(), {}, []
        steps = [("feed", item) for item in feed] + [("tick", now) for now in ticks]
        for i, (kind, item) in enumerate(steps):
            if kind == "feed":
                offset, partial = item
                effects = m.process([(offset, partial)], now_ms=offset)
                seen += [(x.batch_id, x.revision, x.record_count, x.complete) for x in effects.published]
            else:
                effects = m.tick(item)
                seen += [(item, x.batch_id, x.revision, x.record_count, x.complete) for x in effects.published]
                seen.append((item, sorted(b for _, b in m.entries)))
            _log(log, effects)
            if crash_after == i:
                m = fresh()
                _log(log, m.restore(log.items()))  # (its repeated publication is identical: not counted again)
        return seen

    live = run(None)
    assert ("done", 0, 4, True) in live and (TIMEOUT_MS + 10, "late", 0, 3, False) in live
    assert (7009, ["late"]) in live and (8000, []) in live  # each forgotten a grace and a timeout after its publication
    for crash_after in range(len(feed) + len(ticks)):
        assert run(crash_after) == live, crash_after


def test_restore_from_split_partials_equals_the_live_merger_and_forgets_orphans():
    m = _merger()
    log: dict = {}
    effects = m.process([(0, _partial(0, 3)), (1, _partial(1, 4)), (2, _partial(1, 6, revision=1))], now_ms=0)
    _log(log, effects)
    prefix = merge_partial_prefixes(0)[0]
    assert sum(k.startswith(prefix) for k in log) == 2  # one key per records partition, the latest revision
    orphan = prefix + b"gone\x1f0000000003"
    log[orphan] = encode_partial(_partial(3, 1, batch="gone"))  # its entry deleted, then a crash
    restored = _merger()
    again = restored.restore(log.items())
    assert again.changelog == [(orphan, None)]
    assert restored.entries[(None, "b")].partials == m.entries[(None, "b")].partials
    assert again.published == effects.published[-1:]


def test_an_entry_written_with_its_partials_restores_and_is_split_at_its_next_write():
    """A merge entry of the format before the split (its partials inside) still restores; its
    next write puts every partial under its own key, so nothing is lost after that."""
    old = MergeEntry(batch_id="b", partials={0: _partial(0, 3)}, first_seen_ms=0, last_change_ms=0)
    m = _merger()
    m.restore([(merge_key(0, (None, "b")), encode_state(old))])
    effects = m.process([(0, _partial(1, 4))], now_ms=1)
    (published,) = effects.published
    assert published.metrics["spec/accepted_total"] == 7
    log: dict = {}
    _log(log, effects)
    restored = _merger()
    assert restored.restore(log.items()).published == [published]


def test_a_partial_from_a_worker_before_tasks_still_merges():
    """Upgraded mid-run, one records partition's partial comes from a worker before
    revision 4: no per-task sums, no inconsistent count (the fields appended since are
    absent from its bytes). It merges: its generations are the unknown task's, and the
    batch's totals are whole."""
    import msgspec

    from specmeter.schemas import decode_partial

    new = BatchState("b")
    new.add(
        GenerationRecord(
            batch_id="b",
            session_id="s0",
            generation_id="g",
            accepted=3,
            proposed=4,
            verify=9,
            accept_histogram=[1, 2],
            task="gsm8k",
        )
    )
    old = BatchState("b")
    old.add(
        GenerationRecord(batch_id="b", session_id="s1", generation_id="g", accepted=1, proposed=4, weight_version="v1")
    )
    fields = msgspec.to_builtins(old.partial(partition=1))
    for name in ("inconsistent_generation_count", "tasks", "too_many_tasks"):
        del fields[name]
    older = decode_partial(msgspec.msgpack.encode(fields))  # the partials topic's msgpack, as it wrote it
    assert older.tasks == [] and older.inconsistent_generation_count == 0
    m = _merger()
    m.process([(0, new.partial(partition=0))], now_ms=0)
    (out,) = m.process([(1, older)], now_ms=1).published
    assert out.metrics["spec/accepted_total"] == 4 and out.metrics["spec/inconsistent_generation_count"] == 1
    assert [(e.task, e.metrics["spec/accepted_total"]) for e in out.by_task] == [("gsm8k", 3), (None, 1)]
    assert [(e.weight_version, e.metrics["spec/accepted_total"]) for e in out.by_weight_version] == [
        ("v1", 1),
        (None, 3),
    ]


def test_a_partial_from_a_worker_before_draft_lags_still_merges(core):
    """Upgraded mid-run, one records partition's partial comes from a worker before
    revision 5: no per-lag sums, no spread (the fields appended since are absent from its
    bytes). It merges: its generations are the unknown lag's, the batch's totals are
    whole, and the spread is the newer partition's (the older one never counted it)."""
    import msgspec

    from specmeter.schemas import decode_partial

    new = core.BatchState("b")
    for generation, lag in (("g", 1), ("h", 0)):
        new.add(
            GenerationRecord(
                batch_id="b",
                session_id="s0",
                generation_id=generation,
                accepted=3,
                proposed=4,
                verify=2,
                completion=5,
                draft_lag=lag,
            )
        )
    old = core.BatchState("b")
    old.add(GenerationRecord(batch_id="b", session_id="s1", generation_id="g", accepted=1, proposed=4, task="chat"))
    fields = msgspec.to_builtins(old.partial(partition=1))
    for name in ("draft_lags", "too_many_draft_lags", "tokens_per_verify_distribution"):
        del fields[name]
    older = decode_partial(msgspec.msgpack.encode(fields))  # the partials topic's msgpack, as it wrote it
    assert older.draft_lags == [] and older.tokens_per_verify_distribution is None
    m = _merger()
    m.process([(0, new.partial(partition=0))], now_ms=0)
    (out,) = m.process([(1, older)], now_ms=1).published
    assert out.metrics["spec/accepted_total"] == 7
    assert [(e.draft_lag, e.metrics["spec/accepted_total"]) for e in out.by_draft_lag] == [(0, 3), (1, 3), (None, 1)]
    assert [(e.task, e.metrics["spec/accepted_total"]) for e in out.by_task] == [("chat", 1), (None, 6)]
    assert out.tokens_per_verify_distribution == [0] * 6 + [2] + [0] * 57  # 5 / 2 = 2.5: bucket 6, twice
