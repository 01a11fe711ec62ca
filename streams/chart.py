"""The one chart module (issue 45): every picture specmeter draws declares itself here.

Hand-written SVG, nothing fetched, no plotting library. Two families, each a short
declaration of what to draw:

* ``Chart`` (``draw``): the status page's charts, a bar chart or a point series in a fixed
  view box, inline in HTML. Every mark carries its number in a ``data-value`` attribute
  (exact: ``repr`` of a float, the digits of an int) and a ``<title>`` (the tooltip a
  browser shows), and the ``<svg>`` an accessible name (``role="img"``, ``aria-label``),
  so a test reads back what was drawn and compares it with what was published.
* ``LinePanel`` (``stacked_svg``): panels of line series stacked in one SVG document
  (``advise --plot``): axes, ticks, one polyline per series, a legend, a ring on a
  series' marked point. Each panel's ``<g class="panel">`` carries its data ranges and
  its plot area in pixels, so the values read back exactly:
  ``x = x_min + (px - left) / (right - left) * (x_max - x_min)``, likewise y.

Every string a caller gives (labels, keys, titles, attribute values) is escaped: batch
ids, tasks and weight versions are user strings.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Literal

__all__ = [
    "Mark",
    "Chart",
    "draw",
    "bar_chart",
    "point_chart",
    "number",
    "text_width",
    "WIDTH",
    "HEIGHT",
    "Line",
    "LinePanel",
    "stacked_svg",
    "PANEL_WIDTH",
    "PANEL_HEIGHT",
]

#: the view box of every chart (it scales to its box on the page)
WIDTH = 560
HEIGHT = 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 12, 40


@dataclass(frozen=True)
class Mark:
    """One bar or point: its number, the key that names it, what a reader sees.

    ``key`` goes to ``data-key``; ``label`` (None: none) is written under the mark on the
    x axis; ``title`` is the tooltip; ``attrs`` are further ``data-*`` attributes
    (name without ``data-``); ``style`` a CSS class of the page (e.g. ``incomplete``)."""

    key: str
    value: float | int
    label: str | None = None
    title: str = ""
    attrs: Mapping[str, str] = field(default_factory=dict)
    style: str = ""


def number(value: float | int) -> str:
    """The exact text of a number in an attribute: an int's digits, a float's ``repr``."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _exact(value: float, y_format: str) -> bool:
    """Whether ``value`` reads back exactly in ``y_format``."""
    return math.isclose(float(format(value, y_format)), value, abs_tol=1e-9)


def _nice_ceiling(value: float, y_format: str) -> float:
    """The smallest of 1, 2, 3, 4, 5, 6, 8 (times a power of ten) at or above ``value`` (> 0)
    whose quarters the axis' format shows exactly (the ticks), else the smallest of them."""
    above = _round_steps_above(value)
    for ceiling in above:
        if all(_exact(ceiling * i / 4, y_format) for i in range(5)):
            return ceiling
    return above[0]


def _round_steps_above(value: float) -> list[float]:
    """The round numbers (1, 2, 3, 4, 5, 6, 8 times ``value``'s power of ten and the next)
    at or above ``value`` (> 0), smallest first: the ceilings an axis may top at."""
    exponent = math.floor(math.log10(value))
    candidates = [step * 10.0**e for e in (exponent, exponent + 1) for step in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)]
    return [c for c in candidates if c >= value * (1 - 1e-12)]


def _scale_top(marks: Sequence[Mark], y_max: float | None, y_format: str) -> float:
    """The value at the top of the y axis: ``y_max`` when given (and not exceeded), else a
    nice ceiling of the largest finite value (1 for none or all zero)."""
    finite = [float(m.value) for m in marks if math.isfinite(float(m.value))]
    largest = max(finite, default=0.0)
    if y_max is not None and largest <= y_max:
        return y_max
    return _nice_ceiling(largest, y_format) if largest > 0 else 1.0


def _open(chart_id: str, kind: str, title: str, attrs: Mapping[str, str]) -> list[str]:
    extra = "".join(f' data-{_esc(k)}="{_esc(v)}"' for k, v in attrs.items())
    return [
        f'<svg class="chart" id="{_esc(chart_id)}" data-chart="{_esc(chart_id)}" data-kind="{kind}"{extra} '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_esc(title)}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_esc(title)}</title>",
    ]


def _axes(top: float, y_format: str, y_label: str) -> list[str]:
    """The y axis (five ticks, grid lines; a tick its format cannot show exactly left out)
    and the x axis line."""
    out = []
    plot_h = HEIGHT - _TOP - _BOTTOM
    for i in range(5):
        value = top * i / 4
        tick = format(value, y_format)
        if not _exact(value, y_format):  # e.g. 0.5 partitions
            continue
        y = HEIGHT - _BOTTOM - plot_h * i / 4
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{_LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_esc(tick)}</text>')
    if y_label:
        out.append(
            f'<text class="axis-label" transform="translate(11 {_TOP + plot_h / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{_esc(y_label)}</text>'
        )
    base = HEIGHT - _BOTTOM
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{base}" y2="{base}"/>')
    return out


