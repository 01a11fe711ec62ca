"""``specmeter replay``: a saved dump published as its producers would have, with progress and a summary."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from . import preflight
from .base import (
    DEFAULTS,
    KAFKA_ENV_HELP,
    Command,
    CommandFailed,
    Number,
    broker_option,
    ended_by,
    exit_status,
    folded,
    one_line_errors,
    run_id_option,
)


@click.command(cls=Command, epilog=KAFKA_ENV_HELP)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True), metavar="FILE.jsonl")
@broker_option
@click.option("--topic", default=DEFAULTS.topics.records, show_default=True, help="The records topic.")
@run_id_option
@click.option(
    "--rate",
    type=Number(min=0, min_open=True),
    default=None,
    metavar="RECORDS/S",
    help="Pace the replay (default: as fast as the broker takes it).",
)
@click.option(
    "--speculative-algorithm",
    metavar="NAME",
    default=None,
    help="Name the algorithm in markers that the dump does not name one in.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@one_line_errors
def replay(
    file: str,
    broker: str,
    topic: str,
    run_id: str | None,
    rate: float | None,
    speculative_algorithm: str | None,
    no_progress: bool,
) -> None:
    """Publish a saved rollout dump to Kafka, then close every batch it left open.

    Reads what `specmeter aggregate` reads: records, marker lines (sent as the
    protocol sends markers: after that producer's records are acknowledged, to
    every partition) and SGLang outputs. Invalid lines are published as they
    are, so the worker counts them exactly as `aggregate` does. Lines that name
    no run_id are published in --run-id's run.
    """
    import asyncio

    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from specmeter.producers import PublisherSettings

    from ..fleet.dumps import DumpEncodingError
    from ..fleet.replay import ReplaySummary, replay_lines

    security = preflight.security_from_env()
    preflight.check_before_start(broker, security, records_topic=topic)
    settings = PublisherSettings(bootstrap_servers=broker, topic=topic, run_id=run_id, security=security)
    stream, total = _opened(file)
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        disable=no_progress,
        transient=False,
        console=None,
    )
    summary = ReplaySummary()
    try:
        with stream, progress:
            task = progress.add_task(f"replay {os.path.basename(file)}", total=total)
            asyncio.run(
                folded(
                    "replay",
                    replay_lines(
                        stream,
                        settings,
                        rate=rate,
                        speculative_algorithm=speculative_algorithm,
                        on_line=lambda n: progress.advance(task, n),
                        summary=summary,
                    ),
                )
            )
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (base.Stopped): the same summary
        _report_interrupted_replay(summary, interrupt)
        click.get_current_context().exit(exit_status(interrupt))
    except DumpEncodingError as exc:
        raise CommandFailed(f"cannot read {file}: {exc}", "save it as UTF-8 (e.g. Out-File -Encoding utf8)") from None
    click.echo(
        f"replayed {summary.records} records, {summary.invalid} invalid, {summary.markers} markers from "
        f"{summary.producers} producer(s) in {summary.seconds:.1f}s; closed {summary.batches_closed_at_end} "
        f"open batch(es) at the end",
        err=True,
    )


def _opened(file: str) -> tuple[Any, int | None]:
    """The dump to read and its size for the progress bar: stdin (size unknown) for '-'."""
    if file == "-":
        return sys.stdin.buffer, None
    return open(file, "rb"), os.path.getsize(file)


def _report_interrupted_replay(summary: Any, interrupt: KeyboardInterrupt, shown: int = 5) -> None:
    """Ctrl-C or SIGTERM: what was sent, and which batches the worker will close only by timeout."""
    by = ended_by(interrupt)
    click.echo(
        f"specmeter replay: {by} after {summary.seconds:.1f}s: sent {summary.records:,} records, "
        f"{summary.invalid:,} invalid, {summary.markers:,} marker(s) from {summary.producers} producer(s) "
        f"({summary.acknowledged:,} records and invalid lines acknowledged by Kafka)",
        err=True,
    )
    if summary.half_sent:
        _warn_half_sent([batch if run is None else f"{run}/{batch}" for run, batch in summary.half_sent], shown)


def _warn_half_sent(names: list[str], shown: int) -> None:
    """The batches left without their markers (the first ``shown``), and how the worker closes them."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    click.echo(
        f"specmeter replay: warning: {len(names)} batch(es) left half-sent, their markers not sent: "
        f"{', '.join(names[:shown])}{more}",
        err=True,
    )
    click.echo(
        f"  the worker closes them after its --batch-timeout ({DEFAULTS.batch_timeout_s:g} s by default) "
        "as 'timeout', incomplete",
        err=True,
    )
