"""Merging partitions' partials, and the metrics derived from the merged sums.

Partials carry sums only, so merging is addition. Every ratio in the output is
computed here, once, from the merged sums.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from specmeter.schemas import (
    MAX_BREAKDOWN_KEYS,
    BatchMetrics,
    BreakdownSums,
    DraftLagMetrics,
    PartialAggregate,
    TaskMetrics,
    WeightVersionMetrics,
)

from .exact import expansion_value, merge_expansions
from .state import add_histograms, breakdown_order

__all__ = [
    "merge_partials",
    "batch_metrics_dict",
    "build_batch_metrics",
    "missing_records",
    "is_speculative",
    "merge_breakdown",
    "Breakdown",
    "BY_WEIGHT_VERSION",
    "BY_TASK",
    "BY_DRAFT_LAG",
    "by_weight_version",
    "by_task",
    "by_draft_lag",
    "merge_distributions",
    "tokens_per_verify_distribution",
    "accept_rate_by_position",
    "tokens_per_verify_by_budget",
]

_SUMMED = (
    "record_count",
    "invalid_record_count",
    "late_record_count",
    "occurrence_count",
    "unique_generation_count",
    "conflicting_generation_count",
    "sample_count",
    "accepted_total",
    "proposed_total",
    "verify_total",
    "completion_total",
    "paired_accepted_total",
    "paired_proposed_total",
    "accept_covered_count",
    "paired_completion_total",
    "paired_verify_total",
    "verify_covered_count",
    "accept_ratio_samples",
    "length_ratio_samples",
    "inconsistent_generation_count",
)


#: the sums of a breakdown entry: ``BreakdownSums`` less its key and histogram (read off
#: the struct, so a field added there is merged without a second list)
_BREAKDOWN_SUMMED = tuple(name for name in BreakdownSums.__struct_fields__ if name not in ("key", "accept_histogram"))
assert _BREAKDOWN_SUMMED[0] == "unique_generation_count"  # _unbroken computes it and takes the rest


class Breakdown(NamedTuple):
    """One breakdown of a batch's non-conflicting generations (docs/contract.md §3.1,
    §3.4, §3.6): where a partial holds its sums and flag, and the message's entries. Weight
    versions, tasks and draft lags are the same rule on another key."""

    #: the ``PartialAggregate`` fields: the entries, and "past MAX_BREAKDOWN_KEYS known keys"
    entries: str
    too_many: str
    #: the message's entry type and the name of its key field
    metrics_type: type[WeightVersionMetrics] | type[TaskMetrics] | type[DraftLagMetrics]
    key: str


BY_WEIGHT_VERSION = Breakdown("weight_versions", "too_many_versions", WeightVersionMetrics, "weight_version")
BY_TASK = Breakdown("tasks", "too_many_tasks", TaskMetrics, "task")
BY_DRAFT_LAG = Breakdown("draft_lags", "too_many_draft_lags", DraftLagMetrics, "draft_lag")
BREAKDOWNS = (BY_WEIGHT_VERSION, BY_TASK, BY_DRAFT_LAG)


def _unbroken(p: PartialAggregate) -> list[BreakdownSums]:
    """A partial none of whose generations knows the breakdown's key (or one from a
    worker before the breakdown existed): its whole G \\ C is the unknown key."""
    unique = p.unique_generation_count - p.conflicting_generation_count
    if unique <= 0:
        return []
    fields = {name: getattr(p, name) for name in _BREAKDOWN_SUMMED[1:]}
    return [BreakdownSums(key=None, unique_generation_count=unique, accept_histogram=p.accept_histogram, **fields)]


def merge_breakdown(partials: Sequence[PartialAggregate], breakdown: Breakdown) -> list[BreakdownSums] | None:
    """The per-key sums of partials from disjoint partitions, sorted by key with the
    unknown key last; None when no generation knows its key or more than
    ``MAX_BREAKDOWN_KEYS`` known keys appear."""
    lists = [getattr(p, breakdown.entries) for p in partials]
    if any(getattr(p, breakdown.too_many) for p in partials) or not any(lists):
        return None
    by_key = _entries_by_key(partials, lists)
    if _too_many_keys(by_key):
        return None
    return [_added(key, by_key[key]) for key in sorted(by_key, key=breakdown_order)]


def _too_many_keys(keys: Iterable[str | int | None]) -> bool:
    """Whether more than ``MAX_BREAKDOWN_KEYS`` known keys appear (the unknown one, None,
    not counted): then the breakdown has no entries."""
    return sum(key is not None for key in keys) > MAX_BREAKDOWN_KEYS


def _entries_by_key(
    partials: Sequence[PartialAggregate], lists: list[list[BreakdownSums]]
) -> dict[str | int | None, list[BreakdownSums]]:
    """Each key's entries over the partials (a partial without entries: all unknown)."""
    by_key: dict[str | int | None, list[BreakdownSums]] = {}
    for p, entries in zip(partials, lists, strict=True):
        for entry in entries or _unbroken(p):
            by_key.setdefault(entry.key, []).append(entry)
    return by_key


