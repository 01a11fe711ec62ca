"""The staleness curve and the refresh interval (docs/advise.md, "When to refresh the draft").

Per draft lag, the batches' ``by_draft_lag`` paired totals summed (never averaged): the
accept rate and the tokens per verify step at each lag; from those and a refresh cost in
verify steps, after how many policy updates a refresh of the draft pays for itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from specmeter.schemas import BatchMetrics

__all__ = ["LagPoint", "RefreshPlan", "Staleness", "staleness", "refresh_interval", "staleness_of"]

#: the paired totals a lag's point sums
_PAIRED = ("paired_accepted_total", "paired_proposed_total", "paired_completion_total", "paired_verify_total")


class LagPoint(msgspec.Struct, frozen=True):
    """One draft lag's share of the batches read, summed (never averaged): its accept rate
    ``paired_accepted / paired_proposed`` and tokens per verify step
    ``paired_completion / paired_verify`` (None where the denominator is 0 or unknown)."""

    draft_lag: int | None
    verify_steps: int
    accept_rate: float | None
    tokens_per_verify: float | None


class RefreshPlan(msgspec.Struct, frozen=True):
    """When to refresh the draft (docs/advise.md, "When to refresh the draft")."""

    #: the refresh cost R, in verify steps
    refresh_cost: float
    #: G: tokens generated per policy update (the batches' mean ``spec/completion_total``)
    tokens_per_update: float
    #: c(L) = G / T(L): verify steps one update costs at lag L = 0, 1, ..., M - 1
    update_costs: list[float]
    #: A(N) = (R + sum_{L<N} c(L)) / N for N = 1 .. M, at index N - 1
    averages: list[float]
    #: the N with the least A(N) (the smallest of equals): refresh every N updates
    every: int
    #: N is M, the most the measured lags allow: a longer interval is beyond the data
    at_edge: bool


class Staleness(msgspec.Struct, frozen=True):
    """The staleness curve of the batches read (``by="draft_lag"``), and with a refresh
    cost, the refresh interval."""

    points: list[LagPoint]
    refresh: RefreshPlan | None = None
    #: why no refresh interval could be computed (a refresh cost was given)
    no_refresh: str | None = None


def staleness(batches: Iterable[BatchMetrics]) -> list[LagPoint]:
    """The staleness curve: per draft lag (numeric order, unknown last) the accept rate and
    tokens per verify step of the batches' ``by_draft_lag`` entries, their paired totals
    summed across batches (a batch weighs what its generations weigh)."""
    sums = _paired_sums(batches)
    return [_lag_point(lag, sums[lag]) for lag in sorted(sums, key=lambda g: (g is None, g or 0))]


def _paired_sums(batches: Iterable[BatchMetrics]) -> dict[int | None, dict[str, int]]:
    """Each lag's paired totals (``_PAIRED``), summed over the batches' entries; a total an
    entry does not give (or gives as no int) adds nothing."""
    sums: dict[int | None, dict[str, int]] = {}
    for m in batches:
        for entry in m.by_draft_lag or ():
            _add_paired(sums.setdefault(entry.draft_lag, {}), entry.metrics)
    return sums


def _add_paired(total: dict[str, int], metrics: dict[str, int | float]) -> None:
    """One entry's paired totals added into its lag's ``total``; one it does not give as an
    int (unknown) adds nothing, so a lag sums what was measured."""
    for key in _PAIRED:
        value = metrics.get(f"spec/{key}")
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


def _lag_point(lag: int | None, t: dict[str, int]) -> LagPoint:
    """One lag's point from its summed totals (a ratio over 0 is None)."""
    proposed, verify = t.get("paired_proposed_total", 0), t.get("paired_verify_total", 0)
    return LagPoint(
        draft_lag=lag,
        verify_steps=verify,
        accept_rate=t.get("paired_accepted_total", 0) / proposed if proposed else None,
        tokens_per_verify=t.get("paired_completion_total", 0) / verify if verify else None,
    )


