"""The metrics as a terminal table, for ``tail``, ``aggregate`` and the demo.

The table fits the terminal (80 columns included), one row per batch sorted by run
and batch (``step-2`` before ``step-10``): fixed numeric columns, the rest shared by
the batch name (never cut below what tells rows apart), the acceptance by draft
position (``.81 .62 .40``, dropped first when short), the accept rate per task
(``gsm8k .88 chat .71``, the largest tasks first, where the batch name and the drift
view leave room) and a compact drift view, the accept rate per weight version
(``v7 .75 v8 .71``). ``RowPrinter`` prints the same cells a line at a time, for a
pipe. ``task_table`` is the by-task view of ``specmeter aggregate``: a row per batch
and task; ``draft_lag_table`` its by-draft-lag view (revision 5, the staleness curve), a
row per batch and lag; ``spread_table`` the spread of each batch's generations' own
tokens per verify step (its quartiles and the share that barely speculates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specmeter.schemas import BatchMetrics, DraftLagMetrics, TaskMetrics, WeightVersionMetrics

from ..core.order import batch_order, natural

__all__ = [
    "metrics_table",
    "drift_text",
    "staleness_text",
    "tasks_text",
    "task_table",
    "draft_lag_table",
    "spread_table",
    "positions_text",
    "batch_label",
    "fit_labels",
    "batch_order",
    "RowPrinter",
    "coverage_text",
    "output_console",
    "WHOLE_WIDTH",
]

#: the width of a console where stdout is no terminal (a pipe, a file): wide enough that no
#: id, header or drift view is cut (``| grep`` must find what it looks for)
WHOLE_WIDTH = 10_000
#: (header, content width) of the numeric columns, between "batch" and "c/i/l"
_FIXED = (("rev", 3), ("accept", 6), ("tok/v", 5), ("cov", 4), ("gens", 5))
#: the numeric columns of a narrow table: "gens" left out
_NARROW = tuple(c for c in _FIXED if c[0] != "gens")
#: below this width "gens" is left out, so batch names and the drift view keep room
_WIDE = 100
_GAP = 2  # between columns: the (blank) divider and one space of right padding
#: the per-position column shows at most this many positions (then "…")
_MAX_POSITIONS = 8
#: the drift view keeps at least this much room before the per-position column is shown
_DRIFT_BEFORE_POSITIONS = 20
#: the narrowest per-task column worth showing (one task and its rate: ``gsm8k .88 …``)
_MIN_TASKS = 12
#: a task's name in the per-task column: at most this many characters (then "…")
_TASK_NAME = 12


def _fixed(width: int) -> tuple[tuple[str, int], ...]:
    return _FIXED if width >= _WIDE else _NARROW


def _rate(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    text = f"{value:.2f}"
    return text[1:] if text.startswith("0.") else text


def _fit_left(text: str, width: int) -> str:
    """``text``, or its end behind an ellipsis when it is too long."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def drift_text(entries: list[WeightVersionMetrics] | None, width: int) -> str:
    """Accept rate per weight version, oldest first, as many of the newest as fit: ``v7 .75 v8 .71``."""
    if not entries:
        return "-"
    parts = [
        f"{_fit_left(e.weight_version or '?', 10)} {_rate(e.metrics.get('spec/accept_rate'))}"
        for e in sorted(entries, key=lambda e: natural(e.weight_version))
    ]
    return _fit_left(_newest_fitting(parts, width), width)


def staleness_text(entries: list[DraftLagMetrics] | None, width: int) -> str:
    """(revision 5) Accept rate per draft lag, lag 0 first, as many as fit: ``0:.75 1:.71 2:.64 …``
    (``?``: the unknown lag), the staleness curve of one batch."""
    if not entries:
        return "-"
    parts = [
        f"{'?' if e.draft_lag is None else e.draft_lag}:{_rate(e.metrics.get('spec/accept_rate'))}" for e in entries
    ]
    return _fitted(parts, width, keep=1)


def _newest_fitting(parts: list[str], width: int) -> str:
    """``parts`` joined, the oldest dropped (and "…" said) until the text fits or one is left."""
    text = " ".join(parts)
    while len(text) > width and len(parts) > 1:
        parts.pop(0)
        text = "… " + " ".join(parts)
    return text


