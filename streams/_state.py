"""Dedup state of one batch on one partition: records in, a partial out.

Pure: no Kafka, no asyncio, no clocks (times come in as arguments). Both the
Faust agents and the offline ``aggregate`` command drive exactly this class.

Memory is proportional to distinct generations and occurrences, never to
records: a redelivery changes a counter and nothing else.

Two forms of a generation's entry: the common one (no state hash, no histogram,
counters below 2^20 (completion 2^24), one occurrence so far) is one packed int
holding the four counters and the occurrence's sample; anything else is a wide
6-tuple with its occurrences in a set. A packed entry widens the moment a second
occurrence or a different value arrives, so both forms mean exactly the same.
(Histograms stay wide: packing them cost more CPU in the dedup than it saved.)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Final

from specmeter.schemas import BatchMarker, GenerationRecord, PartialAggregate

from ._delta import BatchDelta
from ._exact import grow

__all__ = ["BatchState", "Outcome", "add_histograms"]

#: (state_hash, accepted, proposed, verify, completion, accept_histogram)
Value = tuple[str | None, int | None, int | None, int | None, int | None, tuple[int, ...] | None]


class _Conflict:
    """Sentinel stored for a key seen with two or more different values."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFLICT"


CONFLICT: Final = _Conflict()

# Packed entry layout (an int): four counters stored as value + 1 (0: unknown) in
# 20/20/20/24 bits, then the slot of the occurrence's sample (0: sample_id None).
_C20: Final = (1 << 20) - 1
_C24: Final = (1 << 24) - 1
_SLOTS: Final = (1 << 20) - 1
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


