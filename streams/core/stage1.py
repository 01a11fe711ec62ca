"""Stage 1, pure: one records-topic partition's batches, from messages to partials.

Decides *when* (markers, timeouts, grace) with times passed in; the core
decides *what*. Returns effects for the Faust shell to carry out, in order:
changelog writes (deltas, statuses, then the checkpoint), partials, dead letters.

Exactly-once state without transactions: every chunk's deltas and a checkpoint
(the chunk's last offset) go to the same changelog partition in order, so a
durable checkpoint implies durable deltas. On restore, deltas past the
checkpoint are stale (their chunk will be processed again) and are deleted, and
messages at or below the checkpoint are skipped.

Batch identity is ``(run_id, batch_id)``: two runs never share state. The
default run (None) keeps the changelog key layout it had before runs existed.

The core (dedup state and decoder) is the native one when built, else the Python
reference (``cores``); both answer the same calls: a message is decoded into groups
of records, one per batch, and a slice of a group is applied with ``add_decoded``.

Bounded state: a partition holds at most ``max_open_generations`` distinct
generations. A batch whose input finds the limit reached is closed early (reason
``incomplete``) with what fitted, its partial emitted and its state dropped; the
rest of its input is dead-lettered as ``overflow``. Memory per partition stays near the limit
whatever a producer floods in.

Late for the whole life of a run (SPEC §4): an expired or overflowed batch is
remembered by its 64-bit hash for ``expired_retention_ms`` (``expired``), written to
the changelog once when it goes (``x``/``y`` keys, not with every checkpoint), so
its input is dead-lettered and it never opens again, however many batches came since.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field

import msgspec

from specmeter.schemas import (
    BatchMarker,
    DeadLetter,
    GenerationRecord,
    InvalidRecord,
    PartialAggregate,
    RecordBatch,
    decode_partial,
    encode_partial,
    encode_records_message,
)

from .cores import CORE, Core
from .counts import WorkerCounters
from .exact import exact_sum
from .expired import GoneIds
from .layout import (
    BatchDelta,
    BatchKey,
    BatchStatus,
    Checkpoint,
    GoneBatches,
    batch_from_durable,
    batch_hash,
    checkpoint_key,
    content_digest,
    decode_checkpoint,
    decode_delta,
    decode_gone,
    decode_status,
    delta_key,
    encode_state,
    expired_key,
    key_number,
    overflow_key,
    overflowed_key,
    pack_hashes,
    state_key_prefix,
    status_key,
    unpack_hashes,
)
from .ownership import StateWithoutCheckpoint, owner_key_part, refuse_without_checkpoint, split_key
from .state import BatchState, Decoded

__all__ = ["PartitionProcessor", "Effects", "StateWithoutCheckpoint", "Waiting", "shorten"]

log = logging.getLogger("specmeter.stage1")
#: how long an expired (or overflowed) batch is remembered by default: a week
EXPIRED_RETENTION_MS = 7 * 24 * 3600 * 1000
#: a dead letter carries at most this much of the rejected message (brokers refuse
#: messages over 1 MiB by default; base64 in JSON adds a third)
DEAD_LETTER_RAW_LIMIT = 256 * 1024


def shorten(value: object, limit: int = 80) -> str:
    """repr() of an id for logs and dead-letter details, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _describe(key: BatchKey) -> str:
    run_id, batch_id = key
    return f"batch {shorten(batch_id)}" + ("" if run_id is None else f" of run {shorten(run_id)}")


@dataclass
class Effects:
    """What the shell must do after a call, in this order."""

    changelog: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    partials: list[PartialAggregate] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: deletions of state that this call's changelog writes made dead (an expiry's ``x``
    #: key, an overflow's ``y`` key and checkpoint), to send only once those writes are
    #: acknowledged in place (``_writes``), never with them: the writes of a call may
    #: outlive their owner (``_ownership``), and a deletion that lands without the record
    #: that justifies it would take state its successor restored
    verified_deletions: list[bytes] = field(default_factory=list)


@dataclass
class _Batch:
    state: BatchState
    last_input_ms: int
    closed: bool = False
    close_reason: str | None = None
    closed_at_ms: int = 0
    revision: int = -1
    partial_digest: bytes = b""
    delta_keys: list[bytes] = field(default_factory=list)
    #: producers whose marker for the batch arrived on this partition (to explain a wait)
    marker_producers: set[str] = field(default_factory=set)

    @property
    def key(self) -> BatchKey:
        return (self.state.run_id, self.state.batch_id)

    def status(self) -> BatchStatus:
        return BatchStatus(
            batch_id=self.state.batch_id,
            run_id=self.state.run_id,
            closed=self.closed,
            close_reason=self.close_reason,
            closed_at_ms=self.closed_at_ms,
            revision=self.revision,
            partial_digest=self.partial_digest,
        )


@dataclass(frozen=True, slots=True)
class Waiting:
    """An open batch of one partition, and what it waits for (``/specmeter/stats``, the log)."""

    run_id: str | None
    batch_id: str
    #: producers whose marker arrived; ``expected_producers`` of them close it (0: no marker yet)
    marker_producers: frozenset[str]
    expected_producers: int
    #: since its last input
    idle_ms: int
    #: until it closes by timeout unless more input comes
    closes_in_ms: int


