"""``specmeter advise``: reads published metrics, calls the advice library
(``specmeter.streams.advice``), prints what it returns (docs/advise.md).

Nothing is computed here: the budget curves, the recommendation, the staleness curve, the
refresh interval, the engine settings, the JSON document, the lines around the tables and
the plot are the library's; this module parses the options, reads a file, stdin or the
metrics topic, and prints (the tables through rich, ``--json``, ``--plot``).
"""

from __future__ import annotations

import math
import os
import stat
import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from specmeter.schemas import BatchMetrics

from . import preflight
from .base import (
    DEFAULTS,
    KAFKA_ENV_HELP,
    Command,
    CommandFailed,
    Number,
    broker_option,
    folded,
    input_name,
    one_line_errors,
    run_id,
)

if TYPE_CHECKING:  # imported on first use (``__getattr__``, below; the functions' own imports)
    from ..advice import Advice, TextTable

__all__ = ["advise_command"]


def __getattr__(name: str) -> Any:
    """The advice library's names (``streams.advice.__all__``), importable from here as before
    issue 45 (tests/test_advise.py): imported on first use, so that building the command line
    (every command, the worker's too) does not import the advice code."""
    if not name.startswith("__"):
        from .. import advice

        if name in advice.__all__:
            return getattr(advice, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the command --


class OptionRefused(CommandFailed):
    """An option's value the command does not take, said in one line (a usage error)."""

    exit_code = 2


class Cost(Number):
    """``--draft-cost`` and ``--refresh-cost``: the CLI's number type, refusing anything but a
    finite number >= 0 in one line (``OptionRefused``) rather than click's usage block."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)
        if not (math.isfinite(number) and number >= 0):
            flag = param.opts[0] if param is not None and param.opts else "the cost"
            raise CostRefused(f"{flag} must be a finite number >= 0, not {number!r}", ctx=ctx, param=param)
        return number


class CostRefused(click.BadParameter):
    """A cost refused: said in one line, not click's usage block (the value is the user's
    number, whose fix needs no usage)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"specmeter advise: {self.message}", err=True)


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
    type=click.Choice(["task", "weight_version", "draft_lag"]),
    default=None,
    help="One row per task, weight version or draft lag, from the batches' by_task / by_weight_version / "
    "by_draft_lag entries, as one matrix of groups by budgets (default: one curve for the whole batches). "
    "draft_lag adds the staleness curve: accept rate and tokens per verify step per lag.",
)
@click.option(
    "--draft-cost",
    type=Cost(),
    default=None,
    metavar="C",
    help="The time of one draft step relative to one target forward pass (decode, at your serving batch size): "
    "time both from a profile or the engine's step timings and divide; about 0 for NGRAM, a small share for an "
    "EAGLE head, roughly the parameter ratio for a separate draft model. Adds the expected speedup over no "
    "speculation, tokens/verify / (1 + C*k), the recommended budget (0: turn speculation off) and the engine "
    "settings that apply it. A finite number >= 0.",
)
@click.option(
    "--refresh-cost",
    type=Cost(),
    default=None,
    metavar="R",
    help="With --by draft_lag: what one draft refresh costs, in verify steps (the refresh's seconds times the "
    "fleet's verify steps per second: a batch's spec/verify_total over its rollout seconds; docs/advise.md). "
    "Adds after how many policy updates a refresh pays for itself. A finite number >= 0.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE.svg",
    help="Also draw the speedup (tokens per verify step without --draft-cost) against the budget per group, "
    "and with --by draft_lag the staleness curve, to FILE.svg (an SVG file).",
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
    refresh_cost: float | None,
    plot: str | None,
    as_json: bool,
) -> None:
    """Which draft budget would pay, or whether to speculate at all: per budget k, tokens per verify step.

    Reads published metrics: FILE (BatchMetrics JSON lines, e.g. `specmeter
    aggregate --format jsonl` or `specmeter tail --json` output; '-' for stdin),
    stdin when it is a pipe or a file and no FILE, --broker or --topic is given
    (`advise < metrics.jsonl`), or else the metrics topic at --broker. Sums the acceptance
    histograms of the run's last --last batches (never averaging curves) and
    prints, per budget k up to the one the fleet ran, the tokens per verify
    step it would have given (docs/contract.md, draft budget); with
    --draft-cost, the expected speedup against k=0 (no speculation), the
    recommended k and the SGLang, vLLM and TensorRT-LLM settings for it. The
    curve is exact for chain drafters (EAGLE/MTP chains, NGRAM, a draft model),
    an upper bound for tree drafters (EAGLE-2/3 trees), and says nothing about
    budgets above the one the fleet ran. docs/advise.md explains it all.
    """
    if refresh_cost is not None and by != "draft_lag":
        raise OptionRefused("--refresh-cost needs --by draft_lag (the staleness curve it is weighed against)")
    if plot is not None:
        _check_plot(plot)
    from ..advice import advise

    metrics = _metrics(file, broker, topic)
    advice = advise(metrics, run_id=run_id, last=last, by=by, draft_cost=draft_cost, refresh_cost=refresh_cost)
    _print(advice, plot, as_json)


