"""The advice drawn (``advise --plot FILE.svg``): a declaration of panels for the one chart
module (``specmeter.streams.chart``).

One panel per curve family, stacked: the speedup against the budget k per group (the
tokens per verify step without a draft cost), budget 0 (no speculation, 1.0) included,
each recommended budget ringed; with ``by="draft_lag"`` the staleness curve, tokens per
verify step and accept rate against the draft lag, each where measured. A series' legend
says ``lag N`` for a draft lag (a bare number said nothing, issue 47.5).
"""

from __future__ import annotations

from ..chart import Line, LinePanel, stacked_svg
from ._model import Advice, Curve, Group, group_label, shown_value
from ._staleness import LagPoint

__all__ = ["advice_svg", "advice_panels"]

_LAG = "draft lag (policy updates behind)"


def advice_svg(advice: Advice) -> str:
    """The advice's curves (and staleness curve) as one SVG document."""
    return stacked_svg(advice_panels(advice))


def advice_panels(advice: Advice) -> list[LinePanel]:
    """What the plot draws: the budget panel, then the staleness panels."""
    return _budget_panel(advice) + _staleness_panels(advice)


def _budget_panel(advice: Advice) -> list[LinePanel]:
    """The speedup (tokens per verify step without a draft cost) against the budget, a
    series per group; none without a curve."""
    if not advice.curves:
        return []
    costed = advice.draft_cost is not None
    title = f"speedup at draft cost c={advice.draft_cost:g}" if costed else "tokens per verify step"
    lines = [_budget_line(advice.by, curve, costed) for curve in advice.curves]
    return [LinePanel(title + " by budget", "budget k (draft tokens per step; 0: no speculation)", title, lines)]


def _budget_line(by: str | None, curve: Curve, costed: bool) -> Line:
    """A group's series, budget 0 first, its recommended budget ringed."""
    xy = [(float(p.budget), shown_value(p, costed) or 0.0) for p in curve.points_from_0(costed)]
    ring = None if curve.best is None else xy[curve.best]
    return Line(group_label(by, curve.group), xy, _series_label(by, curve.group), ring)


def _series_label(by: str | None, group: Group) -> str:
    """A curve's legend label: its task or weight version, ``lag N`` for a draft lag."""
    name = group_label(by, group)
    return f"lag {name}" if by == "draft_lag" else name


def _staleness_panels(advice: Advice) -> list[LinePanel]:
    """Tokens per verify step and accept rate against the draft lag, each where measured."""
    known = [p for p in advice.lag_points if p.draft_lag is not None]
    tokens = _lag_panel(known, "tokens_per_verify", "tokens per verify step", "tokens/verify")
    return tokens + _lag_panel(known, "accept_rate", "accept rate", "accept rate")


def _lag_panel(known: list[LagPoint], value: str, name: str, axis: str) -> list[LinePanel]:
    """One staleness panel, ``value`` against the draft lag; none where no lag measured it."""
    series = _lag_series(known, value)
    return [LinePanel(f"staleness: {name} by draft lag", _LAG, axis, [Line(name, series)])] if series else []


def _lag_series(known: list[LagPoint], value: str) -> list[tuple[float, float]]:
    """(lag, value) of each known lag whose ``value`` was measured."""
    return [(float(p.draft_lag or 0), getattr(p, value)) for p in known if getattr(p, value) is not None]
