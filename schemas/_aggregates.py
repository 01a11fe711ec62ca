"""Per-(batch, partition) partial aggregates: sums only, merged by addition."""

from __future__ import annotations

import msgspec

__all__ = [
    "PartialAggregate",
    "BreakdownSums",
    "MAX_BREAKDOWN_KEYS",
    "MAX_WEIGHT_VERSIONS",
    "MAX_TASKS",
    "MAX_DRAFT_LAGS",
    "DISTRIBUTION_BUCKETS",
]

#: More distinct known keys than this in one batch is no breakdown: ``by_weight_version``
#: (past 64 versions: no drift picture), ``by_task`` and ``by_draft_lag`` are then null.
MAX_BREAKDOWN_KEYS = 64
MAX_WEIGHT_VERSIONS = MAX_TASKS = MAX_DRAFT_LAGS = MAX_BREAKDOWN_KEYS
#: (revision 5) the quarter-token buckets of ``tokens_per_verify_distribution`` (§3.7)
DISTRIBUTION_BUCKETS = 64


class BreakdownSums(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Sums over one partition's non-conflicting generations of one breakdown key: a
    weight_version (``PartialAggregate.weight_versions``), a task (``tasks``) or a draft
    lag (``draft_lags``, revision 5: an int key).

    Array-like: the key's name is not on the wire, so the per-version lists written
    before tasks existed (as ``WeightVersionSums``, whose first field was named
    ``weight_version``) are these same bytes."""

    #: the weight_version, task or draft lag; None: the generations that do not know it
    key: str | int | None
    unique_generation_count: int = 0
    accepted_total: int = 0
    proposed_total: int = 0
    verify_total: int = 0
    completion_total: int = 0
    paired_accepted_total: int = 0
    paired_proposed_total: int = 0
    accept_covered_count: int = 0
    paired_completion_total: int = 0
    paired_verify_total: int = 0
    verify_covered_count: int = 0
    accept_histogram: list[int] | None = None


class PartialAggregate(msgspec.Struct, frozen=True, kw_only=True):
    """Everything stage 2 needs from one partition's view of one batch.

    Every field is a sum, a count, a set-like list or an exact float expansion,
    so merging partials from disjoint partitions is exact addition. Ratios are
    never stored: they are derived once, at the edge.

    ``*_ratio_parts`` hold the legacy per-sample ratios' sum as a list of
    non-overlapping floats (a Shewchuk expansion); its exact value is the sum
    of the parts, so adding partitions' expansions loses nothing.
    """

    batch_id: str
    partition: int = 0
    #: bumps each time this partition re-emits the batch (late records).
    revision: int = 0
    close_reason: str = "markers"
    closed_at_ms: int = 0

    record_count: int = 0
    invalid_record_count: int = 0
    late_record_count: int = 0
    #: deliveries seen per producer, and what each producer's marker says it sent.
    records_received: dict[str, int] = {}
    records_sent: dict[str, int] = {}
    marker_producers: list[str] = []
    expected_producers: int = 0
    speculative_algorithms: list[str] = []
    #: a valid record knew accepted, proposed or verify.
    counters_seen: bool = False

    occurrence_count: int = 0
    unique_generation_count: int = 0
    conflicting_generation_count: int = 0
    sample_count: int = 0

    accepted_total: int = 0
    proposed_total: int = 0
    verify_total: int = 0
    completion_total: int = 0
    paired_accepted_total: int = 0
    paired_proposed_total: int = 0
    accept_covered_count: int = 0
    paired_completion_total: int = 0
    paired_verify_total: int = 0
    verify_covered_count: int = 0
    accept_histogram: list[int] | None = None

    #: samples whose (accepted, proposed) fold is known with proposed > 0.
    accept_ratio_samples: int = 0
    accept_ratio_parts: list[float] = []
    #: samples whose (completion, verify) fold is known with verify > 0.
    length_ratio_samples: int = 0
    length_ratio_parts: list[float] = []

    run_id: str | None = None
    #: per weight_version sums (null version included), sorted with null last; at
    #: most ``MAX_WEIGHT_VERSIONS`` known versions, else empty and ``too_many_versions``
    weight_versions: list[BreakdownSums] = []
    too_many_versions: bool = False
    #: (revision 4) non-conflicting generations whose histogram contradicts their own
    #: verify or accepted count (docs/contract.md §3.5)
    inconsistent_generation_count: int = 0
    #: (revision 4) per task sums, like ``weight_versions``: null task included, sorted
    #: with null last; at most ``MAX_TASKS`` known tasks, else empty and ``too_many_tasks``.
    #: A partial from a worker before tasks has none: all its generations' task is unknown
    tasks: list[BreakdownSums] = []
    too_many_tasks: bool = False
    #: (revision 5) per draft lag sums, like ``tasks`` (an int key, sorted numerically, null
    #: last); at most ``MAX_DRAFT_LAGS`` known lags, else empty and ``too_many_draft_lags``.
    #: A partial from a worker before revision 5 has none: all its generations' lag is unknown
    draft_lags: list[BreakdownSums] = []
    too_many_draft_lags: bool = False
    #: (revision 5) ``DISTRIBUTION_BUCKETS`` counts of non-conflicting generations with
    #: completion and verify known and verify > 0, by ``min(63, max(0, 4 * completion //
    #: verify - 4))`` (docs/contract.md §3.7); None when none qualifies (or a partial from a
    #: worker before revision 5). Added element-wise
    tokens_per_verify_distribution: list[int] | None = None
