"""``advise``: one run's last batches, their histograms summed per group, a curve each.

Of one run, the newest revision of each batch is kept and the last ``last`` batches
(natural order of their ids, as ``tail`` sorts them: ``step-2`` before ``step-10``) are
read; their acceptance histograms are **summed** — the whole batch's, or with ``by`` each
``by_task`` / ``by_weight_version`` / ``by_draft_lag`` entry's under its name — and each
sum gives a budget curve (``_budget``). Curves are never averaged: a batch weighs what its
verify steps weigh. With ``by="draft_lag"`` the staleness curve and the refresh interval
follow (``_staleness``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter
from types import EllipsisType

from specmeter.schemas import BatchMetrics

from ..core.order import batch_order
from ..core.state import add_histograms
from ._budget import budget_curve, recommend
from ._model import BREAKDOWNS, Advice, AdviceError, Curve, Group
from ._staleness import staleness_of

__all__ = ["advise"]

_revision = attrgetter("revision")


def _curve(group: Group, histograms: list[list[int] | None], draft_cost: float | None) -> Curve | str:
    """One group's curve, or why it has none."""
    summed = _summed(histograms)
    if isinstance(summed, str):
        return summed
    points = budget_curve(summed, draft_cost)
    if draft_cost is None:
        return Curve(group, summed, points, len(summed) - 1)
    recommendation = recommend(points)
    return Curve(group, summed, points, len(summed) - 1, recommendation.budget, recommendation)


def _summed(histograms: list[list[int] | None]) -> list[int] | str:
    """A group's histograms summed, or why the sum gives no curve (no histogram at all, no
    verify step, a single bin)."""
    summed = add_histograms(histograms)
    if summed is None:
        return "no acceptance histogram"
    if sum(summed) == 0:
        return "no verify step in its histograms"
    if len(summed) < 2:
        return "histograms of one bin (no draft token was ever proposed)"
    return summed


def _run_name(run_id: str | None) -> str:
    return "the default run (no run_id)" if run_id is None else f"run {run_id!r}"


def _runs_text(runs: Iterable[str | None]) -> str:
    names = sorted("(default run)" if r is None else r for r in runs)
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _newest(metrics: Iterable[BatchMetrics]) -> dict[tuple[str | None, str], BatchMetrics]:
    """Each (run, batch)'s newest revision (the first seen of equal ones)."""
    newest: dict[tuple[str | None, str], BatchMetrics] = {}
    for m in metrics:
        key = (m.run_id, m.batch_id)
        newest[key] = max(newest.get(key, m), m, key=_revision)
    return newest


def _choose_run(runs: set[str | None], run_id: str | EllipsisType | None) -> str | None:
    """The run asked for, or the only one there; an error that names the runs otherwise."""
    if not runs:
        raise AdviceError(
            "no published batch to read",
            "give `specmeter aggregate --format jsonl` or `specmeter tail --json` output, or a metrics topic "
            "that a worker has published to (--broker, --topic)",
        )
    if run_id is ...:
        return _only_run(runs)
    if run_id not in runs:
        raise AdviceError(
            f"no batch of {_run_name(run_id)} in the metrics (runs there: {_runs_text(runs)})",
            "check --run-id (env SPECMETER_RUN_ID); --run-id '' is the default run",
        )
    return run_id


def _only_run(runs: set[str | None]) -> str | None:
    """The one run the metrics hold, when none was asked for."""
    if len(runs) > 1:
        raise AdviceError(
            f"the metrics hold {len(runs)} runs: {_runs_text(runs)}",
            "pick one with --run-id ID (env SPECMETER_RUN_ID); --run-id '' is the default run",
        )
    return next(iter(runs))


