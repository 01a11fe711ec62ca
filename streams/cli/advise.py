"""``specmeter advise``: which draft budget a run's own acceptance histograms favour.

Pure: published BatchMetrics in, one curve per group out. Of one run, the newest
revision of each batch is kept and the last ``last`` batches (natural order of their
ids, as ``tail`` sorts them: ``step-2`` before ``step-10``) are read; their
acceptance histograms are **summed** — the whole batch's, or with ``by`` each
``by_task`` / ``by_weight_version`` entry's under its name — and each sum H gives the
curve of docs/contract.md §3.5: the tokens per verify step with a budget of k draft
tokens, ``E_k = (S + sum_i min(i, k) * H[i]) / S`` (S = sum(H)) for k = 1 .. len(H) - 1.
Curves are never averaged: a batch weighs what its verify steps weigh.

Given the cost c of one draft step relative to one target forward pass, a step with
budget k costs ``1 + c * k`` target passes and yields ``E_k`` tokens where plain
decoding yields 1, so the expected speedup over no speculation is ``E_k / (1 + c * k)``
(the verify pass over k + 1 tokens is taken to cost one decode step, as it does while
decoding is memory-bound); the best budget is the one with the greatest speedup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import EllipsisType
from typing import IO, Any

import click
import msgspec

from specmeter.schemas import BatchMetrics, decode_metrics

from ..core.merge import tokens_per_verify_by_budget
from ..core.state import add_histograms
from ..errors import SpecmeterError
from . import preflight
from .base import DEFAULTS, KAFKA_ENV_HELP, Command, Number, broker_option, folded, input_name, one_line_errors, run_id
from .tables import batch_order

__all__ = [
    "Advice",
    "AdviceError",
    "BudgetPoint",
    "Curve",
    "BREAKDOWNS",
    "CAVEAT",
    "advise",
    "budget_curve",
    "metrics_from_lines",
    "advice_tables",
    "advice_notes",
    "advise_command",
]

#: what ``by`` may name: the breakdown of a BatchMetrics, and the attribute naming its entries
BREAKDOWNS = {"task": ("by_task", "task"), "weight_version": ("by_weight_version", "weight_version")}

#: what the curve can and cannot say (docs/contract.md §3.5)
CAVEAT = (
    "exact for chain drafters (EAGLE/MTP chains, NGRAM, a draft model: the first k drafts of a step do not "
    "depend on how many follow); an upper bound for tree drafters (EAGLE-2/3 trees: a smaller budget may prune "
    "the accepted branch); silent on budgets above the one the fleet ran (its histograms' width minus one)"
)


class AdviceError(SpecmeterError, ValueError):
    """The published metrics cannot give a curve: the message says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class BudgetPoint:
    """One candidate budget k: tokens per verify step, and the speedup when a draft cost is given."""

    budget: int
    tokens_per_verify: float
    speedup: float | None = None


@dataclass(frozen=True)
class Curve:
    """The curve of one group's summed histogram (``group``: a task or weight version, None
    for the unknown one, or for the whole batches when the advice is not broken down)."""

    group: str | None
    histogram: list[int]
    points: list[BudgetPoint]
    #: the budget the fleet ran, as its histograms say: their width minus one
    budget_ran: int
    #: the budget with the greatest speedup (None without a draft cost)
    best: int | None = None

    @property
    def verify_steps(self) -> int:
        return sum(self.histogram)


@dataclass(frozen=True)
class Advice:
    """Curves of one run's last batches."""

    run_id: str | None
    #: the batch ids read, oldest first
    batches: list[str]
    by: str | None
    draft_cost: float | None
    curves: list[Curve]
    #: groups without a curve, and why (no histogram, no verify step, a single bin)
    skipped: list[tuple[str | None, str]] = field(default_factory=list)

    def as_document(self) -> dict[str, Any]:
        """The advice as JSON-ready builtins (``--json``)."""
        return {
            "run_id": self.run_id,
            "batches": self.batches,
            "by": self.by,
            "draft_cost": self.draft_cost,
            "caveat": CAVEAT,
            "curves": [_curve_document(c, self.by) for c in self.curves],
            "skipped": [{**_named(self.by, group), "reason": reason} for group, reason in self.skipped],
        }


