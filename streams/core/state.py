"""Dedup state of one batch on one partition: records in, a partial out.

Pure: no Kafka, no asyncio, no clocks (times come in as arguments). The worker's
stage 1 (``stage1.PartitionProcessor``) and the offline ``aggregate`` command drive
this class, or the native core's twin of it.

This is the reference core: written to be read against docs/contract.md §3, not
to be fast (the native core in ``streams/core/native`` is the fast one, and must agree
with this one). Memory is proportional to distinct generations and occurrences,
never to records: a redelivery changes a counter and nothing else.
"""

from __future__ import annotations

import enum
import operator
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import msgspec

from specmeter.schemas import (
    DISTRIBUTION_BUCKETS,
    MAX_BREAKDOWN_KEYS,
    BatchMarker,
    BreakdownSums,
    DecodedMessage,
    GenerationRecord,
    InvalidRecord,
    PartialAggregate,
    decode_records_message,
)

from .exact import grow
from .layout import BatchDelta, encode_delta

__all__ = [
    "BatchState",
    "Decoded",
    "Outcome",
    "add_histograms",
    "decode_message",
    "breaks_bound",
    "inconsistent",
    "value_inconsistent",
    "distribution_bucket",
    "breakdown_order",
]

#: a generation's key: (session_id, generation_id)
Key = tuple[str, str]
#: an occurrence: (session_id, sample_id, generation_id)
Occurrence = tuple[str, str | None, str]


class Value(msgspec.Struct, frozen=True, gc=False):
    """What a record says about its generation (docs/contract.md §3); two records of
    one key agree when their values are equal. ``gc=False``: only strings, ints and
    tuples of ints inside, so the collector need not walk a big batch's values."""

    state_hash: str | None
    accepted: int | None
    proposed: int | None
    verify: int | None
    completion: int | None
    accept_histogram: tuple[int, ...] | None
    weight_version: str | None = None  # entries written before weight versions lack it
    task: str | None = None  # (revision 4) entries written before tasks lack it
    draft_lag: int | None = None  # (revision 5) entries written before draft lags lack it

    @classmethod
    def of(cls, r: GenerationRecord) -> Value:
        hist = None if r.accept_histogram is None else tuple(r.accept_histogram)
        return cls(
            r.state_hash, r.accepted, r.proposed, r.verify, r.completion, hist, r.weight_version, r.task, r.draft_lag
        )


