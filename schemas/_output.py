"""Output messages: batch metrics for dashboards and dead letters for operators."""

from __future__ import annotations

import msgspec

__all__ = ["BatchMetrics", "DeadLetter", "CloseReason"]

#: Why a batch (or a partition of it) was closed.
CloseReason = str  # "markers" | "timeout" | "end_of_input" | "incomplete"


class BatchMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """One batch's weighted speculative-decoding metrics, per revision.

    Published as JSON on the metrics topic keyed by ``batch_id``; a later
    revision (late records) supersedes an earlier one.
    """

    batch_id: str
    revision: int
    close_reason: str
    closed_at: float
    speculative: bool
    complete: bool
    partitions_reported: int
    partitions_expected: int
    record_count: int
    invalid_record_count: int
    missing_record_count: int
    late_record_count: int
    accept_histogram: list[int] | None
    metrics: dict[str, int | float]
    speculative_algorithm: str | None = None


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """A rejected input message, with why and where it came from; nothing is lost."""

    reason: str
    detail: str
    raw: bytes
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    batch_id: str | None = None
    rejected_at: float = 0.0
