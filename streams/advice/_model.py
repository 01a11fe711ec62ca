"""What the advice is: one curve per group, the staleness curve, and its JSON document.

Typed msgspec Structs (frozen): what ``advise`` returns and a trainer reads; ``as_document``
the JSON-ready builtins that ``specmeter advise --json`` prints (``advice_json``: its bytes).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import SpecmeterError
from ._budget import BudgetPoint, Recommendation, engine_settings, recommendation_text
from ._staleness import LagPoint, RefreshPlan, Staleness

__all__ = [
    "BREAKDOWNS",
    "CAVEAT",
    "Group",
    "AdviceError",
    "Curve",
    "Advice",
    "advice_json",
    "group_label",
    "shown_value",
]

#: what ``by`` may name: the breakdown of a BatchMetrics, and the attribute naming its entries
BREAKDOWNS = {
    "task": ("by_task", "task"),
    "weight_version": ("by_weight_version", "weight_version"),
    "draft_lag": ("by_draft_lag", "draft_lag"),
}

#: what the curve can and cannot say (docs/contract.md §3.5)
CAVEAT = (
    "exact for chain drafters (EAGLE/MTP chains, NGRAM, a draft model: the first k drafts of a step do not "
    "depend on how many follow); an upper bound for tree drafters (EAGLE-2/3 trees: a smaller budget may prune "
    "the accepted branch); silent on budgets above the one the fleet ran (its histograms' width minus one)"
)

Group = str | int | None


def shown_value(point: BudgetPoint, costed: bool) -> float | None:
    """The one number the matrix and the plot show of a budget: its speedup with a draft
    cost, its tokens per verify step without."""
    return point.speedup if costed else point.tokens_per_verify


def group_label(by: str | None, group: Group) -> str:
    """A group as the tables, the notes and the plot's series name it: ``all generations``
    where the advice is not broken down, ``(unknown)`` for the unknown group."""
    if by is None:
        return "all generations"
    return "(unknown)" if group is None else str(group)


class AdviceError(SpecmeterError, ValueError):
    """The published metrics cannot give a curve: the message says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class Curve(msgspec.Struct, frozen=True):
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

    def points_from_0(self, costed: bool) -> list[BudgetPoint]:
        """The points as the tables and the plot show them: budget 0 first (no speculation: 1
        token per verify step, and where a draft cost gives speedups, a speedup of 1)."""
        return [BudgetPoint(0, 1.0, 1.0 if costed else None), *self.points]


class Advice(msgspec.Struct, frozen=True):
    """Curves of one run's last batches."""

    run_id: str | None
    #: the batch ids read, oldest first
    batches: list[str]
    by: str | None
    draft_cost: float | None
    curves: list[Curve]
    #: groups without a curve, and why (no histogram, no verify step, a single bin)
    skipped: list[tuple[Group, str]] = msgspec.field(default_factory=list)
    #: with ``by="draft_lag"``: the staleness curve
    staleness: Staleness | None = None

    @property
    def lag_points(self) -> list[LagPoint]:
        """The staleness curve's points; none where the advice is not by draft lag."""
        return [] if self.staleness is None else self.staleness.points

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
        "refresh": None if plan is None else _plan_document(plan),
        "no_refresh": s.no_refresh,
    }


def _plan_document(plan: RefreshPlan) -> dict[str, Any]:
    """The refresh interval as JSON-ready builtins (the staleness document's ``refresh``)."""
    return {
        "refresh_cost_verify_steps": plan.refresh_cost,
        "tokens_per_update": plan.tokens_per_update,
        "update_cost_by_lag": plan.update_costs,
        "average_cost_by_interval": plan.averages,
        "refresh_every_updates": plan.every,
        "beyond_data": plan.at_edge,
    }


def _named(by: str | None, group: Group) -> dict[str, Group]:
    """The group under the breakdown's name (``{"task": "gsm8k"}``); nothing where the advice is not broken down."""
    return {by: group} if by else {}


def advice_json(advice: Advice) -> bytes:
    """The advice's JSON document as ``specmeter advise --json`` prints it (two-space
    indent, a final newline)."""
    return msgspec.json.format(msgspec.json.encode(advice.as_document()), indent=2) + b"\n"