class _Conflict:
    """Sentinel stored for a key seen with two or more different values."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFLICT"

    def __reduce__(self) -> str:
        return "CONFLICT"  # unpickles as the module's one instance (``compact``)


CONFLICT: Final = _Conflict()


class Outcome(enum.Enum):
    """What one valid record did to the state."""

    AGGREGATED = "aggregated"  # a new occurrence
    REDELIVERED = "redelivered"  # an occurrence already seen: changes nothing


def inconsistent(accepted: int | None, verify: int | None, histogram: Sequence[int] | None) -> bool:
    """A generation's histogram contradicts its own counters (docs/contract.md §3.5): it
    is known, and verify is known and is not its step count ``sum(H)``, or accepted is
    known and is not its accepted drafts ``sum(i * H[i])``."""
    if histogram is None:
        return False
    if verify is not None and verify != sum(histogram):
        return True
    return accepted is not None and accepted != sum(map(operator.mul, range(len(histogram)), histogram))


def breaks_bound(accepted: int | None, proposed: int | None, verify: int | None, completion: int | None) -> bool:
    """A generation's counters break a bound no engine's counters can (docs/contract.md
    §3.5, revision 6), each checked only where both of its counters are known: more drafts
    accepted than proposed, more verify steps than emitted tokens (every step emits at
    least one), or more drafts accepted than tokens emitted (an accepted draft is one)."""
    return _above(accepted, proposed) or _above(verify, completion) or _above(accepted, completion)


def _above(count: int | None, bound: int | None) -> bool:
    return count is not None and bound is not None and count > bound


def value_inconsistent(value: Value) -> bool:
    """A generation counted by ``spec/inconsistent_generation_count`` (§3.5): its histogram
    contradicts its counters, or its counters break a bound; either way it counts once."""
    if breaks_bound(value.accepted, value.proposed, value.verify, value.completion):
        return True
    return inconsistent(value.accepted, value.verify, value.accept_histogram)


def distribution_bucket(completion: int, verify: int) -> int:
    """A generation's quarter-token bucket of its own tokens per verify step (docs/contract.md
    §3.7): ``min(63, max(0, floor(4 * completion / verify) - 4))``, for verify > 0."""
    return min(DISTRIBUTION_BUCKETS - 1, max(0, 4 * completion // verify - 4))


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

    The Python twin of the native decoder's answer (``specmeter.streams.core._native``),
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
        self._groups = _grouped(message.records)
        self.groups: list[tuple[tuple[str | None, str], int]] = [
            ((self.run_id if g[0].run_id is None else g[0].run_id, g[0].batch_id), len(g)) for g in self._groups
        ]

    def records(self, group: int, start: int = 0, stop: int | None = None) -> list[GenerationRecord]:
        """The records ``start:stop`` of a group."""
        return self._groups[group][start:stop]

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups)


def _grouped(records: list[GenerationRecord]) -> list[list[GenerationRecord]]:
    """A message's records as ``Decoded`` groups them (the native decoder's way): one
    group when every record names the same batch and run, else one per record."""
    if not records:
        return []
    first = records[0]
    if all(r.batch_id == first.batch_id and r.run_id == first.run_id for r in records):
        return [records]
    return [[r] for r in records]


def decode_message(data: bytes, *, max_bytes: int | None = None) -> Decoded:
    """Decode one records-topic message (never raises on bad input; see
    ``decode_records_message``)."""
    return Decoded(decode_records_message(data, max_bytes=max_bytes))


class _Journal:
    """Changes not yet taken as a delta: keys whose value changed (in order), the
    occurrences added, and the counters as of the last delta."""

    __slots__ = ("base", "keys", "occurrences")

    def __init__(self, base: tuple) -> None:
        self.keys: dict[Key, None] = {}
        self.occurrences: list[Occurrence] = []
        self.base = base

    @property
    def changed(self) -> bool:
        """Whether a key or an occurrence changed (the counters aside)."""
        return bool(self.keys or self.occurrences)


class BatchState:
    """Everything one partition knows about one batch.

    Identity of a generation is ``(session_id, generation_id)``; an occurrence
    is ``(session_id, sample_id, generation_id)`` with ``sample_id=None`` for a
    generation that is its own sample. A key seen with two different values is
    conflicting for good (order-independent).
    """

    def __init__(self, batch_id: str, run_id: str | None = None) -> None:
        self.batch_id = batch_id
        self.run_id = run_id
        self._values: dict[Key, Value | _Conflict] = {}
        self._occurrences: set[Occurrence] = set()
        self.record_count = 0
        self.invalid_record_count = 0
        self.late_record_count = 0
        self.conflicting_record_count = 0
        self._received: dict[str, int] = {}
        self._markers: dict[str, BatchMarker] = {}
        self._algorithms: set[str] = set()
        self._counters_seen = False
        self._journal: _Journal | None = None  # None until ``start_journal``
        #: the dedup state pickled by ``compact`` (None: live) and its generation count
        self._frozen: bytes | None = None
        self._frozen_generations = 0

    # -- the dedup rule ---------------------------------------------------------
    def _observe(self, occurrence: Occurrence, value: Value, journal: _Journal | None) -> tuple[bool, bool]:
        """The one dedup rule (records and restored packed entries alike): the first
        value of a key wins; a different one makes the key CONFLICT for good, whatever
        the order; an occurrence counts once. Changes go to ``journal`` when given.

        Returns:
            (the occurrence is new, the key is conflicting).
        """
        session, _, generation = occurrence
        key = (session, generation)
        known = self._values.get(key)
        if known is None or (known is not CONFLICT and known != value):
            known = self._values[key] = value if known is None else CONFLICT
            if journal is not None:
                journal.keys[key] = None
        new = occurrence not in self._occurrences
        if new:
            self._occurrences.add(occurrence)
            if journal is not None:
                journal.occurrences.append(occurrence)
        return new, known is CONFLICT

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
        """Apply a run of valid records (the worker calls it once per chunk).

        ``producer_id`` is whose deliveries a record without its own counts as (the
        ``RecordBatch`` envelope's producer: a publisher's records are its own).

        Returns:
            (aggregated, redelivered, conflicting) record counts.
        """
        self._thaw()
        aggregated = conflicting = 0
        for r in records:
            new, conflict = self._observe((r.session_id, r.sample_id, r.generation_id), Value.of(r), self._journal)
            aggregated += new
            conflicting += conflict
            producer = r.producer_id or producer_id
            if producer is not None:
                self._received[producer] = self._received.get(producer, 0) + 1
            if r.accepted is not None or r.proposed is not None or r.verify is not None:
                self._counters_seen = True
        self.record_count += len(records)
        if late:
            self.late_record_count += len(records)
        self.conflicting_record_count += conflicting
        return aggregated, len(records) - aggregated, conflicting

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
        """Everything beside entries and occurrences a delta carries, as of now."""
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
        self._journal = _Journal(self._counters())

    def take_delta(self, *, first_offset: int, last_offset: int, last_input_ms: int) -> BatchDelta | None:
        """What changed since the last call (or ``start_journal``); None if nothing did.

        Written wide only (``entries`` and ``occurrences``): the packed forms are
        for ``apply_delta`` to read, from older changelogs and the native core."""
        journal = self._journal
        if journal is None:
            raise RuntimeError("take_delta() needs start_journal() first")
        base, now = journal.base, self._counters()
        if not journal.changed and now == base:
            return None
        delta = BatchDelta(
            batch_id=self.batch_id,
            run_id=self.run_id,
            first_offset=first_offset,
            last_offset=last_offset,
            last_input_ms=last_input_ms,
            entries=self._wide_entries(journal.keys),
            occurrences=journal.occurrences,
            **_changed_counts(base, now),
        )
        self._journal = _Journal(now)
        return delta

    def _wide_entries(self, keys: Iterable[Key]) -> list[tuple]:
        """The entries of the keys changed, wide: (session, generation, conflict, value's fields)."""
        entries = []
        for key in keys:
            value = self._values[key]
            if isinstance(value, Value):
                fields = msgspec.structs.astuple(value)
                # a value without a lag in eleven items, without a task either in ten, as
                # before lags and tasks (the native core too)
                width = len(fields) if value.draft_lag is not None else len(fields) - 1 - (value.task is None)
                entries.append((*key, False, *fields[:width]))
            else:
                entries.append((*key, True, None, None, None, None, None, None, None))
        return entries

    def take_delta_encoded(self, *, first_offset: int, last_offset: int, last_input_ms: int) -> bytes | None:
        """``take_delta`` encoded for the changelog, compressed (the native core encodes
        and compresses it itself, in the same format: ``layout.encode_delta``)."""
        delta = self.take_delta(first_offset=first_offset, last_offset=last_offset, last_input_ms=last_input_ms)
        return None if delta is None else encode_delta(delta)

    def apply_delta(self, delta: BatchDelta) -> None:
        """Replay one durable delta (restoring after a crash or a rebalance), whichever
        core wrote it and whenever: packed entries go through the dedup rule (each
        was new where it was written, but a restore may already hold its key); wide
        entries are the writer's value of the key and replace what is held."""
        self._thaw()
        self._apply_entries(delta)
        self._add_counts(delta)
        if self._journal is not None:  # what was restored is durable already
            self._journal.base = self._counters()

    def _apply_entries(self, delta: BatchDelta) -> None:
        """A delta's keys and occurrences into the dedup state: packed entries through the
        dedup rule, wide ones as the writer's value, then the occurrences it names."""
        for occurrence, value in _packed_entries(delta):
            self._observe(occurrence, value, None)
        for session, generation, conflict, *fields in delta.entries:
            self._values[(session, generation)] = CONFLICT if conflict else _restored_value(*fields)
        self._occurrences.update((s, sample, g) for s, sample, g in delta.occurrences)

    def _add_counts(self, delta: BatchDelta) -> None:
        """A delta's counts, received records, markers and algorithms, added to the batch's."""
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

        For a closed batch waiting out its grace: a fraction of the memory of live
        dicts and sets, and nothing for the garbage collector to walk (its full
        collections paused the worker for 0.1-0.8 s with a minute of closed batches
        held). Whatever reads or changes the state thaws it first, so late records
        apply exactly as before. A no-op while changes wait to be taken as a delta
        (they name live entries). Only bytes written here are unpickled.
        """
        journal = self._journal
        if self._frozen is not None or (journal is not None and journal.changed):
            return
        self._frozen_generations = len(self._values)
        self._frozen = pickle.dumps((self._values, self._occurrences), protocol=pickle.HIGHEST_PROTOCOL)
        self._values, self._occurrences = {}, set()

    @property
    def compacted(self) -> bool:
        return self._frozen is not None

    def _thaw(self) -> None:
        if self._frozen is not None:
            self._values, self._occurrences = pickle.loads(self._frozen)
            self._frozen = None

    # -- output ---------------------------------------------------------------
    def partial(
        self, *, partition: int = 0, revision: int = 0, close_reason: str = "markers", closed_at_ms: int = 0
    ) -> PartialAggregate:
        """This partition's sums for the batch (docs/contract.md §3, §3.1, §3.4 - §3.7):
        over the non-conflicting keys, for the batch, per weight version, per task and per
        draft lag, the inconsistent ones counted and the spread of their tokens per verify
        step; the legacy per-sample ratios over the occurrences."""
        self._thaw()
        by_label, inconsistent_count, distribution = _sums_by_label(self._values.values())
        totals = _Sums.of(by_label.values())
        conflicts = len(self._values) - totals.unique_generation_count
        legacy = _LegacyRatios(self._values, self._occurrences, fold=not (conflicts or self.invalid_record_count))
        weight_versions, too_many_versions = _breakdown(by_label, 0)
        tasks, too_many_tasks = _breakdown(by_label, 1)
        draft_lags, too_many_draft_lags = _breakdown(by_label, 2)
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
            **self._bookkeeping(),
            occurrence_count=len(self._occurrences),
            conflicting_generation_count=conflicts,
            **_legacy_fields(legacy),
            weight_versions=weight_versions,
            too_many_versions=too_many_versions,
            inconsistent_generation_count=inconsistent_count,
            tasks=tasks,
            too_many_tasks=too_many_tasks,
            draft_lags=draft_lags,
            too_many_draft_lags=too_many_draft_lags,
            tokens_per_verify_distribution=distribution,
            **totals.fields(unique_generation_count=len(self._values)),
        )

    def _bookkeeping(self) -> dict[str, Any]:
        """The partial's close bookkeeping (what stage 2 sums or unions by
        ``merge._MERGED``): deliveries received and sent per producer, the
        markers' producers and count, the algorithms, whether a counter was seen."""
        markers = self._markers
        return {
            "records_received": dict(self._received),
            "records_sent": {p: m.records_sent for p, m in markers.items()},
            "marker_producers": sorted(markers),
            "expected_producers": self.expected_producers,
            "speculative_algorithms": sorted(self._algorithms),
            "counters_seen": self._counters_seen,
        }


