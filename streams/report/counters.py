"""What the worker counts of what it publishes, and the names Prometheus shows its counters by.

The stages' own counts (every input accounted for) are ``core.counts.WorkerCounters``;
these are sums over published BatchMetrics, and the tables that name each series."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeGuard

__all__ = [
    "PublishedTotals",
    "LabelTotals",
    "PUBLISHED_QUANTITIES",
    "MORE_COUNTERS",
    "MAX_EXPORTED_POSITION",
    "VERSION_AGES",
    "DRAFT_LAGS",
    "SPREAD_STEM",
    "SPREAD_BOUNDS",
    "TASK_COUNTERS",
    "UNKNOWN_TASK",
    "OTHER_TASKS",
    "SLOTS",
    "Slot",
    "published_labels",
    "version_ages",
    "draft_lag_label",
]

#: (counter stem, where in BatchMetrics, help): sums over a batch's distinct generations
#: or its records, so one batch's value adds to another's. ``spec/...`` are keys of
#: ``BatchMetrics.metrics`` (absent, e.g. in a non-speculative batch: 0), ``""`` is 1 per
#: batch, ``"incomplete"`` is 1 per batch whose newest revision is incomplete, the rest
#: are its attributes.
PUBLISHED_QUANTITIES: tuple[tuple[str, str, str], ...] = (
    ("batches", "", "Distinct batches published (a batch counts once, whatever its revisions)."),
    (
        "paired_accepted_tokens",
        "spec/paired_accepted_total",
        "Accepted draft tokens of generations with both accepted and proposed known.",
    ),
    (
        "paired_proposed_tokens",
        "spec/paired_proposed_total",
        "Proposed draft tokens of generations with both accepted and proposed known.",
    ),
    (
        "paired_completion_tokens",
        "spec/paired_completion_total",
        "Completion tokens of generations with both completion and verify known.",
    ),
    (
        "paired_verify_steps",
        "spec/paired_verify_total",
        "Verify steps of generations with both completion and verify known.",
    ),
    ("accepted_tokens", "spec/accepted_total", "Accepted draft tokens, every known value."),
    ("proposed_tokens", "spec/proposed_total", "Proposed draft tokens, every known value."),
    ("completion_tokens", "spec/completion_total", "Completion tokens, every known value."),
    ("verify_steps", "spec/verify_total", "Verify steps, every known value."),
    ("accept_covered_generations", "spec/accept_covered_count", "Generations with both accepted and proposed known."),
    ("verify_covered_generations", "spec/verify_covered_count", "Generations with both completion and verify known."),
    ("generations", "spec/unique_generation_count", "Distinct generations."),
    (
        "conflicting_generations",
        "spec/conflicting_generation_count",
        "Generations reported with different values (left out of every sum).",
    ),
    (
        "inconsistent_generations",
        "spec/inconsistent_generation_count",
        "Generations whose own acceptance histogram contradicts their own verify or accepted count (sum(H) "
        "is not verify, or sum of i * H[i] is not accepted); still aggregated as reported.",
    ),
    ("published_records", "record_count", "Records delivered (every delivery, invalid ones included)."),
    ("published_invalid_records", "invalid_record_count", "Invalid records attributed to a batch."),
    ("published_late_records", "late_record_count", "Records applied to a batch after it closed, within grace."),
    (
        "incomplete_batches",
        "incomplete",
        "Batches whose newest revision is incomplete (a partition closed by timeout, or records a "
        "producer's marker counted never arrived); a later complete revision takes the batch back.",
    ),
)

#: the highest draft position with a series of its own (``position="1"`` .. ``"16"``).
#: Higher positions are not exported (the metrics topic has them all); the exported ones
#: stay exact, since position k counts the steps that accepted *at least* k drafts. The
#: acceptance-length gauge folds bins past it into its last bin (``accepted="16"``: 16
#: or more).
MAX_EXPORTED_POSITION = 16

#: the ``version_age`` label: how many weight versions a generation's version is behind
#: the newest version in its batch (``"0"``: the newest, i.e. on-policy), ages from
#: ``"4+"`` on folded, ``"unknown"`` for generations whose version is unknown (null) and
#: for batches without a breakdown (``by_weight_version`` null). Version names themselves
#: are never labels: they are unbounded over a run (one per training step).
VERSION_AGES = ("0", "1", "2", "3", "4+", "unknown")

#: (revision 5) the ``draft_lag`` label: how many policy updates the draft model was
#: behind for a generation (``BatchMetrics.by_draft_lag``): ``"0"`` .. ``"7"`` each, lags
#: from 8 on folded into ``"8+"``, ``"unknown"`` for generations whose lag is unknown and
#: for batches without a breakdown (``by_draft_lag`` null). A fixed set: the lags a fleet
#: reports never grow the series, whatever producers send.
DRAFT_LAGS = ("0", "1", "2", "3", "4", "5", "6", "7", "8+", "unknown")

#: (revision 5) the spread of tokens per verify step (``tokens_per_verify_distribution``)
#: as a Prometheus histogram, ``specmeter_<SPREAD_STEM>_bucket``: its ``le`` bounds are
#: the quarter-token buckets' upper edges 1.25, 1.5, ... 16.75 (bucket 63, 16.75 and up,
#: is ``+Inf``), so every bucket is exact (a generation's bucket is computed exactly
#: from its integers, never from a float near an edge)
SPREAD_STEM = "generation_tokens_per_verify"
SPREAD_BOUNDS = (*(f"{1 + (b + 1) / 4:g}" for b in range(63)), "+Inf")

#: counter families of published batches beside PUBLISHED_QUANTITIES: acceptance by draft
#: position, paired tokens by version age and by draft lag; (stem, help, the extra label or None)
MORE_COUNTERS: tuple[tuple[str, str, str | None], ...] = (
    (
        "position_verify_steps",
        "Verify steps counted by acceptance histograms (SGLang's spec_correct_drafts_histogram): "
        "the denominator of acceptance by draft position.",
        None,
    ),
    (
        "position_accepted_steps",
        "Verify steps (of specmeter_position_verify_steps_total) that accepted their k-th draft token, by "
        f"position k = 1..{MAX_EXPORTED_POSITION} (higher positions are not exported). "
        "rate(this{position=k}) / rate(specmeter_position_verify_steps_total) is the acceptance at position k.",
        "position",
    ),
    (
        "version_age_paired_accepted_tokens",
        "specmeter_paired_accepted_tokens_total split by version_age: how many weight versions the "
        "generation's policy is behind the newest one in its batch (0 = on-policy; 4+ folded; unknown).",
        "version_age",
    ),
    (
        "version_age_paired_proposed_tokens",
        "specmeter_paired_proposed_tokens_total split by version_age (see "
        "specmeter_version_age_paired_accepted_tokens_total).",
        "version_age",
    ),
    (
        "draft_lag_paired_accepted_tokens",
        "specmeter_paired_accepted_tokens_total split by draft_lag: how many policy updates the draft model "
        "was behind for the generation (0 = refreshed for its policy; 8+ folded; unknown). The staleness curve.",
        "draft_lag",
    ),
    (
        "draft_lag_paired_proposed_tokens",
        "specmeter_paired_proposed_tokens_total split by draft_lag.",
        "draft_lag",
    ),
    (
        "draft_lag_paired_completion_tokens",
        "specmeter_paired_completion_tokens_total split by draft_lag.",
        "draft_lag",
    ),
    (
        "draft_lag_paired_verify_steps",
        "specmeter_paired_verify_steps_total split by draft_lag.",
        "draft_lag",
    ),
)

#: the by-lag families' keys of a ``by_draft_lag`` entry's metrics, in MORE_COUNTERS' order
_LAG_SUMS = (
    "spec/paired_accepted_total",
    "spec/paired_proposed_total",
    "spec/paired_completion_total",
    "spec/paired_verify_total",
)


#: the ``task`` label of the per-task counters beside a task's own name: generations whose
#: task is unknown (null), and whole batches without a breakdown (``by_task`` null: no
#: generation knows its task, or more than 64 tasks), count under UNKNOWN_TASK; the tasks
#: past a label set's bound (``PublishedTotals.max_tasks``) under OTHER_TASKS, summed. A
#: task that is itself named like one of the two counts under OTHER_TASKS, so each value
#: means one thing.
UNKNOWN_TASK = "(unknown)"
OTHER_TASKS = "(other)"
_RESERVED_TASKS = frozenset((UNKNOWN_TASK, OTHER_TASKS))

#: counter families split by ``task`` (label values above): (stem, key of a ``by_task``
#: entry's metrics, help). Task names come from the producers and may be many, so they
#: are bounded per (algorithm, run_id), not fixed like positions and ages.
TASK_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "task_paired_accepted_tokens",
        "spec/paired_accepted_total",
        "specmeter_paired_accepted_tokens_total split by task (the prompt's dataset or task family).",
    ),
    (
        "task_paired_proposed_tokens",
        "spec/paired_proposed_total",
        "specmeter_paired_proposed_tokens_total split by task.",
    ),
    (
        "task_paired_completion_tokens",
        "spec/paired_completion_total",
        "specmeter_paired_completion_tokens_total split by task.",
    ),
    (
        "task_paired_verify_steps",
        "spec/paired_verify_total",
        "specmeter_paired_verify_steps_total split by task.",
    ),
)


class Slot(NamedTuple):
    """One counter series of a label set: its stem and, for a split family, the extra label."""

    stem: str
    label: str | None = None
    value: str | None = None


#: every counter series of one (algorithm, run_id), in the order of a batch's vector
SLOTS: tuple[Slot, ...] = (
    *(Slot(stem) for stem, _, _ in PUBLISHED_QUANTITIES),
    Slot("position_verify_steps"),
    *(Slot("position_accepted_steps", "position", str(k)) for k in range(1, MAX_EXPORTED_POSITION + 1)),
    *(Slot("version_age_paired_accepted_tokens", "version_age", age) for age in VERSION_AGES),
    *(Slot("version_age_paired_proposed_tokens", "version_age", age) for age in VERSION_AGES),
    *(Slot(stem, "draft_lag", lag) for stem, _, label in MORE_COUNTERS if label == "draft_lag" for lag in DRAFT_LAGS),
    # the spread's buckets (not cumulative): exported as the histogram SPREAD_STEM
    *(Slot(SPREAD_STEM, "le", bound) for bound in SPREAD_BOUNDS),
)
_QUANTITIES = len(PUBLISHED_QUANTITIES)
_STEPS = _QUANTITIES
_POSITIONS = _STEPS + 1
_AGES_ACCEPTED = _POSITIONS + MAX_EXPORTED_POSITION
_AGES_PROPOSED = _AGES_ACCEPTED + len(VERSION_AGES)
_LAGS = _AGES_PROPOSED + len(VERSION_AGES)
_SPREAD = _LAGS + len(_LAG_SUMS) * len(DRAFT_LAGS)
assert SLOTS[_SPREAD] == Slot(SPREAD_STEM, "le", "1.25") and len(SLOTS) == _SPREAD + len(SPREAD_BOUNDS)
#: slots every label set exports; the others once a batch has them
_ALWAYS = frozenset(range(_POSITIONS))

#: labels of the counters of published batches: (algorithm, run_id)
Labels = tuple[str, str]
_Vector = tuple[int, ...]
#: a batch's per-task values: task (None: unknown) -> one value per TASK_COUNTERS family
_TaskVector = dict[str | None, _Vector]
_NO_TASK: _Vector = (0,) * len(TASK_COUNTERS)


def _quantity(metrics: Any, source: str) -> int:
    if not source:
        return 1
    if source == "incomplete":
        return 0 if metrics.complete else 1
    if source.startswith("spec/"):
        return int(metrics.metrics.get(source, 0))
    return int(getattr(metrics, source))


def _natural_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Order of weight versions: digit runs compare as numbers (v9 < v10, 99 < 100). The
    split's odd parts are its digit runs (what the group captured)."""
    return tuple(
        (0, int(part)) if i % 2 else (1, part) for i, part in enumerate(re.split(r"([0-9]+)", version)) if part
    )


