"""``specmeter advise``: which draft budget a run's own acceptance histograms favour,
whether to speculate at all, the engine settings that apply it, and when a stale draft
is worth refreshing (docs/advise.md).

Pure: published BatchMetrics in, one curve per group out. Of one run, the newest
revision of each batch is kept and the last ``last`` batches (natural order of their
ids, as ``tail`` sorts them: ``step-2`` before ``step-10``) are read; their
acceptance histograms are **summed** — the whole batch's, or with ``by`` each
``by_task`` / ``by_weight_version`` / ``by_draft_lag`` entry's under its name — and each
sum H gives the curve of docs/contract.md §3.5: the tokens per verify step with a budget
of k draft tokens, ``E_k = (S + sum_i min(i, k) * H[i]) / S`` (S = sum(H)) for
k = 1 .. len(H) - 1. Curves are never averaged: a batch weighs what its verify steps weigh.

Given the cost c of one draft step relative to one target forward pass, a step with
budget k costs ``1 + c * k`` target passes and yields ``E_k`` tokens where plain
decoding yields 1, so the expected speedup over no speculation is ``E_k / (1 + c * k)``
(the verify pass over k + 1 tokens is taken to cost one decode step, as it does while
decoding is memory-bound). Budget 0 — no speculation, 1 token per step at cost 1,
speedup 1 — is always a candidate. The recommended budget has the greatest speedup;
budgets whose speedups print the same (``SPEEDUP_DECIMALS``) tie, and the smallest of
them is recommended (the same speedup for fewer draft tokens per step), so a budget
that does not beat budget 0 by a printed digit is never recommended. The curve says
nothing about budgets above the one the fleet ran: a recommendation at that edge says
so. With ``by="draft_lag"`` the staleness curve and the refresh interval follow
(``staleness``, ``refresh_interval``).
"""

from __future__ import annotations

import math
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import EllipsisType
from typing import IO, Any

import click
import msgspec
from click.core import ParameterSource

from specmeter.schemas import BatchMetrics, decode_metrics

from ..core.merge import tokens_per_verify_by_budget
from ..core.state import add_histograms
from ..errors import SpecmeterError
from . import preflight
from .base import (
    DEFAULTS,
    KAFKA_ENV_HELP,
    Command,
    CommandFailed,
    Number,
    broker_option,
    folded,
    input_name,
    one_line_errors,
    run_id,
)
from .tables import batch_order

__all__ = [
    "Advice",
    "AdviceError",
    "BudgetPoint",
    "Curve",
    "Recommendation",
    "LagPoint",
    "Staleness",
    "RefreshPlan",
    "BREAKDOWNS",
    "CAVEAT",
    "SPEEDUP_DECIMALS",
    "advise",
    "budget_curve",
    "recommend",
    "engine_settings",
    "staleness",
    "refresh_interval",
    "metrics_from_lines",
    "advice_tables",
    "advice_notes",
    "advise_command",
]

#: what ``by`` may name: the breakdown of a BatchMetrics, and the attribute naming its entries
BREAKDOWNS = {
    "task": ("by_task", "task"),
    "weight_version": ("by_weight_version", "weight_version"),
    "draft_lag": ("by_draft_lag", "draft_lag"),
}

#: speedups are printed with this many decimals; budgets whose speedups print the same tie
SPEEDUP_DECIMALS = 3

#: what the curve can and cannot say (docs/contract.md §3.5)
CAVEAT = (
    "exact for chain drafters (EAGLE/MTP chains, NGRAM, a draft model: the first k drafts of a step do not "
    "depend on how many follow); an upper bound for tree drafters (EAGLE-2/3 trees: a smaller budget may prune "
    "the accepted branch); silent on budgets above the one the fleet ran (its histograms' width minus one)"
)

Group = str | int | None


