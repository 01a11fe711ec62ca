"""Merging partitions' partials, and the metrics derived from the merged sums.

Partials carry sums only, so merging is addition. Every ratio in the output is
computed here, once, from the merged sums.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specmeter.schemas import BatchMetrics, PartialAggregate

from ._exact import expansion_value, merge_expansions
from ._state import add_histograms

__all__ = ["merge_partials", "batch_metrics_dict", "build_batch_metrics", "missing_records", "is_speculative"]

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


def merge_partials(partials: Sequence[PartialAggregate]) -> PartialAggregate:
    """The exact sum of partials of one batch from disjoint partitions.

    Per-producer dictionaries are summed too; the close bookkeeping (markers,
    algorithms) is unioned. The result's ``partition`` is -1 (merged).
    """
    if not partials:
        raise ValueError("merge_partials() needs at least one partial")
    batch_ids = {p.batch_id for p in partials}
    if len(batch_ids) != 1:
        raise ValueError(f"partials of different batches cannot merge: {sorted(batch_ids)}")
    sums = {name: sum(getattr(p, name) for p in partials) for name in _SUMMED}
    received: dict[str, int] = {}
    sent: dict[str, int] = {}
    for p in partials:
        for producer, n in p.records_received.items():
            received[producer] = received.get(producer, 0) + n
        for producer, n in p.records_sent.items():
            sent[producer] = sent.get(producer, 0) + n
    return PartialAggregate(
        batch_id=partials[0].batch_id,
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
    """Gating (SPEC §3): a marker named an algorithm, or a valid record knew a speculative counter."""
    return bool(merged.speculative_algorithms) or merged.counters_seen


def batch_metrics_dict(merged: PartialAggregate) -> dict[str, int | float]:
    """The ``metrics`` map of one batch from its merged sums (empty if not speculative)."""
    if not is_speculative(merged):
        return {}
    m = merged
    g = m.unique_generation_count
    out: dict[str, int | float] = {
        "spec/record_occurrence_count": m.occurrence_count,
        "spec/unique_generation_count": g,
        "spec/conflicting_generation_count": m.conflicting_generation_count,
        "spec/invalid_record_count": m.invalid_record_count,
        "spec/sample_count": m.sample_count,
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
    if g > 0:
        out["spec/accept_count_coverage"] = m.accept_covered_count / g
        out["spec/verify_count_coverage"] = m.verify_covered_count / g
    if m.paired_proposed_total > 0:
        out["spec/accept_rate"] = m.paired_accepted_total / m.paired_proposed_total
    if m.paired_verify_total > 0:
        out["spec/tokens_per_verify"] = m.paired_completion_total / m.paired_verify_total
    samples = m.sample_count
    if samples > 0 and m.conflicting_generation_count == 0 and m.invalid_record_count == 0:
        if m.accept_ratio_samples == samples:
            out["spec_accept_rate"] = expansion_value(m.accept_ratio_parts) / samples
        if m.length_ratio_samples == samples:
            out["spec_accept_length"] = expansion_value(m.length_ratio_parts) / samples
    return out


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
    reported = len({p.partition for p in partials})
    complete = (
        reported >= partitions_expected
        and all(p.close_reason == "markers" for p in partials)
        and _records_matched(partials)
    )
    return BatchMetrics(
        batch_id=merged.batch_id,
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
        accept_histogram=merged.accept_histogram if speculative else None,
        metrics=batch_metrics_dict(merged),
        speculative_algorithm=",".join(merged.speculative_algorithms) or None,
    )