def _digest(partial: PartialAggregate) -> bytes:
    """Identity of a partial's content, revision and close time aside. The ratio
    sums count by their exact value: their expansion terms depend on the order the
    samples were folded in, which differs between a live and a restored state."""
    body = msgspec.structs.replace(
        partial,
        revision=0,
        closed_at_ms=0,
        accept_ratio_parts=[str(exact_sum(partial.accept_ratio_parts))],
        length_ratio_parts=[str(exact_sum(partial.length_ratio_parts))],
    )
    return content_digest(body)


@dataclass
class _Found:
    """What a restore read from a partition's changelog, by kind."""

    now_ms: int
    #: the restore's effects: the deletions decided while reading go first
    effects: Effects
    deltas: list[tuple[bytes, BatchDelta]] = field(default_factory=list)
    #: (run_id, batch_id) -> (its key, its status)
    statuses: dict[BatchKey, tuple[bytes, BatchStatus]] = field(default_factory=dict)
    overflow_partials: list[PartialAggregate] = field(default_factory=list)
    #: kind (x: expired, y: overflowed) -> (number, at_ms, hashes)
    gone: dict[bytes, list[tuple[int, int, bytes]]] = field(default_factory=lambda: {b"x": [], b"y": []})
    #: a checkpoint written before issue 21, whose lists are written again
    legacy: Checkpoint | None = None
    #: the key the checkpoint was found under
    checkpoint_at: bytes | None = None