def _check_cost(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")


def advise(
    metrics: Iterable[BatchMetrics],
    *,
    run_id: str | EllipsisType | None = ...,
    last: int = 20,
    by: str | None = None,
    draft_cost: float | None = None,
    refresh_cost: float | None = None,
) -> Advice:
    """The budget curves of one run's last batches.

    Args:
        metrics: published BatchMetrics, any order, repeats and several revisions allowed.
        run_id: the run (None: the default run); omitted, the only run the metrics hold.
        last: how many of the run's batches to read, the last in natural order of their
            ids (0: all of them).
        by: None for the whole batches, or a key of ``BREAKDOWNS`` (one curve per task,
            weight version or draft lag, from the breakdown entries' histograms; with
            ``draft_lag`` the staleness curve too).
        draft_cost: the cost of one draft step relative to one target forward pass; gives
            each budget's speedup and the recommended budget (0: speculation off).
        refresh_cost: with ``by="draft_lag"``, the cost of one draft refresh in verify
            steps (docs/advise.md); gives the refresh interval.

    Raises:
        AdviceError: no batch, several runs and none chosen, an unknown run, no
            breakdown or no histogram in the batches read.
        ValueError: a cost negative or not finite; a refresh cost without ``by="draft_lag"``.
    """
    _check_arguments(by, draft_cost, refresh_cost)
    run, batches = _run_batches(metrics, run_id, last)
    ids = [m.batch_id for m in batches]
    curves, skipped = _curves(_histograms(batches, by, run), draft_cost)
    stale = staleness_of(batches, refresh_cost) if by == "draft_lag" else None
    advice = Advice(run, ids, by, draft_cost, curves, skipped, stale)
    if not (curves or advice.lag_points):
        raise _no_curve(run, ids, skipped)
    return advice


def _run_batches(
    metrics: Iterable[BatchMetrics], run_id: str | EllipsisType | None, last: int
) -> tuple[str | None, list[BatchMetrics]]:
    """The run the advice is of, and its last ``last`` batches at their newest revisions."""
    newest = _newest(metrics)
    run = _choose_run({r for r, _ in newest}, run_id)
    return run, _last_batches(newest, run, last)


def _check_arguments(by: str | None, draft_cost: float | None, refresh_cost: float | None) -> None:
    """``by`` a breakdown or None, the costs finite and >= 0, a refresh cost only by draft lag."""
    if by not in (None, *BREAKDOWNS):
        raise ValueError(f"by must be one of {sorted(BREAKDOWNS)} or None, not {by!r}")
    _check_cost("draft_cost", draft_cost)
    _check_cost("refresh_cost", refresh_cost)
    if refresh_cost is not None and by != "draft_lag":
        raise ValueError("refresh_cost needs by='draft_lag' (the staleness curve)")


def _last_batches(newest: dict[tuple[str | None, str], BatchMetrics], run: str | None, last: int) -> list[BatchMetrics]:
    """The run's last ``last`` batches in natural order of their ids (0: all of them)."""
    batches = sorted((m for (r, _), m in newest.items() if r == run), key=batch_order)
    return batches[-last:] if last else batches


def _no_curve(run: str | None, ids: list[str], skipped: list[tuple[Group, str]]) -> AdviceError:
    """Why the batches read give no curve at all: every group's reason, and what gives one."""
    reasons = "; ".join(sorted({reason for _, reason in skipped}))
    return AdviceError(
        f"the {len(ids)} batch(es) read of {_run_name(run)} ({ids[0]} .. {ids[-1]}) give no curve: {reasons}",
        "the curve needs SGLang 0.5.9+ (spec_correct_drafts_histogram or spec_accept_histogram in meta_info) "
        "and speculative decoding on; read more batches with --last N (0: all)",
    )


def _histograms(batches: list[BatchMetrics], by: str | None, run: str | None) -> dict[Group, list[list[int] | None]]:
    """The histograms to sum, per group: the batches' own (one group, None), or each
    breakdown entry's under its task, weight version or draft lag.

    Raises:
        AdviceError: ``by`` names a breakdown none of the batches has.
    """
    if by is None:
        return {None: [m.accept_histogram for m in batches]}
    attribute, name = BREAKDOWNS[by]
    groups = _entry_histograms(batches, attribute, name)
    if not groups:
        raise _no_breakdown(len(batches), run, by, attribute)
    return groups


def _no_breakdown(read: int, run: str | None, by: str, attribute: str) -> AdviceError:
    """None of the batches read has the breakdown ``--by`` names: what the producers must give."""
    flag = {"task": "a task", "weight_version": "a weight_version", "draft_lag": "a draft_lag"}[by]
    return AdviceError(
        f"none of the {read} batch(es) read of {_run_name(run)} has a {attribute} breakdown",
        f"the producers must give the records {flag} (docs/contract.md); or leave out --by",
    )


def _entry_histograms(batches: list[BatchMetrics], attribute: str, name: str) -> dict[Group, list[list[int] | None]]:
    """The breakdown entries' histograms under their task, weight version or lag, batch by batch."""
    groups: dict[Group, list[list[int] | None]] = {}
    for m in batches:
        for entry in getattr(m, attribute) or ():
            groups.setdefault(getattr(entry, name), []).append(entry.accept_histogram)
    return groups


def _group_order(group: Group) -> tuple:
    """Groups by name (lags by number), the unknown one last."""
    return (group is None, isinstance(group, str), group if isinstance(group, int) else 0, str(group or ""))


def _curves(
    groups: dict[Group, list[list[int] | None]], draft_cost: float | None
) -> tuple[list[Curve], list[tuple[Group, str]]]:
    """Each group's curve (groups by name, the unknown last), and the groups without one and why."""
    curves: list[Curve] = []
    skipped: list[tuple[Group, str]] = []
    for group in sorted(groups, key=_group_order):
        made = _curve(group, groups[group], draft_cost)
        if isinstance(made, Curve):
            curves.append(made)
        else:
            skipped.append((group, made))
    return curves, skipped
