"""The worker's status page (``/specmeter/``): its recent batches drawn, no Grafana needed.

``RecentBatches`` keeps the newest revision of the last batches this worker published
(stage 2 of its partials partitions: with several workers, each page shows its share);
``render_page`` draws them as one HTML page of server-rendered SVG (the one chart
module, ``streams.chart``; the panels: ``PANELS``, one table of definitions), nothing
fetched, refreshed every ``refresh_s`` seconds by a meta refresh:

* per batch, oldest to newest: the accept rate, tokens per verify step, and coverage
  (partitions reported of those expected; an incomplete batch in another colour);
* the newest batch that has them: accept rate by weight version (the policy's drift),
  acceptance by draft position, and the spread of tokens per verify step over its
  generations (``tokens_per_verify_distribution``, quarter-token buckets);
* over the recent batches: the staleness curve, paired accepted / paired proposed by
  draft lag (``by_draft_lag``), drawn when the metrics carry it.

Each mark's number is in its ``data-value`` (exact) and ``<title>``; ids are escaped.
"""

from __future__ import annotations

import html
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from specmeter.schemas import BatchMetrics

from ..chart import Chart, Mark, draw

__all__ = ["RecentBatches", "render_page", "DISTRIBUTION_BUCKETS", "bucket_range", "spread_drawn", "staleness"]

#: buckets of ``tokens_per_verify_distribution`` (contract §3.7)
DISTRIBUTION_BUCKETS = 64
#: the batches a page draws at most
KEEP_BATCHES = 48
#: batch names under the per-batch charts: at most this many, evenly spread back from the newest
_MAX_BATCH_LABELS = 6


class RecentBatches:
    """The newest revision of each of the last ``keep`` batches published, in the order of
    their first publication (a later revision keeps its batch's place)."""

    def __init__(self, keep: int = KEEP_BATCHES) -> None:
        self.keep = keep
        self._batches: OrderedDict[tuple[str | None, str], BatchMetrics] = OrderedDict()

    def observe(self, metrics: BatchMetrics) -> None:
        key = (metrics.run_id, metrics.batch_id)
        known = self._batches.get(key)
        if known is not None and known.revision >= metrics.revision:
            return
        self._batches[key] = metrics
        while len(self._batches) > self.keep:
            self._batches.popitem(last=False)

    def batches(self) -> list[BatchMetrics]:
        return list(self._batches.values())


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _short(text: str, limit: int = 12) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _batch_name(m: BatchMetrics) -> str:
    return m.batch_id if not m.run_id else f"{m.batch_id} (run {m.run_id})"


def _label_every(count: int) -> int:
    return max(1, math.ceil(count / _MAX_BATCH_LABELS))


def _batch_labels(batches: Sequence[BatchMetrics]) -> list[str | None]:
    """Each batch's name under a per-batch chart, or None: every few batches, counted
    back from the newest (which is always named), so that the names never crowd."""
    every = _label_every(len(batches))
    return [_short(m.batch_id) if (len(batches) - 1 - i) % every == 0 else None for i, m in enumerate(batches)]


def _batch_marks(batches: Sequence[BatchMetrics], key: str, what: str, fmt: str) -> list[Mark]:
    """One mark per batch that has ``metrics[key]``, labelled every few batches."""
    having = [m for m in batches if isinstance(m.metrics.get(key), int | float)]
    return [_batch_mark(m, label, key, what, fmt) for m, label in zip(having, _batch_labels(having), strict=True)]


def _batch_mark(m: BatchMetrics, label: str | None, key: str, what: str, fmt: str) -> Mark:
    """One batch's mark of ``metrics[key]``, its run and revision in its attributes."""
    return Mark(
        key=m.batch_id,
        value=m.metrics[key],
        label=label,
        title=f"{_batch_name(m)}, revision {m.revision}: {what} {format(m.metrics[key], fmt)}",
        attrs={"run": m.run_id or "", "revision": str(m.revision)},
    )


def _coverage_marks(batches: Sequence[BatchMetrics]) -> list[Mark]:
    """One bar per batch, its partitions reported; an incomplete one styled apart."""
    return [_coverage_mark(m, label) for m, label in zip(batches, _batch_labels(batches), strict=True)]