class AdviceError(SpecmeterError, ValueError):
    """The published metrics cannot give a curve: the message says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class BudgetPoint:
    """One candidate budget k: tokens per verify step, and the speedup when a draft cost is given."""

    budget: int
    tokens_per_verify: float
    speedup: float | None = None


@dataclass(frozen=True)
class Recommendation:
    """The budget to run (0: speculation off), and why."""

    budget: int
    speedup: float
    #: every budget whose speedup prints the same as the recommended one's, smallest first
    #: (the recommended budget among them); one budget when nothing ties
    tied: list[int]
    #: the recommended budget is the largest the histograms cover (the one the fleet ran):
    #: a larger one might pay more, but that is beyond the data
    at_edge: bool
    #: the greatest speedup of a budget k >= 1 (what speculating would give at best)
    best_speculating: BudgetPoint | None = None

    @property
    def speculate(self) -> bool:
        return self.budget > 0


@dataclass(frozen=True)
class Curve:
    """The curve of one group's summed histogram (``group``: a task, weight version or draft
    lag, None for the unknown one, or for the whole batches when the advice is not broken down)."""

    group: Group
    histogram: list[int]
    points: list[BudgetPoint]
    #: the budget the fleet ran, as its histograms say: their width minus one
    budget_ran: int
    #: the recommended budget, 0 for no speculation (None without a draft cost)
    best: int | None = None
    recommendation: Recommendation | None = None

    @property
    def verify_steps(self) -> int:
        return sum(self.histogram)


@dataclass(frozen=True)
class LagPoint:
    """One draft lag's share of the batches read, summed (never averaged): its accept rate
    ``paired_accepted / paired_proposed`` and tokens per verify step
    ``paired_completion / paired_verify`` (None where the denominator is 0 or unknown)."""

    draft_lag: int | None
    verify_steps: int
    accept_rate: float | None
    tokens_per_verify: float | None


@dataclass(frozen=True)
class RefreshPlan:
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


@dataclass(frozen=True)
class Staleness:
    """The staleness curve of the batches read (``by="draft_lag"``), and with a refresh
    cost, the refresh interval."""

    points: list[LagPoint]
    refresh: RefreshPlan | None = None
    #: why no refresh interval could be computed (a refresh cost was given)
    no_refresh: str | None = None


@dataclass(frozen=True)
class Advice:
    """Curves of one run's last batches."""

    run_id: str | None
    #: the batch ids read, oldest first
    batches: list[str]
    by: str | None
    draft_cost: float | None
    curves: list[Curve]
    #: groups without a curve, and why (no histogram, no verify step, a single bin)
    skipped: list[tuple[Group, str]] = field(default_factory=list)
    #: with ``by="draft_lag"``: the staleness curve
    staleness: Staleness | None = None

    def as_document(self) -> dict[str, Any]:
        """The advice as JSON-ready builtins (``--json``)."""
        document: dict[str, Any] = {
            "run_id": self.run_id,
            "batches": self.batches,
            "by": self.by,
            "draft_cost": self.draft_cost,
            "caveat": CAVEAT,
            "curves": [_curve_document(c, self.by) for c in self.curves],
            "skipped": [{**_named(self.by, group), "reason": reason} for group, reason in self.skipped],
        }
        if self.staleness is not None:
            document["staleness"] = _staleness_document(self.staleness)
        return document


def _curve_document(c: Curve, by: str | None) -> dict[str, Any]:
    """One curve as JSON-ready builtins, named by its group where the advice is broken down."""
    return {
        **_named(by, c.group),
        "verify_steps": c.verify_steps,
        "accept_histogram": c.histogram,
        "budget_ran": c.budget_ran,
        "best_budget": c.best,
        "no_speculation": {"budget": 0, "tokens_per_verify": 1.0, "speedup": None if c.best is None else 1.0},
        "budgets": [
            {"budget": p.budget, "tokens_per_verify": p.tokens_per_verify, "speedup": p.speedup} for p in c.points
        ],
        "recommendation": None if c.recommendation is None else _recommendation_document(c.recommendation),
    }


def _recommendation_document(r: Recommendation) -> dict[str, Any]:
    return {
        "budget": r.budget,
        "speculate": r.speculate,
        "speedup": r.speedup,
        "tied_budgets": r.tied,
        "beyond_data": r.at_edge,
        "reason": recommendation_text(r),
        "engine_settings": engine_settings(r.budget),
    }


def _staleness_document(s: Staleness) -> dict[str, Any]:
    plan = s.refresh
    return {
        "points": [
            {
                "draft_lag": p.draft_lag,
                "verify_steps": p.verify_steps,
                "accept_rate": p.accept_rate,
                "tokens_per_verify": p.tokens_per_verify,
            }
            for p in s.points
        ],
        "refresh": None
        if plan is None
        else {
            "refresh_cost_verify_steps": plan.refresh_cost,
            "tokens_per_update": plan.tokens_per_update,
            "update_cost_by_lag": plan.update_costs,
            "average_cost_by_interval": plan.averages,
            "refresh_every_updates": plan.every,
            "beyond_data": plan.at_edge,
        },
        "no_refresh": s.no_refresh,
    }


def _named(by: str | None, group: Group) -> dict[str, Group]:
    """The group under the breakdown's name (``{"task": "gsm8k"}``); nothing where the advice is not broken down."""
    return {by: group} if by else {}


def budget_curve(histogram: list[int], draft_cost: float | None = None) -> list[BudgetPoint]:
    """Tokens per verify step for every budget k >= 1 a summed histogram can speak for, and
    with ``draft_cost`` the expected speedup ``E_k / (1 + draft_cost * k)``; empty when the
    histogram has fewer than two bins or no step."""
    curve = tokens_per_verify_by_budget(histogram) or []
    return [
        BudgetPoint(k, tokens, None if draft_cost is None else tokens / (1 + draft_cost * k))
        for k, tokens in enumerate(curve, start=1)
    ]


def _printed(speedup: float) -> str:
    return f"{speedup:.{SPEEDUP_DECIMALS}f}"