def _legacy_fields(legacy: _LegacyRatios) -> dict[str, Any]:
    """A partial's share of the legacy ratios: the samples counted and each ratio's
    expansion (its zero parts dropped, as ``merge_expansions`` drops them)."""
    return {
        "sample_count": legacy.sample_count,
        "accept_ratio_samples": legacy.accept_samples,
        "accept_ratio_parts": [p for p in legacy.accept_parts if p],
        "length_ratio_samples": legacy.length_samples,
        "length_ratio_parts": [p for p in legacy.length_parts if p],
    }


def _changed_counts(base: tuple, now: tuple) -> dict[str, Any]:
    """A delta's counts: what changed from ``base`` to ``now`` (two ``_counters`` tuples)."""
    return {
        "record_count": now[0] - base[0],
        "invalid_record_count": now[1] - base[1],
        "late_record_count": now[2] - base[2],
        "conflicting_record_count": now[3] - base[3],
        "received": {p: n - base[4].get(p, 0) for p, n in now[4].items() if n != base[4].get(p, 0)},
        "markers": [m for p, m in now[5].items() if base[5].get(p) != m],
        "algorithms": sorted(now[6] - base[6]),
        "counters_seen": now[7] and not base[7],
    }


#: a value's breakdown keys: (weight_version, task, draft_lag)
Label = tuple[str | None, str | None, int | None]


