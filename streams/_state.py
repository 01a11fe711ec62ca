"""Dedup state of one batch on one partition: records in, a partial out.

Pure: no Kafka, no asyncio, no clocks (times come in as arguments). Both the
Faust agents and the offline ``aggregate`` command drive exactly this class.

Memory is proportional to distinct generations and occurrences, never to
records: a redelivery changes a counter and nothing else.

Two forms of a generation's entry: the common one (no state hash, no histogram,
counters below 2^20 (completion 2^24), one occurrence so far) is one packed int
holding the four counters, the weight_version's slot and the occurrence's sample;
anything else is a wide 7-tuple with its occurrences in a set. A packed entry widens the moment a second
occurrence or a different value arrives, so both forms mean exactly the same.
(Histograms stay wide: packing them cost more CPU in the dedup than it saved.)
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Iterable, Sequence
from typing import Any, Final

from specmeter.schemas import (
    MAX_WEIGHT_VERSIONS,
    BatchMarker,
    DecodedMessage,
    GenerationRecord,
    InvalidRecord,
    PartialAggregate,
    WeightVersionSums,
    decode_records_message,
)

from ._exact import grow
from ._layout import BatchDelta, encode_state

__all__ = ["BatchState", "Decoded", "Outcome", "add_histograms", "decode_message"]

#: (state_hash, accepted, proposed, verify, completion, accept_histogram, weight_version)
Value = tuple[str | None, int | None, int | None, int | None, int | None, tuple[int, ...] | None, str | None]


class _Conflict:
    """Sentinel stored for a key seen with two or more different values."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFLICT"

    def __reduce__(self) -> str:
        return "CONFLICT"  # unpickles as the module's one instance (``compact``)


CONFLICT: Final = _Conflict()

# Packed entry layout (an int): four counters stored as value + 1 (0: unknown) in
# 20/20/20/24 bits, the slot of the weight_version in 12 bits (0: None), then the
# slot of the occurrence's sample (0: sample_id None).
_C20: Final = (1 << 20) - 1
_C24: Final = (1 << 24) - 1
_SLOTS: Final = (1 << 20) - 1
_VERSION_SHIFT: Final = 84
_VERSION_SLOTS: Final = (1 << 12) - 1
_SAMPLE_SHIFT: Final = 96
_COUNTERS_MASK: Final = (1 << 84) - 1
_LO64: Final = (1 << 64) - 1


def _unpack(packed: int) -> tuple[int | None, int | None, int | None, int | None]:
    a, p, v, c = packed & _C20, (packed >> 20) & _C20, (packed >> 40) & _C20, (packed >> 60) & _C24
    return (a - 1 if a else None, p - 1 if p else None, v - 1 if v else None, c - 1 if c else None)


class Outcome(enum.Enum):
    """What one valid record did to the state."""

    AGGREGATED = "aggregated"  # a new occurrence
    REDELIVERED = "redelivered"  # an occurrence already seen: changes nothing


def add_histograms(histograms: Iterable[Sequence[int] | None]) -> list[int] | None:
    """Element-wise sum of the known histograms (shorter ones padded with zeros);
    None when none is known."""
    out: list[int] | None = None
    for hist in histograms:
        if hist is None:
            continue
        if out is None:
            out = list(hist)
            continue
        if len(hist) > len(out):
            out.extend([0] * (len(hist) - len(out)))
        for i, count in enumerate(hist):
            out[i] += count
    return out


