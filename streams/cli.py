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


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: specmeter's and its stream libraries' versions, and which core runs."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    from ._core import NATIVE_CORE, NATIVE_DISABLED, NATIVE_IMPORT_ERROR

    parts = []
    for name, dist in (("specmeter", "specmeter"), ("faust", "faust-streaming"), ("aiokafka", "aiokafka"),
                       ("msgspec", "msgspec")):
        try:
            parts.append(f"{name} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    if NATIVE_CORE:
        core = "native core loaded"
    elif NATIVE_DISABLED:
        core = "python core (native switched off by SPECMETER_NO_NATIVE)"
    else:
        core = f"python core (native not built: {NATIVE_IMPORT_ERROR})"
    click.echo(", ".join(parts) + f"; {core}")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SPECMETER"})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the versions of specmeter, Faust, aiokafka and msgspec, and which core runs, and exit.")
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
@click.option("--max-open-generations", type=click.IntRange(1), default=1_000_000, show_default=True,
              metavar="N", help="Distinct generations one partition may hold (130-300 B each); the batch that "
              "crosses it is closed early as 'incomplete' and its later input dead-lettered as 'overflow'.")
@click.option("--max-message-bytes", type=click.IntRange(1024), default=8 * 1024 * 1024, show_default=True,
              metavar="BYTES", help="Larger input messages are dead-lettered as 'too_large'.")
@click.option("--web-port", type=click.IntRange(0, 65535), default=6066, show_default=True,
              help="HTTP port for health, stats and Prometheus metrics.")
