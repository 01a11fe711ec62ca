"""Numbers into SVG charts, on the server: a bar chart and a point series, nothing fetched.

Pure functions: marks in, one ``<svg>`` element out (text, for an HTML page). Every mark
carries its number in a ``data-value`` attribute (exact: ``repr`` of a float, the digits of
an int) and a ``<title>`` (the tooltip a browser shows), so a test reads back what was
drawn and compares it with what was published. Every string a caller gives (labels, keys,
titles, attribute values) is escaped: batch ids and weight versions are user strings.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Mark", "bar_chart", "point_chart", "number", "text_width", "WIDTH", "HEIGHT"]

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
    exponent = math.floor(math.log10(value))
    candidates = [step * 10.0**e for e in (exponent, exponent + 1) for step in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)]
    above = [c for c in candidates if c >= value * (1 - 1e-12)]
    for ceiling in above:
        if all(_exact(ceiling * i / 4, y_format) for i in range(5)):
            return ceiling
    return above[0]


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
    out = _open(chart_id, "bar", title, attrs or {})
    if not marks:
        return _empty(out, "nothing to draw yet")
    top = _scale_top(marks, y_max, y_format)
    out += _axes(top, y_format, y_label)
    plot_w = WIDTH - _LEFT - _RIGHT
    slot = plot_w / len(marks)
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
    if x_label:
        out.append(_x_title(x_label))
    out.append("</svg>")
    return "\n".join(out)


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
    out = _open(chart_id, "points", title, attrs or {})
    if not marks:
        return _empty(out, "nothing to draw yet")
    top = _scale_top(marks, y_max, y_format)
    out += _axes(top, y_format, y_label)
    plot_w = WIDTH - _LEFT - _RIGHT
    slot = plot_w / len(marks)
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
    if x_label:
        out.append(_x_title(x_label))
    out.append("</svg>")
    return "\n".join(out)