def _curve_document(c: Curve, by: str | None) -> dict[str, Any]:
    """One curve as JSON-ready builtins, named by its group where the advice is broken down."""
    return {
        **_named(by, c.group),
        "verify_steps": c.verify_steps,
        "accept_histogram": c.histogram,
        "budget_ran": c.budget_ran,
        "best_budget": c.best,
        "budgets": [
            {"budget": p.budget, "tokens_per_verify": p.tokens_per_verify, "speedup": p.speedup} for p in c.points
        ],
    }


def _named(by: str | None, group: str | None) -> dict[str, str | None]:
    """The group under the breakdown's name (``{"task": "gsm8k"}``); nothing where the advice is not broken down."""
    return {by: group} if by else {}


def budget_curve(histogram: list[int], draft_cost: float | None = None) -> list[BudgetPoint]:
    """Tokens per verify step for every budget a summed histogram can speak for, and with
    ``draft_cost`` the expected speedup ``E_k / (1 + draft_cost * k)``; empty when the
    histogram has fewer than two bins or no step."""
    curve = tokens_per_verify_by_budget(histogram) or []
    return [
        BudgetPoint(k, tokens, None if draft_cost is None else tokens / (1 + draft_cost * k))
        for k, tokens in enumerate(curve, start=1)
    ]


def _curve(group: str | None, histograms: list[list[int] | None], draft_cost: float | None) -> Curve | str:
    """One group's curve, or why it has none."""
    summed = add_histograms(histograms)
    if summed is None:
        return "no acceptance histogram"
    if sum(summed) == 0:
        return "no verify step in its histograms"
    if len(summed) < 2:
        return "histograms of one bin (no draft token was ever proposed)"
    points = budget_curve(summed, draft_cost)
    return Curve(group, summed, points, len(summed) - 1, _best(points, draft_cost))


def _best(points: list[BudgetPoint], draft_cost: float | None) -> int | None:
    """The budget with the greatest speedup (the smaller one on a tie); None without a draft cost."""
    if draft_cost is None:
        return None
    return max(points, key=lambda p: (p.speedup, -p.budget)).budget


def _run_name(run_id: str | None) -> str:
    return "the default run (no run_id)" if run_id is None else f"run {run_id!r}"


def _runs_text(runs: Iterable[str | None]) -> str:
    names = sorted("(default run)" if r is None else r for r in runs)
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _newest(metrics: Iterable[BatchMetrics]) -> dict[tuple[str | None, str], BatchMetrics]:
    newest: dict[tuple[str | None, str], BatchMetrics] = {}
    for m in metrics:
        key = (m.run_id, m.batch_id)
        if key not in newest or m.revision > newest[key].revision:
            newest[key] = m
    return newest


def _choose_run(runs: set[str | None], run_id: str | EllipsisType | None) -> str | None:
    """The run asked for, or the only one there; an error that names the runs otherwise."""
    if not runs:
        raise AdviceError(
            "no published batch to read",
            "give `specmeter aggregate --format jsonl` or `specmeter tail --json` output, or a metrics topic "
            "that a worker has published to (--broker, --topic)",
        )
    if run_id is ...:
        return _only_run(runs)
    if run_id not in runs:
        raise AdviceError(
            f"no batch of {_run_name(run_id)} in the metrics (runs there: {_runs_text(runs)})",
            "check --run-id (env SPECMETER_RUN_ID); --run-id '' is the default run",
        )
    return run_id


def _only_run(runs: set[str | None]) -> str | None:
    """The one run the metrics hold, when none was asked for."""
    if len(runs) > 1:
        raise AdviceError(
            f"the metrics hold {len(runs)} runs: {_runs_text(runs)}",
            "pick one with --run-id ID (env SPECMETER_RUN_ID); --run-id '' is the default run",
        )
    return next(iter(runs))