def _added(key: str | int | None, entries: list[BreakdownSums]) -> BreakdownSums:
    """One key's entries from disjoint partitions, added up."""
    return BreakdownSums(
        key=key,
        accept_histogram=add_histograms(e.accept_histogram for e in entries),
        **{name: sum(getattr(e, name) for e in entries) for name in _BREAKDOWN_SUMMED},
    )


def merge_partials(partials: Sequence[PartialAggregate]) -> PartialAggregate:
    """The exact sum of partials of one batch from disjoint partitions.

    Per-producer dictionaries are summed too; the close bookkeeping (markers,
    algorithms) is unioned. The result's ``partition`` is -1 (merged).
    """
    _check_one_batch(partials)
    return PartialAggregate(
        batch_id=partials[0].batch_id,
        run_id=partials[0].run_id,
        partition=-1,
        close_reason=partials[0].close_reason,
        **_merged_fields(partials),
        **_merged_breakdowns(partials),
    )


def _merged_fields(partials: Sequence[PartialAggregate]) -> dict[str, Any]:
    """Each field of ``_MERGED`` by its rule over the partials' values."""
    return {name: rule([getattr(p, name) for p in partials]) for name, rule in _MERGED.items()}


def _check_one_batch(partials: Sequence[PartialAggregate]) -> None:
    if not partials:
        raise ValueError("merge_partials() needs at least one partial")
    batches = {(p.run_id, p.batch_id) for p in partials}
    if len(batches) != 1:
        raise ValueError(f"partials of different batches cannot merge: {sorted(batches, key=str)}")