def version_ages(metrics: Any) -> dict[str | None, str]:
    """The ``version_age`` label of each weight version of a batch's ``by_weight_version``
    (None: the unknown version). Versions are ordered by name, digit runs as numbers,
    the greatest being the newest: name versions so (SGLang's integer versions and
    ``step-N`` names are)."""
    entries = metrics.by_weight_version or ()
    known = sorted((e.weight_version for e in entries if e.weight_version is not None), key=_natural_key)
    ages: dict[str | None, str] = {None: "unknown"}
    for age, version in enumerate(reversed(known)):
        ages[version] = _folded(age, 4)
    return ages


def _folded(n: int, fold: int) -> str:
    """A count as a label of a fixed set: itself below ``fold``, ``"<fold>+"`` from there on."""
    return str(n) if n < fold else f"{fold}+"


def _vector(metrics: Any) -> tuple[_Vector, frozenset[int]]:
    """A batch's value of every slot, and the slots it has (positions of its histogram,
    version ages of its breakdown) beside those every label set shows."""
    out = [0] * len(SLOTS)
    present = set(_ALWAYS)
    for i, (_, source, _) in enumerate(PUBLISHED_QUANTITIES):
        out[i] = _quantity(metrics, source)
    if metrics.speculative:
        _add_speculative(out, present, metrics)
    return tuple(out), frozenset(present)


