"""The metrics as a terminal table, for ``tail``, ``aggregate`` and the demo.

The table fits the terminal (80 columns included), one row per batch sorted by run
and batch (``step-2`` before ``step-10``): fixed numeric columns, the rest shared by
the batch name (never cut below what tells rows apart), the acceptance by draft
position (``.81 .62 .40``, dropped first when short), the accept rate per task
(``gsm8k .88 chat .71``, the largest tasks first, where the batch name and the drift
view leave room) and a compact drift view, the accept rate per weight version
(``v7 .75 v8 .71``). ``RowPrinter`` prints the same cells a line at a time, for a
pipe. ``task_table`` is the by-task view of ``specmeter aggregate``: a row per batch
and task.
"""

from __future__ import annotations

import math
import re
from typing import Any

from specmeter.schemas import BatchMetrics, TaskMetrics, WeightVersionMetrics

__all__ = [
    "metrics_table",
    "drift_text",
    "tasks_text",
    "task_table",
    "positions_text",
    "batch_label",
    "fit_labels",
    "batch_order",
    "RowPrinter",
    "coverage_text",
]

#: (header, content width) of the numeric columns, between "batch" and "c/i/l"
_FIXED = (("rev", 3), ("accept", 6), ("tok/v", 5), ("cov", 4), ("gens", 5))
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
    return _FIXED if width >= _WIDE else tuple(c for c in _FIXED if c[0] != "gens")


def _natural(text: str | None) -> tuple:
    """Natural order: step-2 before step-10, v9 before v10; None (unknown) last."""
    if text is None:
        return (1, ())
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p))


def batch_order(m: BatchMetrics) -> tuple:
    """Rows by run, then batch, both in natural order (step-2 before step-10); the
    default run (no run_id) first."""
    return (m.run_id is not None, _natural(m.run_id), _natural(m.batch_id))


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
        for e in sorted(entries, key=lambda e: _natural(e.weight_version))
    ]
    text = " ".join(parts)
    while len(text) > width and len(parts) > 1:
        parts.pop(0)
        text = "… " + " ".join(parts)
    return _fit_left(text, width)