def _fit_right(text: str, width: int) -> str:
    """``text``, or its start before an ellipsis when it is too long."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _by_size(entries: list[TaskMetrics]) -> list[TaskMetrics]:
    """Tasks with the most generations first (ties by name), the unknown task last."""
    return sorted(
        entries,
        key=lambda e: (e.task is None, -e.metrics.get("spec/unique_generation_count", 0), natural(e.task)),
    )


def tasks_text(entries: list[TaskMetrics] | None, width: int) -> str:
    """Accept rate per task, the largest tasks first, as many as fit, then "…":
    ``gsm8k .88 chat .71 …`` (``?``: the unknown task)."""
    if not entries:
        return "-"
    parts = [
        f"{_fit_right(e.task or '?', _TASK_NAME)} {_rate(e.metrics.get('spec/accept_rate'))}" for e in _by_size(entries)
    ]
    return _fit_right(_fitted(parts, width, keep=1), width)


def positions_text(rates: list[float] | None, width: int = 80) -> str:
    """Acceptance by draft position, first position first: ``.81 .62 .40`` (as many as fit, then …)."""
    if not rates:
        return "-"
    parts = [_rate(r) for r in rates[:_MAX_POSITIONS]]
    text = _fitted(parts, width, cut=len(parts) < len(rates))
    return text if parts else "…"


def _fitted(parts: list[str], width: int, *, cut: bool = False, keep: int = 0) -> str:
    """``parts`` joined by spaces, the last ones dropped (and "…" said once any is, or
    ``cut`` already) until the text fits ``width`` or ``keep`` parts are left."""
    while len(parts) > keep and len(_joined(parts, cut)) > width:
        parts.pop()
        cut = True
    return _joined(parts, cut)


def _joined(parts: list[str], cut: bool) -> str:
    return " ".join(parts) + (" …" if cut else "")


_SEPARATORS = "-_./:@"


def _run_suffixes(batches: list[BatchMetrics]) -> dict[str, int]:
    """For each run id shown, the length of its end that tells it from the other runs:
    what follows their common prefix, from the separator before it (``-2`` of
    ``grpo-7-attempt-2`` beside ``grpo-7-attempt-3``); 0 when a single run is shown."""
    runs = sorted({m.run_id for m in batches if m.run_id is not None})
    start = _first_difference(runs) if len(runs) >= 2 else 0
    if start == 0:  # a single run, or they differ from their first character, which the label's start keeps
        return dict.fromkeys(runs, 0)
    start = _back_to_separator(runs[0], start)
    return {run: len(run) - start for run in runs}


def _first_difference(runs: list[str]) -> int:
    """Where the runs' names first differ (the shortest one's length when one is a prefix of all)."""
    return next((i for i, chars in enumerate(zip(*runs, strict=False)) if len(set(chars)) > 1), min(map(len, runs)))


def _back_to_separator(run: str, start: int) -> int:
    """``start``, moved back to the separator before it, a few characters at most."""
    for back in range(1, 9):
        if start - back >= 0 and run[start - back] in _SEPARATORS:
            return start - back
    return start


def _label(m: BatchMetrics, run_suffix: dict[str, int]) -> tuple[str, int]:
    """``run/batch`` (just the batch in the default run), and how much of its end an
    elided label keeps whenever it can: the batch id and what tells the run apart."""
    if m.run_id is None:
        return m.batch_id, 0
    return f"{m.run_id}/{m.batch_id}", len(m.batch_id) + 1 + run_suffix.get(m.run_id, 0)


def _elide(text: str, width: int, tail: int) -> str:
    """``text`` in ``width`` characters: its start, "…", then its last ``tail`` characters."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    tail = max(0, min(tail, width - 1))
    return text[: width - 1 - tail] + "…" + (text[len(text) - tail :] if tail else "")