def _add_speculative(out: list[int], present: set[int], metrics: Any) -> None:
    """The slots only a speculative batch fills: the positions its histogram reached
    (where it has one), its version ages' and draft lags' paired sums, its spread."""
    if metrics.accept_histogram:
        _add_positions(out, present, metrics.accept_histogram)
    _add_ages(out, present, _age_shares(metrics))
    _add_lags(out, present, _lag_shares(metrics))
    _add_spread(out, present, metrics.tokens_per_verify_distribution)


def draft_lag_label(lag: int | None) -> str:
    """The ``draft_lag`` label of a lag (``DRAFT_LAGS``)."""
    if lag is None:
        return "unknown"
    return _folded(lag, 8)


def _lag_shares(metrics: Any) -> list[tuple[str, Any]]:
    """(draft_lag label, metrics) of each share of a speculative batch: its
    ``by_draft_lag`` entries, or the whole batch as the unknown lag."""
    entries = metrics.by_draft_lag
    if entries is None:
        return [("unknown", metrics.metrics)]
    return [(draft_lag_label(e.draft_lag), e.metrics) for e in entries]


def _add_lags(out: list[int], present: set[int], shares: list[tuple[str, Any]]) -> None:
    """The paired sums of each draft lag label (lags past 7 summed under 8+)."""
    for lag, m in shares:
        a = DRAFT_LAGS.index(lag)
        for family, key in enumerate(_LAG_SUMS):
            slot = _LAGS + family * len(DRAFT_LAGS) + a
            out[slot] += int(m.get(key, 0))
            present.add(slot)