def _fit_right(text: str, width: int) -> str:
    """``text``, or its start before an ellipsis when it is too long."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _by_size(entries: list[TaskMetrics]) -> list[TaskMetrics]:
    """Tasks with the most generations first (ties by name), the unknown task last."""
    return sorted(
        entries,
        key=lambda e: (e.task is None, -e.metrics.get("spec/unique_generation_count", 0), _natural(e.task)),
    )


def tasks_text(entries: list[TaskMetrics] | None, width: int) -> str:
    """Accept rate per task, the largest tasks first, as many as fit, then "…":
    ``gsm8k .88 chat .71 …`` (``?``: the unknown task)."""
    if not entries:
        return "-"
    parts = [
        f"{_fit_right(e.task or '?', _TASK_NAME)} {_rate(e.metrics.get('spec/accept_rate'))}" for e in _by_size(entries)
    ]
    cut = False
    while len(parts) > 1 and len(" ".join(parts) + (" …" if cut else "")) > width:
        parts.pop()
        cut = True
    return _fit_right(" ".join(parts) + (" …" if cut else ""), width)


def positions_text(rates: list[float] | None, width: int = 80) -> str:
    """Acceptance by draft position, first position first: ``.81 .62 .40`` (as many as fit, then …)."""
    if not rates:
        return "-"
    parts = [_rate(r) for r in rates[:_MAX_POSITIONS]]
    cut = len(parts) < len(rates)
    while parts and len(" ".join(parts) + (" …" if cut else "")) > width:
        parts.pop()
        cut = True
    return " ".join(parts) + (" …" if cut else "") if parts else "…"


_SEPARATORS = "-_./:@"


def _run_suffixes(batches: list[BatchMetrics]) -> dict[str, int]:
    """For each run id shown, the length of its end that tells it from the other runs:
    what follows their common prefix, from the separator before it (``-2`` of
    ``grpo-7-attempt-2`` beside ``grpo-7-attempt-3``); 0 when a single run is shown."""
    runs = sorted({m.run_id for m in batches if m.run_id is not None})
    if len(runs) < 2:
        return dict.fromkeys(runs, 0)
    start = next((i for i, chars in enumerate(zip(*runs, strict=False)) if len(set(chars)) > 1), min(map(len, runs)))
    if start == 0:  # they differ from their first character, which the label's start keeps
        return dict.fromkeys(runs, 0)
    for back in range(1, 9):  # to the separator before it, a few characters at most
        if start - back >= 0 and runs[0][start - back] in _SEPARATORS:
            start -= back
            break
    return {run: len(run) - start for run in runs}


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


def _count(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 100_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:.0f}"


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
    known = {
        mark: metrics[key]
        for mark, key in (("a", "spec/accept_count_coverage"), ("v", "spec/verify_count_coverage"))
        if isinstance(metrics.get(key), (int, float))
    }
    if not known:
        return "-"
    lowest = min(known.values())
    text = f"{math.floor(lowest * 100 + 1e-9):.0f}%"
    if len(known) == 2 and known["a"] != known["v"]:
        return text + ("a" if known["a"] < known["v"] else "v")
    return text


class _Layout:
    """Column widths of a table ``total`` columns wide, in the order things give way:
    the per-position column goes first, then the per-task column (it only takes what
    the batch labels and the drift view leave), then (below 100 columns) the
    generation count; the drift view shrinks before the batch labels do, and a label
    is never cut below what tells it from the other rows; c/i/l and close are never cut."""

    def __init__(self, total: int, shown: list[BatchMetrics]) -> None:
        revision_w = max([3] + [len(str(m.revision)) for m in shown])
        self.fixed = [(name, revision_w if name == "rev" else w) for name, w in _fixed(total)]
        self.fixed.append(("c/i/l", max([5] + [len(_problems(m)) for m in shown])))
        self.fixed.append(("close", max([5] + [len(_close(m)) for m in shown])))
        room = max(20, total - sum(w for _, w in self.fixed) - _GAP * (len(self.fixed) + 1))
        labels = [_label(m, {})[0] for m in shown]
        drifts = [drift_text(m.by_weight_version, 200) for m in shown]
        positions = [positions_text(m.accept_rate_by_position) for m in shown]
        batch_need = max([len(s) for s in labels] + [10])
        drift_need = max([len(s) for s in drifts] + [10])
        pos_need = max([len(s) for s in positions] + [3])
        self.tasks = 0
        if any(m.by_task for m in shown):
            task_need = max(len(tasks_text(m.by_task, 200)) for m in shown)
            spare = room - batch_need - drift_need - _GAP
            if spare >= _MIN_TASKS:
                self.tasks = min(task_need, spare)
                room -= self.tasks + _GAP
        self.positions = 0
        if any(m.accept_rate_by_position for m in shown):
            spare = room - batch_need - _GAP - pos_need
            if spare >= min(drift_need, _DRIFT_BEFORE_POSITIONS):
                self.positions = pos_need
                room -= pos_need + _GAP
        if batch_need + drift_need <= room:
            self.batch, self.drift = batch_need, drift_need
            return
        batch = min(batch_need, max(10, room - drift_need, room // 2))
        while batch < min(batch_need, room - 10) and not _distinct(fit_labels(shown, batch), labels):
            batch += 1
        self.batch, self.drift = batch, max(10, room - batch)


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


def metrics_table(latest: dict[Any, BatchMetrics], rows: int = 20, width: int = 80, title: str | None = None) -> Any:
    """The ``rows`` most recently updated batches of ``latest`` (in the order they were
    updated), as a rich Table no wider than ``width``, sorted by run and batch
    (``batch_order``)."""
    from rich import box
    from rich.table import Table

    shown = sorted(list(latest.values())[-rows:] if rows else [], key=batch_order)
    layout = _Layout(width, shown)
    table = Table(
        title=title or f"specmeter: latest {len(shown)} batches",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
        caption=LEGEND
        + (" · pos: accept rate by draft position" if layout.positions else "")
        + (" · task: accept rate by task" if layout.tasks else "")
        + " · drift: accept rate by version",
    )
    table.add_column("batch", width=layout.batch, no_wrap=True, overflow="ellipsis")
    for name, w in layout.fixed:
        table.add_column(name, width=w, justify="right", no_wrap=True, overflow="ellipsis")
    if layout.positions:
        table.add_column("pos", width=layout.positions, no_wrap=True, overflow="ellipsis")
    if layout.tasks:
        table.add_column("task", width=layout.tasks, no_wrap=True, overflow="ellipsis")
    table.add_column("drift", width=layout.drift, no_wrap=True, overflow="ellipsis")

    for m, label in zip(shown, fit_labels(shown, layout.batch), strict=True):
        cells = _cells(m)
        extra = [positions_text(m.accept_rate_by_position, layout.positions)] if layout.positions else []
        if layout.tasks:
            extra.append(tasks_text(m.by_task, layout.tasks))
        table.add_row(
            label,
            *(cells[name] for name, _ in layout.fixed),
            *extra,
            drift_text(m.by_weight_version, layout.drift),
            style=None if m.complete else "yellow",
        )
    return table


def task_table(results: list[BatchMetrics], width: int = 80, title: str | None = None) -> Any:
    """The by-task view (``specmeter aggregate``'s table): a row per batch and task (the
    largest tasks first, the unknown task last, ``?``), with its accept rate, tokens per
    verify step, accept coverage and generation count, and, where there is room, the
    tokens per verify step by draft budget (``1.65 2.07 2.36``, budgets 1, 2, 3 ...).
    None when no batch has a task breakdown."""
    from rich import box
    from rich.table import Table

    rows = [(m, e) for m in sorted(results, key=batch_order) for e in _by_size(m.by_task or [])]
    if not rows:
        return None
    fixed = (("accept", 6), ("tok/v", 5), ("cov", 4), ("gens", 5))
    room = max(20, width - sum(w for _, w in fixed) - _GAP * (len(fixed) + 3))
    batches = [m for m, _ in rows]
    labels = [_label(m, {})[0] for m in batches]
    names = [e.task or "?" for _, e in rows]
    budgets = [positions_text(e.tokens_per_verify_by_budget) for _, e in rows]
    batch_w = min(max(map(len, labels)), max(10, room // 3))
    task_w = min(max(map(len, names)), max(8, room // 3))
    budget_w = min(max(map(len, budgets)), room - batch_w - task_w - _GAP)
    if budget_w < 9:  # no room for a curve of two budgets: the column gives way
        budget_w = 0
        task_w = min(max(map(len, names)), room - batch_w)
    table = Table(
        title=title or "by task",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
        caption="? unknown task" + (" · by budget: with a budget of 1, 2, ... draft tokens" if budget_w else ""),
    )
    table.add_column("batch", width=batch_w, no_wrap=True, overflow="ellipsis")
    table.add_column("task", width=task_w, no_wrap=True, overflow="ellipsis")
    for name, w in fixed:
        table.add_column(name, width=w, justify="right", no_wrap=True, overflow="ellipsis")
    if budget_w:
        table.add_column("tok/v by budget", width=budget_w, no_wrap=True, overflow="ellipsis")
    fitted = fit_labels(batches, batch_w)
    previous = None
    for (m, e), label, name in zip(rows, fitted, names, strict=True):
        shown_label = "" if m is previous else label  # a batch's name on its first row only
        previous = m
        x = e.metrics
        cells = [
            _ratio(x.get("spec/accept_rate")),
            _ratio(x.get("spec/tokens_per_verify")),
            _share(x.get("spec/accept_count_coverage")),
            _count(x.get("spec/unique_generation_count")),
        ]
        if budget_w:
            cells.append(positions_text(e.tokens_per_verify_by_budget, budget_w))
        table.add_row(shown_label, _fit_right(name, task_w), *cells)
    return table


def _share(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


class RowPrinter:
    """Rows for a pipe, one line per message as it arrives (``tail … | head``, ``| grep``):
    a header line first, then the fixed cells of ``metrics_table`` in columns of a
    width fixed up front (so rows line up without knowing the rows to come), the
    ``run/batch`` label elided to its column and the drift view in what is left."""

    def __init__(self, width: int) -> None:
        self.fixed = [*_fixed(width), ("c/i/l", 8), ("close", 8)]
        cells = sum(w for _, w in self.fixed) + _GAP * (len(self.fixed) + 1)
        self.label = max(10, min(32, (width - cells) * 2 // 3))
        self.drift = max(10, width - cells - self.label)

    def _line(self, label: str, cells: dict[str, str], drift: str) -> str:
        fixed = "  ".join(cells[name].rjust(w) for name, w in self.fixed)
        return f"{label.ljust(self.label)}  {fixed}  {drift}".rstrip()

    def header(self) -> str:
        return self._line("batch", {name: name for name, _ in self.fixed}, "drift")

    def row(self, m: BatchMetrics) -> str:
        return self._line(batch_label(m, self.label), _cells(m), drift_text(m.by_weight_version, self.drift))