def _mark_attrs(mark: Mark) -> str:
    extra = "".join(f' data-{_esc(k)}="{_esc(v)}"' for k, v in mark.attrs.items())
    style = f"mark {mark.style}".strip()
    return f'class="{_esc(style)}" data-key="{_esc(mark.key)}" data-value="{number(mark.value)}"{extra}'


def _y(value: float | int, top: float) -> float:
    """The y coordinate of a value (clamped to the plot; a non-finite value sits at 0)."""
    v = float(value)
    if not math.isfinite(v):
        v = 0.0
    plot_h = HEIGHT - _TOP - _BOTTOM
    return HEIGHT - _BOTTOM - plot_h * min(max(v, 0.0), top) / top


#: the font size of a chart's text (the page's CSS: ``.chart text{font-size:10px}``)
_FONT_PX = 10.0
#: characters wider than 0.8 em in DejaVu Sans or Verdana (the page's fonts)
_WIDE = frozenset("mwMW+<>=\u2026%@")


def text_width(text: str, font_px: float = _FONT_PX) -> float:
    """An upper bound of ``text``'s width in pixels: 1 em for the widest characters, 0.8 em
    for capitals, 0.7 em for the rest (DejaVu Sans: digits 0.64 em, lower case at most 0.64
    but m and w; capitals at most 0.79 but M and W)."""
    ems = sum(1.0 if c in _WIDE else 0.8 if c.isupper() else 0.7 for c in text)
    return ems * font_px


def _x_label(x: float, text: str) -> str:
    """A label under the x axis, centred under its mark; one that would run past the chart's
    edge (the newest batch's name, issue 47.6: cut off) ends at the edge instead."""
    half = text_width(text) / 2
    anchor = "middle"
    if x + half > WIDTH - 1:
        x, anchor = WIDTH - 1.0, "end"
    elif x - half < 1:
        x, anchor = 1.0, "start"
    return f'<text class="xlabel" x="{x:.1f}" y="{HEIGHT - _BOTTOM + 14}" text-anchor="{anchor}">{_esc(text)}</text>'


def _x_title(text: str) -> str:
    middle = _LEFT + (WIDTH - _LEFT - _RIGHT) / 2
    return f'<text class="axis-label" x="{middle:.1f}" y="{HEIGHT - 6}" text-anchor="middle">{_esc(text)}</text>'


def _empty(out: list[str], note: str) -> str:
    out.append(f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">{_esc(note)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(
    chart_id: str,
    title: str,
    marks: Sequence[Mark],
    *,
    y_max: float | None = None,
    y_format: str = ".2f",
    y_label: str = "",
    x_label: str = "",
    attrs: Mapping[str, str] | None = None,
    value_format: str | None = None,
) -> str:
    """One bar per mark, left to right, from 0 up to its value (the axis tops at ``y_max``,
    or at a round number above the largest value); ``value_format``: each bar's value
    written above it so."""

    def bars(top: float) -> list[str]:
        return _bars(marks, top, value_format)

    return _framed(chart_id, "bar", title, marks, attrs, (y_max, y_format, y_label, x_label), bars)


def point_chart(
    chart_id: str,
    title: str,
    marks: Sequence[Mark],
    *,
    y_max: float | None = None,
    y_format: str = ".2f",
    y_label: str = "",
    x_label: str = "",
    attrs: Mapping[str, str] | None = None,
) -> str:
    """One point per mark, evenly spaced left to right, joined by a line."""

    def points(top: float) -> list[str]:
        return _points(marks, top)

    return _framed(chart_id, "points", title, marks, attrs, (y_max, y_format, y_label, x_label), points)


def _framed(
    chart_id: str,
    kind: str,
    title: str,
    marks: Sequence[Mark],
    attrs: Mapping[str, str] | None,
    axes: tuple[float | None, str, str, str],
    series: Callable[[float], list[str]],
) -> str:
    """A chart's frame: its ``<svg>`` with its accessible name, the y axis scaled to the
    marks (``axes``: y_max, y_format, y_label, x_label), the series ``series(top)`` draws,
    the x axis' title; "nothing to draw yet" for no mark."""
    y_max, y_format, y_label, x_label = axes
    out = _open(chart_id, kind, title, attrs or {})
    if not marks:
        return _empty(out, "nothing to draw yet")
    top = _scale_top(marks, y_max, y_format)
    out += _axes(top, y_format, y_label)
    out += series(top)
    if x_label:
        out.append(_x_title(x_label))
    out.append("</svg>")
    return "\n".join(out)


