"""The ``specmeter`` command line: click wiring only; each command calls a ``run``.

Heavy imports (Faust, aiokafka, the producer) happen inside the commands that
need them, so ``specmeter --help`` and ``specmeter aggregate`` stay fast.
"""

from __future__ import annotations

import sys
from typing import IO

import click

from specmeter.schemas import encode_metrics

from ._offline import LineError, OfflineAggregator


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SPECMETER"})
@click.version_option(package_name="specmeter")
def main() -> None:
    """specmeter: correct speculative-decoding metrics for RL rollout fleets.

    Rollout workers publish one record per committed generation (accepted and
    proposed draft tokens, verify steps, completion tokens); specmeter
    deduplicates them per batch and publishes weighted metrics with coverage.

    \b
    Offline:   specmeter aggregate dump.jsonl
    """


@main.command()
@click.argument("file", type=click.File("rb"), metavar="FILE.jsonl")
@click.option(
    "--speculative-algorithm",
    metavar="NAME",
    default=None,
    help="Treat every batch as run with this algorithm (e.g. EAGLE3), as a marker naming it would.",
)
@click.option("--quiet", "-q", is_flag=True, help="Do not report bad lines on stderr (they are still counted).")
def aggregate(file: IO[bytes], speculative_algorithm: str | None, quiet: bool) -> None:
    """Aggregate a JSON-lines rollout dump without Kafka; '-' reads stdin.

    Each line is a record (batch_id, session_id, generation_id, sample_id,
    state_hash, accepted, proposed, verify, completion, accept_histogram,
    producer_id; missing fields are unknown), a batch marker
    ({"type": "marker", "batch_id", "producer_id", "records_sent",
    "speculative_algorithm", "expected_producers"}), or an SGLang output
    ({"meta_info": {...}, "batch_id", "session_id", "sample_id", ...}). Prints one BatchMetrics JSON
    object per batch, in order of first appearance. A bad line is reported on
    stderr with its line number and reason, counted in its batch when the batch
    is readable, and never stops the run.
    """

    def report(error: LineError) -> None:
        if not quiet:
            click.echo(f"specmeter aggregate: {error}", err=True)

    from specmeter.producers._dump import parse_dump_line

    aggregator = OfflineAggregator(speculative_algorithm=speculative_algorithm, on_error=report, parse=parse_dump_line)
    aggregator.feed_lines(file)
    out = sys.stdout.buffer
    for metrics in aggregator.results():
        out.write(encode_metrics(metrics) + b"\n")
    out.flush()
    if aggregator.errors and not quiet:
        click.echo(f"specmeter aggregate: {aggregator.errors} bad line(s) reported above", err=True)


def _broker_option(func):
    return click.option(
        "--broker", "-b", envvar="KAFKA_BOOTSTRAP_SERVERS", default="127.0.0.1:9092", show_default=True,
        show_envvar=True, help="Kafka bootstrap address(es), comma-separated.")(func)


def _topic_options(func):
    for name, default in reversed((("records", "specmeter.records"), ("partials", "specmeter.partials"),
                                   ("metrics", "specmeter.metrics"), ("deadletter", "specmeter.deadletter"))):
        func = click.option(f"--{name}-topic", default=default, show_default=True,
                            help=f"Name of the {name} topic.")(func)
    return func


@main.command()
@_broker_option
@_topic_options
@click.option("--app-id", default="specmeter", show_default=True,
              help="Consumer group and prefix of the worker's state topics.")
@click.option("--partitions", type=click.IntRange(1), default=8, show_default=True,
              help="Partitions of the records topic (state topics use the same).")
@click.option("--batch-timeout", type=click.FloatRange(0.1), default=60.0, show_default=True, metavar="SECONDS",
              help="Close a batch this long after its last input when its markers never complete.")
@click.option("--grace", type=click.FloatRange(0), default=300.0, show_default=True, metavar="SECONDS",
              help="Keep a closed batch this long; later records are dead-lettered as 'late'.")
@click.option("--session-timeout", type=click.FloatRange(1), default=30.0, show_default=True, metavar="SECONDS",
              help="How long a silent worker keeps its partitions before others take them.")
@click.option("--web-port", type=click.IntRange(0, 65535), default=6066, show_default=True,
              help="HTTP port for health, stats and Prometheus metrics.")
@click.option("--web-host", default="0.0.0.0", show_default=True, help="HTTP bind address.")
@click.option("--no-web", is_flag=True, help="Do not start the HTTP server.")
@click.option("--data-dir", default="/tmp/specmeter-worker", show_default=True, help="Faust's local data folder.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def worker(broker: str, records_topic: str, partials_topic: str, metrics_topic: str, deadletter_topic: str,
           app_id: str, partitions: int, batch_timeout: float, grace: float, session_timeout: float,
           web_port: int, web_host: str, no_web: bool, data_dir: str, log_level: str) -> None:
    """Run a stream worker: records topic in, BatchMetrics on the metrics topic.

    Creates missing topics, deduplicates each batch per partition (durable
    state in changelog topics), closes batches on their producers' markers or
    after --batch-timeout, and publishes one BatchMetrics JSON message per
    batch and revision. Start more workers with the same --app-id to scale out
    (up to --partitions). Stop with Ctrl-C or SIGTERM.
    """
    from .settings import TopicNames, WorkerSettings
    from .worker import run_worker

    settings = WorkerSettings(
        broker=broker, app_id=app_id, partitions=partitions, batch_timeout_s=batch_timeout, grace_s=grace,
        session_timeout_s=session_timeout, web_enabled=not no_web, web_port=web_port, web_host=web_host,
        data_dir=data_dir, log_level=log_level,
        topics=TopicNames(records=records_topic, partials=partials_topic, metrics=metrics_topic,
                          deadletter=deadletter_topic),
    )
    run_worker(settings)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True), metavar="FILE.jsonl")
@_broker_option
@click.option("--topic", default="specmeter.records", show_default=True, help="The records topic.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="RECORDS/S",
              help="Pace the replay (default: as fast as the broker takes it).")
@click.option("--speculative-algorithm", metavar="NAME", default=None,
              help="Name the algorithm in markers that the dump does not name one in.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def replay(file: str, broker: str, topic: str, rate: float | None, speculative_algorithm: str | None,
           no_progress: bool) -> None:
    """Publish a saved rollout dump to Kafka, then close every batch it left open.

    Reads what `specmeter aggregate` reads: records, marker lines (sent as the
    protocol sends markers: after that producer's records are acknowledged, to
    every partition) and SGLang outputs. Invalid lines are published as they
    are, so the worker counts them exactly as `aggregate` does.
    """
    import asyncio
    import os

    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from specmeter.producers import PublisherSettings
    from specmeter.producers._replay import replay_lines

    settings = PublisherSettings(bootstrap_servers=broker, topic=topic)
    stream = sys.stdin.buffer if file == "-" else open(file, "rb")  # noqa: SIM115
    total = None if file == "-" else os.path.getsize(file)
    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), disable=no_progress, transient=False,
                        console=None)
    with stream, progress:
        task = progress.add_task(f"replay {os.path.basename(file)}", total=total)
        summary = asyncio.run(replay_lines(stream, settings, rate=rate, speculative_algorithm=speculative_algorithm,
                                           on_line=lambda n: progress.advance(task, n)))
    click.echo(f"replayed {summary.records} records, {summary.invalid} invalid, {summary.markers} markers from "
               f"{summary.producers} producer(s) in {summary.seconds:.1f}s; closed {summary.batches_closed_at_end} "
               f"open batch(es) at the end", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