def recommend(points: list[BudgetPoint]) -> Recommendation:
    """The budget to run among 0 (no speculation: speedup 1) and the points' budgets.

    The greatest speedup wins; budgets whose speedups print the same (``SPEEDUP_DECIMALS``
    decimals) tie, and the smallest of them is recommended: the same speedup for fewer
    draft tokens per step. Budget 0 is among them, so a budget that does not beat
    decoding without speculation by a printed digit is never recommended.

    Raises:
        ValueError: a point without a speedup (no draft cost).
    """
    if any(p.speedup is None for p in points):
        raise ValueError("recommend() needs every point's speedup (a draft cost)")
    speedups = {0: 1.0, **{p.budget: float(p.speedup or 0.0) for p in points}}
    top = max(speedups.values())
    tied = sorted(k for k, value in speedups.items() if _printed(value) == _printed(top))
    best_speculating = max(points, key=lambda p: (speedups[p.budget], -p.budget)) if points else None
    return Recommendation(
        budget=tied[0],
        speedup=speedups[tied[0]],
        tied=tied,
        at_edge=bool(points) and tied[0] == points[-1].budget,
        best_speculating=best_speculating,
    )


def recommendation_text(r: Recommendation) -> str:
    """The recommendation in one sentence or two: what to run, the ties, the edge of the data."""
    best = r.best_speculating
    if not r.speculate:
        if best is None:
            return "no budget was measured: turn speculative decoding off"
        if 0 in r.tied and len(r.tied) > 1:
            others = _budgets_text([k for k in r.tied if k])
            return (
                f"no budget beats decoding without speculation: {others} only tie it at {_printed(r.speedup)}× "
                "(equal within the printed precision); turn speculative decoding off, which gives the same "
                "speed without the draft's work and memory"
            )
        return (
            f"no budget beats decoding without speculation (the best, k={best.budget}, gives "
            f"{_printed(best.speedup or 0.0)}×): turn speculative decoding off"
        )
    text = f"run k={r.budget} draft tokens per step: {_printed(r.speedup)}× over decoding without speculation"
    if len(r.tied) > 1:
        text += (
            f"; {_budgets_text(r.tied)} tie at {_printed(r.speedup)}× (equal within the printed precision), "
            f"and the smaller, k={r.budget}, gives the same speedup for fewer draft tokens per step"
        )
    if r.at_edge:
        text += (
            f"; k={r.budget} is the largest budget the histograms cover (the one the fleet ran): whether a larger "
            "one pays more is beyond the data — run the fleet at a larger budget to measure it"
        )
    return text


def _budgets_text(budgets: list[int]) -> str:
    names = [f"k={k}" for k in budgets]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def engine_settings(budget: int) -> dict[str, str]:
    """The settings that run a chain drafter at ``budget`` draft tokens per step, per engine
    (docs/advise.md, "Engine settings"); for budget 0, how to turn speculation off.

    SGLang (python/sglang/srt/server_args.py) sets ``speculative_num_draft_tokens`` to
    ``speculative_num_steps + 1`` whenever ``speculative_eagle_topk`` is 1 (a chain): k draft
    steps verify k + 1 tokens. vLLM's budget is ``num_speculative_tokens`` in
    ``--speculative-config``; TensorRT-LLM's is ``max_draft_len`` in its speculative config.
    """
    if budget < 0:
        raise ValueError(f"a budget is >= 0, not {budget}")
    if budget == 0:
        return {
            "sglang": "leave out --speculative-algorithm and the other --speculative-* flags",
            "vllm": "leave out --speculative-config",
            "tensorrt_llm": "leave out speculative_config (no max_draft_len)",
        }
    return {
        "sglang": (
            f"--speculative-num-steps {budget} --speculative-eagle-topk 1 --speculative-num-draft-tokens {budget + 1}"
        ),
        "vllm": f"--speculative-config '{{..., \"num_speculative_tokens\": {budget}}}' (keep your method and model)",
        "tensorrt_llm": (
            f"max_draft_len={budget} in speculative_config (e.g. Eagle3DecodingConfig(max_draft_len={budget}))"
        ),
    }


def _curve(group: Group, histograms: list[list[int] | None], draft_cost: float | None) -> Curve | str:
    """One group's curve, or why it has none."""
    summed = add_histograms(histograms)
    if summed is None:
        return "no acceptance histogram"
    if sum(summed) == 0:
        return "no verify step in its histograms"
    if len(summed) < 2:
        return "histograms of one bin (no draft token was ever proposed)"
    points = budget_curve(summed, draft_cost)
    recommendation = None if draft_cost is None else recommend(points)
    best = None if recommendation is None else recommendation.budget
    return Curve(group, summed, points, len(summed) - 1, best, recommendation)


# -- the staleness curve and the refresh interval (docs/advise.md) --