def _bars(marks: Sequence[Mark], top: float, value_format: str | None) -> list[str]:
    """A bar per mark in its slot, its value above it (``value_format``), its label under it."""
    out = []
    slot = (WIDTH - _LEFT - _RIGHT) / len(marks)
    gap = min(slot * 0.2, 6.0)
    base = HEIGHT - _BOTTOM
    for i, mark in enumerate(marks):
        x = _LEFT + slot * i + gap / 2
        y = _y(mark.value, top)
        out.append(
            f'<rect {_mark_attrs(mark)} x="{x:.1f}" y="{y:.1f}" width="{max(slot - gap, 0.5):.1f}" '
            f'height="{base - y:.1f}"><title>{_esc(mark.title)}</title></rect>'
        )
        if value_format is not None:
            text = _esc(format(mark.value, value_format))
            out.append(
                f'<text class="value" x="{x + (slot - gap) / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{text}</text>'
            )
        if mark.label is not None:
            out.append(_x_label(x + (slot - gap) / 2, mark.label))
    return out


def _points(marks: Sequence[Mark], top: float) -> list[str]:
    """A point per mark in the middle of its slot, joined by a line, its label under it."""
    out = []
    slot = (WIDTH - _LEFT - _RIGHT) / len(marks)
    xy = [(_LEFT + slot * (i + 0.5), _y(m.value, top)) for i, m in enumerate(marks)]
    if len(xy) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        out.append(f'<polyline class="line" points="{path}"/>')
    for (x, y), mark in zip(xy, marks, strict=True):
        out.append(
            f'<circle {_mark_attrs(mark)} cx="{x:.1f}" cy="{y:.1f}" r="3.5"><title>{_esc(mark.title)}</title></circle>'
        )
        if mark.label is not None:
            out.append(_x_label(x, mark.label))
    return out


@dataclass(frozen=True)
class Chart:
    """What one status-page chart draws: ``kind`` (bars from 0, or points joined by a
    line), its id, title (the accessible name), marks and axes; ``value_format`` writes each
    bar's value above it."""

    kind: Literal["bar", "points"]
    chart_id: str
    title: str
    marks: Sequence[Mark]
    y_max: float | None = None
    y_format: str = ".2f"
    y_label: str = ""
    x_label: str = ""
    attrs: Mapping[str, str] | None = None
    value_format: str | None = None


def draw(chart: Chart) -> str:
    """The chart's ``<svg>`` element."""
    c = chart
    if c.kind == "bar":
        return bar_chart(
            c.chart_id,
            c.title,
            c.marks,
            y_max=c.y_max,
            y_format=c.y_format,
            y_label=c.y_label,
            x_label=c.x_label,
            attrs=c.attrs,
            value_format=c.value_format,
        )
    return point_chart(
        c.chart_id,
        c.title,
        c.marks,
        y_max=c.y_max,
        y_format=c.y_format,
        y_label=c.y_label,
        x_label=c.x_label,
        attrs=c.attrs,
    )


# -- line panels stacked in one document (advise --plot) --

PANEL_WIDTH = 720
PANEL_HEIGHT = 300
#: the plot area inside a panel: left, top, right and bottom margins in pixels
_MARGINS = (64, 36, 180, 44)
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class Line:
    """One series: ``name`` (``data-name``), its legend ``label``, its points in data units,
    and the point to ring (``ring_label`` names it in the ring's tooltip), if any."""

    name: str
    points: list[tuple[float, float]]
    label: str = ""
    ring: tuple[float, float] | None = None

    @property
    def legend(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class LinePanel:
    """One panel: a title, the axes' labels and its series; the y axis from 0 to a round
    number above the largest value, the x axis over the points' range with a tick per
    integer."""

    title: str
    x_label: str
    y_label: str
    lines: list[Line]


def _line_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value)


@dataclass(frozen=True)
class _Frame:
    """A panel's data ranges and plot area in pixels, and the mapping between them."""

    x_min: float
    x_max: float
    y_min: float
    y_max: float
    left: float
    right: float
    top: float
    bottom: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x_min) / (self.x_max - self.x_min) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y_min) / (self.y_max - self.y_min) * (self.bottom - self.top)


def _frame(top: float, lines: Sequence[Line]) -> _Frame:
    xs = [x for line in lines for x, _ in line.points]
    ys = [y for line in lines for _, y in line.points]
    x_min, x_max = min(xs), max(xs)
    if x_max == x_min:
        x_max = x_min + 1
    return _Frame(
        x_min,
        x_max,
        0.0,
        _line_ceiling(max(ys) * 1.1),
        float(_MARGINS[0]),
        float(PANEL_WIDTH - _MARGINS[2]),
        top + _MARGINS[1],
        top + PANEL_HEIGHT - _MARGINS[3],
    )