def _per_producer(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-producer counts of disjoint partitions, added up."""
    total: dict[str, int] = {}
    for each in counts:
        for producer, n in each.items():
            total[producer] = total.get(producer, 0) + n
    return total


def _union(names: Iterable[list[str]]) -> list[str]:
    return sorted({name for each in names for name in each})


def _merged_breakdowns(partials: Sequence[PartialAggregate]) -> dict[str, Any]:
    """Each breakdown's merged entries and its "past MAX_BREAKDOWN_KEYS" flag: set when
    the merge gives none though a partition had entries or the flag."""
    fields: dict[str, Any] = {}
    for breakdown in BREAKDOWNS:
        entries = merge_breakdown(partials, breakdown)
        fields[breakdown.entries] = entries or []
        fields[breakdown.too_many] = entries is None and any(
            getattr(p, breakdown.entries) or getattr(p, breakdown.too_many) for p in partials
        )
    return fields


def merge_distributions(distributions: Iterable[list[int] | None]) -> list[int] | None:
    """Spreads of tokens per verify step (docs/contract.md §3.7) from disjoint partitions,
    added element-wise (exact); None when none is known."""
    return add_histograms(distributions)


#: how each field of the merged partial comes from the partials' (the breakdowns aside):
#: the close bookkeeping (the newest revision and close, per-producer counts summed,
#: markers and algorithms unioned), then the counts (histograms, expansions and
#: distributions merged exactly, the rest summed)
_MERGED: dict[str, Callable[[list[Any]], Any]] = {
    "revision": max,
    "closed_at_ms": max,
    "records_received": _per_producer,
    "records_sent": _per_producer,
    "marker_producers": _union,
    "expected_producers": max,
    "speculative_algorithms": _union,
    "counters_seen": any,
    "accept_histogram": add_histograms,
    "accept_ratio_parts": merge_expansions,
    "length_ratio_parts": merge_expansions,
    "tokens_per_verify_distribution": merge_distributions,
    **dict.fromkeys(_SUMMED, sum),
}


def missing_records(partials: Iterable[PartialAggregate]) -> int:
    """Records that producers' markers say were sent but no partition received.

    Compared per (partition, producer), so a surplus on one partition never
    hides a loss on another.
    """
    missing = 0
    for p in partials:
        for producer, sent in p.records_sent.items():
            missing += max(0, sent - p.records_received.get(producer, 0))
    return missing


def _records_matched(partials: Iterable[PartialAggregate]) -> bool:
    """Every record a marker counts arrived (more may have: a restarted producer
    re-sends, and deduplication makes extra deliveries harmless)."""
    return all(
        p.records_received.get(producer, 0) >= sent for p in partials for producer, sent in p.records_sent.items()
    )


def _complete(partials: Sequence[PartialAggregate], reported: int, partitions_expected: int) -> bool:
    """A batch is complete when every expected partition reported, each closed it on
    markers, and every record the markers count arrived."""
    return (
        reported >= partitions_expected
        and all(p.close_reason == "markers" for p in partials)
        and _records_matched(partials)
    )


def is_speculative(merged: PartialAggregate) -> bool:
    """Gating (docs/contract.md §3): a marker named an algorithm, or a valid record knew a speculative counter."""
    return bool(merged.speculative_algorithms) or merged.counters_seen


def _sums_metrics(sums: PartialAggregate | BreakdownSums, coverage_of: int) -> dict[str, int | float]:
    """The totals, paired totals, covered counts and the ratios derived from them (the
    one place a ratio is computed); coverages divide by ``coverage_of`` when it is > 0."""
    m = sums
    out: dict[str, int | float] = {
        "spec/accepted_total": m.accepted_total,
        "spec/proposed_total": m.proposed_total,
        "spec/verify_total": m.verify_total,
        "spec/completion_total": m.completion_total,
        "spec/paired_accepted_total": m.paired_accepted_total,
        "spec/paired_proposed_total": m.paired_proposed_total,
        "spec/accept_covered_count": m.accept_covered_count,
        "spec/paired_completion_total": m.paired_completion_total,
        "spec/paired_verify_total": m.paired_verify_total,
        "spec/verify_covered_count": m.verify_covered_count,
    }
    if coverage_of > 0:
        out["spec/accept_count_coverage"] = m.accept_covered_count / coverage_of
        out["spec/verify_count_coverage"] = m.verify_covered_count / coverage_of
    if m.paired_proposed_total > 0:
        out["spec/accept_rate"] = m.paired_accepted_total / m.paired_proposed_total
    if m.paired_verify_total > 0:
        out["spec/tokens_per_verify"] = m.paired_completion_total / m.paired_verify_total
    return out


def _steps_at_least(histogram: Sequence[int] | None) -> tuple[int, list[int]] | None:
    """A summed histogram H's steps S = sum(H) and, for k = 1 .. len(H) - 1, the steps
    that accepted at least k drafts, ``sum(H[k:])``: what both per-position curves are
    made of (docs/contract.md §3.3, §3.5). None without two bins or more, or without a
    step: then both curves are null."""
    if histogram is None or len(histogram) < 2:
        return None
    steps = sum(histogram)
    if steps <= 0:
        return None
    at_least = list(itertools.accumulate(histogram[:-1], operator.sub, initial=steps))[1:]
    return steps, at_least


def accept_rate_by_position(histogram: Sequence[int] | None) -> list[float] | None:
    """Acceptance by draft position (docs/contract.md §3.3) from a summed histogram H
    (bin i: verify steps that accepted exactly i drafts): at index k - 1 the share of
    steps that accepted at least k, ``sum(H[k:]) / sum(H)``, for k = 1 .. len(H) - 1.
    None without a histogram of two bins or more, or when it counts no step."""
    parts = _steps_at_least(histogram)
    if parts is None:
        return None
    steps, at_least = parts
    return [n / steps for n in at_least]


def tokens_per_verify_by_budget(histogram: Sequence[int] | None) -> list[float] | None:
    """What a smaller draft budget would give (docs/contract.md §3.5), from a summed
    histogram H of S steps: at index k - 1 the tokens per verify step with a budget of
    k draft tokens, a step that accepted i drafts then accepting min(i, k):
    ``(S + sum_i min(i, k) * H[i]) / S`` for k = 1 .. len(H) - 1, one division of two
    integers each (``sum_i min(i, k) * H[i]`` is the steps that accepted at least 1, 2,
    ... k drafts, added up). None exactly when ``accept_rate_by_position`` is None."""
    parts = _steps_at_least(histogram)
    if parts is None:
        return None
    steps, at_least = parts
    # every step yields one token of its own, then one per draft it would have accepted
    return [tokens / steps for tokens in itertools.accumulate(at_least, initial=steps)][1:]


def batch_metrics_dict(merged: PartialAggregate) -> dict[str, int | float]:
    """The ``metrics`` map of one batch from its merged sums (empty if not speculative)."""
    if not is_speculative(merged):
        return {}
    m = merged
    out: dict[str, int | float] = {
        "spec/record_occurrence_count": m.occurrence_count,
        "spec/unique_generation_count": m.unique_generation_count,
        "spec/conflicting_generation_count": m.conflicting_generation_count,
        "spec/inconsistent_generation_count": m.inconsistent_generation_count,
        "spec/invalid_record_count": m.invalid_record_count,
        "spec/sample_count": m.sample_count,
        **_sums_metrics(m, m.unique_generation_count),
    }
    if _legacy_known(m):
        out.update(_legacy_ratios(m))
    return out


def _legacy_known(m: PartialAggregate) -> bool:
    """Whether the legacy per-sample aliases may be given (docs/contract.md §3): the batch
    has samples, no conflict and no invalid record."""
    return m.sample_count > 0 and m.conflicting_generation_count == 0 and m.invalid_record_count == 0


def _legacy_ratios(m: PartialAggregate) -> dict[str, float]:
    """The legacy per-sample aliases (docs/contract.md §3), each only when every sample
    had its ratio (for a batch with samples, no conflict and no invalid record)."""
    samples = m.sample_count
    out = {}
    if m.accept_ratio_samples == samples:
        out["spec_accept_rate"] = expansion_value(m.accept_ratio_parts) / samples
    if m.length_ratio_samples == samples:
        out["spec_accept_length"] = expansion_value(m.length_ratio_parts) / samples
    return out


def breakdown_entries(merged: PartialAggregate, breakdown: Breakdown) -> list | None:
    """A breakdown's entries in the message (``by_weight_version``, ``by_task``,
    ``by_draft_lag``) from a batch's merged sums: null unless speculative and some
    non-conflicting generation knows its key. Each entry's metrics, histogram and
    curves as the batch's."""
    entries: list[BreakdownSums] = getattr(merged, breakdown.entries)
    if not is_speculative(merged) or not entries:
        return None
    return [
        breakdown.metrics_type(
            **{breakdown.key: cast(Any, entry.key)},  # a str, or an int for a draft lag
            metrics={
                "spec/unique_generation_count": entry.unique_generation_count,
                **_sums_metrics(entry, entry.unique_generation_count),
            },
            accept_histogram=entry.accept_histogram,
            accept_rate_by_position=accept_rate_by_position(entry.accept_histogram),
            tokens_per_verify_by_budget=tokens_per_verify_by_budget(entry.accept_histogram),
        )
        for entry in entries
    ]