def _add_spread(out: list[int], present: set[int], distribution: list[int] | None) -> None:
    """The spread's bucket counts (a batch without one adds nothing; its buckets show
    once any batch of the label set had one)."""
    if not distribution:
        return
    for b, n in enumerate(distribution[: len(SPREAD_BOUNDS)]):
        out[_SPREAD + b] = n
    present.update(range(_SPREAD, _SPREAD + len(SPREAD_BOUNDS)))


def _add_positions(out: list[int], present: set[int], histogram: list[int]) -> None:
    """The verify steps of a histogram, and those that reached each exported position."""
    at_least = out[_STEPS] = sum(histogram)
    for k, count in enumerate(histogram[: MAX_EXPORTED_POSITION + 1]):
        if k > 0:
            out[_POSITIONS + k - 1] = at_least
            present.add(_POSITIONS + k - 1)
        at_least -= count


def _age_shares(metrics: Any) -> list[tuple[str, Any]]:
    """(version age, metrics) of each share of a speculative batch: its
    ``by_weight_version`` entries, or the whole batch as the unknown age."""
    ages = version_ages(metrics)
    entries = metrics.by_weight_version
    return (
        [(ages[e.weight_version], e.metrics) for e in entries]
        if entries is not None
        else [("unknown", metrics.metrics)]
    )


def _add_ages(out: list[int], present: set[int], shares: list[tuple[str, Any]]) -> None:
    """The paired accepted and proposed drafts of each version age."""
    for age, m in shares:
        a = VERSION_AGES.index(age)
        out[_AGES_ACCEPTED + a] += int(m.get("spec/paired_accepted_total", 0))
        out[_AGES_PROPOSED + a] += int(m.get("spec/paired_proposed_total", 0))
        present.update((_AGES_ACCEPTED + a, _AGES_PROPOSED + a))


def _task_shares(metrics: Any) -> list[tuple[str | None, Any]]:
    """(task, metrics) of each share of a speculative batch: its ``by_task`` entries, or
    the whole batch as the unknown task when it has no breakdown."""
    if not metrics.speculative:
        return []
    if metrics.by_task is None:
        return [(None, metrics.metrics)]
    return [(entry.task, entry.metrics) for entry in metrics.by_task]


def _diff(added: list[int], retracted: list[int], before: _Vector, after: _Vector) -> None:
    """Count the change from ``before`` to ``after``: increases to ``added``, decreases to ``retracted``."""
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if new > old:
            added[i] += new - old
        elif new < old:
            retracted[i] += old - new


def published_labels(metrics: Any) -> Labels:
    """(algorithm, run_id) of a BatchMetrics: the algorithm a marker named (``unknown`` if
    none did), the run id (``""`` for the default run, whose records name none)."""
    return (metrics.speculative_algorithm or "unknown", metrics.run_id or "")