def _line_panel(top: float, panel: LinePanel) -> list[str]:
    """One panel at ``top`` pixels: axes, ticks, one polyline (and its points) per series, a
    legend, each series' ringed point."""
    f = _frame(top, panel.lines)
    out = [
        f'<g class="panel" data-title="{escape(panel.title)}" data-x-min="{f.x_min:g}" data-x-max="{f.x_max:g}" '
        f'data-y-min="{f.y_min:g}" data-y-max="{f.y_max:g}" data-left="{f.left:g}" data-right="{f.right:g}" '
        f'data-top="{f.top:g}" data-bottom="{f.bottom:g}">',
        f'<text x="{f.left:g}" y="{top + 20:g}" font-size="14" font-weight="bold">{escape(panel.title)}</text>',
        f'<line x1="{f.left:g}" y1="{f.bottom:g}" x2="{f.right:g}" y2="{f.bottom:g}" stroke="#000"/>',
        f'<line x1="{f.left:g}" y1="{f.top:g}" x2="{f.left:g}" y2="{f.bottom:g}" stroke="#000"/>',
        *_line_ticks(f),
        f'<text x="{(f.left + f.right) / 2:g}" y="{f.bottom + 34:g}" font-size="12" text-anchor="middle">'
        f"{escape(panel.x_label)}</text>",
        f'<text x="14" y="{(f.top + f.bottom) / 2:g}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(f.top + f.bottom) / 2:g})">{escape(panel.y_label)}</text>',
        *_drawn_lines(panel.lines, f.px, f.py, (f.right, f.top)),
        "</g>",
    ]
    return out


def _line_ticks(f: _Frame) -> list[str]:
    """A tick per integer on the x axis; six on the y axis, each with its grid line."""
    out = [
        f'<text x="{f.px(tick):.2f}" y="{f.bottom + 16:g}" font-size="11" text-anchor="middle">{tick}</text>'
        for tick in range(math.ceil(f.x_min), math.floor(f.x_max) + 1)
    ]
    for i in range(6):
        y = f.y_min + (f.y_max - f.y_min) * i / 5
        out.append(f'<line x1="{f.left:g}" y1="{f.py(y):.2f}" x2="{f.right:g}" y2="{f.py(y):.2f}" stroke="#ddd"/>')
        out.append(f'<text x="{f.left - 6:g}" y="{f.py(y) + 4:.2f}" font-size="11" text-anchor="end">{y:g}</text>')
    return out


def _drawn_lines(
    lines: Sequence[Line],
    px: Callable[[float], float],
    py: Callable[[float], float],
    legend_at: tuple[float, float],
) -> list[str]:
    """Each series' polyline, its points, its ringed point and its legend entry (at
    ``legend_at``: the plot's right edge and top), then what a ring means."""
    out: list[str] = []
    right, area_top = legend_at
    for i, line in enumerate(lines):
        colour = _COLOURS[i % len(_COLOURS)]
        out += _series(line, colour, px, py)
        if line.ring is not None:
            out.append(_ring(line, colour, px(line.ring[0]), py(line.ring[1])))
        out += _legend_entry(line.legend, colour, right, area_top + 14 * i + 6)
    if any(line.ring is not None for line in lines):
        out += _ring_legend(right, area_top + 14 * len(lines) + 6)
    return out


def _series(line: Line, colour: str, px: Callable[[float], float], py: Callable[[float], float]) -> list[str]:
    """One series' polyline and a dot per point in its colour, each dot's tooltip its values."""
    coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in line.points)
    polyline = (
        f'<polyline class="series" data-name="{escape(line.name)}" fill="none" stroke="{colour}" '
        f'stroke-width="2" points="{coords}"/>'
    )
    dots = [
        f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" fill="{colour}">'
        f"<title>{escape(line.name)}: {x:g}, {y:.4g}</title></circle>"
        for x, y in line.points
    ]
    return [polyline, *dots]


def _ring(line: Line, colour: str, cx: float, cy: float) -> str:
    """A series' marked point (the recommended budget), ringed in its colour
    (``class="recommended"``, ``data-budget``: read back by the tests)."""
    x, y = line.ring or (0.0, 0.0)
    return (
        f'<circle class="recommended" data-name="{escape(line.name)}" data-budget="{x:g}" cx="{cx:.2f}" '
        f'cy="{cy:.2f}" r="7" fill="none" stroke="{colour}" stroke-width="2">'
        f"<title>{escape(line.legend)}: recommended k={x:g}, {y:.4g}</title></circle>"
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


def stacked_svg(panels: Sequence[LinePanel]) -> str:
    """The panels stacked top to bottom in one SVG document (one empty panel's height for none)."""
    height = PANEL_HEIGHT * max(1, len(panels))
    body = [part for i, panel in enumerate(panels) for part in _line_panel(i * PANEL_HEIGHT, panel)]
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