def _metrics(file: IO[bytes] | None, broker: str, topic: str) -> Iterable[BatchMetrics]:
    """What the command reads: FILE, stdin where it is meant (``_stdin_meant``), or the topic."""
    from ..advice import metrics_from_lines

    if file is None and _stdin_meant(click.get_current_context()):
        file = click.get_binary_stream("stdin")
    if file is not None:
        return metrics_from_lines(file, input_name(file))
    return _read_topic(broker, topic)


def _print(advice: Advice, plot: str | None, as_json: bool) -> None:
    """What the command prints: the plot first (``--plot``), then the JSON document or the
    terminal's text and where the plot went."""
    from ..advice import advice_json

    if plot is not None:
        _write_plot(plot, advice)
    if as_json:
        sys.stdout.buffer.write(advice_json(advice))
        return
    _print_advice(advice)
    if plot is not None:
        click.echo(f"plot written to {plot}")


def _check_plot(plot: str) -> None:
    """``--plot``: an SVG file in a folder that exists and can be written, checked before
    anything is read (issue 47.5: a missing folder was a traceback after the advice)."""
    if not plot.lower().endswith(".svg"):
        raise OptionRefused(f"--plot writes an SVG file: give a FILE ending in .svg, not {plot!r}")
    folder = os.path.dirname(os.path.abspath(plot))
    if not os.path.isdir(folder):
        fix = "create it first, or give a FILE.svg in another folder"
        raise OptionRefused(f"--plot {plot}: the folder {folder} does not exist", fix)
    if not os.access(folder, os.W_OK) or (os.path.exists(plot) and not os.access(plot, os.W_OK)):
        raise OptionRefused(f"--plot {plot}: permission denied", "give a FILE.svg in a folder you can write to")


def _write_plot(plot: str, advice: Advice) -> None:
    """The plot written; a failure checked for before (the folder gone meanwhile, a full
    disk) said in one line."""
    from ..advice import advice_svg

    try:
        with open(plot, "w", encoding="utf-8") as out:
            out.write(advice_svg(advice))
    except OSError as exc:
        raise CommandFailed(f"cannot write --plot {plot}: {exc.strerror}", "give another FILE.svg") from None


def _stdin_meant(ctx: click.Context) -> bool:
    """Whether the metrics come on stdin though no FILE says '-': stdin is a pipe or a
    redirected file (``advise < metrics.jsonl``, issue 47.5: it was ignored for the default
    broker) and neither --broker nor --topic (nor their variables) names a topic to read.
    A terminal, /dev/null or a closed stdin is not input."""
    named = ("broker", "topic")
    if any(ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None) for name in named):
        return False
    return _stdin_is_data()


def _stdin_is_data() -> bool:
    """Whether stdin is a pipe or a regular file (not a terminal, /dev/null or closed)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _print_advice(advice: Advice) -> None:
    """The advice on the terminal: what was read, the tables, then the recommendation and
    what the curve can say."""
    from rich.console import Console

    from ..advice import Verbatim, advice_notes, advice_tables

    console = Console()
    first, *rest = advice_notes(advice)
    console.print(first, highlight=False)
    for table in advice_tables(advice):
        console.print(_rich_table(table))
    for line in rest:
        console.print(line, highlight=False, soft_wrap=isinstance(line, Verbatim))


def _rich_table(t: TextTable) -> Any:
    """A table of the library's rows as rich draws it: a simple head, no edge, the title left."""
    from rich import box
    from rich.table import Table

    table = Table(title=t.title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
    for header, justify in t.columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for cells, bold in t.rows:
        table.add_row(*cells, style="bold" if bold else None)
    return table


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
