"""The advice in words: the terminal's tables as plain rows, and the lines around them.

No terminal here: ``TextTable`` is what a table shows (title, columns, rows, the bold row),
which the command hands to rich; ``advice_notes`` the lines before and after the tables
(the recommendation in words, the engine settings, the refresh interval, what the curve
can say). ``Verbatim`` marks a line never to be wrapped (an engine's command line).
"""

from __future__ import annotations

import msgspec

from ._budget import SPEEDUP_DECIMALS, BudgetPoint, budgets_text, engine_settings, printed, recommendation_text
from ._model import CAVEAT, Advice, Curve, group_label, shown_value
from ._staleness import LagPoint, RefreshPlan, Staleness

__all__ = ["ENGINES", "TextTable", "Verbatim", "advice_notes", "advice_tables"]


class TextTable(msgspec.Struct):
    """One table as the terminal shows it: a title, columns (header and justification),
    rows of cells, and whether each row is bold (the recommended budget)."""

    title: str
    columns: list[tuple[str, str]] = msgspec.field(default_factory=list)
    rows: list[tuple[list[str], bool]] = msgspec.field(default_factory=list)

    def add_column(self, header: str, justify: str = "left") -> None:
        self.columns.append((header, justify))

    def add_row(self, *cells: str, style: str | None = None) -> None:
        self.rows.append((list(cells), style == "bold"))


class Verbatim(str):
    """A line printed as it is, never wrapped at the console's width (an engine's command
    line: wrapped at 80 columns in a file or pipe, it split in two, issue 47.5); a terminal
    still folds it visually, and copies it whole."""


#: the engines' names as printed, in the order of ``engine_settings``
ENGINES = {"sglang": "SGLang", "vllm": "vLLM", "tensorrt_llm": "TensorRT-LLM"}


def _in_words(by: str | None, none: str) -> str:
    """A breakdown as the text names it (``weight_version``: weight version), ``none``
    where the advice is not broken down."""
    return by.replace("_", " ") if by else none


def _group_name(advice: Advice, curve: Curve) -> str:
    if advice.by is None:
        return "all generations"
    return f"{advice.by.replace('_', ' ')} {group_label(advice.by, curve.group)}"


def _table(advice: Advice, curve: Curve) -> TextTable:
    """One curve as rows of budgets, budget 0 (no speculation) first."""
    table = TextTable(title=f"{_group_name(advice, curve)}: {curve.verify_steps:,} verify steps")
    _budget_columns(table, advice.draft_cost)
    for point in curve.points_from_0(advice.draft_cost is not None):
        table.add_row(*_point_cells(curve, point), style="bold" if point.budget == curve.best else None)
    return table


def _budget_columns(table: TextTable, draft_cost: float | None) -> None:
    """The budget, its tokens per verify step, with a draft cost its speedup, and its marks."""
    table.add_column("budget k", justify="right")
    table.add_column("tokens/verify", justify="right")
    if draft_cost is not None:
        table.add_column(f"speedup (c={draft_cost:g})", justify="right")
    table.add_column("")


def _point_cells(curve: Curve, point: BudgetPoint) -> list[str]:
    """A budget's row: k, tokens per verify step, the speedup if known, and its marks."""
    speedup = [] if point.speedup is None else [f"{printed(point.speedup)}×"]
    return [str(point.budget), f"{point.tokens_per_verify:.3f}", *speedup, ", ".join(_marks(curve, point.budget))]


def _marks(curve: Curve, budget: int) -> list[str]:
    """What the last column says of a budget: the recommended one, those that tie with it,
    no speculation, the one the fleet ran."""
    marks = _rank_marks(curve, budget)
    if budget == 0:
        marks.append("no speculation")
    if budget == curve.budget_ran:
        marks.append("the fleet ran this")
    return marks


def _rank_marks(curve: Curve, budget: int) -> list[str]:
    """What the recommendation says of a budget: the recommended one, or one that ties with it."""
    r = curve.recommendation
    if budget == curve.best:
        return ["◀ best"]
    if r is not None and budget in r.tied:
        return [f"ties with k={r.budget}"]
    return []


def _matrix(advice: Advice) -> TextTable:
    """Every group's curve as one row (group × budget): the speedup per budget with a draft
    cost (tokens per verify step without), the recommended budget marked per row."""
    costed = advice.draft_cost is not None
    widest = max(c.budget_ran for c in advice.curves)
    table = TextTable(title=_matrix_title(advice.by, advice.draft_cost))
    _matrix_columns(table, advice.by, widest, costed)
    for curve in advice.curves:
        table.add_row(*_matrix_row(advice.by, curve, widest, costed))
    return table