def refresh_interval(tokens_per_verify: list[float], tokens_per_update: float, refresh_cost: float) -> RefreshPlan:
    """How often to refresh the draft, from the staleness curve (docs/advise.md).

    An update generated at lag L costs ``c(L) = G / T(L)`` verify steps (``T``: tokens per
    verify step at lag L, ``G``: tokens per update); refreshing every N updates (lags 0 ..
    N - 1, then a refresh of R verify steps) costs ``R + sum_{L<N} c(L)`` per N updates. The
    interval is the N in 1 .. M (M = ``len(tokens_per_verify)``, lags 0 .. M - 1 measured)
    with the least average ``A(N) = (R + sum_{L<N} c(L)) / N``, the smallest of equals.

    Raises:
        ValueError: no lag, a T(L) or G not > 0, R negative or not finite.
    """
    _check_refresh_inputs(tokens_per_verify, tokens_per_update, refresh_cost)
    costs = [tokens_per_update / t for t in tokens_per_verify]
    averages = _averages(costs, refresh_cost)
    every = min(range(len(averages)), key=lambda i: (averages[i], i)) + 1
    return RefreshPlan(refresh_cost, tokens_per_update, costs, averages, every, every == len(costs))


def _check_refresh_inputs(tokens_per_verify: list[float], tokens_per_update: float, refresh_cost: float) -> None:
    """Lag 0 at least, every T(L) and G finite and > 0, R finite and >= 0."""
    if not tokens_per_verify:
        raise ValueError("refresh_interval() needs the tokens per verify step of lag 0 at least")
    if not all(map(_finite_and_positive, [*tokens_per_verify, tokens_per_update])):
        raise ValueError("tokens per verify step and per update must be finite and > 0")
    if not (math.isfinite(refresh_cost) and refresh_cost >= 0):
        raise ValueError(f"the refresh cost must be a finite number >= 0, not {refresh_cost!r}")


def _finite_and_positive(tokens: float) -> bool:
    """A T(L) or G an update's cost can be divided out of: finite and > 0."""
    return math.isfinite(tokens) and tokens > 0


def _averages(costs: list[float], refresh_cost: float) -> list[float]:
    """A(N) = (R + sum_{L<N} c(L)) / N for N = 1 .. M, summed in order (as the docs' table)."""
    averages = []
    running = refresh_cost
    for n, cost in enumerate(costs, start=1):
        running += cost
        averages.append(running / n)
    return averages


def staleness_of(batches: list[BatchMetrics], refresh_cost: float | None) -> Staleness:
    """The staleness curve of the batches read and, with a refresh cost, the refresh interval
    over the lags measured without a gap from lag 0."""
    points = staleness(batches)
    if refresh_cost is None:
        return Staleness(points)
    measured = _measured_from_lag_0(points)
    if not measured:
        return Staleness(points, no_refresh="no generation at draft lag 0 with tokens per verify step measured")
    per_update = _tokens_per_update(batches)
    if per_update is None:
        return Staleness(points, no_refresh="the batches give no spec/completion_total (tokens per update)")
    return Staleness(points, refresh_interval(measured, per_update, refresh_cost))


def _tokens_per_update(batches: list[BatchMetrics]) -> float | None:
    """G, the tokens per policy update: the mean ``spec/completion_total`` of the batches
    that give one; None where none does, or they sum to nothing (no G to divide by)."""
    known = [t for t in (m.metrics.get("spec/completion_total") for m in batches) if isinstance(t, (int, float))]
    if sum(known) <= 0:
        return None
    return sum(known) / len(known)


def _measured_from_lag_0(points: list[LagPoint]) -> list[float]:
    """T(0), T(1), ... up to the first lag without tokens per verify step (0 tokens: no
    cost to weigh)."""
    measured: list[float] = []
    by_lag = {p.draft_lag: p.tokens_per_verify for p in points}  # the unknown lag (None) is never looked up
    while (tokens := by_lag.get(len(measured))) is not None and tokens > 0:
        measured.append(tokens)
    return measured