def _coverage_mark(m: BatchMetrics, label: str | None) -> Mark:
    """One batch's bar of partitions reported, said and styled complete or incomplete."""
    return Mark(
        key=m.batch_id,
        value=m.partitions_reported,
        label=label,
        title=f"{_batch_name(m)}: {m.partitions_reported} of {m.partitions_expected} partitions, "
        + ("complete" if m.complete else f"incomplete ({m.close_reason})"),
        attrs={
            "run": m.run_id or "",
            "revision": str(m.revision),
            "expected": str(m.partitions_expected),
            "complete": "true" if m.complete else "false",
        },
        style="" if m.complete else "incomplete",
    )


def _newest(batches: Sequence[BatchMetrics], has: str | None = None) -> BatchMetrics | None:
    """The newest batch (last closed; the last published of a tie), of those whose ``has``
    is set when given."""
    having = [(m.closed_at, i, m) for i, m in enumerate(batches) if has is None or getattr(m, has)]
    return max(having, key=lambda t: (t[0], t[1]))[2] if having else None


def _version_marks(m: BatchMetrics) -> list[Mark]:
    """A bar per weight version of the batch that has an accept rate."""
    out = []
    for entry in m.by_weight_version or ():
        rate = entry.metrics.get("spec/accept_rate")
        if isinstance(rate, int | float):
            out.append(_version_mark(entry.weight_version, rate))
    return out


def _version_mark(version: str | None, rate: float) -> Mark:
    """One weight version's bar; the unknown version (None) named so and marked unknown."""
    name = version if version is not None else "unknown"
    return Mark(
        key=version or "",
        value=rate,
        label=_short(name, 10),
        title=f"weight version {name}: accept rate {rate:.4f}",
        attrs={"known": "true" if version is not None else "false"},
    )


def _position_marks(m: BatchMetrics) -> list[Mark]:
    rates = m.accept_rate_by_position or []
    every = 1 if len(rates) <= 16 else 2
    return [
        Mark(
            key=str(k),
            value=rate,
            label=str(k) if (k - 1) % every == 0 else None,
            title=f"draft position {k}: {rate:.4f} of verify steps accepted it",
        )
        for k, rate in enumerate(rates, start=1)
    ]


def staleness(batches: Iterable[BatchMetrics]) -> list[tuple[int | None, int, int, int]]:
    """The staleness curve over batches: per draft lag (numeric order, unknown last), its
    paired accepted and paired proposed drafts summed over the batches' ``by_draft_lag``,
    and how many batches had it: (lag, accepted, proposed, batches)."""
    sums: dict[int | None, list[int]] = {}
    for m in batches:
        for entry in m.by_draft_lag or ():
            s = sums.setdefault(entry.draft_lag, [0, 0, 0])
            s[0] += int(entry.metrics.get("spec/paired_accepted_total", 0))
            s[1] += int(entry.metrics.get("spec/paired_proposed_total", 0))
            s[2] += 1
    order = sorted(sums, key=lambda lag: (lag is None, lag or 0))
    return [(lag, *sums[lag]) for lag in order]  # type: ignore[misc]


def _staleness_marks(batches: Sequence[BatchMetrics]) -> list[Mark]:
    """A point per draft lag of the staleness curve that has drafts proposed."""
    return [_staleness_mark(*point) for point in staleness(batches) if point[2] > 0]


def _staleness_mark(lag: int | None, accepted: int, proposed: int, count: int) -> Mark:
    """One draft lag's point: its accept rate, the drafts and batches it sums."""
    name = "unknown" if lag is None else str(lag)
    return Mark(
        key=name,
        value=accepted / proposed,
        label=name,
        title=f"draft lag {name}: accept rate {accepted / proposed:.4f} "
        f"({accepted} of {proposed} drafts, {count} batches)",
        attrs={"accepted": str(accepted), "proposed": str(proposed), "batches": str(count)},
    )


def bucket_range(bucket: int) -> str:
    """Tokens per verify step of a distribution bucket (contract §3.7): [1 + b/4, 1 + (b+1)/4),
    the first also everything below, the last everything from 16.75 up."""
    if bucket == 0:
        return "< 1.25"
    if bucket == DISTRIBUTION_BUCKETS - 1:
        return f">= {1 + bucket / 4:.2f}"
    return f"[{1 + bucket / 4:.2f}, {1 + (bucket + 1) / 4:.2f})"