class PartitionProcessor:
    """All open and recently closed batches of one records-topic partition."""

    def __init__(
        self,
        partition: int,
        *,
        source_topic: str,
        batch_timeout_ms: int,
        grace_ms: int,
        max_message_bytes: int | None = None,
        max_open_generations: int | None = None,
        counters: WorkerCounters | None = None,
        core: Core | None = None,
        expired_retention_ms: int = EXPIRED_RETENTION_MS,
        owner_epoch: int | None = None,
    ) -> None:
        self.partition = partition
        #: the first part of every key this owner writes (``ownership``): the partition,
        #: tagged with the epoch of the worker's takeover (untagged offline and in tests)
        self.key_part = owner_key_part(partition, owner_epoch)
        #: the stage-1 core: the loaded one unless a test picks one
        self.core = core if core is not None else CORE
        self.source_topic = source_topic
        self.batch_timeout_ms = batch_timeout_ms
        self.grace_ms = grace_ms
        self.max_message_bytes = max_message_bytes
        self.counters = counters if counters is not None else WorkerCounters()
        self.checkpoint = -1
        self.batches: dict[BatchKey, _Batch] = {}
        #: batches closed more than grace ago, for ``expired_retention_ms`` (their input is late)
        self.expired = GoneIds(expired_retention_ms)
        self.max_open_generations = max_open_generations
        #: batches closed early at the open-generation limit (their input is dead-lettered)
        self.overflowed = GoneIds(expired_retention_ms)
        #: hashes of the batches overflowed in the current chunk (written with its checkpoint)
        self._overflowed_now: set[int] = set()
        #: the time of the last ``x`` key written: each expiry tick gets a key of its own
        self._last_expired_ms = -1
        #: distinct generations held over all batches (open or within grace)
        self.open_generations = 0
        self._dropped: list[_Batch] = []
        #: status writes of the current call: they go after its checkpoint (see ``_flush_statuses``)
        self._statuses: list[tuple[bytes, bytes]] = []
        #: overflowed batches whose last partial is kept (re-sent on restore) until grace ends
        self._overflow_partials: dict[BatchKey, int] = {}  # batch -> closed_at_ms
        #: the keys of restored expired (x), overflowed (y) and overflow-partial (o) records
        #: another owner wrote (under its tag), for their deletion when their time comes
        self._gone_keys: dict[tuple[bytes, int], bytes] = {}
        self._overflow_keys: dict[BatchKey, bytes] = {}

    # -- restore ------------------------------------------------------------------
    def restore(self, entries: Iterable[tuple[bytes, bytes]], now_ms: int) -> Effects:
        """Rebuild from the changelog entries of this partition (``restoring`` at once)."""
        steps = self.restoring(entries, now_ms)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def restoring(self, entries: Iterable[tuple[bytes, bytes]], now_ms: int) -> Generator[None, None, Effects]:
        """Rebuild from the valid changelog entries of this partition (any order; physical
        keys, tagged by their owners: ``ownership``), yielding between deltas so that a
        worker restoring a large state keeps answering (heartbeats, probes, other input).

        Returns the deletions of stale deltas (past the checkpoint or of expired
        batches), the checkpoint and statuses written again under this owner's tag, and
        the partials of closed batches, to send again.
        """
        effects = Effects()
        found = yield from self._read_changelog(entries, now_ms, effects)
        restored = [key for key, _ in found.deltas] + [key for key, _ in found.statuses.values()]
        refuse_without_checkpoint(f"partition {self.partition}", restored, found.checkpoint_at is not None)
        self._restore_gone(found.gone, found.legacy, now_ms, effects)
        yield from self._apply_deltas(found.deltas, effects)
        replaced = self._own_checkpoint_and_statuses(found, effects)
        self.open_generations = sum(b.state.generation_count for b in self.batches.values())
        self._send_partials_again(now_ms, effects)
        self._flush_statuses(effects)
        # deleted once the writes that replace them count (``delivery.writes``): a restore's
        # writes may land after a newer owner's takeover, and these keys then still hold the state
        effects.verified_deletions.extend(replaced)
        effects.partials.extend(found.overflow_partials)
        log.info(
            "partition=%d restored batches=%d checkpoint=%d expired=%d overflowed=%d changelog_writes=%d",
            self.partition,
            len(self.batches),
            self.checkpoint,
            len(self.expired),
            len(self.overflowed),
            len(effects.changelog),
        )
        return effects

    def _read_changelog(
        self, entries: Iterable[tuple[bytes, bytes]], now_ms: int, effects: Effects
    ) -> Generator[None, None, _Found]:
        """Sort this partition's changelog records by kind (``layout``'s key letters; upper
        case: a named run's), a step per record read; the checkpoint's offset is restored
        at once. Decoding the deltas is a restore's largest piece (92 ms in one step for a
        partition of 48k records in 20 batches, the longest stall of a rebalance)."""
        prefix = state_key_prefix(self.partition)
        found = _Found(now_ms=now_ms, effects=effects)
        readers: dict[bytes, Callable[[bytes, bytes, _Found], None]] = {
            b"c": self._read_checkpoint,
            b"x": functools.partial(self._read_gone, b"x"),
            b"y": functools.partial(self._read_gone, b"y"),
            b"d": self._read_delta,
            b"s": self._read_status,
            b"o": self._read_overflow_partial,
        }
        for key, value in entries:
            logical, _ = split_key(key)
            if not logical.startswith(prefix) or value is None:
                continue
            kind = logical[len(prefix) : len(prefix) + 1].lower()
            read = readers.get(kind)
            if read is not None:
                read(key, value, found)
                yield
        return found

    def _read_checkpoint(self, key: bytes, value: bytes, found: _Found) -> None:
        checkpoint = decode_checkpoint(value)
        self.checkpoint, found.checkpoint_at = checkpoint.offset, key
        if checkpoint.expired or checkpoint.overflowed:
            found.legacy = checkpoint  # written before issue 21: its lists are written again below

    def _read_gone(self, kind: bytes, key: bytes, value: bytes, found: _Found) -> None:
        record = decode_gone(value)
        number = key_number(key)
        found.gone[kind].append((number, record.at_ms, record.hashes))
        self._gone_keys[(kind, number)] = key

    def _read_delta(self, key: bytes, value: bytes, found: _Found) -> None:
        found.deltas.append((key, decode_delta(value)))

    def _read_status(self, key: bytes, value: bytes, found: _Found) -> None:
        status = decode_status(value)
        found.statuses[(status.run_id, status.batch_id)] = (key, status)

    def _read_overflow_partial(self, key: bytes, value: bytes, found: _Found) -> None:
        partial = decode_partial(value)
        if found.now_ms - partial.closed_at_ms >= self.grace_ms:
            found.effects.changelog.append((key, None))  # stage 2 has forgotten the batch too
            return
        found.overflow_partials.append(partial)
        self._overflow_partials[(partial.run_id, partial.batch_id)] = partial.closed_at_ms
        self._overflow_keys[(partial.run_id, partial.batch_id)] = key

    def _apply_deltas(self, deltas: list[tuple[bytes, BatchDelta]], effects: Effects) -> Generator[None, None, None]:
        """Apply the deltas up to the checkpoint in offset order, one per step; delete
        those past it (their chunk is read again) and those of batches gone for good."""
        for key, delta in sorted(deltas, key=lambda kd: kd[1].last_offset):
            batch_key = (delta.run_id, delta.batch_id)
            if delta.last_offset > self.checkpoint or self._gone_reason(batch_key) is not None:
                effects.changelog.append((key, None))
                continue
            self._restore_delta(batch_key, key, delta)
            yield

    def _restore_delta(self, batch_key: BatchKey, key: bytes, delta: BatchDelta) -> None:
        """One delta onto its batch (opened by its first): its state, markers and last
        input, and its key for the batch's deletion."""
        batch = self._open(batch_key, delta.last_input_ms)
        batch.state.apply_delta(delta)
        batch.marker_producers.update(m.producer_id for m in delta.markers)
        batch.last_input_ms = max(batch.last_input_ms, delta.last_input_ms)
        batch.delta_keys.append(key)

    def _own_checkpoint_and_statuses(self, found: _Found, effects: Effects) -> list[bytes]:
        """Write the checkpoint and every status again under this owner's tag (before the
        statuses: a status follows the checkpoint that covers it); returns the keys they
        replace, deleted once written: a late write of the previous owner under its own
        tag can then never leave a restore without them (``ownership``). A status of a
        batch no delta restored is deleted."""
        return self._own_checkpoint(found, effects) + self._own_statuses(found, effects)

    def _own_checkpoint(self, found: _Found, effects: Effects) -> list[bytes]:
        """The checkpoint written again under this owner's tag, unless found there; returns
        the key it replaces (none when no checkpoint was found)."""
        own_checkpoint = checkpoint_key(self.key_part)
        replaced = []
        owned = own_checkpoint != checkpoint_key(self.partition)
        if (owned or found.checkpoint_at is not None) and found.checkpoint_at != own_checkpoint:
            # an owner writes its checkpoint first, found or not: a valid delta of its
            # then implies a valid checkpoint (``ownership.refuse_without_checkpoint``)
            effects.changelog.append((own_checkpoint, self._checkpoint_value()))
            if found.checkpoint_at is not None:
                replaced.append(found.checkpoint_at)
        return replaced

    def _own_statuses(self, found: _Found, effects: Effects) -> list[bytes]:
        """Each restored status onto its batch, written again under this owner's tag;
        returns the keys they replace (a status of a batch no delta restored: deleted)."""
        replaced = []
        for batch_key, (key, status) in found.statuses.items():
            restored = self.batches.get(batch_key)
            if restored is None:
                effects.changelog.append((key, None))
                continue
            restored.closed, restored.close_reason = status.closed, status.close_reason
            restored.closed_at_ms, restored.revision = status.closed_at_ms, status.revision
            restored.partial_digest = status.partial_digest
            own = status_key(self.key_part, batch_key)
            if key != own:
                self._statuses.append((own, encode_state(restored.status())))
                replaced.append(key)
        return replaced

    def _send_partials_again(self, now_ms: int, effects: Effects) -> None:
        """Send every closed batch's latest partial again: its status may be durable while
        the partial itself was lost in a crash (stage 2 ignores a revision it has). A
        status may also be older than the state (lost in a crash after the checkpoint):
        then close or emit now what the closing chunk would have."""
        for batch in self.batches.values():
            if not batch.closed:
                self._close_on_markers(batch, now_ms, effects)
                continue
            if now_ms - batch.closed_at_ms >= self.grace_ms:
                continue  # stage 2 may have forgotten the batch: a repeat would publish it anew
            self._send_partial_again(batch, now_ms, effects)

    def _send_partial_again(self, batch: _Batch, now_ms: int, effects: Effects) -> None:
        """A closed batch's partial again: the one its status names, or emitted anew when
        the status is older than the state."""
        partial = self._partial(batch, batch.revision)
        if batch.revision >= 0 and _digest(partial) == batch.partial_digest:
            effects.partials.append(partial)
        else:
            self._emit(batch, now_ms, effects)

    def _restore_gone(
        self,
        gone: dict[bytes, list[tuple[int, int, bytes]]],
        legacy: Checkpoint | None,
        now_ms: int,
        effects: Effects,
    ) -> None:
        """Load the expired and overflowed batches the changelog names (tombstoning the
        keys past the horizon, and ``y`` keys past the checkpoint: their chunk is replayed
        and overflows again), and write again, in the new form, the lists of a checkpoint
        an older worker wrote (the next checkpoint drops them)."""
        overflowed = {number: (at_ms, hashes) for number, at_ms, hashes in gone[b"y"]}
        if legacy is not None:
            self._migrate_expired(legacy, gone[b"x"], now_ms, effects)
            self._migrate_overflowed(legacy, overflowed, now_ms, effects)
        kinds = (
            (b"x", self.expired, gone[b"x"]),
            (b"y", self.overflowed, [(n, at, h) for n, (at, h) in overflowed.items()]),
        )
        for kind, ids, records in kinds:
            self._load_gone(kind, ids, records, now_ms, effects)
        self._last_expired_ms = max((number for number, _, _ in gone[b"x"]), default=-1)

    def _load_gone(
        self, kind: bytes, ids: GoneIds, records: list[tuple[int, int, bytes]], now_ms: int, effects: Effects
    ) -> None:
        """One kind's records into its ids, oldest first; those past the horizon (and
        overflows past the checkpoint) tombstoned instead."""
        for number, at_ms, hashes in sorted(records, key=lambda r: (r[1], r[0])):  # generations fill in order
            stale = ids is self.overflowed and number > self.checkpoint
            if stale or ids.past_horizon(at_ms, now_ms):
                effects.changelog.append((self._gone_key(kind, number), None))
            else:
                ids.add(unpack_hashes(hashes), at_ms, number)

    def _migrate_expired(
        self, legacy: Checkpoint, expired: list[tuple[int, int, bytes]], now_ms: int, effects: Effects
    ) -> None:
        """The expired batches an older checkpoint listed, as an ``x`` record of their own."""
        migrated = [batch_hash(batch_from_durable(item)) for item in legacy.expired]
        if not migrated:
            return
        at_ms = max([now_ms, *(number + 1 for number, _, _ in expired)])
        record = GoneBatches(at_ms=at_ms, hashes=pack_hashes(migrated))
        effects.changelog.append((expired_key(self.key_part, at_ms), encode_state(record)))
        expired.append((at_ms, at_ms, record.hashes))

    def _migrate_overflowed(
        self, legacy: Checkpoint, overflowed: dict[int, tuple[int, bytes]], now_ms: int, effects: Effects
    ) -> None:
        """The overflowed batches an older checkpoint listed, added to the ``y`` record of its offset."""
        migrated = [batch_hash(batch_from_durable(item)) for item in legacy.overflowed]
        if not migrated:
            return
        at_ms, hashes = overflowed.get(legacy.offset, (now_ms, b""))
        record = GoneBatches(at_ms=at_ms, hashes=hashes + pack_hashes(migrated))
        effects.changelog.append((overflowed_key(self.key_part, legacy.offset), encode_state(record)))
        overflowed[legacy.offset] = (at_ms, record.hashes)

    def _gone_key(self, kind: bytes, number: int) -> bytes:
        """The key of an expired (x) or overflowed (y) record: the restored one's own (its
        writer's tag), else this owner's."""
        key = self._gone_keys.pop((kind, number), None)
        if key is not None:
            return key
        return (expired_key if kind == b"x" else overflowed_key)(self.key_part, number)

    def _gone_reason(self, key: BatchKey) -> str | None:
        """``overflow`` or ``late`` when the batch was let go of for good (its input is
        dead-lettered), else None."""
        h = batch_hash(key)
        if h in self._overflowed_now or self.overflowed.has_hash(h):
            return "overflow"
        return "late" if self.expired.has_hash(h) else None

    def _open(self, key: BatchKey, now_ms: int) -> _Batch:
        batch = self.batches.get(key)
        if batch is None:
            state = self.core.BatchState(key[1], key[0])
            state.start_journal()
            batch = self.batches[key] = _Batch(state=state, last_input_ms=now_ms)
        return batch

    # -- processing ---------------------------------------------------------------
    def process(self, messages: Iterable[tuple[int, bytes]], now_ms: int) -> Effects:
        """Apply one chunk of ``(offset, value)`` messages of this partition, in offset order."""
        effects = Effects()
        touched: dict[BatchKey, _Batch] = {}
        offsets = self._apply_chunk(messages, now_ms, touched, effects)
        if offsets is None:
            return effects
        first, last = offsets
        for batch_key, batch in touched.items():
            self._write_delta(batch_key, batch, first, last, effects)
            self._after_input(batch, now_ms, effects)
        self._write_overflowed(last, now_ms, effects)
        self.checkpoint = last
        effects.changelog.append((checkpoint_key(self.key_part), self._checkpoint_value()))
        self._flush_statuses(effects)
        if self._dropped:
            self._forget_dropped(effects)
        return effects

    def _forget_dropped(self, effects: Effects) -> None:
        """The state of the batches this chunk dropped, deleted after the checkpoint that
        names them: leftovers of a crash are then known stale."""
        for batch in self._dropped:
            self._forget_state(batch, effects)
        self._dropped.clear()

    def _apply_chunk(
        self, messages: Iterable[tuple[int, bytes]], now_ms: int, touched: dict[BatchKey, _Batch], effects: Effects
    ) -> tuple[int, int] | None:
        """Apply each message past the checkpoint (those at or below it are redeliveries);
        returns the first and last offsets applied, None when there was none."""
        first = last = None
        for offset, value in messages:
            if offset <= self.checkpoint:
                self.counters.messages_replayed_skipped += 1
                continue
            self.counters.messages += 1
            if first is None:
                first = offset
            last = offset
            self._apply_or_dead_letter(offset, value, now_ms, touched, effects)
        return None if first is None or last is None else (first, last)

    def _apply_or_dead_letter(
        self, offset: int, value: bytes, now_ms: int, touched: dict[BatchKey, _Batch], effects: Effects
    ) -> None:
        """Apply one message; one the worker fails on is dead-lettered, never a crash."""
        try:
            self._apply_message(offset, value, now_ms, touched, effects)
        except Exception as exc:
            log.exception("partition=%d offset=%d: applying the message failed; dead-lettered", self.partition, offset)
            detail = f"the worker failed on this message ({shorten(exc, 400)}); please report it"
            self._internal_error(detail, value, offset, now_ms, effects)

    def _write_delta(self, batch_key: BatchKey, batch: _Batch, first: int, last: int, effects: Effects) -> None:
        """The chunk's delta of one batch it touched (none when nothing changed)."""
        delta = batch.state.take_delta_encoded(first_offset=first, last_offset=last, last_input_ms=batch.last_input_ms)
        if delta is not None:
            key = delta_key(self.key_part, batch_key, last)
            effects.changelog.append((key, delta))
            batch.delta_keys.append(key)

    def _after_input(self, batch: _Batch, now_ms: int, effects: Effects) -> None:
        """Close a batch whose markers are all in; a closed one (late input within grace)
        emits a new revision if it changed."""
        if not batch.closed:
            self._close_on_markers(batch, now_ms, effects)
            return
        if batch.close_reason == "timeout" and batch.state.markers_complete:
            batch.close_reason = "markers"  # every marker arrived after all (within grace): complete
        self._emit(batch, now_ms, effects)

    def _close_on_markers(self, batch: _Batch, now_ms: int, effects: Effects) -> None:
        """An open batch closes once the markers of all its producers are in."""
        if batch.state.markers_complete:
            self._close(batch, "markers", now_ms, effects)

    def _write_overflowed(self, last: int, now_ms: int, effects: Effects) -> None:
        """The batches this chunk overflowed, under a key of their own, before the checkpoint:
        stale (replayed, overflowing again) without it."""
        if not self._overflowed_now:
            return
        hashes = sorted(self._overflowed_now)
        record = GoneBatches(at_ms=now_ms, hashes=pack_hashes(hashes))
        effects.changelog.append((overflowed_key(self.key_part, last), encode_state(record)))
        self.overflowed.add(hashes, now_ms, last)
        self._overflowed_now.clear()

    def _apply_message(
        self, offset: int, value: bytes, now_ms: int, touched: dict[BatchKey, _Batch], effects: Effects
    ) -> None:
        """Decode one records-topic message and apply what it holds."""
        decoded = self.core.decode(value, max_bytes=self.max_message_bytes)
        # one group per batch (usually one); a record without its own run_id or
        # producer_id belongs to the envelope's
        for group, (key, count) in enumerate(decoded.groups):
            self._apply_records(key, decoded, group, count, decoded.producer_id, offset, now_ms, touched, effects)
        invalid = decoded.invalid  # the native decoder builds the list at each access
        if invalid:
            self._apply_invalid(invalid, offset, now_ms, touched, effects)
        if decoded.marker is not None:
            self._apply_marker(decoded.marker, value, offset, now_ms, touched, effects)

    def _apply_invalid(
        self, invalid: list[InvalidRecord], offset: int, now_ms: int, touched: dict[BatchKey, _Batch], effects: Effects
    ) -> None:
        """A message's invalid records: each dead-lettered, and counted in the batch it
        names (every delivery counts; none for a batch gone)."""
        counters = self.counters
        for bad in invalid:
            counters.records_invalid += 1
            counters.dead_letter(bad.reason)
            effects.dead_letters.append(
                self._dead_letter(bad.reason, bad.detail, bad.raw, offset, bad.batch_id, now_ms, bad.run_id)
            )
            if bad.batch_id is not None:
                self._count_invalid(bad, (bad.run_id, bad.batch_id), now_ms, touched)

    def _count_invalid(self, bad: InvalidRecord, key: BatchKey, now_ms: int, touched: dict[BatchKey, _Batch]) -> None:
        """An invalid record counted in the batch it names (``key``), unless that batch is gone."""
        batch = self._batch_for_input(key, now_ms)
        if batch is not None:
            batch.state.add_invalid(bad.producer_id, late=batch.closed)
            touched[key] = batch

    def _batch_for_input(self, key: BatchKey, now_ms: int) -> _Batch | None:
        """The batch to apply input to; None when it expired (the input is late) or
        was closed early at the open-generation limit."""
        batch = self.batches.get(key)
        if batch is None:
            if self._gone_reason(key) is not None:
                return None
            batch = self._open(key, now_ms)
        batch.last_input_ms = now_ms
        return batch

    def _apply_records(
        self,
        key: BatchKey,
        decoded: Decoded,
        group: int,
        count: int,
        producer_id: str | None,
        offset: int,
        now_ms: int,
        touched: dict,
        effects: Effects,
    ) -> None:
        """Apply a group of ``count`` records of one batch from one message
        (``producer_id``: the envelope's)."""
        batch = self._batch_for_input(key, now_ms)
        if batch is None:
            self._reject_records(key, decoded.records(group), offset, now_ms, effects)
            return
        touched[key] = batch
        limit = self.max_open_generations
        if limit is None or self.open_generations + count <= limit:
            self._add(batch, decoded, group, 0, count, producer_id)
            return
        # each record adds at most one generation: apply what fits, then cut the batch
        start = 0
        while start < count and self.open_generations < limit:
            stop = min(count, start + limit - self.open_generations)
            self._add(batch, decoded, group, start, stop, producer_id)
            start = stop
        if start < count:
            del touched[key]
            self._overflow(batch, now_ms, effects)
            self._dead_letter_records(
                "overflow", self._overflow_detail(key), decoded.records(group, start), offset, key, now_ms, effects
            )

    def _reject_records(
        self, key: BatchKey, records: list[GenerationRecord], offset: int, now_ms: int, effects: Effects
    ) -> None:
        """Records of a batch gone for good: dead-lettered as ``overflow`` (packed) or ``late`` (each)."""
        if self._gone_reason(key) == "overflow":
            self._dead_letter_records("overflow", self._overflow_detail(key), records, offset, key, now_ms, effects)
            return
        for record in records:
            self.counters.dead_letter("late")
            effects.dead_letters.append(
                self._dead_letter(
                    "late",
                    f"{_describe(key)} closed more than grace ago on partition {self.partition}",
                    encode_records_message(record),
                    offset,
                    key[1],
                    now_ms,
                    key[0],
                )
            )

    def _add(self, batch: _Batch, decoded: Decoded, group: int, start: int, stop: int, producer_id: str | None) -> None:
        counters = self.counters
        held = batch.state.generation_count
        aggregated, redelivered, conflicting = batch.state.add_decoded(
            decoded, group, start, stop, late=batch.closed, producer_id=producer_id
        )
        self.open_generations += batch.state.generation_count - held
        counters.records_conflicting += conflicting
        if batch.closed:
            counters.records_late += stop - start
        else:
            counters.records_aggregated += aggregated
            counters.records_redelivered += redelivered

    def _overflow_detail(self, key: BatchKey) -> str:
        return (
            f"{_describe(key)} passed the limit of {self.max_open_generations} open generations on "
            f"partition {self.partition} and was closed early as incomplete (raise --max-open-generations "
            f"if batches are really this large)"
        )

    def _overflow(self, batch: _Batch, now_ms: int, effects: Effects) -> None:
        """Close the batch now (its partial holds everything up to this message) and drop its state."""
        key = batch.key
        log.warning("partition=%d: %s", self.partition, self._overflow_detail(key))
        if batch.closed:
            self._emit(batch, now_ms, effects)  # late input within grace: publish what it changed
        else:
            self._close(batch, "incomplete", now_ms, effects)
        del self.batches[key]
        self.open_generations -= batch.state.generation_count
        self._overflowed_now.add(batch_hash(key))
        # its last partial stays in the changelog until grace ends (sent again on restore)
        effects.changelog.append(
            (overflow_key(self.key_part, key), encode_partial(self._partial(batch, batch.revision)))
        )
        self._overflow_partials[key] = batch.closed_at_ms
        self._dropped.append(batch)

    def _forget_state(self, batch: _Batch, effects: Effects) -> None:
        """Delete a dropped batch's deltas and status from the changelog, once the record that
        says it is gone is acknowledged (``Effects.verified_deletions``)."""
        effects.verified_deletions.extend(batch.delta_keys)
        effects.verified_deletions.append(status_key(self.key_part, batch.key))

    def _apply_marker(
        self, marker: BatchMarker, raw: bytes, offset: int, now_ms: int, touched: dict, effects: Effects
    ) -> None:
        self.counters.markers += 1
        key = (marker.run_id, marker.batch_id)
        batch = self._batch_for_input(key, now_ms)
        if batch is None:
            self._reject_marker(key, raw, offset, now_ms, effects)
            return
        batch.state.add_marker(marker)
        batch.marker_producers.add(marker.producer_id)
        touched[key] = batch

    def _reject_marker(self, key: BatchKey, raw: bytes, offset: int, now_ms: int, effects: Effects) -> None:
        """A marker of a batch gone for good: dead-lettered as ``overflow`` or ``late``."""
        overflowed = self._gone_reason(key) == "overflow"
        reason = "overflow" if overflowed else "late"
        detail = self._overflow_detail(key) if overflowed else f"marker for {_describe(key)} after its grace ended"
        self.counters.dead_letter(reason, records=0)
        effects.dead_letters.append(self._dead_letter(reason, detail, raw, offset, key[1], now_ms, key[0]))

    def _dead_letter_records(
        self,
        reason: str,
        detail: str,
        records: list[GenerationRecord],
        offset: int,
        key: BatchKey,
        now_ms: int,
        effects: Effects,
    ) -> None:
        """Dead-letter valid records as packed batches, each small enough to carry whole."""
        raw = encode_records_message(RecordBatch(records=records, run_id=key[0]))
        if len(raw) > DEAD_LETTER_RAW_LIMIT and len(records) > 1:
            half = len(records) // 2
            self._dead_letter_records(reason, detail, records[:half], offset, key, now_ms, effects)
            self._dead_letter_records(reason, detail, records[half:], offset, key, now_ms, effects)
            return
        self.counters.dead_letter(reason, records=len(records))
        effects.dead_letters.append(self._dead_letter(reason, detail, raw, offset, key[1], now_ms, key[0]))

    def _internal_error(
        self,
        detail: str,
        raw: bytes,
        offset: int,
        now_ms: int,
        effects: Effects,
        batch_key: BatchKey | None = None,
        *,
        records: int = 1,
    ) -> None:
        """A failure of the worker's own (a message it could not apply, a partial it could
        not build): counted and dead-lettered as ``internal_error``, never a crash."""
        self.counters.dead_letter("internal_error", records=records)
        run_id, batch_id = batch_key or (None, None)
        effects.dead_letters.append(self._dead_letter("internal_error", detail, raw, offset, batch_id, now_ms, run_id))

    def _dead_letter(
        self,
        reason: str,
        detail: str,
        raw: bytes,
        offset: int,
        batch_id: str | None,
        now_ms: int,
        run_id: str | None = None,
    ) -> DeadLetter:
        if len(raw) > DEAD_LETTER_RAW_LIMIT:  # the whole message stays in the records topic, named here
            detail = (
                f"{detail} (raw cut to its first {DEAD_LETTER_RAW_LIMIT} of {len(raw)} bytes; the whole "
                f"message is {self.source_topic} partition {self.partition} offset {offset})"
            )
            raw = raw[:DEAD_LETTER_RAW_LIMIT]
        return DeadLetter(
            reason=reason,
            detail=detail,
            raw=raw,
            source_topic=self.source_topic,
            source_partition=self.partition,
            source_offset=offset,
            batch_id=batch_id,
            rejected_at=now_ms / 1000,
            run_id=run_id,
        )

    # -- closing ----------------------------------------------------------------
    def _close(self, batch: _Batch, reason: str, now_ms: int, effects: Effects) -> None:
        batch.closed, batch.close_reason, batch.closed_at_ms = True, reason, now_ms
        self.counters.batch_partitions_closed[reason] = self.counters.batch_partitions_closed.get(reason, 0) + 1
        self._emit(batch, now_ms, effects)

    def _emit(self, batch: _Batch, now_ms: int, effects: Effects) -> None:
        """Emit the batch's partial if its content changed since the last one."""
        try:
            partial = self._partial(batch, batch.revision + 1)
            digest = _digest(partial)
        except Exception as exc:
            log.exception("partition=%d %s: building its partial failed", self.partition, _describe(batch.key))
            detail = (
                f"building the partial of {_describe(batch.key)} failed ({shorten(exc, 400)}); "
                "its input is applied but not published; please report it"
            )
            self._internal_error(detail, b"", self.checkpoint, now_ms, effects, batch.key, records=0)
            return
        if digest == batch.partial_digest:
            return
        batch.revision += 1
        batch.partial_digest = digest
        self._statuses.append((status_key(self.key_part, batch.key), encode_state(batch.status())))
        effects.partials.append(partial)
        self.counters.partials_emitted += 1

    def _flush_statuses(self, effects: Effects) -> None:
        """Append the statuses written by this call, after its checkpoint: a status can
        then only be durable with the state it describes (same changelog partition, in
        order). Were it durable without that checkpoint, a restore would hold a closed
        batch whose closing chunk is replayed as late input, its partial never re-sent."""
        effects.changelog.extend(self._statuses)
        self._statuses.clear()

    def _partial(self, batch: _Batch, revision: int) -> PartialAggregate:
        return batch.state.partial(
            partition=self.partition,
            revision=revision,
            close_reason=batch.close_reason or "markers",
            closed_at_ms=batch.closed_at_ms,
        )

    def waiting(self, now_ms: int) -> list[Waiting]:
        """The open batches and what each waits for: its producers' markers, or its timeout."""
        return [
            Waiting(
                run_id=batch.state.run_id,
                batch_id=batch.state.batch_id,
                marker_producers=frozenset(batch.marker_producers),
                expected_producers=batch.state.expected_producers,
                idle_ms=now_ms - batch.last_input_ms,
                closes_in_ms=max(0, batch.last_input_ms + self.batch_timeout_ms - now_ms),
            )
            for batch in self.batches.values()
            if not batch.closed
        ]

    @property
    def has_timers(self) -> bool:
        """Whether ``tick`` has anything to look at (an idle partition costs a worker nothing)."""
        return bool(self.batches or self._overflow_partials)

    def tick(self, now_ms: int) -> Effects:
        """Close batches idle for ``batch_timeout``; drop those closed more than ``grace`` ago
        (remembering them as expired); forget expired ones past the retention horizon."""
        effects = Effects()
        self._forget_gone(now_ms, effects)
        self._forget_overflow_partials(now_ms, effects)
        expired = [batch for batch in list(self.batches.values()) if self._timed(batch, now_ms, effects)]
        if expired:
            self._expire(expired, now_ms, effects)
        self._flush_statuses(effects)
        return effects

    def _forget_gone(self, now_ms: int, effects: Effects) -> None:
        """The expired and overflowed ids the retention horizon passed over are forgotten,
        their changelog keys deleted."""
        for kind, ids in ((b"x", self.expired), (b"y", self.overflowed)):
            effects.changelog.extend((self._gone_key(kind, number), None) for number in ids.forget(now_ms))

    def _forget_overflow_partials(self, now_ms: int, effects: Effects) -> None:
        """An overflowed batch's last partial is deleted once its grace has ended."""
        for key, closed_at_ms in list(self._overflow_partials.items()):
            if now_ms - closed_at_ms >= self.grace_ms:
                del self._overflow_partials[key]
                own = overflow_key(self.key_part, key)
                effects.changelog.append((self._overflow_keys.pop(key, own), None))

    def _timed(self, batch: _Batch, now_ms: int, effects: Effects) -> bool:
        """Close an open batch idle for ``batch_timeout``; whether a closed one's grace has ended."""
        if not batch.closed:
            if now_ms - batch.last_input_ms >= self.batch_timeout_ms:
                self._close(batch, "timeout", now_ms, effects)
            return False
        return now_ms - batch.closed_at_ms >= self.grace_ms

    def _expire(self, expired: list[_Batch], now_ms: int, effects: Effects) -> None:
        """Drop batches whose grace has ended: their ids first (once, under a key of their
        own: deltas left behind by a crash are then known stale), then their state."""
        for batch in expired:
            del self.batches[batch.key]
            self.open_generations -= batch.state.generation_count
            self.counters.batches_expired += 1
        at_ms = max(now_ms, self._last_expired_ms + 1)
        self._last_expired_ms = at_ms
        hashes = sorted({batch_hash(batch.key) for batch in expired})
        record = GoneBatches(at_ms=at_ms, hashes=pack_hashes(hashes))
        effects.changelog.append((expired_key(self.key_part, at_ms), encode_state(record)))
        self.expired.add(hashes, at_ms, at_ms)
        for batch in expired:
            self._forget_state(batch, effects)

    def _checkpoint_value(self) -> bytes:
        """The offset alone: constant size, however many batches expired (issue 21)."""
        return encode_state(Checkpoint(offset=self.checkpoint))