class Decoded:
    """One records-topic message, decoded: its records as groups, one per batch.

    The Python twin of the native decoder's answer (``specmeter.streams._native``),
    so that the worker applies a message the same way whichever core runs:
    ``groups`` is ``[((run_id, batch_id), record count), ...]`` -- one group when every
    record names the same batch, else one per record, in message order -- and
    ``BatchState.add_decoded`` applies a slice of a group.
    """

    __slots__ = ("_groups", "groups", "invalid", "marker", "producer_id", "run_id")

    def __init__(self, message: DecodedMessage) -> None:
        #: the envelope's producer and run: a record without its own belongs to them
        self.producer_id = message.producer_id
        self.run_id = message.run_id
        self.invalid: list[InvalidRecord] = message.invalid
        self.marker: BatchMarker | None = message.marker
        records = message.records
        self._groups: list[list[GenerationRecord]] = []
        if records:
            first = records[0]
            if all(r.batch_id == first.batch_id and r.run_id == first.run_id for r in records):
                self._groups = [records]
            else:
                self._groups = [[r] for r in records]
        self.groups: list[tuple[tuple[str | None, str], int]] = [
            ((self.run_id if g[0].run_id is None else g[0].run_id, g[0].batch_id), len(g)) for g in self._groups
        ]

    def records(self, group: int, start: int = 0, stop: int | None = None) -> list[GenerationRecord]:
        """The records ``start:stop`` of a group."""
        return self._groups[group][start:stop]

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups)


def decode_message(data: bytes, *, max_bytes: int | None = None) -> Decoded:
    """Decode one records-topic message (never raises on bad input; see
    ``decode_records_message``)."""
    return Decoded(decode_records_message(data, max_bytes=max_bytes))