@click.option("--web-host", default="0.0.0.0", show_default=True, help="HTTP bind address.")
@click.option("--no-web", is_flag=True, help="Do not start the HTTP server.")
@click.option("--data-dir", default="/tmp/specmeter-worker", show_default=True, help="Faust's local data folder.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def worker(broker: str, records_topic: str, partials_topic: str, metrics_topic: str, deadletter_topic: str,
           app_id: str, partitions: int, batch_timeout: float, grace: float, session_timeout: float,
           max_open_generations: int, max_message_bytes: int, web_port: int, web_host: str, no_web: bool, data_dir: str, log_level: str) -> None:
    """Run a stream worker: records topic in, BatchMetrics on the metrics topic.

    Creates missing topics, deduplicates each batch per partition (durable
    state in changelog topics), closes batches on their producers' markers or
    after --batch-timeout, and publishes one BatchMetrics JSON message per
    batch and revision. Start more workers with the same --app-id to scale out
    (up to --partitions). Stop with Ctrl-C or SIGTERM.
    """
    from specmeter.producers import KafkaSecurity

    from .settings import TopicNames, WorkerSettings
    from .worker import run_worker

    settings = WorkerSettings(
        broker=broker, app_id=app_id, partitions=partitions, batch_timeout_s=batch_timeout, grace_s=grace,
        session_timeout_s=session_timeout, max_open_generations=max_open_generations,
        max_message_bytes=max_message_bytes, web_enabled=not no_web, web_port=web_port, web_host=web_host,
        data_dir=data_dir, log_level=log_level, security=KafkaSecurity.from_env(),
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

    from specmeter.producers import KafkaSecurity, PublisherSettings
    from specmeter.producers._replay import replay_lines

    settings = PublisherSettings(bootstrap_servers=broker, topic=topic, security=KafkaSecurity.from_env())
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


@main.command()
@_broker_option
@click.option("--topic", default="specmeter.records", show_default=True, help="The records topic.")
@click.option("--producers", type=click.IntRange(1), default=4, show_default=True, help="Simulated rollout workers.")
@click.option("--batches", type=click.IntRange(0), default=10, show_default=True, help="Training steps to simulate.")
@click.option("--sessions-per-batch", type=click.IntRange(1), default=200, show_default=True)
@click.option("--max-samples-per-session", type=click.IntRange(1), default=3, show_default=True,
              help="Trajectories a session branches into (sharing ancestor generations).")
@click.option("--max-turns", type=click.IntRange(1), default=4, show_default=True)
@click.option("--algorithm", type=click.Choice(["NGRAM", "EAGLE", "EAGLE3", "STANDALONE", "none"]),
              default="EAGLE3", show_default=True, help="Counter model; 'none' sends completion-only records.")
@click.option("--redelivery-rate", type=click.FloatRange(0, 1), default=0.2, show_default=True)
@click.option("--conflict-rate", type=click.FloatRange(0, 1), default=0.01, show_default=True)
@click.option("--missing-rate", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="Share of generations with some counters unknown.")
@click.option("--invalid-rate", type=click.FloatRange(0, 1), default=0.005, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="RECORDS/S",
              help="Target rate (default: as fast as the broker takes it).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--expect", type=click.File("wb"), default=None, metavar="FILE",
              help="Write the BatchMetrics the offline core computes for the same events (JSON lines).")
@click.option("--dump", type=click.File("wb"), default=None, metavar="FILE",
              help="Write the events as a JSON-lines dump instead of publishing them.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def loadgen(broker: str, topic: str, producers: int, batches: int, sessions_per_batch: int,
            max_samples_per_session: int, max_turns: int, algorithm: str, redelivery_rate: float,
            conflict_rate: float, missing_rate: float, invalid_rate: float, rate: float | None, seed: int,
            expect: IO[bytes] | None, dump: IO[bytes] | None, no_progress: bool) -> None:
    """Simulate a rollout fleet: publish synthetic records and batch markers.

    Sessions branch into trajectories that share ancestor generations; counters
    follow a per-step acceptance model of the algorithm; a share of records is
    redelivered, conflicting, missing counters or invalid. Each simulated worker
    closes its batches with markers. With --expect, the metrics the worker must
    publish are written first, so a run can be checked end to end.
    """
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from specmeter.producers import KafkaSecurity, PublisherSettings
    from specmeter.producers._loadgen import publish_fleet, write_dump, write_expected
    from specmeter.producers.synthetic import FleetSpec, synthetic_fleet

    spec = FleetSpec(batches=batches, sessions_per_batch=sessions_per_batch, producers=producers,
                     max_samples_per_session=max_samples_per_session, max_turns=max_turns,
                     redelivery_rate=redelivery_rate, conflict_rate=conflict_rate, missing_rate=missing_rate,
                     invalid_rate=invalid_rate, algorithm=None if algorithm == "none" else algorithm, seed=seed)
    if expect is not None:
        n = write_expected(synthetic_fleet(spec), expect)
        click.echo(f"loadgen: expected metrics of {n} batch(es) written to {expect.name}", err=True)
    if dump is not None:
        n = write_dump(synthetic_fleet(spec), dump)
        click.echo(f"loadgen: {n} events written to {dump.name}", err=True)
        return
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), disable=no_progress) as progress:
        task = progress.add_task("batches", total=batches)

        def on_event(event) -> None:
            if event.kind == "marker" and event.producer_id.endswith(f"-{producers - 1}"):
                progress.advance(task)

        summary = asyncio.run(publish_fleet(synthetic_fleet(spec), PublisherSettings(
            bootstrap_servers=broker, topic=topic, security=KafkaSecurity.from_env()), rate=rate,
            on_event=on_event))
    click.echo(f"loadgen: {summary.records} records, {summary.invalid} invalid, {summary.markers} markers in "
               f"{summary.seconds:.1f}s ({summary.rate:,.0f} records/s)", err=True)


@main.command()
@_broker_option
@click.option("--topic", default="specmeter.metrics", show_default=True, help="The metrics topic.")
@click.option("--json", "as_json", is_flag=True, help="Print each BatchMetrics as a JSON line (for scripts).")
@click.option("--from-beginning", is_flag=True, help="Start at the topic's first message, not its end.")
@click.option("--rows", type=click.IntRange(1), default=20, show_default=True, help="Batches in the table.")
@click.option("--max-messages", type=click.IntRange(1), default=None, help="Stop after this many messages.")
@click.option("--timeout", type=click.FloatRange(0), default=None, metavar="SECONDS", help="Stop after this long.")
def tail(broker: str, topic: str, as_json: bool, from_beginning: bool, rows: int, max_messages: int | None,
         timeout: float | None) -> None:
    """Follow the metrics topic: a live table of the latest batches, or JSON lines."""
    from specmeter.producers import KafkaSecurity

    from ._tail import run_tail

    try:
        run_tail(broker, topic, as_json=as_json, from_beginning=from_beginning, rows=rows,
                 max_messages=max_messages, timeout_s=timeout, kafka=KafkaSecurity.from_env().aiokafka_kwargs())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":  # pragma: no cover
    main()
