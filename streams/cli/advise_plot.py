"""``specmeter advise --plot FILE.svg``: the advice drawn as hand-written SVG (no plotting library).

One panel per curve family, stacked: the speedup against the budget k per group (the
tokens per verify step without a draft cost), budget 0 (no speculation, 1.0) included;
with ``--by draft_lag`` the staleness curve, tokens per verify step and accept rate
against the draft lag. Each panel's ``<g class="panel">`` carries its data ranges and its
plot area in pixels (``data-x-min`` .. ``data-bottom``), and each series is one
``<polyline class="series" data-name=...>`` (its legend says ``lag N`` for a draft lag),
and each recommended budget a ``<circle class="recommended" data-name=... data-budget=...>``
ring around its point, so the values can be read back exactly:
``x = x_min + (px - left) / (right - left) * (x_max - x_min)``, and likewise y from the
bottom up (tests/test_advise.py does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .advise import Advice

__all__ = ["advice_svg", "PANEL_WIDTH", "PANEL_HEIGHT"]

PANEL_WIDTH = 720
PANEL_HEIGHT = 300
#: the plot area inside a panel: left, top, right and bottom margins in pixels
_MARGINS = (64, 36, 180, 44)
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")

Series = tuple[str, list[tuple[float, float]]]
#: a series' legend label and the point to ring as recommended (None: none), by series name
Labels = dict[str, tuple[str, tuple[float, float] | None]]


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value)


def _panel(
    top: float, title: str, x_label: str, y_label: str, series: Sequence[Series], labels: Labels | None = None
) -> list[str]:
    """One panel at ``top`` pixels: axes, ticks, one polyline (and its points) per series, a
    legend (``labels``: a series' legend text, and its recommended point, ringed)."""
    xs = [x for _, points in series for x, _ in points]
    ys = [y for _, points in series for _, y in points]
    x_min, x_max = min(xs), max(xs)
    if x_max == x_min:
        x_max = x_min + 1
    y_min, y_max = 0.0, _nice_ceiling(max(ys) * 1.1)
    left, right = float(_MARGINS[0]), float(PANEL_WIDTH - _MARGINS[2])
    area_top, bottom = top + _MARGINS[1], top + PANEL_HEIGHT - _MARGINS[3]

    def px(x: float) -> float:
        return left + (x - x_min) / (x_max - x_min) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y_min) / (y_max - y_min) * (bottom - area_top)

    out = [
        f'<g class="panel" data-title="{escape(title)}" data-x-min="{x_min:g}" data-x-max="{x_max:g}" '
        f'data-y-min="{y_min:g}" data-y-max="{y_max:g}" data-left="{left:g}" data-right="{right:g}" '
        f'data-top="{area_top:g}" data-bottom="{bottom:g}">',
        f'<text x="{left:g}" y="{top + 20:g}" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<line x1="{left:g}" y1="{bottom:g}" x2="{right:g}" y2="{bottom:g}" stroke="#000"/>',
        f'<line x1="{left:g}" y1="{area_top:g}" x2="{left:g}" y2="{bottom:g}" stroke="#000"/>',
    ]
    for tick in range(math.ceil(x_min), math.floor(x_max) + 1):
        out.append(f'<text x="{px(tick):.2f}" y="{bottom + 16:g}" font-size="11" text-anchor="middle">{tick}</text>')
    for i in range(6):
        y = y_min + (y_max - y_min) * i / 5
        out.append(f'<line x1="{left:g}" y1="{py(y):.2f}" x2="{right:g}" y2="{py(y):.2f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6:g}" y="{py(y) + 4:.2f}" font-size="11" text-anchor="end">{y:g}</text>')
    out.append(
        f'<text x="{(left + right) / 2:g}" y="{bottom + 34:g}" font-size="12" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text x="14" y="{(area_top + bottom) / 2:g}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(area_top + bottom) / 2:g})">{escape(y_label)}</text>'
    )
    out += _drawn_series(series, labels or {}, px, py, (right, area_top))
    out.append("</g>")
    return out


def _drawn_series(
    series: Sequence[Series],
    labels: Labels,
    px: Callable[[float], float],
    py: Callable[[float], float],
    legend_at: tuple[float, float],
) -> list[str]:
    """Each series' polyline, its points, its recommended point ringed and its legend entry
    (at ``legend_at``: the plot's right edge and top), then what a ring means."""
    out: list[str] = []
    right, area_top = legend_at
    for i, (name, points) in enumerate(series):
        colour = _COLOURS[i % len(_COLOURS)]
        coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in points)
        out.append(
            f'<polyline class="series" data-name="{escape(name)}" fill="none" stroke="{colour}" '
            f'stroke-width="2" points="{coords}"/>'
        )
        for x, y in points:
            out.append(
                f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" fill="{colour}">'
                f"<title>{escape(name)}: {x:g}, {y:.4g}</title></circle>"
            )
        label, best = labels.get(name, (name, None))
        if best is not None:
            out.append(_ring(name, label, colour, best, px(best[0]), py(best[1])))
        out += _legend_entry(label, colour, right, area_top + 14 * i + 6)
    if any(best is not None for _, best in labels.values()):
        out += _ring_legend(right, area_top + 14 * len(series) + 6)
    return out