def _matrix_title(by: str | None, draft_cost: float | None) -> str:
    """What the matrix's cells are (the speedup at the draft cost, or tokens per verify step),
    its rows and columns, and with a draft cost what ``*`` marks."""
    what = "tokens per verify step" if draft_cost is None else f"speedup at c={draft_cost:g}"
    rows = _in_words(by, "group")
    marked = "" if draft_cost is None else ", * the recommended budget"
    return f"{what} by {rows} (rows) and budget k (columns){marked}"


def _matrix_columns(table: TextTable, by: str | None, widest: int, costed: bool) -> None:
    """The group, its verify steps, a column per budget 0 .. ``widest``, the budget it ran,
    and with a draft cost the recommendation."""
    table.add_column(_in_words(by, "group"), justify="left")
    table.add_column("verify steps", justify="right")
    for k in range(widest + 1):
        table.add_column(f"k={k}", justify="right")
    table.add_column("ran", justify="right")
    if costed:
        table.add_column("recommended", justify="left")


def _matrix_row(by: str | None, curve: Curve, widest: int, costed: bool) -> list[str]:
    """A group's row: its name, verify steps, a cell per budget up to the widest (empty
    beyond its data), the budget it ran and, costed, its recommendation."""
    cells = [group_label(by, curve.group), f"{curve.verify_steps:,}"]
    values = [shown_value(p, costed) for p in curve.points_from_0(costed)]
    cells += [_budget_cell(values, k, costed and k == curve.best) for k in range(widest + 1)]
    cells.append(str(curve.budget_ran))
    return [*cells, _row_recommendation(curve)] if costed else cells


def _budget_cell(values: list[float | None], k: int, best: bool) -> str:
    """Budget k's value, ``*`` on the recommended one; empty beyond the group's data."""
    if k >= len(values):
        return ""
    return f"{printed(values[k] or 0.0)}{'*' if best else ''}"


def _row_recommendation(curve: Curve) -> str:
    r = curve.recommendation
    if r is None:
        return ""
    text = "off (no speculation)" if not r.speculate else f"k={r.budget}"
    if r.others_tied:
        text += f", ties {budgets_text(r.others_tied)}"
    if r.at_edge:
        text += " (edge of the data)"
    return text


def _staleness_table(points: list[LagPoint]) -> TextTable:
    table = TextTable(
        title="the staleness curve: per draft lag (policy updates the draft is behind), summed over the batches"
    )
    # paired: spec/paired_verify_total, not the matrix's histogram steps (``_VERIFY_STEPS_NOTE``)
    for name in ("draft lag", "paired verify steps", "accept rate", "tokens/verify"):
        table.add_column(name, justify="right")
    for p in points:
        table.add_row(*_lag_cells(p))
    return table


def _lag_cells(p: LagPoint) -> list[str]:
    """A lag's row: the lag, its paired verify steps, its accept rate and tokens per verify
    step (``-`` where not measured)."""
    lag = "(unknown)" if p.draft_lag is None else str(p.draft_lag)
    return [lag, f"{p.verify_steps:,}", _measured(p.accept_rate), _measured(p.tokens_per_verify)]


def _measured(value: float | None) -> str:
    """A ratio of the staleness table to three decimals, ``-`` where it was not measured."""
    return "-" if value is None else f"{value:.3f}"


def advice_tables(advice: Advice) -> list[TextTable]:
    """The rich tables: a table of budgets for the one curve of unbroken-down advice, or one
    matrix of groups × budgets; with ``by="draft_lag"`` the staleness curve after it."""
    tables = []
    if advice.curves:
        tables = [_table(advice, advice.curves[0])] if advice.by is None else [_matrix(advice)]
    if advice.lag_points:
        tables.append(_staleness_table(advice.lag_points))
    return tables


def advice_notes(advice: Advice) -> list[str]:
    """The lines around the tables: what was read first; after the tables the
    recommendations and their engine settings, the refresh interval, what is missing,
    what the curve can say and how the speedup is counted."""
    return [
        _read_note(advice),
        *_verify_steps_notes(advice),
        *_recommendation_notes(advice),
        *_refresh_notes(advice.staleness),
        *_skipped_notes(advice),
        f"The curve is {CAVEAT}.",
        _cost_note(advice.draft_cost),
    ]