#: buckets named under the spread chart: 1.25, 2, 3, 4, 6, 8, 12, 16.75+ tokens per step
_SPREAD_LABELS = {0: "<1.25", 4: "2", 8: "3", 12: "4", 20: "6", 28: "8", 44: "12", 63: "16.75+"}


#: the spread chart draws at least the buckets below 3 tokens per verify step
_SPREAD_MIN_BUCKETS = 9


def spread_drawn(counts: Sequence[int]) -> int:
    """How many buckets of a distribution the spread chart draws, from bucket 0: up to the
    last occupied one and one empty bucket after it (the edge of the data), at least
    ``_SPREAD_MIN_BUCKETS``, at most all. Issue 47.6: drawing all 64 spent 85 % of the width
    on empty buckets, a fleet's steps rarely passing 3 or 4 tokens."""
    occupied = [b for b, count in enumerate(counts) if count]
    end = occupied[-1] + 2 if occupied else 0
    return min(len(counts), max(end, _SPREAD_MIN_BUCKETS))


def _spread_marks(m: BatchMetrics) -> list[Mark]:
    """A bar per bucket drawn (``spread_drawn``); each whole token named when few are drawn."""
    counts = m.tokens_per_verify_distribution or []
    drawn = spread_drawn(counts)
    names = _spread_names(drawn)
    return [
        Mark(
            key=str(b),
            value=count,
            label=names.get(b),
            title=f"{bucket_range(b)} tokens per verify step: {count} generations",
        )
        for b, count in enumerate(counts[:drawn])
    ]


def _spread_names(drawn: int) -> dict[int, str]:
    """The buckets named under the spread chart of ``drawn`` buckets: ``_SPREAD_LABELS``'
    when many are drawn, else each whole token's first bucket."""
    if drawn > 24:
        return _SPREAD_LABELS
    return {b: _SPREAD_LABELS.get(b, f"{1 + b // 4}") for b in range(0, drawn, 4)}


def _spread_note(m: BatchMetrics) -> str:
    """The spread panel's note: what it draws, and from where on nothing is drawn."""
    counts = m.tokens_per_verify_distribution or []
    note = f"Generations of batch {_batch_name(m)} by their own tokens per verify step, quarter-token buckets."
    drawn = spread_drawn(counts)
    if drawn < len(counts):
        note += f" None at {1 + drawn / 4:.2f} or more: those buckets are not drawn."
    return note


def _panel(panel_id: str, heading: str, note: str, chart: str) -> str:
    return (
        f'<section class="panel" id="panel-{_esc(panel_id)}"><h2>{_esc(heading)}</h2>'
        f'<p class="note">{_esc(note)}</p>\n{chart}\n</section>'
    )


def _absent(panel_id: str, heading: str, note: str) -> str:
    return (
        f'<section class="panel absent" id="panel-{_esc(panel_id)}"><h2>{_esc(heading)}</h2>'
        f'<p class="note">{_esc(note)}</p></section>'
    )


def _accept_rate(batches: Sequence[BatchMetrics]) -> Drawn:
    note = "Paired accepted / paired proposed draft tokens (spec/accept_rate), per batch, oldest first."
    marks = _batch_marks(batches, "spec/accept_rate", "accept rate", ".4f")
    chart = Chart("points", "accept_rate", "Accept rate per batch", marks, 1.0, y_label="accept rate", x_label="batch")
    return note, chart


def _tokens_per_verify(batches: Sequence[BatchMetrics]) -> Drawn:
    note = "Paired completion tokens / paired verify steps (spec/tokens_per_verify), per batch."
    marks = _batch_marks(batches, "spec/tokens_per_verify", "tokens per verify step", ".3f")
    title = "Tokens per verify step per batch"
    return note, Chart("points", "tokens_per_verify", title, marks, y_label="tokens / step", x_label="batch")