def fit_labels(batches: list[BatchMetrics], width: int) -> list[str]:
    """Each row's ``run/batch`` in ``width`` characters, rows that differ kept different.

    A label too long loses its middle, never the batch id at its end while that
    fits, nor what tells its run from the other runs shown: ``grpo-7-attempt-2/step-1``
    and ``grpo-7-attempt-3/step-1`` become ``grpo-7…-2/step-1`` and ``grpo-7…-3/step-1``,
    not two ``grpo-7-at…/step-1``. Where labels still collide, the kept end grows one
    character at a time until every label is told apart."""
    suffixes = _run_suffixes(batches)
    labels = [_label(m, suffixes) for m in batches]
    if all(len(text) <= width for text, _ in labels):
        return [text for text, _ in labels]
    return _elided_apart(labels, width)


def _elided_apart(labels: list[tuple[str, int]], width: int) -> list[str]:
    """The labels elided to ``width``, their kept ends grown one character at a time until
    the labels that differ stay different (as elided at first, when they never do)."""
    distinct = len({text for text, _ in labels})
    balanced = (width - 1) // 2

    def attempt(extra: int) -> list[str]:
        return [_elide(text, width, (batch_end or balanced) + extra) for text, batch_end in labels]

    for extra in range(width):
        out = attempt(extra)
        if len(set(out)) == distinct:
            return out
    return attempt(0)


def batch_label(m: BatchMetrics, width: int) -> str:
    """One row's label in ``width`` characters (``fit_labels`` of a single row)."""
    return fit_labels([m], width)[0]


#: how a large count is shortened: (from, unit, its size, the format of the count in units), the largest first
_COUNT_UNITS = ((10_000_000, "M", 1e6, ".0f"), (1_000_000, "M", 1e6, ".1f"), (100_000, "k", 1e3, ".0f"))


def _count(n: float | None) -> str:
    if n is None:
        return "-"
    shortened = (format(n / size, fmt) + unit for least, unit, size, fmt in _COUNT_UNITS if n >= least)
    return next(shortened, f"{n:.0f}")


def _problems(m: BatchMetrics) -> str:
    """conflicting/invalid/late: shown whole, whatever its width."""
    conflicting = m.metrics.get("spec/conflicting_generation_count", 0)
    return "/".join(_count(n) for n in (conflicting, m.invalid_record_count, m.late_record_count))


def _close(m: BatchMetrics) -> str:
    return m.close_reason if m.complete else f"{m.close_reason}!"


def coverage_text(metrics: dict[str, Any]) -> str:
    """The lower of the accept and verify coverage, marked ``a`` or ``v`` when one is
    lower than the other (``50%v``: half the generations know completion and verify,
    all of them accepted and proposed). Rounded down, so ``100%`` means every one."""
    known = _coverages(metrics)
    if not known:
        return "-"
    lowest = min(known.values())
    return f"{math.floor(lowest * 100 + 1e-9):.0f}%" + _lower_mark(known)


def _coverages(metrics: dict[str, Any]) -> dict[str, float]:
    """The accept (``a``) and verify (``v``) coverage, those that are known."""
    return {
        mark: metrics[key]
        for mark, key in (("a", "spec/accept_count_coverage"), ("v", "spec/verify_count_coverage"))
        if isinstance(metrics.get(key), (int, float))
    }


def _lower_mark(known: dict[str, float]) -> str:
    """``a`` or ``v`` where both are known and one is lower; nothing otherwise."""
    if len(known) == 2 and known["a"] != known["v"]:
        return "a" if known["a"] < known["v"] else "v"
    return ""