def _read_note(advice: Advice) -> str:
    """The first line: the run, the batches read and how their histograms were summed."""
    run = "the default run" if advice.run_id is None else f"run {advice.run_id}"
    batches = advice.batches
    span = batches[0] if len(batches) == 1 else f"{batches[0]} .. {batches[-1]}"
    by = f", one curve per {advice.by.replace('_', ' ')}" if advice.by else ""
    return f"specmeter advise: {run}, {len(batches)} batch(es) ({span}), histograms summed{by}"


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
    return [_VERIFY_STEPS_NOTE] if advice.curves and advice.lag_points else []


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
    return lines + _engine_notes(advice.by, curves)


def _engine_notes(by: str | None, curves: list[Curve]) -> list[str]:
    """The engine settings of each recommended budget, once per budget, naming its groups."""
    budgets = _groups_by_budget(by, curves)
    kind = _in_words(by, "")
    lines: list[str] = []
    for budget in sorted(budgets):
        groups = "" if by is None else f" ({kind} {', '.join(budgets[budget])})"
        lines += _engine_lines(budget, groups)
    return lines


def _groups_by_budget(by: str | None, curves: list[Curve]) -> dict[int, list[str]]:
    """Each recommended budget (0: speculation off) and the groups it is recommended for,
    so that a budget's settings are printed once."""
    budgets: dict[int, list[str]] = {}
    for curve in curves:
        budgets.setdefault(curve.best or 0, []).append(group_label(by, curve.group))
    return budgets


def _engine_lines(budget: int, groups: str) -> list[str]:
    """One budget's title line (``groups``: whom it is for), then a line per engine, never
    wrapped (``Verbatim``: a command line to copy)."""
    title = "speculation off" if budget == 0 else f"k={budget}"
    lines: list[str] = [f"Engine settings for {title}{groups}, a chain drafter:"]
    return lines + [Verbatim(f"  {ENGINES[engine]}: {text}") for engine, text in engine_settings(budget).items()]


#: the matrix's remarks in words, one line per kind (``_remarks``: the groups that should not
#: speculate, those whose budgets tie, those recommended at the edge of the data)
_REMARK_LINES = (
    "No budget beats decoding without speculation for {kind} {groups}: turn it off there.",
    "Ties within the printed precision, the smaller budget recommended (the same speedup for fewer draft "
    "tokens per step): {kind} {groups}.",
    "Recommended at the largest budget the histograms cover (the one the fleet ran): {kind} {groups}; "
    "whether a larger one pays more is beyond the data.",
)


def _matrix_recommendation_notes(advice: Advice, curves: list[Curve]) -> list[str]:
    """What the matrix's recommended column abbreviates, one line per kind of remark some group has."""
    kind = _in_words(advice.by, "group")
    remarks = zip(_remarks(advice.by, curves), _REMARK_LINES, strict=True)
    return [line.format(kind=kind, groups=", ".join(groups)) for groups, line in remarks if groups]


def _remarks(by: str | None, curves: list[Curve]) -> tuple[list[str], list[str], list[str]]:
    """The groups that should not speculate, those whose budgets tie (with the ties), and
    those recommended at the edge of the data (with the budget)."""
    off, ties, edges = [], [], []
    for curve in curves:
        r = curve.recommendation
        assert r is not None
        name = group_label(by, curve.group)
        if not r.speculate:
            off.append(name)
        if len(r.tied) > 1:
            ties.append(f"{name} ({' = '.join(f'k={k}' for k in r.tied)})")
        if r.at_edge:
            edges.append(f"{name} (k={r.budget})")
    return off, ties, edges


def _refresh_notes(s: Staleness | None) -> list[str]:
    """The refresh interval in words, or why there is none."""
    if s is None:
        return []
    if s.no_refresh is not None:
        return [f"No refresh interval: {s.no_refresh}."]
    if s.refresh is None:
        return [
            "Pass --refresh-cost R (one draft refresh, in verify steps: docs/advise.md) for the number of "
            "policy updates after which a refresh pays for itself."
        ]
    return _interval_notes(s.refresh)


def _interval_notes(plan: RefreshPlan) -> list[str]:
    """The refresh interval, what it costs against refreshing every update or as rarely as the
    lags allow, and whether it is the longest the lags measured allow."""
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
    kind = _in_words(advice.by, "it")
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