def _sums_by_label(values: Iterable[Value | _Conflict]) -> tuple[dict[Label, _Sums], int, list[int] | None]:
    """One pass over the non-conflicting values: their sums per (weight_version, task,
    draft_lag) label (the batch's and each breakdown key's are added up from those), how
    many are inconsistent (docs/contract.md §3.5), and the spread of their tokens per
    verify step (§3.7: None when no value has completion and verify > 0)."""
    by_label: dict[Label, _Sums] = {}
    inconsistent_count = 0
    distribution: list[int] | None = None
    for value in values:
        if isinstance(value, Value):
            label = (value.weight_version, value.task, value.draft_lag)
            sums = by_label.get(label)
            if sums is None:
                sums = by_label[label] = _Sums()
            sums.add(value)
            inconsistent_count += value_inconsistent(value)
            if value.verify and value.completion is not None:
                if distribution is None:
                    distribution = [0] * DISTRIBUTION_BUCKETS
                distribution[distribution_bucket(value.completion, value.verify)] += 1
    return by_label, inconsistent_count, distribution


def _breakdown(by_label: dict[Label, _Sums], part: int) -> tuple[list[BreakdownSums], bool]:
    """One breakdown of the non-conflicting values (``part`` of their (weight_version,
    task, draft_lag) label: 0 per weight version, 1 per task, 2 per draft lag -- the same
    rule for all, docs/contract.md §3.1, §3.4 and §3.6): the sums of each key, sorted
    (lags numerically) with the unknown (None) last, and whether more than
    ``MAX_BREAKDOWN_KEYS`` known keys appeared (then no entries). No entries either when
    no value knows its key."""
    groups: dict[str | int | None, list[_Sums]] = {}
    for label, sums in by_label.items():
        groups.setdefault(label[part], []).append(sums)
    known = len(groups) - (None in groups)
    if known > MAX_BREAKDOWN_KEYS:
        return [], True
    if not known:
        return [], False
    names = sorted(groups, key=breakdown_order)
    return [_Sums.of(groups[name]).entry(name) for name in names], False