class BatchState:
    """Everything one partition knows about one batch.

    Identity of a generation is ``(session_id, generation_id)``; an occurrence
    is ``(session_id, sample_id, generation_id)`` with ``sample_id=None`` for a
    generation that is its own sample. A key seen with two different values is
    conflicting for good (order-independent).
    """

    __slots__ = (
        "batch_id",
        "_values",
        "_occurrences",
        "_packed",
        "_samples",
        "_sample_slot",
        "record_count",
        "invalid_record_count",
        "late_record_count",
        "conflicting_record_count",
        "_received",
        "_markers",
        "_algorithms",
        "_counters_seen",
        "_conflicts",
        "_journal_keys",
        "_journal_occurrences",
        "_journal_new",
        "_journal_base",
    )

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self._values: dict[tuple[str, str], Value | _Conflict] = {}
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

    def add_many(self, records: list[GenerationRecord], *, late: bool = False) -> tuple[int, int, int]:
        """Apply a run of valid records: the one implementation of the dedup rule
        (``add`` is its one-record case; the worker calls it once per chunk).

        Returns:
            (aggregated, redelivered, conflicting) record counts.
        """
        values = self._values
        occurrences = self._occurrences
        journal_keys = self._journal_keys
        journal_occurrences = self._journal_occurrences
        journal_new = self._journal_new.append if self._journal_new is not None else None
        received = self._received
        slots = self._sample_slot
        samples = self._samples
        aggregated = redelivered = conflicting = packed_added = 0
        counters_seen = self._counters_seen
        producer, produced = None, 0
        for r in records:
            if r.producer_id is not producer:
                if producer is not None:
                    received[producer] = received.get(producer, 0) + produced
                producer, produced = r.producer_id, 0
            produced += 1
            session, generation, sample = r.session_id, r.generation_id, r.sample_id
            key = (session, generation)
            accepted, proposed, verify, completion = r.accepted, r.proposed, r.verify, r.completion
            if not counters_seen and (accepted is not None or proposed is not None or verify is not None):
                counters_seen = True
            histogram = r.accept_histogram
            # the packed form of this record, when it has one
            packed = None
            if r.state_hash is None and histogram is None:
                slot = 0 if sample is None else slots.get(sample) or self._new_slot(sample)
                if slot is not None:
                    a = 0 if accepted is None else accepted + 1
                    p = 0 if proposed is None else proposed + 1
                    v = 0 if verify is None else verify + 1
                    c = 0 if completion is None else completion + 1
                    if a <= _C20 and p <= _C20 and v <= _C20 and c <= _C24:
                        packed = a | p << 20 | v << 40 | c << 60 | slot << 84
            known = values.get(key)
            if known is None:
                aggregated += 1
                if packed is not None:
                    values[key] = packed
                    packed_added += 1
                    if journal_new is not None:
                        journal_new((session, generation, sample, packed))
                else:
                    values[key] = (r.state_hash, accepted, proposed, verify, completion,
                                   None if histogram is None else tuple(histogram))
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
                    first_slot = known >> 84
                    journal_keys.add(key)
                    journal_occurrences.append(  # type: ignore[union-attr]
                        (session, samples[first_slot - 1] if first_slot else None, generation))
                known = self._widen(key, known)
            value = (r.state_hash, accepted, proposed, verify, completion,
                     None if histogram is None else tuple(histogram))
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

    def _widen(self, key: tuple[str, str], packed: int) -> Value:
        """Turn a packed entry into its wide form (value tuple, occurrence in the set)."""
        accepted, proposed, verify, completion = _unpack(packed)
        slot = packed >> 84
        value = (None, accepted, proposed, verify, completion, None)
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
                    slot = value >> 84  # type: ignore[operator]
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
        return (self.record_count, self.invalid_record_count, self.late_record_count,
                self.conflicting_record_count, dict(self._received), dict(self._markers),
                frozenset(self._algorithms), self._counters_seen)

    def start_journal(self) -> None:
        """Begin recording changes, to be taken as deltas by ``take_delta``."""
        self._journal_keys = set()
        self._journal_occurrences = []
        self._journal_new = []
        self._journal_base = self._counters()

    def take_delta(self, *, first_offset: int, last_offset: int, last_input_ms: int) -> BatchDelta | None:
        """What changed since the last call (or ``start_journal``); None if nothing did."""
        journal_keys, journal_new = self._journal_keys, self._journal_new
        if journal_keys is None or self._journal_base is None or self._journal_occurrences is None or journal_new is None:
            raise RuntimeError("take_delta() needs start_journal() first")
        base = self._journal_base
        now = self._counters()
        if not journal_keys and not self._journal_occurrences and not journal_new and now == base:
            return None
        # entries created packed and still packed: five flat items each (the counters
        # split below 2^64 for msgpack); one widened since is in ``entries`` instead
        packed: list[str | int | None] = []
        extend = packed.extend
        for session, generation, sample, value in journal_new:
            if journal_keys and (session, generation) in journal_keys:
                continue
            counters = value & _COUNTERS_MASK
            extend((session, generation, sample, counters & _LO64, counters >> 64))
        values = self._values
        entries = []
        for key in journal_keys:
            value = values[key]
            if value is CONFLICT:
                entries.append((key[0], key[1], True, None, None, None, None, None, None))
            else:
                entries.append((key[0], key[1], False, *value))  # type: ignore[misc]
        received = {p: n - base[4].get(p, 0) for p, n in now[4].items() if n != base[4].get(p, 0)}
        markers = [m for p, m in now[5].items() if base[5].get(p) != m]
        delta = BatchDelta(
            batch_id=self.batch_id,
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
        )
        self._journal_keys = set()
        self._journal_occurrences = []
        self._journal_new = []
        self._journal_base = now
        return delta

    def apply_delta(self, delta: BatchDelta) -> None:
        """Replay one durable delta (restoring after a crash or a rebalance)."""
        values = self._values
        flat = delta.packed
        for i in range(0, len(flat), 5):
            session, generation, sample, low, high = flat[i:i + 5]
            self._restore_packed((session, generation), sample, low | high << 64)  # type: ignore[operator]
        for session, generation, conflict, *value in delta.entries:
            key = (session, generation)
            before = values.get(key)
            if before.__class__ is int:
                before = self._widen(key, before)  # type: ignore[arg-type]
            if conflict:
                if before is not CONFLICT:
                    self._conflicts += 1
                values[key] = CONFLICT
            else:
                state_hash, accepted, proposed, verify, completion, histogram = value
                values[key] = (state_hash, accepted, proposed, verify, completion,
                               tuple(histogram) if histogram is not None else None)
        for session, sample, generation in delta.occurrences:
            known = values.get((session, generation))
            if known.__class__ is int:
                self._widen((session, generation), known)  # type: ignore[arg-type]
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

    def _restore_packed(self, key: tuple[str, str], sample: str | None, counters: int) -> None:
        """Install an entry a delta wrote in packed form (new when it was written)."""
        values = self._values
        known = values.get(key)
        if known is None:
            slot = 0 if sample is None else self._sample_slot.get(sample) or self._new_slot(sample)
            if slot is not None:
                values[key] = counters | slot << 84
                self._packed += 1
                return
        # not new after all, or no slot left: the wide form, with add's conflict rule
        if known.__class__ is int:
            known = self._widen(key, known)  # type: ignore[arg-type]
        value = (None, *_unpack(counters), None)
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
        return len(self._values)

    # -- output ---------------------------------------------------------------
    def partial(
        self, *, partition: int = 0, revision: int = 0, close_reason: str = "markers", closed_at_ms: int = 0
    ) -> PartialAggregate:
        """This partition's sums for the batch: one pass over the entries (packed ones
        read straight from their bits), one over the occurrences of wide ones."""
        accepted_total = proposed_total = verify_total = completion_total = 0
        paired_accepted = paired_proposed = accept_covered = 0
        paired_completion = paired_verify = verify_covered = 0
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
            if value.__class__ is not int:
                _, accepted, proposed, verify, completion, hist = value  # type: ignore[misc]
                if accepted is not None:
                    accepted_total += accepted
                if proposed is not None:
                    proposed_total += proposed
                if verify is not None:
                    verify_total += verify
                if completion is not None:
                    completion_total += completion
                if accepted is not None and proposed is not None:
                    paired_accepted += accepted
                    paired_proposed += proposed
                    accept_covered += 1
                if completion is not None and verify is not None:
                    paired_completion += completion
                    paired_verify += verify
                    verify_covered += 1
                if hist is not None:
                    histograms.append(hist)
                continue
            # packed: counters stored as value + 1 (0: unknown)
            packed = value
            a, p, v, c = packed & _C20, (packed >> 20) & _C20, (packed >> 40) & _C20, (packed >> 60) & _C24
            if a:
                accepted_total += a - 1
            if p:
                proposed_total += p - 1
            if v:
                verify_total += v - 1
            if c:
                completion_total += c - 1
            if a and p:
                paired_accepted += a - 1
                paired_proposed += p - 1
                accept_covered += 1
            if c and v:
                paired_completion += c - 1
                paired_verify += v - 1
                verify_covered += 1
            if fold:
                slot = packed >> 84
                _fold(folds, (session, samples[slot - 1]) if slot else (session, None, generation), a, p, v, c)
        accept_parts: list[float] = []
        length_parts: list[float] = []
        accept_samples = length_samples = 0
        if fold:
            for session, sample, generation in self._occurrences:
                value = values[(session, generation)]
                _, accepted, proposed, verify, completion, _ = value  # type: ignore[misc]
                _fold(folds, (session, sample) if sample is not None else (session, None, generation),
                      0 if accepted is None else accepted + 1, 0 if proposed is None else proposed + 1,
                      0 if verify is None else verify + 1, 0 if completion is None else completion + 1)
            sample_count = len(folds)
            for a, p, v, c in folds.values():
                if a and p > 1:
                    accept_samples += 1
                    grow(accept_parts, (a - 1) / (p - 1))
                if c and v > 1:
                    length_samples += 1
                    grow(length_parts, (c - 1) / (v - 1))
        else:
            sample_count = len({(s, sample) if sample is not None else (s, None, g)
                                for s, sample, g in self._all_occurrences()})
        markers = self._markers
        return PartialAggregate(
            batch_id=self.batch_id,
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