def _coverage(batches: Sequence[BatchMetrics]) -> Drawn:
    complete = sum(1 for m in batches if m.complete)
    expected = max((m.partitions_expected for m in batches), default=1)
    note = (
        f"{complete} of {len(batches)} batches complete; partitions reported of those expected, "
        "an incomplete batch in orange."
    )
    attrs = {"complete": str(complete), "batches": str(len(batches))}
    marks = _coverage_marks(batches)
    title = "Partitions reported per batch"
    return note, Chart("bar", "coverage", title, marks, float(expected), ".0f", "partitions", "batch", attrs)


def _drift(batches: Sequence[BatchMetrics]) -> Drawn | None:
    m = _newest(batches, "by_weight_version")
    if m is None:
        return None
    note = (
        f"Accept rate of each policy version in batch {_batch_name(m)}: acceptance falls as the "
        "policy moves away from the version the draft model was trained on."
    )
    title = "Accept rate by weight version"
    chart = Chart("bar", "drift", title, _version_marks(m), 1.0, ".2f", "accept rate", "weight version", _of(m), ".3f")
    return note, chart


def _positions(batches: Sequence[BatchMetrics]) -> Drawn | None:
    m = _newest(batches, "accept_rate_by_position")
    if m is None:
        return None
    note = f"Share of verify steps that accepted their k-th draft token, batch {_batch_name(m)}."
    title = "Acceptance by draft position"
    chart = Chart(
        "bar", "positions", title, _position_marks(m), 1.0, ".2f", "accepted", "draft position k", _of(m), ".3f"
    )
    return note, chart


def _staleness_curve(batches: Sequence[BatchMetrics]) -> Drawn | None:
    marks = _staleness_marks(batches)
    if not marks:
        return None
    with_lags = sum(1 for m in batches if m.by_draft_lag)
    note = (
        f"Paired accepted / paired proposed by draft lag (policy updates the draft is behind), "
        f"summed over {with_lags} recent batches."
    )
    attrs = {"batches": str(with_lags)}
    chart = Chart(
        "points", "staleness", "Accept rate by draft lag", marks, 1.0, ".2f", "accept rate", "draft lag", attrs
    )
    return note, chart


def _spread(batches: Sequence[BatchMetrics]) -> Drawn | None:
    m = _newest(batches, "tokens_per_verify_distribution")
    if m is None:
        return None
    attrs = {**_of(m), "buckets": str(len(m.tokens_per_verify_distribution or []))}
    title = "Generations by tokens per verify step"
    chart = Chart("bar", "spread", title, _spread_marks(m), None, ".0f", "generations", "tokens per verify step", attrs)
    return _spread_note(m), chart


def _of(m: BatchMetrics) -> dict[str, str]:
    """A newest-batch chart's attributes: the batch and run it draws."""
    return {"batch": m.batch_id, "run": m.run_id or ""}


#: a panel's note and chart, from the recent batches
Drawn = tuple[str, Chart]


@dataclass(frozen=True)
class PanelDefinition:
    """One panel of the page: its id and heading, what draws it (None: nothing to draw),
    and what the page says instead (None: always drawn)."""

    panel_id: str
    heading: str
    draw: Callable[[Sequence[BatchMetrics]], Drawn | None]
    absent: str = ""


#: the page's panels, in order: per batch, the newest batch that has them, over the batches
PANELS = (
    PanelDefinition("accept_rate", "Accept rate", _accept_rate),
    PanelDefinition("tokens_per_verify", "Tokens per verify step", _tokens_per_verify),
    PanelDefinition("coverage", "Coverage", _coverage),
    PanelDefinition("drift", "Drift by weight version", _drift, "No recent batch has a weight-version breakdown."),
    PanelDefinition(
        "positions", "Acceptance by draft position", _positions, "No recent batch has an acceptance histogram."
    ),
    PanelDefinition(
        "staleness",
        "Staleness curve",
        _staleness_curve,
        "No recent batch carries a draft-lag breakdown (by_draft_lag, revision 5).",
    ),
    PanelDefinition(
        "spread",
        "Spread of tokens per verify step",
        _spread,
        "No recent batch carries a distribution (tokens_per_verify_distribution, revision 5).",
    ),
)


def _panels(batches: Sequence[BatchMetrics]) -> list[str]:
    """Each defined panel drawn, or said absent."""
    out = []
    for p in PANELS:
        drawn = p.draw(batches)
        if drawn is None:
            out.append(_absent(p.panel_id, p.heading, p.absent))
        else:
            out.append(_panel(p.panel_id, p.heading, drawn[0], draw(drawn[1])))
    return out