class _Layout:
    """Column widths of a table ``total`` columns wide, in the order things give way:
    the per-position column goes first, then the per-task column (it only takes what
    the batch labels and the drift view leave), then (below 100 columns) the
    generation count; the drift view shrinks before the batch labels do, and a label
    is never cut below what tells it from the other rows; c/i/l and close are never cut."""

    def __init__(self, total: int, shown: list[BatchMetrics], *, whole: bool = False, ids: bool = False) -> None:
        self.fixed = _fixed_columns(total, shown)
        room = max(20, total - sum(w for _, w in self.fixed) - _GAP * (len(self.fixed) + 1))
        labels = [_label(m, {})[0] for m in shown]
        batch_need = _widest(labels, 10)
        drift_need = _widest([drift_text(m.by_weight_version, WHOLE_WIDTH) for m in shown], 10)
        if whole:  # piped: every column as wide as its widest cell, nothing cut
            self._whole(shown, batch_need, drift_need)
        else:
            self._fitted(shown, labels, room, (batch_need, drift_need), ids)

    def _whole(self, shown: list[BatchMetrics], batch_need: int, drift_need: int) -> None:
        """Every column as wide as its widest cell (a pipe's ``whole`` table): nothing cut."""
        self.tasks = _tasks_width(shown, WHOLE_WIDTH)
        self.positions = _positions_width(shown, WHOLE_WIDTH, drift_need)
        self.batch, self.drift = batch_need, drift_need

    def _fitted(
        self, shown: list[BatchMetrics], labels: list[str], room: int, needs: tuple[int, int], ids: bool
    ) -> None:
        """The columns in ``room`` (``needs``: the batch labels' and the drift view's whole
        widths), each giving way in turn; ``ids``: the labels whole all the same."""
        batch_need, drift_need = needs
        self.tasks = _tasks_width(shown, room - batch_need - drift_need - _GAP)
        room -= _taken(self.tasks)
        self.positions = _positions_width(shown, room - batch_need - _GAP, drift_need)
        room -= _taken(self.positions)
        self.batch, self.drift = _label_and_drift_widths(shown, labels, room, batch_need, drift_need)
        if ids:  # piped: the run/batch ids whole, the table wider by what they need
            self.batch = batch_need

    def caption(self) -> str:
        return (
            LEGEND
            + (" · pos: accept rate by draft position" if self.positions else "")
            + (" · task: accept rate by task" if self.tasks else "")
            + " · drift: accept rate by version"
        )

    def add_columns(self, table: Any) -> None:
        table.add_column("batch", width=self.batch, no_wrap=True, overflow="ellipsis")
        for name, w in self.fixed:
            table.add_column(name, width=w, justify="right", no_wrap=True, overflow="ellipsis")
        if self.positions:
            table.add_column("pos", width=self.positions, no_wrap=True, overflow="ellipsis")
        if self.tasks:
            table.add_column("task", width=self.tasks, no_wrap=True, overflow="ellipsis")
        table.add_column("drift", width=self.drift, no_wrap=True, overflow="ellipsis")

    def row(self, m: BatchMetrics, label: str) -> list[str]:
        """One batch's cells, its label fitted already."""
        cells = _cells(m)
        extra = [positions_text(m.accept_rate_by_position, self.positions)] if self.positions else []
        if self.tasks:
            extra.append(tasks_text(m.by_task, self.tasks))
        return [label, *(cells[name] for name, _ in self.fixed), *extra, drift_text(m.by_weight_version, self.drift)]


def _taken(width: int) -> int:
    """The room a column takes with its gap; none for a column not shown (width 0)."""
    return width + _GAP if width else 0


def _widest(texts: list[str], least: int) -> int:
    return max([len(t) for t in texts] + [least])


def _fixed_columns(total: int, shown: list[BatchMetrics]) -> list[tuple[str, int]]:
    """The numeric columns (the revision's as wide as the largest), then c/i/l and close, never cut."""
    widths = dict(_fixed(total))
    widths["rev"] = _widest([str(m.revision) for m in shown], 3)
    widths["c/i/l"] = _widest([_problems(m) for m in shown], 5)
    widths["close"] = _widest([_close(m) for m in shown], 5)
    return list(widths.items())


def _tasks_width(shown: list[BatchMetrics], spare: int) -> int:
    """The per-task column: what the batch labels and the drift view leave, if that is
    worth showing (0: no column)."""
    if not any(m.by_task for m in shown) or spare < _MIN_TASKS:
        return 0
    return min(max(len(tasks_text(m.by_task, 200)) for m in shown), spare)


def _positions_width(shown: list[BatchMetrics], spare: int, drift_need: int) -> int:
    """The per-position column, whole, when the drift view keeps enough room beside it (0: no column)."""
    if not any(m.accept_rate_by_position for m in shown):
        return 0
    need = _widest([positions_text(m.accept_rate_by_position) for m in shown], 3)
    return need if spare - need >= min(drift_need, _DRIFT_BEFORE_POSITIONS) else 0