def by_weight_version(merged: PartialAggregate) -> list[WeightVersionMetrics] | None:
    """``BatchMetrics.by_weight_version`` of one batch from its merged sums (docs/contract.md §3.1)."""
    return breakdown_entries(merged, BY_WEIGHT_VERSION)


def by_task(merged: PartialAggregate) -> list[TaskMetrics] | None:
    """``BatchMetrics.by_task`` of one batch from its merged sums (docs/contract.md §3.4)."""
    return breakdown_entries(merged, BY_TASK)


def by_draft_lag(merged: PartialAggregate) -> list[DraftLagMetrics] | None:
    """``BatchMetrics.by_draft_lag`` of one batch from its merged sums (docs/contract.md §3.6)."""
    return breakdown_entries(merged, BY_DRAFT_LAG)


def tokens_per_verify_distribution(merged: PartialAggregate) -> list[int] | None:
    """``BatchMetrics.tokens_per_verify_distribution`` (docs/contract.md §3.7): the merged
    counts, null unless speculative and some generation qualifies."""
    if not is_speculative(merged):
        return None
    return merged.tokens_per_verify_distribution


def build_batch_metrics(
    partials: Sequence[PartialAggregate],
    *,
    revision: int,
    close_reason: str,
    closed_at: float,
    partitions_expected: int,
) -> BatchMetrics:
    """One ``BatchMetrics`` message from the latest partial of each reporting partition."""
    merged = merge_partials(partials)
    speculative = is_speculative(merged)
    histogram = merged.accept_histogram if speculative else None
    reported = len({p.partition for p in partials})
    return BatchMetrics(
        batch_id=merged.batch_id,
        run_id=merged.run_id,
        revision=revision,
        close_reason=close_reason,
        closed_at=closed_at,
        speculative=speculative,
        complete=_complete(partials, reported, partitions_expected),
        partitions_reported=reported,
        partitions_expected=partitions_expected,
        record_count=merged.record_count,
        invalid_record_count=merged.invalid_record_count,
        missing_record_count=missing_records(partials),
        late_record_count=merged.late_record_count,
        accept_histogram=histogram,
        metrics=batch_metrics_dict(merged),
        speculative_algorithm=",".join(merged.speculative_algorithms) or None,
        by_weight_version=by_weight_version(merged),
        accept_rate_by_position=accept_rate_by_position(histogram),
        tokens_per_verify_by_budget=tokens_per_verify_by_budget(histogram),
        by_task=by_task(merged),
        by_draft_lag=by_draft_lag(merged),
        tokens_per_verify_distribution=tokens_per_verify_distribution(merged),
    )
