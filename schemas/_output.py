"""Output messages: batch metrics for dashboards and dead letters for operators."""

from __future__ import annotations

import msgspec

__all__ = ["BatchMetrics", "DeadLetter", "CloseReason", "WeightVersionMetrics", "TaskMetrics", "DraftLagMetrics"]

#: Why a batch (or a partition of it) was closed.
CloseReason = str  # "markers" | "timeout" | "end_of_input" | "incomplete"


class WeightVersionMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """One policy version's share of a batch (``BatchMetrics.by_weight_version``).

    ``weight_version`` None is the generations whose version is unknown. The
    entries' totals and paired totals add up exactly to the batch's.
    """

    weight_version: str | None
    metrics: dict[str, int | float]
    accept_histogram: list[int] | None
    #: this version's share of steps that accepted their k-th draft, at index k - 1
    #: (revision 3; from ``accept_histogram`` like ``BatchMetrics.accept_rate_by_position``)
    accept_rate_by_position: list[float] | None = None
    #: (revision 4) tokens per verify step this version's histogram implies with a budget
    #: of k draft tokens, at index k - 1 (like ``BatchMetrics.tokens_per_verify_by_budget``)
    tokens_per_verify_by_budget: list[float] | None = None


class TaskMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """(revision 4) One task's share of a batch (``BatchMetrics.by_task``): the prompt's
    dataset or task family. ``task`` None is the generations whose task is unknown. Built
    like a ``WeightVersionMetrics``: the entries' totals add up exactly to the batch's."""

    task: str | None
    metrics: dict[str, int | float]
    accept_histogram: list[int] | None
    accept_rate_by_position: list[float] | None = None
    tokens_per_verify_by_budget: list[float] | None = None


class DraftLagMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """(revision 5) One draft lag's share of a batch (``BatchMetrics.by_draft_lag``): the
    generations whose draft was that many policy updates behind. ``draft_lag`` None is the
    generations whose lag is unknown. Built like a ``WeightVersionMetrics``: the entries'
    totals add up exactly to the batch's. Read across batches: the staleness curve."""

    draft_lag: int | None
    metrics: dict[str, int | float]
    accept_histogram: list[int] | None
    accept_rate_by_position: list[float] | None = None
    tokens_per_verify_by_budget: list[float] | None = None


class BatchMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """One batch's weighted speculative-decoding metrics, per revision.

    Published as JSON on the metrics topic keyed by ``batch_id``; a later
    revision (late records) supersedes an earlier one. A batch is
    ``(run_id, batch_id)``: two runs never share one.
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
    run_id: str | None = None
    by_weight_version: list[WeightVersionMetrics] | None = None
    #: (revision 3) at index k - 1, the share of verify steps that reported a histogram
    #: whose k-th draft token was accepted: ``sum(H[k:]) / sum(H)`` of ``accept_histogram``
    #: H; None without a histogram of two bins or more and at least one step
    accept_rate_by_position: list[float] | None = None
    #: (revision 4) at index k - 1, the tokens per verify step the fleet would have produced
    #: with a budget of k draft tokens (exact for chain drafters, an upper bound for trees):
    #: ``(S + sum_i min(i, k) * H[i]) / S``; None exactly when ``accept_rate_by_position`` is
    tokens_per_verify_by_budget: list[float] | None = None
    #: (revision 4) one entry per task among the non-conflicting generations, unknown last;
    #: None when not speculative, no generation knows its task, or past 64 known tasks
    by_task: list[TaskMetrics] | None = None
    #: (revision 5) one entry per draft lag among the non-conflicting generations, in
    #: numeric order, unknown last; None when not speculative, no generation knows its
    #: lag, or past 64 known lags
    by_draft_lag: list[DraftLagMetrics] | None = None
    #: (revision 5) 64 counts of non-conflicting generations with known completion and
    #: verify > 0, by their own tokens per verify step in quarter-token buckets:
    #: bucket ``min(63, max(0, 4 * completion // verify - 4))``; None when none qualifies
    #: or the batch is not speculative. Counts add element-wise across batches and workers
    tokens_per_verify_distribution: list[int] | None = None


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
    run_id: str | None = None