def staleness(batches: Iterable[BatchMetrics]) -> list[LagPoint]:
    """The staleness curve: per draft lag (numeric order, unknown last) the accept rate and
    tokens per verify step of the batches' ``by_draft_lag`` entries, their paired totals
    summed across batches (a batch weighs what its generations weigh)."""
    sums: dict[int | None, dict[str, int]] = {}
    for m in batches:
        for entry in m.by_draft_lag or ():
            total = sums.setdefault(entry.draft_lag, {})
            for key in (
                "paired_accepted_total",
                "paired_proposed_total",
                "paired_completion_total",
                "paired_verify_total",
            ):
                value = entry.metrics.get(f"spec/{key}")
                if isinstance(value, int):
                    total[key] = total.get(key, 0) + value
    points = []
    for lag in sorted(sums, key=lambda g: (g is None, g or 0)):
        t = sums[lag]
        proposed, verify = t.get("paired_proposed_total", 0), t.get("paired_verify_total", 0)
        points.append(
            LagPoint(
                draft_lag=lag,
                verify_steps=verify,
                accept_rate=t.get("paired_accepted_total", 0) / proposed if proposed else None,
                tokens_per_verify=t.get("paired_completion_total", 0) / verify if verify else None,
            )
        )
    return points


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
    if not tokens_per_verify:
        raise ValueError("refresh_interval() needs the tokens per verify step of lag 0 at least")
    if not all(math.isfinite(t) and t > 0 for t in [*tokens_per_verify, tokens_per_update]):
        raise ValueError("tokens per verify step and per update must be finite and > 0")
    if not (math.isfinite(refresh_cost) and refresh_cost >= 0):
        raise ValueError(f"the refresh cost must be a finite number >= 0, not {refresh_cost!r}")
    costs = [tokens_per_update / t for t in tokens_per_verify]
    averages = []
    running = refresh_cost
    for n, cost in enumerate(costs, start=1):
        running += cost
        averages.append(running / n)
    every = min(range(len(averages)), key=lambda i: (averages[i], i)) + 1
    return RefreshPlan(refresh_cost, tokens_per_update, costs, averages, every, every == len(costs))


def _staleness(batches: list[BatchMetrics], refresh_cost: float | None) -> Staleness:
    """The staleness curve of the batches read and, with a refresh cost, the refresh interval
    over the lags measured without a gap from lag 0."""
    points = staleness(batches)
    if refresh_cost is None:
        return Staleness(points)
    measured: list[float] = []
    by_lag = {p.draft_lag: p.tokens_per_verify for p in points if p.draft_lag is not None}
    while (tokens := by_lag.get(len(measured))) is not None and tokens > 0:  # 0 tokens: no cost to weigh
        measured.append(tokens)
    totals = [m.metrics.get("spec/completion_total") for m in batches]
    known = [t for t in totals if isinstance(t, (int, float))]
    if not measured:
        return Staleness(points, no_refresh="no generation at draft lag 0 with tokens per verify step measured")
    if not known or sum(known) <= 0:
        return Staleness(points, no_refresh="the batches give no spec/completion_total (tokens per update)")
    return Staleness(points, refresh_interval(measured, sum(known) / len(known), refresh_cost))


def _run_name(run_id: str | None) -> str:
    return "the default run (no run_id)" if run_id is None else f"run {run_id!r}"


def _runs_text(runs: Iterable[str | None]) -> str:
    names = sorted("(default run)" if r is None else r for r in runs)
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _newest(metrics: Iterable[BatchMetrics]) -> dict[tuple[str | None, str], BatchMetrics]:
    newest: dict[tuple[str | None, str], BatchMetrics] = {}
    for m in metrics:
        key = (m.run_id, m.batch_id)
        if key not in newest or m.revision > newest[key].revision:
            newest[key] = m
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
    if by is not None and by not in BREAKDOWNS:
        raise ValueError(f"by must be one of {sorted(BREAKDOWNS)} or None, not {by!r}")
    _check_cost("draft_cost", draft_cost)
    _check_cost("refresh_cost", refresh_cost)
    if refresh_cost is not None and by != "draft_lag":
        raise ValueError("refresh_cost needs by='draft_lag' (the staleness curve)")
    newest = _newest(metrics)
    run = _choose_run({r for r, _ in newest}, run_id)
    batches = _last_batches(newest, run, last)
    ids = [m.batch_id for m in batches]
    curves, skipped = _curves(_histograms(batches, by, run), draft_cost)
    stale = _staleness(batches, refresh_cost) if by == "draft_lag" else None
    if not curves and not (stale and stale.points):
        raise _no_curve(run, ids, skipped)
    return Advice(run, ids, by, draft_cost, curves, skipped, stale)


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


