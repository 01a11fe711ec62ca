"""Stage 2, pure: merge partitions' partials of a batch and decide publication.

A batch is published when every records partition has reported, or when
``batch_timeout`` passed since its first partial (then ``complete`` is false).
A later partial (late records, a slow partition) publishes a new revision, but
only if the content changed, so replays after a crash publish nothing new.

State writes are O(1) per partial, O(P) per batch: a partial is written under its own
key when it arrives, beside the batch's small bookkeeping entry, never again with the
partials that follow it.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

import msgspec

from specmeter.schemas import BatchMetrics, PartialAggregate, decode_partial, encode_partial

from .counts import WorkerCounters
from .layout import (
    BatchKey,
    MergeEntry,
    Stage2Checkpoint,
    content_digest,
    decode_merge_entry,
    decode_stage2_checkpoint,
    encode_state,
    merge_key,
    merge_key_prefixes,
    merge_partial_key,
    merge_partial_prefixes,
    stage2_checkpoint_key,
)
from .merge import build_batch_metrics
from .ownership import owner_key_part, refuse_without_checkpoint, split_key
from .stage1 import shorten

__all__ = ["BatchMerger", "MergeEffects", "MergeWaiting"]

log = logging.getLogger("specmeter.stage2")


@dataclass
class MergeEffects:
    changelog: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    published: list[BatchMetrics] = field(default_factory=list)
    #: deletions to send once this call's changelog writes are verified (``stage1.Effects``)
    verified_deletions: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MergeWaiting:
    """A batch not published yet, waiting for partials (``/specmeter/stats``, the log)."""

    run_id: str | None
    batch_id: str
    partitions_reported: tuple[int, ...]
    partitions_expected: int
    #: since its first partial
    waited_ms: int
    #: until it is published by timeout, incomplete
    publishes_in_ms: int


def _takes(entry: MergeEntry, partial: PartialAggregate) -> bool:
    """Whether a partial replaces what the batch holds of its partition: not when it is
    a repeat or an older revision. The same revision with other content is taken (a
    stage-1 owner that restored from a state its predecessor had written past; the
    later one is the restored truth), and said."""
    known = entry.partials.get(partial.partition)
    if known is None:
        return True
    if known.revision > partial.revision or known == partial:
        return False
    if known.revision == partial.revision:
        log.warning(
            "batch=%s run=%s partition=%d: revision %d arrived again with other content; taking the later one",
            shorten(partial.batch_id),
            shorten(partial.run_id),
            partial.partition,
            partial.revision,
        )
    return True


def _newer(entry: MergeEntry, partial: PartialAggregate) -> bool:
    """Whether a restored partial is a newer revision than what its batch holds of its
    partition (restored partials come in any order)."""
    known = entry.partials.get(partial.partition)
    return known is None or known.revision < partial.revision


class BatchMerger:
    """Every batch whose partials land on one partition of the partials topic."""

    def __init__(
        self,
        partition: int,
        *,
        partitions_expected: int,
        batch_timeout_ms: int,
        grace_ms: int,
        counters: WorkerCounters | None = None,
        owner_epoch: int | None = None,
    ) -> None:
        self.partition = partition
        #: the first part of every key this owner writes (``ownership``)
        self.owner_epoch = owner_epoch
        self.key_part = owner_key_part(partition, owner_epoch)
        self.partitions_expected = partitions_expected
        self.batch_timeout_ms = batch_timeout_ms
        self.grace_ms = grace_ms
        self.counters = counters if counters is not None else WorkerCounters()
        self.entries: dict[BatchKey, MergeEntry] = {}
        #: last partials-topic offset whose effects are durable
        self.checkpoint = -1
        #: batches restored from entries that held their partials (written before the split):
        #: their next write writes every partial under its own key
        self._unsplit: set[BatchKey] = set()
        #: whether a restore found a checkpoint
        self._checkpoint_found = False

    def restore(self, entries: Iterable[tuple[bytes, bytes]]) -> MergeEffects:
        """Rebuild from the changelog (``restoring`` at once)."""
        steps = self.restoring(entries)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def restoring(self, entries: Iterable[tuple[bytes, bytes]]) -> Generator[None, None, MergeEffects]:
        """Rebuild from the valid changelog entries (physical keys, tagged by their owners:
        ``ownership``), yielding now and then. Returns each batch's latest publication, to
        send again (the state that says it was published may be durable while the
        publication itself was lost in a crash; the repeat is identical), the deletion of
        partials whose batch was forgotten (a crash between the deletions left them
        behind), and, when the keys were another owner's, the whole state written again
        under this owner's tag with the keys it replaces deleted: a late write of the
        previous owner under its own tag can then never leave a restore without it."""
        effects = MergeEffects()
        kept: list[tuple[bytes, PartialAggregate]] = []
        replaced = yield from self._read_all(entries, kept)
        refuse_without_checkpoint(f"partials partition {self.partition}", replaced, self._checkpoint_found)
        orphans = self._attach_partials(kept, effects)
        self._own_again(replaced, orphans, effects)
        log.debug("partition=%d restored merges=%d checkpoint=%d", self.partition, len(self.entries), self.checkpoint)
        self._publish_again(effects)
        return effects

    def _read_all(
        self, entries: Iterable[tuple[bytes, bytes]], kept: list[tuple[bytes, PartialAggregate]]
    ) -> Generator[None, None, list[bytes]]:
        """Restore every record (``_read``), yielding now and then; returns the keys of
        another owner, to write again under this one's."""
        replaced: list[bytes] = []
        for n, (key, value) in enumerate(entries):
            if value is None or not self._read(key, value, kept):
                continue
            if split_key(key)[1] != self.owner_epoch:
                replaced.append(key)
            if n % 256 == 255:
                yield
        return replaced

    def _read(self, key: bytes, value: bytes, kept: list[tuple[bytes, PartialAggregate]]) -> bool:
        """Restore one changelog record: the checkpoint or a batch's bookkeeping at once,
        a partial into ``kept``; whether it was one of this partition's records."""
        logical, _ = split_key(key)
        if logical == stage2_checkpoint_key(self.partition):
            self.checkpoint = decode_stage2_checkpoint(value).offset
            self._checkpoint_found = True
        elif logical.startswith(merge_key_prefixes(self.partition)):
            entry = decode_merge_entry(value)
            self.entries[entry.key] = entry
            if entry.partials:
                self._unsplit.add(entry.key)
        elif logical.startswith(merge_partial_prefixes(self.partition)):
            kept.append((key, decode_partial(value)))
        else:
            return False
        return True

    def _attach_partials(self, kept: list[tuple[bytes, PartialAggregate]], effects: MergeEffects) -> set[bytes]:
        """Give each restored partial to its batch (the newest revision of each partition);
        returns the keys of those whose batch was forgotten (the entry's deletion came
        first, then a crash), deleted."""
        orphans = set()
        for key, partial in kept:
            owner = self.entries.get((partial.run_id, partial.batch_id))
            if owner is None:
                orphans.add(key)
                effects.changelog.append((key, None))
                continue
            if _newer(owner, partial):
                owner.partials[partial.partition] = partial
        return orphans

    def _own_again(self, replaced: list[bytes], orphans: set[bytes], effects: MergeEffects) -> None:
        """When another owner's keys were restored (or this is an owner): the whole state
        written again under this owner's keys, and the keys it replaces deleted (orphans
        aside: deleted already)."""
        if replaced or self.owner_epoch is not None:
            self._write_all_again(effects)
            # deleted once the writes that replace them count (``delivery.writes``)
            effects.verified_deletions.extend(key for key in replaced if key not in orphans)

    def _write_all_again(self, effects: MergeEffects) -> None:
        """The whole state, written again under this owner's keys."""
        for entry in self.entries.values():
            self._unsplit.add(entry.key)  # every partial written again, under this owner's keys
            self._write(entry, effects)
        if self.checkpoint >= 0 or self.owner_epoch is not None:
            # an owner writes its checkpoint at its restore, found or not: a valid entry of
            # its then implies a valid checkpoint (``ownership.refuse_without_checkpoint``)
            effects.changelog.append(self._checkpoint_write())

    def _publish_again(self, effects: MergeEffects) -> None:
        """Each batch's latest publication, to send again (identical to the first); then
        what the restored state holds and no publication says yet, published now as
        ``on_partial`` would have, with its bookkeeping (``_publish_owed``)."""
        for entry in self.entries.values():
            if entry.published_revision >= 0:
                self._repeat(entry, effects)
            self._publish_owed(entry, effects)

    def _repeat(self, entry: MergeEntry, effects: MergeEffects) -> None:
        """The entry's latest publication again, when the restored state reproduces it."""
        metrics, digest = self._metrics(entry, entry.published_revision)
        if digest == entry.published_digest:
            effects.published.append(metrics)
        else:  # a partial written after it, its publication not: published next (``_publish_owed``)
            log.debug(
                "batch=%s run=%s: restored state moved past revision %d; publishing the next",
                shorten(entry.batch_id),
                shorten(entry.run_id),
                entry.published_revision,
            )

    def _publish_owed(self, entry: MergeEntry, effects: MergeEffects) -> None:
        """A write group lands in part when its worker stops while sending it (a write
        refused, a crash): a partial can be durable while the publication it completed, and
        its bookkeeping, are not. Its input is then before the checkpoint, so it never comes
        again: the restore publishes what the state holds (a complete batch never published,
        a published one whose content moved), as the partial would have."""
        if not self._publishes(entry):
            return
        revision = entry.published_revision
        self._publish(entry, effects)
        if entry.published_revision != revision:
            self._write(entry, effects)

    def process(self, messages: Iterable[tuple[int, PartialAggregate]], now_ms: int) -> MergeEffects:
        """Apply partials in offset order; the checkpoint is written last."""
        effects = MergeEffects()
        last = None
        for offset, partial in messages:
            if offset <= self.checkpoint:
                continue
            sub = self.on_partial(partial, now_ms)
            effects.changelog.extend(sub.changelog)
            effects.published.extend(sub.published)
            last = offset
        if last is not None:
            self.checkpoint = last
            effects.changelog.append(self._checkpoint_write())
        return effects

    def _checkpoint_write(self) -> tuple[bytes, bytes]:
        return stage2_checkpoint_key(self.key_part), encode_state(Stage2Checkpoint(offset=self.checkpoint))

    def on_partial(self, partial: PartialAggregate, now_ms: int) -> MergeEffects:
        effects = MergeEffects()
        entry, new = self._entry_of(partial, now_ms)
        if not _takes(entry, partial):
            return effects  # a replayed or stale partial
        entry.partials[partial.partition] = partial
        entry.last_change_ms = now_ms
        if self._publishes(entry):
            self._publish(entry, effects)
        # Until its first publication an entry's bookkeeping changes only in last_change_ms,
        # which nothing reads before then (the timeout runs from first_seen_ms, the grace
        # from the publication, which writes it): the partials between the first and the
        # publishing one are written alone, one write per partial instead of two.
        self._write(entry, effects, partial, book=new or entry.published_revision >= 0)
        return effects

    def _publishes(self, entry: MergeEntry) -> bool:
        """Whether a batch publishes what its partials hold now (a revision whose content
        changed): every partition reported, or it was published already."""
        return len(entry.partials) >= self.partitions_expected or entry.published_revision >= 0

    def _entry_of(self, partial: PartialAggregate, now_ms: int) -> tuple[MergeEntry, bool]:
        """The merge a partial belongs to, and whether it is new (its first partial opens
        it: its timeout runs from ``now_ms``)."""
        key = (partial.run_id, partial.batch_id)
        entry = self.entries.get(key)
        if entry is not None:
            return entry, False
        entry = self.entries[key] = MergeEntry(batch_id=partial.batch_id, run_id=partial.run_id, first_seen_ms=now_ms)
        return entry, True

    def _write(
        self, entry: MergeEntry, effects: MergeEffects, partial: PartialAggregate | None = None, *, book: bool = True
    ) -> None:
        """Write, when given, the partial that changed a batch (every partial of an entry
        restored from the format that held them, and then its bookkeeping too) and, when
        ``book``, its bookkeeping."""
        unsplit = entry.key in self._unsplit
        written = list(entry.partials.values()) if unsplit else [partial] if partial else []
        self._unsplit.discard(entry.key)
        for p in written:
            effects.changelog.append((merge_partial_key(self.key_part, entry.key, p.partition), encode_partial(p)))
        if book or unsplit:
            bookkeeping = msgspec.structs.replace(entry, partials={})
            effects.changelog.append((merge_key(self.key_part, entry.key), encode_state(bookkeeping)))

    def waiting(self, now_ms: int) -> list[MergeWaiting]:
        """The batches waiting for some partitions' partials before their first publication."""
        return [
            MergeWaiting(
                run_id=entry.run_id,
                batch_id=entry.batch_id,
                partitions_reported=tuple(sorted(entry.partials)),
                partitions_expected=self.partitions_expected,
                waited_ms=now_ms - entry.first_seen_ms,
                publishes_in_ms=max(0, entry.first_seen_ms + self.batch_timeout_ms - now_ms),
            )
            for entry in self.entries.values()
            if entry.published_revision < 0
        ]

    def tick(self, now_ms: int) -> MergeEffects:
        """Publish, incomplete, the batches that waited ``batch_timeout`` for their
        partitions; forget those published longer ago than grace and the timeout."""
        effects = MergeEffects()
        for entry in list(self.entries.values()):
            if entry.published_revision < 0:
                self._publish_if_timed_out(entry, now_ms, effects)
            elif now_ms - entry.last_change_ms >= self.grace_ms + self.batch_timeout_ms:
                self._forget(entry, effects)
        return effects

    def _publish_if_timed_out(self, entry: MergeEntry, now_ms: int, effects: MergeEffects) -> None:
        """A batch never published that waited ``batch_timeout`` since its first partial:
        published now, incomplete, and its bookkeeping written."""
        if now_ms - entry.first_seen_ms < self.batch_timeout_ms:
            return
        # grace runs from this publication, as stage 1's from a batch's close: a merge
        # restored after downtime must still take the partials that follow it
        entry.last_change_ms = now_ms
        self._publish(entry, effects)
        self._write(entry, effects)

    def _forget(self, entry: MergeEntry, effects: MergeEffects) -> None:
        """Delete a batch's state: the entry first (a crash between leaves partials without
        an entry, ignored at restore), then its partials."""
        del self.entries[entry.key]
        self._unsplit.discard(entry.key)
        effects.changelog.append((merge_key(self.key_part, entry.key), None))
        effects.changelog.extend((merge_partial_key(self.key_part, entry.key, p), None) for p in entry.partials)

    def _publish(self, entry: MergeEntry, effects: MergeEffects) -> None:
        metrics, digest = self._metrics(entry, entry.published_revision + 1)
        if digest == entry.published_digest:
            return
        entry.published_revision += 1
        entry.published_digest = digest
        effects.published.append(metrics)
        self.counters.batches_published += 1

    def _metrics(self, entry: MergeEntry, revision: int) -> tuple[BatchMetrics, bytes]:
        """The entry's BatchMetrics at ``revision`` and the digest of its content (revision aside)."""
        partials = [entry.partials[p] for p in sorted(entry.partials)]
        metrics = build_batch_metrics(
            partials,
            revision=revision,
            close_reason=self._close_reason(partials),
            closed_at=max(p.closed_at_ms for p in partials) / 1000,
            partitions_expected=self.partitions_expected,
        )
        body = msgspec.structs.replace(metrics, revision=0)
        return metrics, content_digest(body)

    def _close_reason(self, partials: list[PartialAggregate]) -> str:
        """``incomplete`` when a partition closed it early at its open-generation limit,
        ``markers`` when every partition reported and closed it on markers, else ``timeout``."""
        if any(p.close_reason == "incomplete" for p in partials):
            return "incomplete"
        all_reported = len(partials) >= self.partitions_expected
        return "markers" if all_reported and all(p.close_reason == "markers" for p in partials) else "timeout"