def breakdown_order(key: str | int | None) -> tuple[bool, str | int]:
    """A breakdown's order: by key (a task or version by its string, a draft lag by its
    number), the unknown (None) last."""
    return (key is None, 0 if key is None else key)


class _Sums:
    """Totals, paired totals, covered counts and histogram over non-conflicting
    generations: the batch's, or one breakdown key's. The attributes are named as
    the fields of ``PartialAggregate`` and ``BreakdownSums`` they fill."""

    def __init__(self) -> None:
        self.unique_generation_count = 0
        self.accepted_total = self.proposed_total = self.verify_total = self.completion_total = 0
        self.paired_accepted_total = self.paired_proposed_total = self.accept_covered_count = 0
        self.paired_completion_total = self.paired_verify_total = self.verify_covered_count = 0
        self.histograms: list[tuple[int, ...]] = []

    def add(self, v: Value) -> None:
        self.unique_generation_count += 1
        self.accepted_total += v.accepted or 0
        self.proposed_total += v.proposed or 0
        self.verify_total += v.verify or 0
        self.completion_total += v.completion or 0
        if v.accepted is not None and v.proposed is not None:  # a complete accept pair
            self.paired_accepted_total += v.accepted
            self.paired_proposed_total += v.proposed
            self.accept_covered_count += 1
        if v.completion is not None and v.verify is not None:  # a complete verify pair
            self.paired_completion_total += v.completion
            self.paired_verify_total += v.verify
            self.verify_covered_count += 1
        if v.accept_histogram is not None:
            self.histograms.append(v.accept_histogram)

    @classmethod
    def of(cls, parts: Iterable[_Sums]) -> _Sums:
        """The sums of disjoint groups of generations, added up."""
        out = cls()
        for part in parts:
            for name, value in vars(part).items():
                if name == "histograms":
                    out.histograms += value
                else:
                    setattr(out, name, getattr(out, name) + value)
        return out

    def fields(self, **override: int) -> dict:
        """The fields a ``PartialAggregate`` and a ``BreakdownSums`` share."""
        out = {name: value for name, value in vars(self).items() if name != "histograms"}
        return out | {"accept_histogram": add_histograms(self.histograms)} | override

    def entry(self, key: str | int | None) -> BreakdownSums:
        return BreakdownSums(key=key, **self.fields())