def _summary(m: BatchMetrics) -> str:
    """The newest batch's table (``_summary_rows``) as HTML."""
    cells = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in _summary_rows(m))
    return f'<table class="summary" id="newest"><caption>Newest batch</caption>{cells}</table>'


def _summary_rows(m: BatchMetrics) -> list[tuple[str, str]]:
    """What the newest batch's table says, row by row (a name, its text); "-" for a ratio
    the batch has not."""
    return [
        ("batch", m.batch_id),
        ("run", m.run_id or "(default)"),
        ("algorithm", m.speculative_algorithm or "unknown"),
        ("revision", str(m.revision)),
        ("closed", f"{m.close_reason}, " + ("complete" if m.complete else "incomplete")),
        ("records", f"{m.record_count} ({m.invalid_record_count} invalid, {m.late_record_count} late)"),
        ("accept rate", _ratio_text(m.metrics.get("spec/accept_rate"), ".4f")),
        ("tokens / verify step", _ratio_text(m.metrics.get("spec/tokens_per_verify"), ".3f")),
    ]


def _ratio_text(value: float | None, fmt: str) -> str:
    """A ratio of the newest batch's table in ``fmt``; "-" for one the batch has not."""
    return "-" if value is None else format(value, fmt)


_STYLE = """
body{font-family:"DejaVu Sans",Verdana,sans-serif;margin:16px 20px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:0 0 2px}
.sub{color:#555;font-size:13px;margin:0 0 12px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.panel{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 12px}
.panel.absent{color:#777}.note{font-size:12px;color:#555;margin:0 0 6px}
.chart{width:100%;height:auto;display:block}
.chart .grid{stroke:#e6e6e6;stroke-width:1}.chart .axis{stroke:#888;stroke-width:1}
.chart text{font-size:10px;fill:#444}.chart .axis-label{font-size:11px;fill:#333}
.chart .empty{font-size:13px;fill:#888}.chart .value{font-size:10px;fill:#222}
.chart rect.mark{fill:#3b6fb6}.chart rect.mark.incomplete{fill:#e08a2c}
.chart circle.mark{fill:#3b6fb6;stroke:#fff;stroke-width:1}
.chart .line{fill:none;stroke:#3b6fb6;stroke-width:1.5;opacity:.6}
.summary{border-collapse:collapse;font-size:13px;margin:0 0 14px}
.summary caption{text-align:left;font-weight:bold;padding-bottom:4px}
.summary th{text-align:left;font-weight:normal;color:#555;padding:1px 14px 1px 0}
.summary td{font-family:"DejaVu Sans Mono",monospace}
"""


def render_page(
    batches: Sequence[BatchMetrics], *, worker: str, refresh_s: int = 10, now_s: float | None = None
) -> str:
    """The whole page (HTML with inline SVG) of ``batches``, oldest first, for worker
    ``worker`` (its app id); ``refresh_s`` 0: no refresh."""
    head = _head(len(batches), worker, refresh_s, time.time() if now_s is None else now_s)
    if not batches:
        return head + '<p class="empty" id="no-batches">No batch published by this worker yet.</p></body></html>\n'
    newest = _newest(batches) or batches[-1]
    panels = _panels(batches)
    return head + _summary(newest) + '\n<div class="grid">\n' + "\n".join(panels) + "\n</div></body></html>\n"


def _head(count: int, worker: str, refresh_s: int, now_s: float) -> str:
    """The page up to its content: the document's head (and its refresh, when
    ``refresh_s`` > 0), the heading and the line that says what the page shows and when."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now_s))
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s > 0 else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>specmeter: {_esc(worker)}</title><style>{_STYLE}</style></head>\n<body>"
        f"<h1>specmeter worker {_esc(worker)}</h1>"
        f'<p class="sub">The newest revision of the last {count} batches this worker published '
        f"(its share of the partials partitions), at {_esc(when)}"
        + (f"; refreshed every {int(refresh_s)} s" if refresh_s > 0 else "")
        + ". Numbers: /specmeter/stats, /metrics and the metrics topic.</p>\n"
    )
