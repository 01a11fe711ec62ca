"""``specmeter aggregate``: a rollout dump aggregated offline by the core the worker runs."""

from __future__ import annotations

import sys
from typing import IO, Any

import click

from specmeter.schemas import encode_metrics

from ..core.offline import LineError, OfflineAggregator
from .base import Command, CommandFailed, input_name, reader_left


@click.command(cls=Command)
@click.argument("file", type=click.File("rb"), metavar="FILE.jsonl")
@click.option(
    "--speculative-algorithm",
    metavar="NAME",
    default=None,
    help="Treat every batch as run with this algorithm (e.g. EAGLE3), as a marker naming it would.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["auto", "table", "jsonl", "json"], case_sensitive=False),
    default="auto",
    show_default=True,
    help="table: one row per batch, fitted to the terminal; jsonl: one BatchMetrics JSON object per line; "
    "json: one JSON document (a list); auto: a table on a terminal, JSON lines when piped.",
)
@click.option("--quiet", "-q", is_flag=True, help="Do not report bad lines on stderr (they are still counted).")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit with status 1 when any line is bad (for CI); the metrics are printed all the same.",
)
def aggregate(
    file: IO[bytes], speculative_algorithm: str | None, output_format: str, quiet: bool, strict: bool
) -> None:
    """Aggregate a JSON-lines rollout dump without Kafka; '-' reads stdin.

    Each line is a record (batch_id, session_id, generation_id, sample_id,
    state_hash, accepted, proposed, verify, completion, accept_histogram,
    producer_id, weight_version, run_id, task, draft_lag; missing fields are unknown), a batch marker
    ({"type": "marker", "batch_id", "producer_id", "records_sent",
    "speculative_algorithm", "expected_producers"}), or an SGLang output
    ({"meta_info": {...}, "batch_id", "session_id", "sample_id", ...}). Prints the
    BatchMetrics of each batch, in order of first appearance (the table sorts by
    run and batch, then shows them by task, by draft lag and the spread of their
    generations' tokens per verify step). A bad line is reported on stderr with its line number and
    reason, counted in its batch when the batch is readable, and never stops the
    run; the exit status is 1 when no line at all could be read (an empty file
    included), or with --strict when any line is bad; a reader that leaves early
    (`| head`) ends the output quietly and changes nothing. A UTF-8 byte-order
    mark is ignored.
    """

    def report(error: LineError) -> None:
        if not quiet:
            click.echo(f"specmeter aggregate: {error}", err=True)

    from ..fleet.dumps import parse_dump_line

    name = input_name(file)
    aggregator = OfflineAggregator(speculative_algorithm=speculative_algorithm, on_error=report, parse=parse_dump_line)
    _feed(aggregator, file, name)
    results = aggregator.results()
    _print_metrics(results, _format(output_format), f"specmeter aggregate {name}: {len(results)} batch(es)")
    _check_lines(aggregator, name, quiet, strict)


def _check_lines(aggregator: OfflineAggregator, name: str, quiet: bool, strict: bool) -> None:
    """After the output, the bad lines counted (unless ``--quiet``), and the failure they
    make: no line read at all, or with ``--strict`` any bad one."""
    if aggregator.errors and not quiet:
        click.echo(f"specmeter aggregate: {aggregator.errors} bad line(s) reported above", err=True)
    if aggregator.read == 0:
        raise _nothing_read(name, aggregator.errors)
    if strict and aggregator.errors:
        raise CommandFailed(
            f"{aggregator.errors} bad line(s) in {name} (--strict)",
            "fix the lines reported (run without --quiet to see them), or drop --strict to count them and go on",
        )


def _feed(aggregator: OfflineAggregator, file: IO[bytes], name: str) -> None:
    """Every line of the dump to the aggregator; a dump that is not UTF-8 said as such."""
    from ..fleet.dumps import DumpEncodingError, dump_lines

    try:
        aggregator.feed_lines(dump_lines(file))
    except DumpEncodingError as exc:
        raise CommandFailed(f"cannot read {name}: {exc}", "save it as UTF-8 (e.g. Out-File -Encoding utf8)") from None


def _format(output_format: str) -> str:
    """The output format asked for; ``auto`` is a table on a terminal, JSON lines when piped."""
    fmt = output_format.lower()
    if fmt == "auto":
        return "table" if sys.stdout.isatty() else "jsonl"
    return fmt


def _nothing_read(name: str, errors: int) -> CommandFailed:
    """Not one line of the dump could be read: an empty file, or every line bad."""
    a_dump = "a dump has one record, marker or SGLang output per line (`specmeter aggregate --help`)"
    if errors == 0:
        return CommandFailed(f"{name} is empty: no records to aggregate", a_dump)
    return CommandFailed(f"none of the {errors} line(s) of {name} could be read", a_dump)


def _print_metrics(results: list[Any], fmt: str, title: str) -> None:
    """``aggregate``'s output: JSON lines, one JSON document, or a table. A reader that
    leaves early (``| head -1``) ends the output quietly and leaves the exit status to
    what was read (issue 47.7: click made it 1, which says no line could be read)."""
    try:
        _write(results, fmt, title)
    except BrokenPipeError:
        reader_left()


def _write(results: list[Any], fmt: str, title: str) -> None:
    """The results in ``fmt``, flushed: JSON lines, one JSON document, or the tables (none
    for no batch)."""
    out = sys.stdout.buffer
    if fmt == "jsonl":
        out.writelines(encode_metrics(m) + b"\n" for m in results)
    elif fmt == "json":
        out.write(_json_document(results))
    elif results:
        _print_tables(results, title)
    out.flush()


def _json_document(results: list[Any]) -> bytes:
    """One JSON list, one object per line inside it: readable, and one document."""
    return b"[\n" + b",\n".join(encode_metrics(m) for m in results) + (b"\n]\n" if results else b"]\n")


def _print_tables(results: list[Any], title: str) -> None:
    """The batches' table, then the by-task view when a batch has tasks, the by-draft-lag
    view when one has lags and the spread of tokens per verify step when one has it."""
    from .tables import draft_lag_table, metrics_table, spread_table, task_table

    console = _console()
    latest = {(m.run_id, m.batch_id): m for m in results}
    console.print(metrics_table(latest, len(latest), console.width, title=title))
    batches = list(latest.values())
    views = (
        task_table(batches, console.width, title="by task"),
        draft_lag_table(batches, console.width, title="by draft lag"),
        spread_table(batches),
    )
    for view in views:
        if view is not None:
            console.print(view)


def _console() -> Any:
    """rich's console, except that a closed pipe raises BrokenPipeError for
    ``_print_metrics`` to end quietly (rich's own exits with status 1)."""
    from rich.console import Console

    class Piped(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return Piped()