class BatchState:
    """Everything one partition knows about one batch.

    Identity of a generation is ``(session_id, generation_id)``; an occurrence
    is ``(session_id, sample_id, generation_id)`` with ``sample_id=None`` for a
    generation that is its own sample. A key seen with two different values is
    conflicting for good (order-independent).
    """

    __slots__ = (
        "_algorithms",
        "_conflicts",
        "_counters_seen",
        "_frozen",
        "_frozen_generations",
        "_journal_base",
        "_journal_keys",
        "_journal_new",
        "_journal_occurrences",
        "_markers",
        "_occurrences",
        "_packed",
        "_received",
        "_sample_slot",
        "_samples",
        "_values",
        "_version_slot",
        "_versions",
        "batch_id",
        "conflicting_record_count",
        "invalid_record_count",
        "late_record_count",
        "record_count",
        "run_id",
    )

    def __init__(self, batch_id: str, run_id: str | None = None) -> None:
        self.batch_id = batch_id
        self.run_id = run_id
        self._versions: list[str] = []  # slot k+1 -> weight_version
        self._version_slot: dict[str, int] = {}
        #: a generation seen once with small counters is one packed int (counters, sample
        #: and version slots); any other is a ``Value`` tuple or CONFLICT
        self._values: dict[tuple[str, str], Value | _Conflict | int] = {}
        self._occurrences: set[tuple[str, str | None, str]] = set()  # of wide entries only
        self._packed = 0  # entries in packed form (each one occurrence)
        self._samples: list[str] = []  # slot k+1 -> sample_id
        self._sample_slot: dict[str, int] = {}
        self.record_count = 0
        self.invalid_record_count = 0
        self.late_record_count = 0
        self.conflicting_record_count = 0
        self._received: dict[str, int] = {}
        self._markers: dict[str, BatchMarker] = {}
        self._algorithms: set[str] = set()
        self._counters_seen = False
        self._conflicts = 0
        #: changes since the last delta: keys of wide entries changed, occurrences of
        #: wide entries added, and entries created packed (session, generation, sample, packed)
        self._journal_keys: set[tuple[str, str]] | None = None
        self._journal_occurrences: list[tuple[str, str | None, str]] | None = None
        self._journal_new: list[tuple[str, str, str | None, int]] | None = None
        self._journal_base: tuple | None = None
        #: the dedup state pickled by ``compact`` (None: live) and its generation count
        self._frozen: bytes | None = None
        self._frozen_generations = 0

    # -- input ----------------------------------------------------------------
    def add(self, record: GenerationRecord, *, late: bool = False) -> Outcome:
        """Apply one valid record (any delivery of it).

        Args:
            record: a validated record of this batch.
            late: it arrived after the batch was closed (counted, still applied).

        Returns:
            ``AGGREGATED`` for a new occurrence, ``REDELIVERED`` otherwise.
        """
        aggregated, _, _ = self.add_many([record], late=late)
        return Outcome.AGGREGATED if aggregated else Outcome.REDELIVERED

    def add_many(
        self, records: list[GenerationRecord], *, late: bool = False, producer_id: str | None = None
    ) -> tuple[int, int, int]:
        """Apply a run of valid records: the one implementation of the dedup rule
        (``add`` is its one-record case; the worker calls it once per chunk).

        ``producer_id`` is whose deliveries a record without its own counts as (the
        ``RecordBatch`` envelope's producer: a publisher's records are its own).

        Returns:
            (aggregated, redelivered, conflicting) record counts.
        """
        if self._frozen is not None:
            self._thaw()
        values = self._values
        occurrences = self._occurrences
        journal_keys = self._journal_keys
        journal_occurrences = self._journal_occurrences
        journal_new = self._journal_new.append if self._journal_new is not None else None
        received = self._received
        slots = self._sample_slot
        samples = self._samples
        version_slots = self._version_slot
        aggregated = redelivered = conflicting = packed_added = 0
        counters_seen = self._counters_seen
        producer, produced = None, 0
        for r in records:
            record_producer = r.producer_id or producer_id
            if record_producer is not producer:
                if producer is not None:
                    received[producer] = received.get(producer, 0) + produced
                producer, produced = record_producer, 0
            produced += 1
            session, generation, sample = r.session_id, r.generation_id, r.sample_id
            key = (session, generation)
            accepted, proposed, verify, completion = r.accepted, r.proposed, r.verify, r.completion
            if not counters_seen and (accepted is not None or proposed is not None or verify is not None):
                counters_seen = True
            histogram = r.accept_histogram
            version = r.weight_version
            vslot = 0 if version is None else version_slots.get(version) or self._new_version_slot(version)
            # the packed form of this record, when it has one
            packed = None
            if r.state_hash is None and histogram is None:
                slot = 0 if sample is None else slots.get(sample) or self._new_slot(sample)
                if slot is not None and vslot is not None:
                    a = 0 if accepted is None else accepted + 1
                    p = 0 if proposed is None else proposed + 1
                    v = 0 if verify is None else verify + 1
                    c = 0 if completion is None else completion + 1
                    if a <= _C20 and p <= _C20 and v <= _C20 and c <= _C24:
                        packed = a | p << 20 | v << 40 | c << 60 | vslot << _VERSION_SHIFT | slot << _SAMPLE_SHIFT
            known = values.get(key)
            if known is None:
                aggregated += 1
                if packed is not None:
                    values[key] = packed
                    packed_added += 1
                    if journal_new is not None:
                        journal_new((session, generation, sample, packed))
                else:
                    values[key] = (
                        r.state_hash,
                        accepted,
                        proposed,
                        verify,
                        completion,
                        None if histogram is None else tuple(histogram),
                        version,
                    )
                    occurrence = (session, sample, generation)
                    occurrences.add(occurrence)
                    if journal_keys is not None:
                        journal_keys.add(key)
                        journal_occurrences.append(occurrence)  # type: ignore[union-attr]
                continue
            if known.__class__ is int:
                if known == packed:
                    redelivered += 1  # same value, same (only) occurrence
                    continue
                if journal_keys is not None:  # the wide form goes in the delta, with its first occurrence
                    first_slot = known >> _SAMPLE_SHIFT
                    journal_keys.add(key)
                    journal_occurrences.append(  # type: ignore[union-attr]
                        (session, samples[first_slot - 1] if first_slot else None, generation)
                    )
                known = self._widen(key, known)
            value = (
                r.state_hash,
                accepted,
                proposed,
                verify,
                completion,
                None if histogram is None else tuple(histogram),
                version,
            )
            if known is CONFLICT:
                conflicting += 1
            elif known != value:
                values[key] = CONFLICT
                self._conflicts += 1
                conflicting += 1
                if journal_keys is not None:
                    journal_keys.add(key)
            occurrence = (session, sample, generation)
            if occurrence in occurrences:
                redelivered += 1
            else:
                occurrences.add(occurrence)
                aggregated += 1
                if journal_occurrences is not None:
                    journal_occurrences.append(occurrence)
        self._packed += packed_added
        if producer is not None:
            received[producer] = received.get(producer, 0) + produced
        self._counters_seen = counters_seen
        n = len(records)
        self.record_count += n
        if late:
            self.late_record_count += n
        self.conflicting_record_count += conflicting
        return aggregated, redelivered, conflicting

    def add_decoded(
        self,
        decoded: Decoded,
        group: int,
        start: int = 0,
        stop: int | None = None,
        *,
        late: bool = False,
        producer_id: str | None = None,
    ) -> tuple[int, int, int]:
        """Apply records ``start:stop`` of a group of a decoded message (``add_many``
        over them; the native core applies them without a Python object per record).

        Returns:
            (aggregated, redelivered, conflicting) record counts.
        """
        return self.add_many(decoded.records(group, start, stop), late=late, producer_id=producer_id)

    def _widen(self, key: tuple[str, str], packed: int) -> Value:
        """Turn a packed entry into its wide form (value tuple, occurrence in the set)."""
        accepted, proposed, verify, completion = _unpack(packed)
        slot = packed >> _SAMPLE_SHIFT
        value = (None, accepted, proposed, verify, completion, None, self._version_of(packed))
        self._values[key] = value
        self._occurrences.add((key[0], self._samples[slot - 1] if slot else None, key[1]))
        self._packed -= 1
        return value

    def _all_occurrences(self) -> Iterable[tuple[str, str | None, str]]:
        """Every occurrence: the one of each packed entry, then those in the set."""
        if self._packed:
            samples = self._samples
            for (session, generation), value in self._values.items():
                if value.__class__ is int:
                    slot = value >> _SAMPLE_SHIFT
                    yield session, samples[slot - 1] if slot else None, generation
        yield from self._occurrences

    def add_invalid(self, producer_id: str | None = None, *, late: bool = False) -> None:
        """Count an invalid record attributed to this batch (every delivery counts)."""
        self.record_count += 1
        self.invalid_record_count += 1
        if late:
            self.late_record_count += 1
        if producer_id is not None:
            self._received[producer_id] = self._received.get(producer_id, 0) + 1

    def add_marker(self, marker: BatchMarker) -> None:
        """Record a producer's end-of-batch marker (a repeat replaces the earlier one)."""
        self._markers[marker.producer_id] = marker
        if marker.speculative_algorithm:
            self._algorithms.add(marker.speculative_algorithm)

    def add_algorithm(self, name: str) -> None:
        """Name the batch's speculative algorithm without a marker (offline flag)."""
        if name:
            self._algorithms.add(name)

    # -- durability -----------------------------------------------------------
    def _counters(self) -> tuple:
        return (
            self.record_count,
            self.invalid_record_count,
            self.late_record_count,
            self.conflicting_record_count,
            dict(self._received),
            dict(self._markers),
            frozenset(self._algorithms),
            self._counters_seen,
        )

    def start_journal(self) -> None:
        """Begin recording changes, to be taken as deltas by ``take_delta``."""
        self._journal_keys = set()
        self._journal_occurrences = []
        self._journal_new = []
        self._journal_base = self._counters()

    def take_delta(self, *, first_offset: int, last_offset: int, last_input_ms: int) -> BatchDelta | None:
        """What changed since the last call (or ``start_journal``); None if nothing did."""
        journal_keys, journal_new = self._journal_keys, self._journal_new
        if (
            journal_keys is None
            or self._journal_base is None
            or self._journal_occurrences is None
            or journal_new is None
        ):
            raise RuntimeError("take_delta() needs start_journal() first")
        base = self._journal_base
        now = self._counters()
        if not journal_keys and not self._journal_occurrences and not journal_new and now == base:
            return None
        # entries created packed and still packed: five flat items each (the counters
        # split below 2^64 for msgpack); one widened since is in ``entries`` instead
        packed: list[str | int | None] = []
        versioned: list[str | int | None] = []
        for session, generation, sample, bits in journal_new:
            if journal_keys and (session, generation) in journal_keys:
                continue
            counters = bits & _COUNTERS_MASK
            vslot = (bits >> _VERSION_SHIFT) & _VERSION_SLOTS
            if vslot:
                versioned.extend(
                    (session, generation, sample, counters & _LO64, counters >> 64, self._versions[vslot - 1])
                )
            else:
                packed.extend((session, generation, sample, counters & _LO64, counters >> 64))
        values = self._values
        entries = []
        for key in journal_keys:
            value = values[key]
            if value is CONFLICT:
                entries.append((key[0], key[1], True, None, None, None, None, None, None, None))
            else:
                entries.append((key[0], key[1], False, *value))  # type: ignore[misc]
        received = {p: n - base[4].get(p, 0) for p, n in now[4].items() if n != base[4].get(p, 0)}
        markers = [m for p, m in now[5].items() if base[5].get(p) != m]
        delta = BatchDelta(
            batch_id=self.batch_id,
            run_id=self.run_id,
            first_offset=first_offset,
            last_offset=last_offset,
            last_input_ms=last_input_ms,
            entries=entries,
            occurrences=self._journal_occurrences,
            record_count=now[0] - base[0],
            invalid_record_count=now[1] - base[1],
            late_record_count=now[2] - base[2],
            conflicting_record_count=now[3] - base[3],
            received=received,
            markers=markers,
            algorithms=sorted(now[6] - base[6]),
            counters_seen=now[7] and not base[7],
            packed=packed,
            packed_versioned=versioned,
        )
        self._journal_keys = set()
        self._journal_occurrences = []
        self._journal_new = []
        self._journal_base = now
        return delta

    def take_delta_encoded(self, *, first_offset: int, last_offset: int, last_input_ms: int) -> bytes | None:
        """``take_delta`` encoded for the changelog (the native core encodes it itself)."""
        delta = self.take_delta(first_offset=first_offset, last_offset=last_offset, last_input_ms=last_input_ms)
        return None if delta is None else encode_state(delta)

    def apply_delta(self, delta: BatchDelta) -> None:
        """Replay one durable delta (restoring after a crash or a rebalance)."""
        if self._frozen is not None:
            self._thaw()
        values = self._values
        packed: list[Any] = delta.packed  # (session, generation, sample, low, high) flat
        for i in range(0, len(packed), 5):
            session, generation, sample, low, high = packed[i : i + 5]
            self._restore_packed((session, generation), sample, low | high << 64, None)
        versioned: list[Any] = delta.packed_versioned  # the same and the weight version
        for i in range(0, len(versioned), 6):
            session, generation, sample, low, high, version = versioned[i : i + 6]
            self._restore_packed((session, generation), sample, low | high << 64, version)
        for session, generation, conflict, *fields in delta.entries:
            key = (session, generation)
            before = values.get(key)
            if before.__class__ is int:
                before = self._widen(key, before)
            if conflict:
                if before is not CONFLICT:
                    self._conflicts += 1
                values[key] = CONFLICT
            else:
                # entries written before weight versions existed have six items
                state_hash, accepted, proposed, verify, completion, histogram, *appended = fields
                weight_version = appended[0] if appended else None
                if weight_version is not None and weight_version not in self._version_slot:
                    self._new_version_slot(weight_version)
                values[key] = (
                    state_hash,
                    accepted,
                    proposed,
                    verify,
                    completion,
                    tuple(histogram) if histogram is not None else None,
                    weight_version,
                )
        for session, sample, generation in delta.occurrences:
            known = values.get((session, generation))
            if known.__class__ is int:
                self._widen((session, generation), known)
            self._occurrences.add((session, sample, generation))
        self.record_count += delta.record_count
        self.invalid_record_count += delta.invalid_record_count
        self.late_record_count += delta.late_record_count
        self.conflicting_record_count += delta.conflicting_record_count
        for producer, n in delta.received.items():
            self._received[producer] = self._received.get(producer, 0) + n
        for marker in delta.markers:
            self.add_marker(marker)
        self._algorithms.update(delta.algorithms)
        self._counters_seen = self._counters_seen or delta.counters_seen
        if self._journal_keys is not None:
            self._journal_base = self._counters()

    def _new_slot(self, sample: str) -> int | None:
        """Give a sample its slot (1-based) in packed entries; None once all are taken."""
        if len(self._samples) >= _SLOTS:
            return None
        self._samples.append(sample)
        slot = self._sample_slot[sample] = len(self._samples)
        return slot

    def _new_version_slot(self, version: str) -> int | None:
        """Give a weight_version its slot (1-based) in packed entries; None once all are taken."""
        if len(self._versions) >= _VERSION_SLOTS:
            return None
        self._versions.append(version)
        slot = self._version_slot[version] = len(self._versions)
        return slot

    def _version_of(self, packed: int) -> str | None:
        vslot = (packed >> _VERSION_SHIFT) & _VERSION_SLOTS
        return self._versions[vslot - 1] if vslot else None

    def _restore_packed(self, key: tuple[str, str], sample: str | None, counters: int, version: str | None) -> None:
        """Install an entry a delta wrote in packed form (new when it was written)."""
        values = self._values
        known = values.get(key)
        if known is None:
            slot = 0 if sample is None else self._sample_slot.get(sample) or self._new_slot(sample)
            vslot = 0 if version is None else self._version_slot.get(version) or self._new_version_slot(version)
            if slot is not None and vslot is not None:
                values[key] = counters | vslot << _VERSION_SHIFT | slot << _SAMPLE_SHIFT
                self._packed += 1
                return
        # not new after all, or no slot left: the wide form, with add's conflict rule
        if known.__class__ is int:
            known = self._widen(key, known)
        value = (None, *_unpack(counters), None, version)
        if known is None:
            values[key] = value
        elif known is not CONFLICT and known != value:
            values[key] = CONFLICT
            self._conflicts += 1
        self._occurrences.add((key[0], sample, key[1]))

    # -- closing --------------------------------------------------------------
    @property
    def expected_producers(self) -> int:
        """The most producers any marker for this batch said to wait for (0: no marker)."""
        return max((m.expected_producers for m in self._markers.values()), default=0)

    @property
    def markers_complete(self) -> bool:
        """Markers from ``expected_producers`` distinct producers have arrived."""
        expected = self.expected_producers
        return expected > 0 and len(self._markers) >= expected

    @property
    def generation_count(self) -> int:
        """Distinct generations held (the size of the dedup state)."""
        return self._frozen_generations if self._frozen is not None else len(self._values)

    # -- a closed batch's grace -----------------------------------------------
    def compact(self) -> None:
        """Hold the dedup state as one bytes object until something needs it again.

        For a closed batch waiting out its grace: about 170 bytes per generation
        instead of about 1 KB of dicts, sets and tuples, and nothing for the garbage
        collector to walk (its full collections paused the worker for 0.1-0.8 s with
        a minute of closed batches held). Every method that reads or changes the
        state thaws it first, so late records apply exactly as before. A no-op while
        changes wait to be taken as a delta. Only bytes written here are unpickled.
        """
        if self._frozen is not None or self._journal_keys or self._journal_occurrences or self._journal_new:
            return
        self._frozen_generations = len(self._values)
        self._frozen = pickle.dumps(
            (self._values, self._occurrences, self._samples, self._versions), protocol=pickle.HIGHEST_PROTOCOL
        )
        self._values, self._occurrences = {}, set()
        self._samples, self._sample_slot, self._versions, self._version_slot = [], {}, [], {}

    @property
    def compacted(self) -> bool:
        return self._frozen is not None

    def _thaw(self) -> None:
        values, occurrences, samples, versions = pickle.loads(self._frozen)  # type: ignore[arg-type]
        self._frozen = None
        self._values, self._occurrences, self._samples, self._versions = values, occurrences, samples, versions
        self._sample_slot = {sample: slot for slot, sample in enumerate(samples, 1)}
        self._version_slot = {version: slot for slot, version in enumerate(versions, 1)}

    # -- output ---------------------------------------------------------------
    def partial(
        self, *, partition: int = 0, revision: int = 0, close_reason: str = "markers", closed_at_ms: int = 0
    ) -> PartialAggregate:
        """This partition's sums for the batch: one pass over the entries (packed ones
        read straight from their bits), one over the occurrences of wide ones."""
        if self._frozen is not None:
            self._thaw()
        # per weight_version (None: unknown), only once some record named one:
        # [unique, accepted, proposed, verify, completion, paired accepted, paired proposed,
        #  accept covered, paired completion, paired verify, verify covered] and histograms
        by_version: dict[str | None, list[int]] | None = {} if self._versions else None
        version_histograms: dict[str | None, list[tuple[int, ...]]] = {}
        versions = self._versions
        totals = [0] * 11
        histograms = []
        # The aliases are suppressed by any conflict or invalid record, anywhere;
        # this partition's share is only worth folding when it has neither.
        fold = not (self._conflicts or self.invalid_record_count)
        #: per sample, its counters over its distinct generations (+1 form): a counter
        #: is known only if known for every one of them
        folds: dict[tuple, list[int]] = {}
        samples = self._samples
        values = self._values
        for (session, generation), value in values.items():
            if value is CONFLICT:
                continue
            if value.__class__ is int:
                # packed: counters stored as value + 1 (0: unknown)
                packed: int = value
                a, p, v, c = packed & _C20, (packed >> 20) & _C20, (packed >> 40) & _C20, (packed >> 60) & _C24
                hist = None
                if by_version is not None:
                    vslot = (packed >> _VERSION_SHIFT) & _VERSION_SLOTS
                    version = versions[vslot - 1] if vslot else None
                if fold:
                    slot = packed >> _SAMPLE_SHIFT
                    _fold(folds, (session, samples[slot - 1]) if slot else (session, None, generation), a, p, v, c)
            else:
                _, accepted, proposed, verify, completion, hist, version = value  # type: ignore[misc]
                a = 0 if accepted is None else accepted + 1
                p = 0 if proposed is None else proposed + 1
                v = 0 if verify is None else verify + 1
                c = 0 if completion is None else completion + 1
                if hist is not None:
                    histograms.append(hist)
            _add_counters(totals, a, p, v, c)
            if by_version is not None:
                sums = by_version.get(version)
                if sums is None:
                    sums = by_version[version] = [0] * 11
                _add_counters(sums, a, p, v, c)
                if hist is not None:
                    version_histograms.setdefault(version, []).append(hist)
        accept_parts: list[float] = []
        length_parts: list[float] = []
        accept_samples = length_samples = 0
        if fold:
            for session, sample, generation in self._occurrences:
                value = values[(session, generation)]
                _, accepted, proposed, verify, completion, _, _ = value  # type: ignore[misc]
                _fold(
                    folds,
                    (session, sample) if sample is not None else (session, None, generation),
                    0 if accepted is None else accepted + 1,
                    0 if proposed is None else proposed + 1,
                    0 if verify is None else verify + 1,
                    0 if completion is None else completion + 1,
                )
            sample_count = len(folds)
            for a, p, v, c in folds.values():
                if a and p > 1:
                    accept_samples += 1
                    grow(accept_parts, (a - 1) / (p - 1))
                if c and v > 1:
                    length_samples += 1
                    grow(length_parts, (c - 1) / (v - 1))
        else:
            sample_count = len(
                {(s, sample) if sample is not None else (s, None, g) for s, sample, g in self._all_occurrences()}
            )
        weight_versions: list[WeightVersionSums] = []
        too_many = False
        if by_version is not None and any(v is not None for v in by_version):
            if sum(v is not None for v in by_version) > MAX_WEIGHT_VERSIONS:
                too_many = True
            else:
                weight_versions = [
                    _version_sums(version, by_version[version], version_histograms.get(version))
                    for version in sorted(by_version, key=lambda v: (v is None, v or ""))
                ]
        markers = self._markers
        (
            _,
            accepted_total,
            proposed_total,
            verify_total,
            completion_total,
            paired_accepted,
            paired_proposed,
            accept_covered,
            paired_completion,
            paired_verify,
            verify_covered,
        ) = totals
        return PartialAggregate(
            batch_id=self.batch_id,
            run_id=self.run_id,
            partition=partition,
            revision=revision,
            close_reason=close_reason,
            closed_at_ms=closed_at_ms,
            record_count=self.record_count,
            invalid_record_count=self.invalid_record_count,
            late_record_count=self.late_record_count,
            records_received=dict(self._received),
            records_sent={p: m.records_sent for p, m in markers.items()},
            marker_producers=sorted(markers),
            expected_producers=self.expected_producers,
            speculative_algorithms=sorted(self._algorithms),
            counters_seen=self._counters_seen,
            occurrence_count=len(self._occurrences) + self._packed,
            unique_generation_count=len(self._values),
            conflicting_generation_count=self._conflicts,
            sample_count=sample_count,
            accepted_total=accepted_total,
            proposed_total=proposed_total,
            verify_total=verify_total,
            completion_total=completion_total,
            paired_accepted_total=paired_accepted,
            paired_proposed_total=paired_proposed,
            accept_covered_count=accept_covered,
            paired_completion_total=paired_completion,
            paired_verify_total=paired_verify,
            verify_covered_count=verify_covered,
            accept_histogram=add_histograms(histograms),
            accept_ratio_samples=accept_samples,
            accept_ratio_parts=[p for p in accept_parts if p],
            length_ratio_samples=length_samples,
            length_ratio_parts=[p for p in length_parts if p],
            weight_versions=weight_versions,
            too_many_versions=too_many,
        )