def advise(
    metrics: Iterable[BatchMetrics],
    *,
    run_id: str | EllipsisType | None = ...,
    last: int = 20,
    by: str | None = None,
    draft_cost: float | None = None,
) -> Advice:
    """The budget curves of one run's last batches.

    Args:
        metrics: published BatchMetrics, any order, repeats and several revisions allowed.
        run_id: the run (None: the default run); omitted, the only run the metrics hold.
        last: how many of the run's batches to read, the last in natural order of their
            ids (0: all of them).
        by: None for the whole batches, or a key of ``BREAKDOWNS`` (one curve per task
            or weight version, from the breakdown entries' histograms).
        draft_cost: the cost of one draft step relative to one target forward pass; gives
            each budget's speedup and the best budget.

    Raises:
        AdviceError: no batch, several runs and none chosen, an unknown run, no
            breakdown or no histogram in the batches read.
    """
    if by is not None and by not in BREAKDOWNS:
        raise ValueError(f"by must be one of {sorted(BREAKDOWNS)} or None, not {by!r}")
    newest = _newest(metrics)
    run = _choose_run({r for r, _ in newest}, run_id)
    batches = _last_batches(newest, run, last)
    ids = [m.batch_id for m in batches]
    curves, skipped = _curves(_histograms(batches, by, run), draft_cost)
    if not curves:
        raise _no_curve(run, ids, skipped)
    return Advice(run, ids, by, draft_cost, curves, skipped)


def _last_batches(newest: dict[tuple[str | None, str], BatchMetrics], run: str | None, last: int) -> list[BatchMetrics]:
    """The run's last ``last`` batches in natural order of their ids (0: all of them)."""
    batches = sorted((m for (r, _), m in newest.items() if r == run), key=batch_order)
    return batches[-last:] if last else batches


def _no_curve(run: str | None, ids: list[str], skipped: list[tuple[str | None, str]]) -> AdviceError:
    """Why the batches read give no curve at all: every group's reason, and what gives one."""
    reasons = "; ".join(sorted({reason for _, reason in skipped}))
    return AdviceError(
        f"the {len(ids)} batch(es) read of {_run_name(run)} ({ids[0]} .. {ids[-1]}) give no curve: {reasons}",
        "the curve needs SGLang 0.5.9+ (spec_correct_drafts_histogram or spec_accept_histogram in meta_info) "
        "and speculative decoding on; read more batches with --last N (0: all)",
    )


def _histograms(
    batches: list[BatchMetrics], by: str | None, run: str | None
) -> dict[str | None, list[list[int] | None]]:
    """The histograms to sum, per group: the batches' own (one group, None), or each
    breakdown entry's under its task or weight version.

    Raises:
        AdviceError: ``by`` names a breakdown none of the batches has.
    """
    if by is None:
        return {None: [m.accept_histogram for m in batches]}
    attribute, name = BREAKDOWNS[by]
    groups = _entry_histograms(batches, attribute, name)
    if not groups:
        raise _no_breakdown(len(batches), run, by, attribute)
    return groups


def _no_breakdown(read: int, run: str | None, by: str, attribute: str) -> AdviceError:
    """None of the batches read has the breakdown ``--by`` names: what the producers must give."""
    flag = "a task" if by == "task" else "a weight_version"
    return AdviceError(
        f"none of the {read} batch(es) read of {_run_name(run)} has a {attribute} breakdown",
        f"the producers must give the records {flag} (docs/contract.md); or leave out --by",
    )


def _entry_histograms(
    batches: list[BatchMetrics], attribute: str, name: str
) -> dict[str | None, list[list[int] | None]]:
    """The breakdown entries' histograms under their task or weight version, batch by batch."""
    groups: dict[str | None, list[list[int] | None]] = {}
    for m in batches:
        for entry in getattr(m, attribute) or ():
            groups.setdefault(getattr(entry, name), []).append(entry.accept_histogram)
    return groups