@dataclass
class LabelTotals:
    """One (algorithm, run_id)'s running sums, per slot (``SLOTS``): what revisions added
    and what later revisions took back (a late record that makes a key conflicting
    removes its counters from the batch's sums). Both only grow, as Prometheus counters
    must."""

    added: list[int] = field(default_factory=lambda: [0] * len(SLOTS))
    retracted: list[int] = field(default_factory=lambda: [0] * len(SLOTS))
    #: slots exported: those of every label set, and those a batch has had
    present: set[int] = field(default_factory=lambda: set(_ALWAYS))
    #: per ``task`` label value, added and retracted per TASK_COUNTERS family (a task has an
    #: entry once its label is given: that is what admits it)
    task_added: dict[str, list[int]] = field(default_factory=dict)
    task_retracted: dict[str, list[int]] = field(default_factory=dict)

    def task_label(self, task: str | None, max_tasks: int) -> str:
        """The ``task`` label of a task's share: its own name while fewer than ``max_tasks``
        tasks have one here (first come, kept for the label set's life: every revision of a
        batch lands where its first did), else OTHER_TASKS; UNKNOWN_TASK for None."""
        label = self._label_of(task, max_tasks)
        if label not in self.task_added:
            self.task_added[label] = [0] * len(TASK_COUNTERS)
            self.task_retracted[label] = [0] * len(TASK_COUNTERS)
        return label

    def _label_of(self, task: str | None, max_tasks: int) -> str:
        """The label a task's share goes under (``task_label``), given or not yet."""
        if task is None:
            return UNKNOWN_TASK
        if task in _RESERVED_TASKS:
            return OTHER_TASKS
        if task in self.task_added or sum(t not in _RESERVED_TASKS for t in self.task_added) < max_tasks:
            return task
        return OTHER_TASKS

    def add(self, before: _Batch, after: _Batch, max_tasks: int) -> None:
        """Count a batch's change from one revision (``before``) to the next (``after``)."""
        self.present |= after.present
        _diff(self.added, self.retracted, before.vector, after.vector)
        olds, news = self._by_label(before.tasks, max_tasks), self._by_label(after.tasks, max_tasks)
        for label in olds.keys() | news.keys():
            _diff(
                self.task_added[label],
                self.task_retracted[label],
                olds.get(label, _NO_TASK),
                news.get(label, _NO_TASK),
            )

    def _by_label(self, tasks: _TaskVector, max_tasks: int) -> dict[str, _Vector]:
        """A batch's per-task values under their labels (tasks past the bound summed)."""
        out: dict[str, _Vector] = {}
        for task, values in tasks.items():
            label = self.task_label(task, max_tasks)
            known = out.get(label)
            out[label] = values if known is None else tuple(a + b for a, b in zip(known, values, strict=True))
        return out


class _Batch(NamedTuple):
    """What one revision of a batch adds to its label set's counters."""

    #: the value of every slot (``SLOTS``)
    vector: _Vector
    #: the slots it has beside those every label set shows (positions of its histogram,
    #: version ages of its breakdown)
    present: frozenset[int]
    #: per task (None: unknown), its values of the TASK_COUNTERS families; task names, not
    #: labels: the label set maps them to labels when it counts them
    tasks: _TaskVector

    @classmethod
    def of(cls, metrics: Any) -> _Batch:
        vector, present = _vector(metrics)
        tasks = {task: tuple(int(m.get(key, 0)) for _, key, _ in TASK_COUNTERS) for task, m in _task_shares(metrics)}
        return cls(vector, present, tasks)


_NOTHING = _Batch((0,) * len(SLOTS), frozenset(), {})


@dataclass
class _Published:
    labels: Labels
    batch: _Batch
    revision: int
    at_s: float