def _label_and_drift_widths(
    shown: list[BatchMetrics], labels: list[str], room: int, batch_need: int, drift_need: int
) -> tuple[int, int]:
    """The batch labels' and the drift view's widths in ``room``: the drift view shrinks
    first, and the labels stay wide enough to tell the rows apart."""
    if batch_need + drift_need <= room:
        return batch_need, drift_need
    batch = min(batch_need, max(10, room - drift_need, room // 2))
    while batch < min(batch_need, room - 10) and not _distinct(fit_labels(shown, batch), labels):
        batch += 1
    return batch, max(10, room - batch)


def _distinct(fitted: list[str], labels: list[str]) -> bool:
    return len(set(fitted)) == len(set(labels))


def _ratio(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _cells(m: BatchMetrics) -> dict[str, str]:
    """A row's fixed cells, by column header."""
    x = m.metrics
    return {
        "rev": str(m.revision),
        "accept": _ratio(x.get("spec/accept_rate")),
        "tok/v": _ratio(x.get("spec/tokens_per_verify")),
        "cov": coverage_text(x),
        "gens": _count(x.get("spec/unique_generation_count")),
        "c/i/l": _problems(m),
        "close": _close(m),
    }


#: what the table's caption and the piped header say the columns are
LEGEND = "c/i/l conflicting/invalid/late · ! incomplete · cov: lower of accept/verify coverage (a/v: which)"


def metrics_table(
    latest: dict[Any, BatchMetrics],
    rows: int = 20,
    width: int = 80,
    title: str | None = None,
    *,
    whole: bool = False,
    ids: bool = False,
) -> Any:
    """The ``rows`` most recently updated batches of ``latest`` (in the order they were
    updated), as a rich Table no wider than ``width``, sorted by run and batch
    (``batch_order``). For a pipe (print it on ``output_console``): ``ids``, the run/batch
    ids never cut (the table wider by what they need); ``whole``, no cell cut at all."""
    shown = _shown(latest, rows)
    layout = _Layout(width, shown, whole=whole, ids=ids)
    table = _table(title or f"specmeter: latest {len(shown)} batches", layout.caption())
    layout.add_columns(table)
    for m, label in zip(shown, fit_labels(shown, layout.batch), strict=True):
        table.add_row(*layout.row(m, label), style=None if m.complete else "yellow")
    return table


def _shown(latest: dict[Any, BatchMetrics], rows: int) -> list[BatchMetrics]:
    """The ``rows`` most recently updated batches, by run and batch (``batch_order``)."""
    return sorted(list(latest.values())[-rows:] if rows else [], key=batch_order)


def _table(title: str, caption: str) -> Any:
    """A rich Table as both views draw it: a simple head, no edges, a space between columns."""
    from rich import box
    from rich.table import Table

    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
        caption=caption,
    )


def task_table(results: list[BatchMetrics], width: int = 80, title: str | None = None) -> Any:
    """The by-task view (``specmeter aggregate``'s table): a row per batch and task (the
    largest tasks first, the unknown task last, ``?``), with its accept rate, tokens per
    verify step, accept coverage and generation count, and, where there is room, the
    tokens per verify step by draft budget (``1.65 2.07 2.36``, budgets 1, 2, 3 ...).
    None when no batch has a task breakdown."""
    return _entry_table(_task_rows(results), width, title or "by task", "task", "? unknown task")


def _task_rows(results: list[BatchMetrics]) -> list[tuple[BatchMetrics, TaskMetrics]]:
    """(batch, task) pairs: the batches by run and batch, each one's largest tasks first."""
    return [(m, e) for m in sorted(results, key=batch_order) for e in _by_size(m.by_task or [])]


def draft_lag_table(results: list[BatchMetrics], width: int = 80, title: str | None = None) -> Any:
    """The by-draft-lag view (``specmeter aggregate``'s table, revision 5): a row per
    batch and draft lag (in numeric order, the unknown lag last, ``?``), its columns the
    by-task view's: read down a batch, acceptance against how far the draft is behind.
    None when no batch has a lag breakdown."""
    legend = "lag: policy updates the draft is behind · ? unknown"
    return _entry_table(_lag_rows(results), width, title or "by draft lag", "lag", legend)


def _lag_rows(results: list[BatchMetrics]) -> list[tuple[BatchMetrics, Entry]]:
    """(batch, lag) pairs: the batches by run and batch, each one's lags as published
    (numeric order, the unknown lag last)."""
    return [(m, e) for m in sorted(results, key=batch_order) for e in (m.by_draft_lag or [])]


def _entry_table(rows: Sequence[tuple[BatchMetrics, Entry]], width: int, title: str, header: str, legend: str) -> Any:
    """The by-task and by-draft-lag views' one table: a row per batch and entry under
    ``header``, the caption ``legend`` (and the by-budget column's, where it fits); None
    for no row."""
    if not rows:
        return None
    layout = _TaskLayout(width, rows, header=header)
    budgets = " · by budget: with a budget of 1, 2, ... draft tokens" if layout.budget else ""
    table = _table(title, legend + budgets)
    layout.add_columns(table)
    layout.add_rows(table, rows)
    return table


def spread_quantile(counts: list[int], q: float) -> float:
    """The lower edge of the quarter-token bucket (docs/contract.md §3.7: bucket b holds
    [1 + b/4, 1 + (b+1)/4)) that holds the generation at quantile ``q`` of the spread."""
    total = sum(counts)
    rank = max(1, math.ceil(q * total))
    seen = 0
    for b, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return 1 + b / 4
    return 1 + (len(counts) - 1) / 4


def spread_table(results: list[BatchMetrics], title: str | None = None) -> Any:
    """The spread of tokens per verify step (``specmeter aggregate``'s table, revision 5):
    a row per batch with a ``tokens_per_verify_distribution``: the generations it counts,
    the bucket of its first quartile, median and third quartile (``>=`` their lower edge,
    quarter tokens), and the share under 1.25 tokens per step (bucket 0: barely
    speculating). None when no batch has one."""
    rows = [m for m in sorted(results, key=batch_order) if m.tokens_per_verify_distribution]
    if not rows:
        return None
    table = _table(title or "spread of tokens per verify step", "p25/p50/p75: lower edge of the quarter-token bucket")
    _spread_columns(table)
    for m in rows:
        table.add_row(*_spread_row(m))
    return table


def _spread_columns(table: Any) -> None:
    """The spread's columns: the batch (cut at its end where it must), then its numbers,
    right-aligned and never wrapped."""
    table.add_column("batch", no_wrap=True, overflow="ellipsis")
    for name in ("gens", "p25", "p50", "p75", "<1.25"):
        table.add_column(name, justify="right", no_wrap=True)


def _spread_row(m: BatchMetrics) -> list[str]:
    """A batch's spread: its name, the generations counted, the quartiles' buckets, the share under 1.25."""
    counts = m.tokens_per_verify_distribution or []
    total = sum(counts)
    quartiles = [f"{spread_quantile(counts, q):.2f}" for q in (0.25, 0.5, 0.75)]
    return [_label(m, {})[0], _count(total), *quartiles, _share(counts[0] / total if total else None)]


#: a breakdown entry of the by-task and by-draft-lag views
Entry = TaskMetrics | DraftLagMetrics


def _entry_name(e: Entry) -> str:
    """A view's key cell: the task or the lag, ``?`` when unknown."""
    key = e.task if isinstance(e, TaskMetrics) else e.draft_lag
    return "?" if key is None else str(key)


def _whole_widths(rows: Sequence[tuple[BatchMetrics, Entry]]) -> tuple[int, int, int]:
    """How wide the batch, key and by-budget columns of a by-task or by-lag view are, nothing cut."""
    return (
        max(len(_label(m, {})[0]) for m, _ in rows),
        max(len(_entry_name(e)) for _, e in rows),
        max(len(positions_text(e.tokens_per_verify_by_budget)) for _, e in rows),
    )


class _TaskLayout:
    """Column widths of the by-task view: the batch and the task a third of what the
    numbers leave each at most, the curve by draft budget the rest (given up first)."""

    FIXED = (("accept", 6), ("tok/v", 5), ("cov", 4), ("gens", 5))

    def __init__(self, width: int, rows: Sequence[tuple[BatchMetrics, Entry]], header: str = "task") -> None:
        self.header = header
        room = max(20, width - sum(w for _, w in self.FIXED) - _GAP * (len(self.FIXED) + 3))
        label_w, name_w, budget_w = _whole_widths(rows)
        name_w = max(name_w, len(header))  # a lag's "0" under its whole header
        self.batch = min(label_w, max(10, room // 3))
        self.task = min(name_w, max(8, room // 3))
        self.budget = min(budget_w, room - self.batch - self.task - _GAP)
        if self.budget < 9:  # no room for a curve of two budgets: the column gives way
            self.budget = 0
            self.task = min(name_w, room - self.batch)

    def add_columns(self, table: Any) -> None:
        table.add_column("batch", width=self.batch, no_wrap=True, overflow="ellipsis")
        table.add_column(self.header, width=self.task, no_wrap=True, overflow="ellipsis")
        for name, w in self.FIXED:
            table.add_column(name, width=w, justify="right", no_wrap=True, overflow="ellipsis")
        if self.budget:
            table.add_column("tok/v by budget", width=self.budget, no_wrap=True, overflow="ellipsis")

    def add_rows(self, table: Any, rows: Sequence[tuple[BatchMetrics, Entry]]) -> None:
        """A row per batch and task, the batch's label on its first row only."""
        previous = None
        for (m, e), label in zip(rows, fit_labels([m for m, _ in rows], self.batch), strict=True):
            table.add_row("" if m is previous else label, *self.cells(e))
            previous = m

    def cells(self, e: Entry) -> list[str]:
        """A task's (lag's) cells beside its batch's label: its name, rates, coverage, size and curve."""
        x = e.metrics
        cells = [
            _fit_right(_entry_name(e), self.task),
            _ratio(x.get("spec/accept_rate")),
            _ratio(x.get("spec/tokens_per_verify")),
            _share(x.get("spec/accept_count_coverage")),
            _count(x.get("spec/unique_generation_count")),
        ]
        if self.budget:
            cells.append(positions_text(e.tokens_per_verify_by_budget, self.budget))
        return cells


def _share(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def output_console(**kwargs: Any) -> Any:
    """A rich Console for a command's output: the terminal's width on a terminal; piped or
    redirected, ``WHOLE_WIDTH``, so a table is as wide as its cells and nothing is wrapped
    or cut (a table laid out ``whole``)."""
    from rich.console import Console

    console = Console(**kwargs)
    return console if console.is_terminal else Console(width=WHOLE_WIDTH, **kwargs)


class RowPrinter:
    """Rows for a pipe, one line per message as it arrives (``tail … | head``, ``| grep``):
    a header line first, then the fixed cells of ``metrics_table`` in columns of a
    width fixed up front (so rows line up without knowing the rows to come), then the
    drift view. The ``run/batch`` id is never cut (issue 39.2: `| grep` found
    ``audit-rep…/step-00004`` for two runs): one longer than its column pushes the row's
    cells to the right and the drift view keeps the newest versions that fit what is left
    of ``width``; ``whole``: the drift view too, however long the line."""

    def __init__(self, width: int, *, whole: bool = False) -> None:
        self.fixed = [*_fixed(width), ("c/i/l", 8), ("close", 8)]
        self.cells = sum(w for _, w in self.fixed) + _GAP * (len(self.fixed) + 1)
        self.label = max(10, min(32, (width - self.cells) * 2 // 3))
        self.width, self.whole = width, whole

    def _line(self, label: str, cells: dict[str, str], drift: str) -> str:
        fixed = "  ".join(cells[name].rjust(w) for name, w in self.fixed)
        return f"{label.ljust(self.label)}  {fixed}  {drift}".rstrip()

    def header(self) -> str:
        return self._line("batch", {name: name for name, _ in self.fixed}, "drift")

    def row(self, m: BatchMetrics) -> str:
        label = _label(m, {})[0]
        drift = WHOLE_WIDTH if self.whole else max(10, self.width - self.cells - max(self.label, len(label)))
        return self._line(label, _cells(m), drift_text(m.by_weight_version, drift))