def _curves(
    groups: dict[str | None, list[list[int] | None]], draft_cost: float | None
) -> tuple[list[Curve], list[tuple[str | None, str]]]:
    """Each group's curve (groups by name, the unknown last), and the groups without one and why."""
    curves: list[Curve] = []
    skipped: list[tuple[str | None, str]] = []
    for group in sorted(groups, key=lambda g: (g is None, g or "")):
        made = _curve(group, groups[group], draft_cost)
        if isinstance(made, Curve):
            curves.append(made)
        else:
            skipped.append((group, made))
    return curves, skipped


def metrics_from_lines(lines: Iterable[bytes], name: str = "the input") -> Iterator[BatchMetrics]:
    """BatchMetrics from JSON lines (``specmeter aggregate --format jsonl``, ``tail --json``)
    or one JSON list (``aggregate --format json``); blank lines are skipped.

    Raises:
        AdviceError: a line (or the document) is not BatchMetrics JSON, with its number.
    """
    it = iter(lines)
    for number, line in enumerate(it, start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith(b"["):  # one JSON document: the rest of the input belongs to it
            yield from _document(b"".join([line, *it]), name, number)
            return
        yield _line(text, name, number)


def _line(text: bytes, name: str, number: int) -> BatchMetrics:
    """The BatchMetrics of line ``number``."""
    try:
        return decode_metrics(text)
    except msgspec.DecodeError as exc:
        raise _not_metrics(name, f"line {number}", exc) from None


def _document(document: bytes, name: str, number: int) -> list[BatchMetrics]:
    """The BatchMetrics of one JSON list that starts at line ``number``."""
    try:
        return msgspec.json.decode(document, type=list[BatchMetrics])
    except msgspec.DecodeError as exc:  # a ValidationError is one too
        raise _not_metrics(name, f"the JSON list from line {number}", exc) from None


def _not_metrics(name: str, where: str, exc: Exception) -> AdviceError:
    return AdviceError(
        f"{name}, {where}, is not a BatchMetrics JSON object ({exc})",
        "advise reads published metrics: `specmeter aggregate --format jsonl DUMP` or `specmeter tail --json` "
        "output, not a records dump",
    )


# -- the terminal output: one rich table per curve, and what the curve can say --


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
        table.add_row(*_point_cells(curve, point), style="bold" if point.budget == curve.best else None)
    return table


def _point_cells(curve: Curve, point: BudgetPoint) -> list[str]:
    """A budget's row: k, tokens per verify step, the speedup if known, and its marks
    (the best budget, the one the fleet ran)."""
    marks = []
    if point.budget == curve.best:
        marks.append("◀ best")
    if point.budget == curve.budget_ran:
        marks.append("the fleet ran this")
    speedup = [] if point.speedup is None else [f"{point.speedup:.3f}×"]
    return [str(point.budget), f"{point.tokens_per_verify:.3f}", *speedup, ", ".join(marks)]


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
    return [
        f"specmeter advise: {run}, {len(batches)} batch(es) ({span}), histograms summed{by}",
        *_skipped_notes(advice),
        f"The curve is {CAVEAT}.",
        _cost_note(advice.draft_cost),
    ]


def _skipped_notes(advice: Advice) -> list[str]:
    """A line per group without a curve, and why."""
    kind = advice.by.replace("_", " ") if advice.by else "it"
    return [
        f"no curve for {kind} {'(unknown)' if group is None else group}: {reason}" for group, reason in advice.skipped
    ]


def _cost_note(draft_cost: float | None) -> str:
    """How the speedup is counted, or how to get one."""
    if draft_cost is None:
        return (
            "Pass --draft-cost C (one draft step's time over one target forward pass) to rank the budgets "
            "by expected speedup, tokens/verify / (1 + C·k)."
        )
    return (
        f"speedup = tokens/verify / (1 + {draft_cost:g}·k): over decoding without speculation, "
        "counting k draft steps and one verify pass per step."
    )


# -- the command --


def _advise_run(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--run-id``: not given is every run (one is then required), '' the default run."""
    if value is None:
        return ...
    if value == "":
        return None
    return run_id(ctx, param, value)


@click.command("advise", cls=Command, epilog=KAFKA_ENV_HELP)
@click.argument("file", type=click.File("rb"), required=False, default=None, metavar="[FILE.jsonl]")
@broker_option
@click.option(
    "--topic",
    default=DEFAULTS.topics.metrics,
    show_default=True,
    help="The metrics topic to read when no FILE is given (the worker's --metrics-topic).",
)
@click.option(
    "--run-id",
    envvar="SPECMETER_RUN_ID",
    default=None,
    metavar="ID",
    callback=_advise_run,
    help="The training run whose batches to read; '' is the default run (batches that name none). "
    "Needed when the metrics hold several runs.",
)
@click.option(
    "--last",
    type=Number(0, integer=True),
    default=20,
    show_default=True,
    metavar="N",
    help="Read the run's last N batches, in natural order of their ids (step-2 before step-10), each at its "
    "newest revision; 0 reads all of them.",
)
@click.option(
    "--by",
    type=click.Choice(["task", "weight_version"]),
    default=None,
    help="One curve per task or per weight version, from the batches' by_task / by_weight_version entries "
    "(default: one curve for the whole batches).",
)
@click.option(
    "--draft-cost",
    type=Number(0),
    default=None,
    metavar="C",
    help="The time of one draft step relative to one target forward pass (decode, at your serving batch size): "
    "time both from a profile or the engine's step timings and divide; about 0 for NGRAM, a small share for an "
    "EAGLE head, roughly the parameter ratio for a separate draft model. Adds the expected speedup over no "
    "speculation, tokens/verify / (1 + C*k), and marks the best budget.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the curves as one JSON document (for scripts).")
@one_line_errors
def advise_command(
    file: IO[bytes] | None,
    broker: str,
    topic: str,
    run_id: Any,
    last: int,
    by: str | None,
    draft_cost: float | None,
    as_json: bool,
) -> None:
    """Which draft budget would pay: tokens per verify step for each budget k, from the histograms.

    Reads published metrics: FILE (BatchMetrics JSON lines, e.g. `specmeter
    aggregate --format jsonl` or `specmeter tail --json` output; '-' for stdin),
    or without FILE the metrics topic at --broker. Sums the acceptance
    histograms of the run's last --last batches (never averaging curves) and
    prints, per budget k up to the one the fleet ran, the tokens per verify
    step it would have given (docs/contract.md, draft budget); with
    --draft-cost, the expected speedup and the best k. The curve is exact for
    chain drafters (EAGLE/MTP chains, NGRAM, a draft model), an upper bound for
    tree drafters (EAGLE-2/3 trees), and says nothing about budgets above the
    one the fleet ran.
    """
    if file is not None:
        metrics: Iterable[BatchMetrics] = metrics_from_lines(file, input_name(file))
    else:
        metrics = _read_topic(broker, topic)
    advice = advise(metrics, run_id=run_id, last=last, by=by, draft_cost=draft_cost)
    if as_json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(advice.as_document()), indent=2) + b"\n")
        return
    _print_advice(advice)


def _print_advice(advice: Advice) -> None:
    """The advice on the terminal: what was read, a table per curve, then what the curve can say."""
    from rich.console import Console

    console = Console()
    first, *rest = advice_notes(advice)
    console.print(first, highlight=False)
    for table in advice_tables(advice):
        console.print(table)
    for line in rest:
        console.print(line, highlight=False)


def _read_topic(broker: str, topic: str) -> list[BatchMetrics]:
    """Every batch of every run on the metrics topic (advise names the runs there when
    --run-id is not one), read to its end, after the checks a command runs first."""
    import asyncio

    from ..readers.consume import consume_metrics

    security = preflight.security_from_env()
    preflight.check_before_start(broker, security)

    async def read() -> list[BatchMetrics]:
        stream = consume_metrics(
            broker,
            topic=topic,
            from_beginning=True,
            stop_at_end=True,
            topic_wait_s=0,
            kafka=security.aiokafka_kwargs(),
        )
        return [m async for m in stream]

    return asyncio.run(folded("advise", read()))