def _ring(name: str, label: str, colour: str, best: tuple[float, float], cx: float, cy: float) -> str:
    """The recommended budget of a series, ringed in its colour (``class="recommended"``,
    ``data-budget``: read back by the tests)."""
    return (
        f'<circle class="recommended" data-name="{escape(name)}" data-budget="{best[0]:g}" cx="{cx:.2f}" '
        f'cy="{cy:.2f}" r="7" fill="none" stroke="{colour}" stroke-width="2">'
        f"<title>{escape(label)}: recommended k={best[0]:g}, {best[1]:.4g}</title></circle>"
    )


def _legend_entry(label: str, colour: str, right: float, legend_y: float) -> list[str]:
    return [
        f'<line x1="{right + 12:g}" y1="{legend_y:g}" x2="{right + 30:g}" y2="{legend_y:g}" '
        f'stroke="{colour}" stroke-width="2"/>',
        f'<text class="legend" x="{right + 36:g}" y="{legend_y + 4:g}" font-size="11">{escape(label)}</text>',
    ]


def _ring_legend(right: float, legend_y: float) -> list[str]:
    """What a ring means, under the series' entries."""
    return [
        f'<circle cx="{right + 21:g}" cy="{legend_y:g}" r="6" fill="none" stroke="#000" stroke-width="2"/>',
        f'<text class="legend" x="{right + 36:g}" y="{legend_y + 4:g}" font-size="11">recommended budget</text>',
    ]


def _series_label(by: str | None, group: object) -> str:
    """A curve's legend label: its task or weight version, ``lag N`` for a draft lag (a bare
    number said nothing, issue 47.5)."""
    if by is None:
        return "all generations"
    name = "(unknown)" if group is None else str(group)
    return f"lag {name}" if by == "draft_lag" else name


Panel = tuple[str, str, str, list[Series], Labels]


def _budget_panel(advice: Advice) -> list[Panel]:
    """The speedup (tokens per verify step without a draft cost) against the budget, a
    series per group, each recommended budget ringed; none without a curve."""
    from .advise import BudgetPoint

    if not advice.curves:
        return []
    costed = advice.draft_cost is not None
    series: list[Series] = []
    labels: Labels = {}
    for curve in advice.curves:
        name = "all generations" if advice.by is None else ("(unknown)" if curve.group is None else str(curve.group))
        points = [BudgetPoint(0, 1.0, 1.0 if costed else None), *curve.points]
        xy = [(float(p.budget), (p.speedup if costed else p.tokens_per_verify) or 0.0) for p in points]
        series.append((name, xy))
        labels[name] = (_series_label(advice.by, curve.group), None if curve.best is None else xy[curve.best])
    title = f"speedup at draft cost c={advice.draft_cost:g}" if costed else "tokens per verify step"
    return [(title + " by budget", "budget k (draft tokens per step; 0: no speculation)", title, series, labels)]


def _staleness_panels(advice: Advice) -> list[Panel]:
    """Tokens per verify step and accept rate against the draft lag, each where measured."""
    stale = advice.staleness
    known = [p for p in stale.points if p.draft_lag is not None] if stale is not None else []
    tokens = [(float(p.draft_lag), p.tokens_per_verify) for p in known if p.tokens_per_verify is not None]  # type: ignore[arg-type]
    rates = [(float(p.draft_lag), p.accept_rate) for p in known if p.accept_rate is not None]  # type: ignore[arg-type]
    lag = "draft lag (policy updates behind)"
    panels: list[Panel] = []
    if tokens:
        title = "staleness: tokens per verify step by draft lag"
        panels.append((title, lag, "tokens/verify", [("tokens per verify step", tokens)], {}))
    if rates:
        panels.append(("staleness: accept rate by draft lag", lag, "accept rate", [("accept rate", rates)], {}))
    return panels


def advice_svg(advice: Advice) -> str:
    """The advice's curves (and staleness curve) as one SVG document."""
    panels = _budget_panel(advice) + _staleness_panels(advice)
    height = PANEL_HEIGHT * max(1, len(panels))
    body: list[str] = []
    for i, (title, x_label, y_label, series, labels) in enumerate(panels):
        body += _panel(i * PANEL_HEIGHT, title, x_label, y_label, series, labels)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_WIDTH}" height="{height}" '
            f'viewBox="0 0 {PANEL_WIDTH} {height}" font-family="sans-serif">',
            f'<rect width="{PANEL_WIDTH}" height="{height}" fill="#fff"/>',
            *body,
            "</svg>",
            "",
        ]
    )