@dataclass
class PublishedTotals:
    """Running sums of every BatchMetrics revision this worker published, for counters
    that add up across batches, revisions and workers, and the newest batch of each
    label set for the latest-batch gauges.

    A revision adds only its difference from the previous revision of the same
    ``(run_id, batch_id)`` that this worker published (an increase to ``added``, a
    decrease to ``retracted``), so ``added - retracted`` is, per label set, the sum over
    batches of their latest revision. Memory is bounded: a batch is remembered for
    ``forget_after_s`` after its last publication (stage 2 keeps a batch for grace +
    timeout after its last change, so no revision can follow later) and at most
    ``max_remembered`` batches; at most ``max_label_sets`` (algorithm, run_id) pairs
    are kept, the least recently published one dropped first, and each names at most
    ``max_tasks`` tasks in its per-task counters (``LabelTotals.task_label``). ``latest`` holds, for the
    ``latest_label_sets`` most recently published pairs, the batch that closed last (at
    its newest revision): a late revision of an older batch does not replace it.
    """

    forget_after_s: float = 360.0
    max_remembered: int = 100_000
    max_label_sets: int = 16
    latest_label_sets: int = 4
    #: task names with counters of their own per label set; the rest count under OTHER_TASKS
    max_tasks: int = 16
    totals: OrderedDict[Labels, LabelTotals] = field(default_factory=OrderedDict)
    latest: OrderedDict[Labels, Any] = field(default_factory=OrderedDict)
    _last: OrderedDict[tuple[str | None, str], _Published] = field(default_factory=OrderedDict)

    @property
    def remembered(self) -> list[tuple[str | None, str]]:
        """(run_id, batch_id) of the batches whose last revision is remembered, oldest first."""
        return list(self._last)

    def observe(self, metrics: Any, now_s: float) -> None:
        """Count a published revision (a repeated or older revision counts nothing)."""
        self._remember(metrics, now_s, count=True)

    def seed(self, republished: Iterable[Any], now_s: float) -> None:
        """Remember revisions without counting them: those republished after a partition
        moved here, which their previous owner already counted (later revisions then
        add only their difference, so a rebalance does not count a batch twice)."""
        for metrics in republished:
            self._remember(metrics, now_s, count=False)

    def _label_totals(self, labels: Labels) -> LabelTotals:
        totals = self.totals.get(labels)
        if totals is None:
            totals = self.totals[labels] = LabelTotals()
            _drop_oldest(self.totals, self.max_label_sets)
        else:
            self.totals.move_to_end(labels)
        return totals

    def _remember(self, metrics: Any, now_s: float, *, count: bool) -> None:
        key = (metrics.run_id, metrics.batch_id)
        known = self._last.get(key)
        if known is not None and metrics.revision <= known.revision:
            return
        labels = published_labels(metrics)
        batch = _Batch.of(metrics)
        if count:
            self._count(known, labels, batch)
        if _moved(known, labels):
            self._drop_latest(known.labels, key)
        self._last[key] = _Published(labels, batch, metrics.revision, now_s)
        self._last.move_to_end(key)
        self._forget(now_s)
        self._keep_latest(labels, metrics)

    def _count(self, known: _Published | None, labels: Labels, batch: _Batch) -> None:
        """Count a revision's difference from the batch's previous one (taken back from its
        label set first when the batch moved to another)."""
        before = _NOTHING
        if _moved(known, labels):
            self._label_totals(known.labels).add(known.batch, _NOTHING, self.max_tasks)
        elif known is not None:
            before = known.batch
        self._label_totals(labels).add(before, batch, self.max_tasks)

    def _drop_latest(self, labels: Labels, key: tuple[str | None, str]) -> None:
        """A batch that moved to another label set is no longer its old set's newest."""
        newest = self.latest.get(labels)
        if newest is not None and (newest.run_id, newest.batch_id) == key:
            del self.latest[labels]

    def _keep_latest(self, labels: Labels, metrics: Any) -> None:
        if _newest_now(self.latest.get(labels), metrics):
            self.latest[labels] = metrics
        self.latest.move_to_end(labels)
        _drop_oldest(self.latest, self.latest_label_sets)

    def _forget(self, now_s: float) -> None:
        last = self._last
        while last:
            key, oldest = next(iter(last.items()))
            if len(last) <= self.max_remembered and now_s - oldest.at_s <= self.forget_after_s:
                break
            del last[key]


def _moved(known: _Published | None, labels: Labels) -> TypeGuard[_Published]:
    """Whether a batch's new revision goes under other labels than its last one remembered:
    a marker named the algorithm after the first revision (the batch moves to that label set)."""
    return known is not None and known.labels != labels


def _newest_now(newest: Any, metrics: Any) -> bool:
    """Whether a revision is its label set's newest batch now: none was, it is the newest
    batch's own later revision, or it closed no earlier (a late revision of an older batch
    is not)."""
    return (
        newest is None
        or (newest.run_id, newest.batch_id) == (metrics.run_id, metrics.batch_id)
        or metrics.closed_at >= newest.closed_at
    )


def _drop_oldest(kept: OrderedDict[Any, Any], most: int) -> None:
    """The least recently used entries dropped until ``most`` are left."""
    while len(kept) > most:
        kept.popitem(last=False)