def metrics_from_lines(lines: Iterable[bytes], name: str = "the input") -> Iterator[BatchMetrics]:
    """BatchMetrics from JSON lines (``specmeter aggregate --format jsonl``, ``tail --json``)
    or one JSON list (``aggregate --format json``); blank lines are skipped.

    Raises:
        AdviceError: a line (or the document) is not BatchMetrics JSON, with its number.
    """
    it = iter(lines)
    for number, line in enumerate(it, start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith(b"["):  # one JSON document: the rest of the input belongs to it
            yield from _document(b"".join([line, *it]), name, number)
            return
        yield _line(text, name, number)


def _line(text: bytes, name: str, number: int) -> BatchMetrics:
    """The BatchMetrics of line ``number``."""
    try:
        return decode_metrics(text)
    except msgspec.DecodeError as exc:
        raise _not_metrics(name, f"line {number}", exc) from None


def _document(document: bytes, name: str, number: int) -> list[BatchMetrics]:
    """The BatchMetrics of one JSON list that starts at line ``number``."""
    try:
        return msgspec.json.decode(document, type=list[BatchMetrics])
    except msgspec.DecodeError as exc:  # a ValidationError is one too
        raise _not_metrics(name, f"the JSON list from line {number}", exc) from None


def _not_metrics(name: str, where: str, exc: Exception) -> AdviceError:
    return AdviceError(
        f"{name}, {where}, is not a BatchMetrics JSON object ({exc})",
        "advise reads published metrics: `specmeter aggregate --format jsonl DUMP` or `specmeter tail --json` "
        "output, not a records dump",
    )


# -- the terminal output: one table per curve or one matrix of groups, the recommendation,
# the engine settings, the staleness curve, and what the curve can say --


class Verbatim(str):
    """A line printed as it is, never wrapped at the console's width (an engine's command
    line: wrapped at 80 columns in a file or pipe, it split in two, issue 47.5); a terminal
    still folds it visually, and copies it whole."""


#: the engines' names as printed, in the order of ``engine_settings``
ENGINES = {"sglang": "SGLang", "vllm": "vLLM", "tensorrt_llm": "TensorRT-LLM"}


def _group_label(by: str | None, group: Group) -> str:
    if by is None:
        return "all generations"
    return "(unknown)" if group is None else str(group)


def _group_name(advice: Advice, curve: Curve) -> str:
    if advice.by is None:
        return "all generations"
    return f"{advice.by.replace('_', ' ')} {_group_label(advice.by, curve.group)}"


def _table(advice: Advice, curve: Curve) -> Any:
    """One curve as rows of budgets, budget 0 (no speculation) first."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"{_group_name(advice, curve)}: {curve.verify_steps:,} verify steps",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
    )
    table.add_column("budget k", justify="right")
    table.add_column("tokens/verify", justify="right")
    if advice.draft_cost is not None:
        table.add_column(f"speedup (c={advice.draft_cost:g})", justify="right")
    table.add_column("")
    speedup = None if advice.draft_cost is None else 1.0
    for point in [BudgetPoint(0, 1.0, speedup), *curve.points]:
        table.add_row(*_point_cells(curve, point), style="bold" if point.budget == curve.best else None)
    return table


def _point_cells(curve: Curve, point: BudgetPoint) -> list[str]:
    """A budget's row: k, tokens per verify step, the speedup if known, and its marks
    (the recommended budget, those that tie with it, no speculation, the one the fleet ran)."""
    marks = []
    r = curve.recommendation
    if point.budget == curve.best:
        marks.append("◀ best")
    elif r is not None and point.budget in r.tied:
        marks.append(f"ties with k={r.budget}")
    if point.budget == 0:
        marks.append("no speculation")
    if point.budget == curve.budget_ran:
        marks.append("the fleet ran this")
    speedup = [] if point.speedup is None else [f"{_printed(point.speedup)}×"]
    return [str(point.budget), f"{point.tokens_per_verify:.3f}", *speedup, ", ".join(marks)]


def _matrix(advice: Advice) -> Any:
    """Every group's curve as one row (group × budget): the speedup per budget with a draft
    cost (tokens per verify step without), the recommended budget marked per row."""
    from rich import box
    from rich.table import Table

    costed = advice.draft_cost is not None
    widest = max(c.budget_ran for c in advice.curves)
    what = f"speedup at c={advice.draft_cost:g}" if costed else "tokens per verify step"
    table = Table(
        title=f"{what} by {advice.by.replace('_', ' ') if advice.by else 'group'} (rows) and budget k (columns)"
        + (", * the recommended budget" if costed else ""),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
    )
    table.add_column((advice.by or "group").replace("_", " "), justify="left")
    table.add_column("verify steps", justify="right")
    for k in range(widest + 1):
        table.add_column(f"k={k}", justify="right")
    table.add_column("ran", justify="right")
    if costed:
        table.add_column("recommended", justify="left")
    for curve in advice.curves:
        cells = [_group_label(advice.by, curve.group), f"{curve.verify_steps:,}"]
        values = [1.0, *[(p.speedup if costed else p.tokens_per_verify) for p in curve.points]]
        for k in range(widest + 1):
            if k >= len(values):
                cells.append("")  # beyond this group's data
                continue
            mark = "*" if costed and k == curve.best else ""
            cells.append(f"{_printed(values[k] or 0.0)}{mark}")
        cells.append(str(curve.budget_ran))
        if costed:
            cells.append(_row_recommendation(curve))
        table.add_row(*cells)
    return table


def _row_recommendation(curve: Curve) -> str:
    r = curve.recommendation
    if r is None:
        return ""
    text = "off (no speculation)" if not r.speculate else f"k={r.budget}"
    others = [k for k in r.tied if k != r.budget]
    if others:
        text += f", ties {_budgets_text(others)}"
    if r.at_edge:
        text += " (edge of the data)"
    return text


def _staleness_table(s: Staleness) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title="the staleness curve: per draft lag (policy updates the draft is behind), summed over the batches",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
    )
    # paired: spec/paired_verify_total, not the matrix's histogram steps (``_VERIFY_STEPS_NOTE``)
    for name in ("draft lag", "paired verify steps", "accept rate", "tokens/verify"):
        table.add_column(name, justify="right")
    for p in s.points:
        table.add_row(
            "(unknown)" if p.draft_lag is None else str(p.draft_lag),
            f"{p.verify_steps:,}",
            "-" if p.accept_rate is None else f"{p.accept_rate:.3f}",
            "-" if p.tokens_per_verify is None else f"{p.tokens_per_verify:.3f}",
        )
    return table


def advice_tables(advice: Advice) -> list[Any]:
    """The rich tables: a table of budgets for the one curve of unbroken-down advice, or one
    matrix of groups × budgets; with ``by="draft_lag"`` the staleness curve after it."""
    tables = []
    if advice.curves:
        tables = [_table(advice, advice.curves[0])] if advice.by is None else [_matrix(advice)]
    if advice.staleness is not None and advice.staleness.points:
        tables.append(_staleness_table(advice.staleness))
    return tables


def advice_notes(advice: Advice) -> list[str]:
    """The lines around the tables: what was read first; after the tables the
    recommendations and their engine settings, the refresh interval, what is missing,
    what the curve can say and how the speedup is counted."""
    run = "the default run" if advice.run_id is None else f"run {advice.run_id}"
    batches = advice.batches
    span = batches[0] if len(batches) == 1 else f"{batches[0]} .. {batches[-1]}"
    by = f", one curve per {advice.by.replace('_', ' ')}" if advice.by else ""
    return [
        f"specmeter advise: {run}, {len(batches)} batch(es) ({span}), histograms summed{by}",
        *_verify_steps_notes(advice),
        *_recommendation_notes(advice),
        *_refresh_notes(advice.staleness),
        *_skipped_notes(advice),
        f"The curve is {CAVEAT}.",
        _cost_note(advice.draft_cost),
    ]


#: why the matrix's and the staleness table's verify steps of one lag differ (issue 47.5:
#: 4,234 against 4,218 at lag 0, unexplained)
_VERIFY_STEPS_NOTE = (
    "Verify steps: the matrix counts the steps in the acceptance histograms (the generations that reported "
    "one: the curves' data); the staleness table's paired verify steps are spec/paired_verify_total (the "
    "generations that reported both verify and completion: tokens/verify's denominator). They differ by the "
    "generations that reported only one of the two, and by histograms that contradict their own counters "
    "(spec/inconsistent_generation_count)."
)


def _verify_steps_notes(advice: Advice) -> list[str]:
    """What each table's verify steps count, where a lag's two counts are printed side by side."""
    both = advice.curves and advice.staleness is not None and advice.staleness.points
    return [_VERIFY_STEPS_NOTE] if both else []


def _recommendation_notes(advice: Advice) -> list[str]:
    """The recommendation (one curve: in words; a matrix: one line each for the groups that
    should not speculate, the ties and the edges of the data), then the engine settings of
    each recommended budget, once per budget, naming its groups."""
    curves = [c for c in advice.curves if c.recommendation is not None]
    if not curves:
        return []
    if advice.by is None:
        lines = [f"{recommendation_text(curves[0].recommendation)}."]  # type: ignore[arg-type]
    else:
        lines = _matrix_recommendation_notes(advice, curves)
    budgets: dict[int, list[str]] = {}
    for curve in curves:
        budgets.setdefault(curve.best or 0, []).append(_group_label(advice.by, curve.group))
    kind = "" if advice.by is None else advice.by.replace("_", " ")
    for budget in sorted(budgets):
        groups = "" if advice.by is None else f" ({kind} {', '.join(budgets[budget])})"
        title = "speculation off" if budget == 0 else f"k={budget}"
        lines.append(f"Engine settings for {title}{groups}, a chain drafter:")
        lines += [Verbatim(f"  {ENGINES[engine]}: {text}") for engine, text in engine_settings(budget).items()]
    return lines


def _matrix_recommendation_notes(advice: Advice, curves: list[Curve]) -> list[str]:
    """What the matrix's recommended column abbreviates, one line per kind of remark."""
    kind = (advice.by or "group").replace("_", " ")
    off, ties, edges = [], [], []
    for curve in curves:
        r = curve.recommendation
        assert r is not None
        name = _group_label(advice.by, curve.group)
        if not r.speculate:
            off.append(name)
        if len(r.tied) > 1:
            ties.append(f"{name} ({' = '.join(f'k={k}' for k in r.tied)})")
        if r.at_edge:
            edges.append(f"{name} (k={r.budget})")
    lines = []
    if off:
        lines.append(f"No budget beats decoding without speculation for {kind} {', '.join(off)}: turn it off there.")
    if ties:
        lines.append(
            f"Ties within the printed precision, the smaller budget recommended (the same speedup for fewer draft "
            f"tokens per step): {kind} {', '.join(ties)}."
        )
    if edges:
        lines.append(
            f"Recommended at the largest budget the histograms cover (the one the fleet ran): {kind} "
            f"{', '.join(edges)}; "
            "whether a larger one pays more is beyond the data."
        )
    return lines


def _refresh_notes(s: Staleness | None) -> list[str]:
    """The refresh interval in words, or why there is none."""
    if s is None:
        return []
    if s.no_refresh is not None:
        return [f"No refresh interval: {s.no_refresh}."]
    plan = s.refresh
    if plan is None:
        return [
            "Pass --refresh-cost R (one draft refresh, in verify steps: docs/advise.md) for the number of "
            "policy updates after which a refresh pays for itself."
        ]
    n, steps = plan.every, _verify_steps_text
    lines = [
        f"Refresh the draft every {n} policy update(s): a refresh of {plan.refresh_cost:g} verify steps pays for "
        f"itself after {n} update(s), at {steps(plan.averages[n - 1])} verify steps per update on average "
        f"(every update: {steps(plan.averages[0])}; every {len(plan.averages)}: {steps(plan.averages[-1])}), "
        f"with {plan.tokens_per_update:,.0f} tokens per update.",
    ]
    if plan.at_edge:
        lines.append(
            f"{n} is the longest interval the measured lags (0 .. {n - 1}) allow: a longer one may cost less "
            "still, but that is beyond the data."
        )
    return lines


#: an average cost of verify steps at or above this is printed in scientific notation
_SCIENTIFIC_FROM = 1e12


def _verify_steps_text(value: float) -> str:
    """An average cost in verify steps: one decimal with thousands separators, or, from
    ``_SCIENTIFIC_FROM`` up (a refresh cost such as 1e300), scientific notation, never a
    300-digit number (issue 47.5)."""
    return f"{value:,.1f}" if abs(value) < _SCIENTIFIC_FROM else f"{value:.4g}"


def _skipped_notes(advice: Advice) -> list[str]:
    """A line per group without a curve, and why."""
    kind = advice.by.replace("_", " ") if advice.by else "it"
    return [
        f"no curve for {kind} {'(unknown)' if group is None else group}: {reason}" for group, reason in advice.skipped
    ]


def _cost_note(draft_cost: float | None) -> str:
    """How the speedup is counted, or how to get one."""
    if draft_cost is None:
        return (
            "Pass --draft-cost C (one draft step's time over one target forward pass) to rank the budgets "
            "by expected speedup, tokens/verify / (1 + C·k), and get a recommendation."
        )
    return (
        f"speedup = tokens/verify / (1 + {draft_cost:g}·k): over decoding without speculation (k=0, 1.000×), "
        f"counting k draft steps and one verify pass per step; speedups equal to {SPEEDUP_DECIMALS} decimals tie, "
        "and the smaller budget is recommended."
    )


# -- the command --


class OptionRefused(CommandFailed):
    """An option's value the command does not take, said in one line (a usage error)."""

    exit_code = 2


class Cost(Number):
    """``--draft-cost`` and ``--refresh-cost``: the CLI's number type, refusing anything but a
    finite number >= 0 in one line (``OptionRefused``) rather than click's usage block."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)
        if not (math.isfinite(number) and number >= 0):
            flag = param.opts[0] if param is not None and param.opts else "the cost"
            raise CostRefused(f"{flag} must be a finite number >= 0, not {number!r}", ctx=ctx, param=param)
        return number


class CostRefused(click.BadParameter):
    """A cost refused: said in one line, not click's usage block (the value is the user's
    number, whose fix needs no usage)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"specmeter advise: {self.message}", err=True)


