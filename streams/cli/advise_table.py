"""``specmeter advise``'s terminal output: one rich table per curve, and what the curve can say."""

from __future__ import annotations

from typing import Any

from .advise import CAVEAT, Advice, Curve

__all__ = ["advice_tables", "advice_notes"]


def _group_name(advice: Advice, curve: Curve) -> str:
    if advice.by is None:
        return "all generations"
    name = "(unknown)" if curve.group is None else curve.group
    return f"{advice.by.replace('_', ' ')} {name}"


def _table(advice: Advice, curve: Curve) -> Any:
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
    for point in curve.points:
        marks = []
        if point.budget == curve.best:
            marks.append("◀ best")
        if point.budget == curve.budget_ran:
            marks.append("the fleet ran this")
        speedup = [] if point.speedup is None else [f"{point.speedup:.3f}×"]
        table.add_row(
            str(point.budget),
            f"{point.tokens_per_verify:.3f}",
            *speedup,
            ", ".join(marks),
            style="bold" if point.budget == curve.best else None,
        )
    return table


def advice_tables(advice: Advice) -> list[Any]:
    """A rich Table per curve: per budget k the tokens per verify step, the speedup with a
    draft cost, the best budget and the one the fleet ran marked."""
    return [_table(advice, curve) for curve in advice.curves]


def advice_notes(advice: Advice) -> list[str]:
    """The lines around the tables: what was read, what the curve can say, what is missing."""
    run = "the default run" if advice.run_id is None else f"run {advice.run_id}"
    batches = advice.batches
    span = batches[0] if len(batches) == 1 else f"{batches[0]} .. {batches[-1]}"
    by = f", one curve per {advice.by.replace('_', ' ')}" if advice.by else ""
    notes = [f"specmeter advise: {run}, {len(batches)} batch(es) ({span}), histograms summed{by}"]
    for group, reason in advice.skipped:
        name = "(unknown)" if group is None else group
        notes.append(f"no curve for {advice.by.replace('_', ' ') if advice.by else 'it'} {name}: {reason}")
    notes.append(f"The curve is {CAVEAT}.")
    if advice.draft_cost is None:
        notes.append(
            "Pass --draft-cost C (one draft step's time over one target forward pass) to rank the budgets "
            "by expected speedup, tokens/verify / (1 + C·k)."
        )
    else:
        notes.append(
            f"speedup = tokens/verify / (1 + {advice.draft_cost:g}·k): over decoding without speculation, "
            "counting k draft steps and one verify pass per step."
        )
    return notes