class _LegacyRatios:
    """The legacy aliases' share (docs/contract.md §3): per sample, each counter folded
    over its distinct generations (known only when known for every one), then the
    sample's accepted/proposed and completion/verify, summed exactly (``exact``).
    Only folded when ``fold`` (no conflict, no invalid record): otherwise they are
    suppressed anyway, and only the samples are counted."""

    def __init__(self, values: dict[Key, Value | _Conflict], occurrences: set[Occurrence], *, fold: bool) -> None:
        samples = _samples(values, occurrences, fold=fold)
        self.sample_count = len(samples)
        self.accept_samples = self.length_samples = 0
        self.accept_parts: list[float] = []
        self.length_parts: list[float] = []
        for accepted, proposed, verify, completion in samples.values() if fold else ():
            self._add(accepted, proposed, verify, completion)

    def _add(self, accepted: int | None, proposed: int | None, verify: int | None, completion: int | None) -> None:
        """One sample's ratios, each where its counters are known (and its divisor not 0)."""
        accept = _ratio(accepted, proposed)
        if accept is not None:
            self.accept_samples += 1
            grow(self.accept_parts, accept)
        length = _ratio(completion, verify)
        if length is not None:
            self.length_samples += 1
            grow(self.length_parts, length)


def _ratio(numerator: int | None, denominator: int | None) -> float | None:
    """A sample's ratio of two counters: None unless both are known and the divisor is positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _samples(
    values: dict[Key, Value | _Conflict], occurrences: set[Occurrence], *, fold: bool
) -> dict[tuple, list[int | None]]:
    """Each sample's counters folded over its distinct generations (``_fold``; not
    folded, only the samples: empty lists). A sample is (session, sample_id), or the
    generation itself when sample_id is null."""
    samples: dict[tuple, list[int | None]] = {}
    for session, sample, generation in occurrences:
        sample_key = (session, sample) if sample is not None else (session, None, generation)
        if not fold:
            samples[sample_key] = []
            continue
        v = values[(session, generation)]
        assert isinstance(v, Value)  # no conflict when folding
        samples[sample_key] = _fold(samples.get(sample_key), [v.accepted, v.proposed, v.verify, v.completion])
    return samples


def _fold(known: list[int | None] | None, counters: list[int | None]) -> list[int | None]:
    """A sample's counters with one more of its generations: each stays known only
    while known for every one."""
    if known is None:
        return counters
    return [None if a is None or b is None else a + b for a, b in zip(known, counters, strict=True)]


def _restored_value(*fields: Any) -> Value:
    """A wide entry's value as a delta holds it: six fields (before weight versions),
    seven (before tasks), eight (before draft lags, or without one) or nine, the
    histogram a list."""
    state_hash, accepted, proposed, verify, completion, hist, *version = fields
    return Value(state_hash, accepted, proposed, verify, completion, None if hist is None else tuple(hist), *version)


#: the packed delta layout's counters (accepted, proposed, verify, completion): bit
#: offset and width of each, stored as value + 1 (0: unknown)
_PACKED_COUNTERS: Final = ((0, 20), (20, 20), (40, 20), (60, 24))


def _packed_entries(delta: BatchDelta) -> Iterator[tuple[Occurrence, Value]]:
    """The entries a delta holds in the packed forms (the native core writes them;
    this core did before it wrote everything wide): flat runs of (session, generation,
    sample, counters' low 64 bits, high bits) in ``packed``, the same and the weight
    version in ``packed_versioned``; each one occurrence, no state hash or histogram."""
    forms: tuple[tuple[list[Any], int], ...] = ((delta.packed, 5), (delta.packed_versioned, 6))
    for flat, width in forms:
        for i in range(0, len(flat), width):
            session, generation, sample, low, high, *version = flat[i : i + width]
            bits = low | high << 64
            counters = [(bits >> shift) & ((1 << size) - 1) for shift, size in _PACKED_COUNTERS]
            accepted, proposed, verify, completion = (c - 1 if c else None for c in counters)
            yield (session, sample, generation), Value(None, accepted, proposed, verify, completion, None, *version)