def _advise_run(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--run-id``: not given is every run (one is then required), '' the default run."""
    if value is None:
        return ...
    if value == "":
        return None
    return run_id(ctx, param, value)


@click.command("advise", cls=Command, epilog=KAFKA_ENV_HELP)
@click.argument("file", type=click.File("rb"), required=False, default=None, metavar="[FILE.jsonl]")
@broker_option
@click.option(
    "--topic",
    default=DEFAULTS.topics.metrics,
    show_default=True,
    help="The metrics topic to read when no FILE is given (the worker's --metrics-topic).",
)
@click.option(
    "--run-id",
    envvar="SPECMETER_RUN_ID",
    default=None,
    metavar="ID",
    callback=_advise_run,
    help="The training run whose batches to read; '' is the default run (batches that name none). "
    "Needed when the metrics hold several runs.",
)
@click.option(
    "--last",
    type=Number(0, integer=True),
    default=20,
    show_default=True,
    metavar="N",
    help="Read the run's last N batches, in natural order of their ids (step-2 before step-10), each at its "
    "newest revision; 0 reads all of them.",
)
@click.option(
    "--by",
    type=click.Choice(["task", "weight_version", "draft_lag"]),
    default=None,
    help="One row per task, weight version or draft lag, from the batches' by_task / by_weight_version / "
    "by_draft_lag entries, as one matrix of groups by budgets (default: one curve for the whole batches). "
    "draft_lag adds the staleness curve: accept rate and tokens per verify step per lag.",
)
@click.option(
    "--draft-cost",
    type=Cost(),
    default=None,
    metavar="C",
    help="The time of one draft step relative to one target forward pass (decode, at your serving batch size): "
    "time both from a profile or the engine's step timings and divide; about 0 for NGRAM, a small share for an "
    "EAGLE head, roughly the parameter ratio for a separate draft model. Adds the expected speedup over no "
    "speculation, tokens/verify / (1 + C*k), the recommended budget (0: turn speculation off) and the engine "
    "settings that apply it. A finite number >= 0.",
)
@click.option(
    "--refresh-cost",
    type=Cost(),
    default=None,
    metavar="R",
    help="With --by draft_lag: what one draft refresh costs, in verify steps (the refresh's seconds times the "
    "fleet's verify steps per second: a batch's spec/verify_total over its rollout seconds; docs/advise.md). "
    "Adds after how many policy updates a refresh pays for itself. A finite number >= 0.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE.svg",
    help="Also draw the speedup (tokens per verify step without --draft-cost) against the budget per group, "
    "and with --by draft_lag the staleness curve, to FILE.svg (an SVG file).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the curves as one JSON document (for scripts).")
@one_line_errors
def advise_command(
    file: IO[bytes] | None,
    broker: str,
    topic: str,
    run_id: Any,
    last: int,
    by: str | None,
    draft_cost: float | None,
    refresh_cost: float | None,
    plot: str | None,
    as_json: bool,
) -> None:
    """Which draft budget would pay, or whether to speculate at all: per budget k, tokens per verify step.

    Reads published metrics: FILE (BatchMetrics JSON lines, e.g. `specmeter
    aggregate --format jsonl` or `specmeter tail --json` output; '-' for stdin),
    stdin when it is a pipe or a file and no FILE, --broker or --topic is given
    (`advise < metrics.jsonl`), or else the metrics topic at --broker. Sums the acceptance
    histograms of the run's last --last batches (never averaging curves) and
    prints, per budget k up to the one the fleet ran, the tokens per verify
    step it would have given (docs/contract.md, draft budget); with
    --draft-cost, the expected speedup against k=0 (no speculation), the
    recommended k and the SGLang, vLLM and TensorRT-LLM settings for it. The
    curve is exact for chain drafters (EAGLE/MTP chains, NGRAM, a draft model),
    an upper bound for tree drafters (EAGLE-2/3 trees), and says nothing about
    budgets above the one the fleet ran. docs/advise.md explains it all.
    """
    if refresh_cost is not None and by != "draft_lag":
        raise OptionRefused("--refresh-cost needs --by draft_lag (the staleness curve it is weighed against)")
    if plot is not None:
        _check_plot(plot)
    if file is None and _stdin_meant(click.get_current_context()):
        file = click.get_binary_stream("stdin")
    if file is not None:
        metrics: Iterable[BatchMetrics] = metrics_from_lines(file, input_name(file))
    else:
        metrics = _read_topic(broker, topic)
    advice = advise(metrics, run_id=run_id, last=last, by=by, draft_cost=draft_cost, refresh_cost=refresh_cost)
    if plot is not None:
        _write_plot(plot, advice)
    if as_json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(advice.as_document()), indent=2) + b"\n")
        return
    _print_advice(advice)
    if plot is not None:
        click.echo(f"plot written to {plot}")


def _check_plot(plot: str) -> None:
    """``--plot``: an SVG file in a folder that exists and can be written, checked before
    anything is read (issue 47.5: a missing folder was a traceback after the advice)."""
    if not plot.lower().endswith(".svg"):
        raise OptionRefused(f"--plot writes an SVG file: give a FILE ending in .svg, not {plot!r}")
    folder = os.path.dirname(os.path.abspath(plot))
    if not os.path.isdir(folder):
        fix = "create it first, or give a FILE.svg in another folder"
        raise OptionRefused(f"--plot {plot}: the folder {folder} does not exist", fix)
    if not os.access(folder, os.W_OK) or (os.path.exists(plot) and not os.access(plot, os.W_OK)):
        raise OptionRefused(f"--plot {plot}: permission denied", "give a FILE.svg in a folder you can write to")


def _write_plot(plot: str, advice: Advice) -> None:
    """The plot written; a failure checked for before (the folder gone meanwhile, a full
    disk) said in one line."""
    from .advise_plot import advice_svg

    try:
        with open(plot, "w", encoding="utf-8") as out:
            out.write(advice_svg(advice))
    except OSError as exc:
        raise CommandFailed(f"cannot write --plot {plot}: {exc.strerror}", "give another FILE.svg") from None


def _stdin_meant(ctx: click.Context) -> bool:
    """Whether the metrics come on stdin though no FILE says '-': stdin is a pipe or a
    redirected file (``advise < metrics.jsonl``, issue 47.5: it was ignored for the default
    broker) and neither --broker nor --topic (nor their variables) names a topic to read.
    A terminal, /dev/null or a closed stdin is not input."""
    named = ("broker", "topic")
    if any(ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None) for name in named):
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _print_advice(advice: Advice) -> None:
    """The advice on the terminal: what was read, the tables, then the recommendation and
    what the curve can say."""
    from rich.console import Console

    console = Console()
    first, *rest = advice_notes(advice)
    console.print(first, highlight=False)
    for table in advice_tables(advice):
        console.print(table)
    for line in rest:
        console.print(line, highlight=False, soft_wrap=isinstance(line, Verbatim))


def _read_topic(broker: str, topic: str) -> list[BatchMetrics]:
    """Every batch of every run on the metrics topic (advise names the runs there when
    --run-id is not one), read to its end, after the checks a command runs first."""
    import asyncio

    from ..readers.consume import consume_metrics

    security = preflight.security_from_env()
    preflight.check_before_start(broker, security)

    async def read() -> list[BatchMetrics]:
        stream = consume_metrics(
            broker,
            topic=topic,
            from_beginning=True,
            stop_at_end=True,
            topic_wait_s=0,
            kafka=security.aiokafka_kwargs(),
        )
        return [m async for m in stream]

    return asyncio.run(folded("advise", read()))