def _add_counters(sums: list[int], a: int, p: int, v: int, c: int) -> None:
    """Add one non-conflicting generation (counters in +1 form, 0: unknown) to sums laid
    out as [unique, accepted, proposed, verify, completion, paired accepted, paired
    proposed, accept covered, paired completion, paired verify, verify covered]."""
    sums[0] += 1
    if a:
        sums[1] += a - 1
    if p:
        sums[2] += p - 1
    if v:
        sums[3] += v - 1
    if c:
        sums[4] += c - 1
    if a and p:
        sums[5] += a - 1
        sums[6] += p - 1
        sums[7] += 1
    if c and v:
        sums[8] += c - 1
        sums[9] += v - 1
        sums[10] += 1


def _version_sums(version: str | None, sums: list[int], histograms: list[tuple[int, ...]] | None) -> WeightVersionSums:
    return WeightVersionSums(
        weight_version=version,
        unique_generation_count=sums[0],
        accepted_total=sums[1],
        proposed_total=sums[2],
        verify_total=sums[3],
        completion_total=sums[4],
        paired_accepted_total=sums[5],
        paired_proposed_total=sums[6],
        accept_covered_count=sums[7],
        paired_completion_total=sums[8],
        paired_verify_total=sums[9],
        verify_covered_count=sums[10],
        accept_histogram=add_histograms(histograms or ()),
    )


def _fold(folds: dict[tuple, list[int]], sample_key: tuple, a: int, p: int, v: int, c: int) -> None:
    """Add one generation's counters (+1 form, 0: unknown) to its sample's fold."""
    fold = folds.get(sample_key)
    if fold is None:
        folds[sample_key] = [a, p, v, c]
        return
    f = fold[0]
    fold[0] = f + a - 1 if f and a else 0
    f = fold[1]
    fold[1] = f + p - 1 if f and p else 0
    f = fold[2]
    fold[2] = f + v - 1 if f and v else 0
    f = fold[3]
    fold[3] = f + c - 1 if f and c else 0
