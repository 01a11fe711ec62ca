"""Merging partitions' partials, and the metrics derived from the merged sums.

Partials carry sums only, so merging is addition. Every ratio in the output is
computed here, once, from the merged sums.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specmeter.schemas import (
    MAX_WEIGHT_VERSIONS,
    BatchMetrics,
    PartialAggregate,
    WeightVersionMetrics,
    WeightVersionSums,
)

from ._exact import expansion_value, merge_expansions
from ._state import add_histograms

__all__ = [
    "merge_partials",
    "batch_metrics_dict",
    "build_batch_metrics",
    "missing_records",
    "is_speculative",
    "merge_weight_versions",
    "by_weight_version",
    "accept_rate_by_position",
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
)


#: the sums of a weight_version entry: ``WeightVersionSums`` less its name and histogram
#: (read off the struct, so a field added there is merged without a second list)
_VERSION_SUMMED = tuple(
    name for name in WeightVersionSums.__struct_fields__ if name not in ("weight_version", "accept_histogram")
)
assert _VERSION_SUMMED[0] == "unique_generation_count"  # _unversioned computes it and takes the rest


def _unversioned(p: PartialAggregate) -> list[WeightVersionSums]:
    """A partial that knows no weight_version: its whole G \\ C is the unknown version."""
    unique = p.unique_generation_count - p.conflicting_generation_count
    if unique <= 0:
        return []
    fields = {name: getattr(p, name) for name in _VERSION_SUMMED[1:]}
    return [
        WeightVersionSums(
            weight_version=None, unique_generation_count=unique, accept_histogram=p.accept_histogram, **fields
        )
    ]


def merge_weight_versions(partials: Sequence[PartialAggregate]) -> list[WeightVersionSums] | None:
    """The per-version sums of partials from disjoint partitions, sorted by version
    with the unknown version last; None when no generation knows its version or
    more than ``MAX_WEIGHT_VERSIONS`` known versions appear."""
    if any(p.too_many_versions for p in partials) or not any(p.weight_versions for p in partials):
        return None
    merged: dict[str | None, list[WeightVersionSums]] = {}
    for p in partials:
        for entry in p.weight_versions or _unversioned(p):
            merged.setdefault(entry.weight_version, []).append(entry)
    if sum(version is not None for version in merged) > MAX_WEIGHT_VERSIONS:
        return None
    return [
        WeightVersionSums(
            weight_version=version,
            accept_histogram=add_histograms(e.accept_histogram for e in merged[version]),
            **{name: sum(getattr(e, name) for e in merged[version]) for name in _VERSION_SUMMED},
        )
        for version in sorted(merged, key=lambda v: (v is None, v or ""))
    ]


def merge_partials(partials: Sequence[PartialAggregate]) -> PartialAggregate:
    """The exact sum of partials of one batch from disjoint partitions.

    Per-producer dictionaries are summed too; the close bookkeeping (markers,
    algorithms) is unioned. The result's ``partition`` is -1 (merged).
    """
    if not partials:
        raise ValueError("merge_partials() needs at least one partial")
    batches = {(p.run_id, p.batch_id) for p in partials}
    if len(batches) != 1:
        raise ValueError(f"partials of different batches cannot merge: {sorted(batches, key=str)}")
    sums = {name: sum(getattr(p, name) for p in partials) for name in _SUMMED}
    received: dict[str, int] = {}
    sent: dict[str, int] = {}
    for p in partials:
        for producer, n in p.records_received.items():
            received[producer] = received.get(producer, 0) + n
        for producer, n in p.records_sent.items():
            sent[producer] = sent.get(producer, 0) + n
    versions = merge_weight_versions(partials)
    return PartialAggregate(
        batch_id=partials[0].batch_id,
        run_id=partials[0].run_id,
        partition=-1,
        revision=max(p.revision for p in partials),
        close_reason=partials[0].close_reason,
        closed_at_ms=max(p.closed_at_ms for p in partials),
        records_received=received,
        records_sent=sent,
        marker_producers=sorted({m for p in partials for m in p.marker_producers}),
        expected_producers=max(p.expected_producers for p in partials),
        speculative_algorithms=sorted({a for p in partials for a in p.speculative_algorithms}),
        counters_seen=any(p.counters_seen for p in partials),
        accept_histogram=add_histograms(p.accept_histogram for p in partials),
        accept_ratio_parts=merge_expansions(p.accept_ratio_parts for p in partials),
        length_ratio_parts=merge_expansions(p.length_ratio_parts for p in partials),
        weight_versions=versions or [],
        too_many_versions=versions is None and any(p.weight_versions or p.too_many_versions for p in partials),
        **sums,
    )


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


def is_speculative(merged: PartialAggregate) -> bool:
    """Gating (docs/contract.md §3): a marker named an algorithm, or a valid record knew a speculative counter."""
    return bool(merged.speculative_algorithms) or merged.counters_seen


def _sums_metrics(sums: PartialAggregate | WeightVersionSums, coverage_of: int) -> dict[str, int | float]:
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


def accept_rate_by_position(histogram: Sequence[int] | None) -> list[float] | None:
    """Acceptance by draft position (docs/contract.md §3.3) from a summed histogram H
    (bin i: verify steps that accepted exactly i drafts): at index k - 1 the share of
    steps that accepted at least k, ``sum(H[k:]) / sum(H)``, for k = 1 .. len(H) - 1.
    None without a histogram of two bins or more, or when it counts no step."""
    if histogram is None or len(histogram) < 2:
        return None
    steps = sum(histogram)
    if steps <= 0:
        return None
    rates = []
    at_least = steps
    for count in histogram[:-1]:
        at_least -= count  # steps that accepted more than this bin's count of drafts
        rates.append(at_least / steps)
    return rates


def batch_metrics_dict(merged: PartialAggregate) -> dict[str, int | float]:
    """The ``metrics`` map of one batch from its merged sums (empty if not speculative)."""
    if not is_speculative(merged):
        return {}
    m = merged
    out: dict[str, int | float] = {
        "spec/record_occurrence_count": m.occurrence_count,
        "spec/unique_generation_count": m.unique_generation_count,
        "spec/conflicting_generation_count": m.conflicting_generation_count,
        "spec/invalid_record_count": m.invalid_record_count,
        "spec/sample_count": m.sample_count,
        **_sums_metrics(m, m.unique_generation_count),
    }
    samples = m.sample_count
    if samples > 0 and m.conflicting_generation_count == 0 and m.invalid_record_count == 0:
        if m.accept_ratio_samples == samples:
            out["spec_accept_rate"] = expansion_value(m.accept_ratio_parts) / samples
        if m.length_ratio_samples == samples:
            out["spec_accept_length"] = expansion_value(m.length_ratio_parts) / samples
    return out


def by_weight_version(merged: PartialAggregate) -> list[WeightVersionMetrics] | None:
    """``BatchMetrics.by_weight_version`` of one batch from its merged sums: null unless
    speculative and some non-conflicting generation knows its version."""
    if not is_speculative(merged) or not merged.weight_versions:
        return None
    return [
        WeightVersionMetrics(
            weight_version=entry.weight_version,
            metrics={
                "spec/unique_generation_count": entry.unique_generation_count,
                **_sums_metrics(entry, entry.unique_generation_count),
            },
            accept_histogram=entry.accept_histogram,
            accept_rate_by_position=accept_rate_by_position(entry.accept_histogram),
        )
        for entry in merged.weight_versions
    ]


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
    complete = (
        reported >= partitions_expected
        and all(p.close_reason == "markers" for p in partials)
        and _records_matched(partials)
    )
    return BatchMetrics(
        batch_id=merged.batch_id,
        run_id=merged.run_id,
        revision=revision,
        close_reason=close_reason,
        closed_at=closed_at,
        speculative=speculative,
        complete=complete,
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
    )
