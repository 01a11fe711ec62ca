"""``specmeter worker``: its flags, mapped onto the one settings object, then the worker process."""

from __future__ import annotations

import click

from . import preflight
from .base import DEFAULTS, KAFKA_ENV_HELP, Command, Number, broker_option, one_line_errors

_PARTIALS_HELP = (
    "Name of the partials topic, this deployment's own (between its two stages). "
    "[default: <app-id>.partials, so deployments of different --app-id never share it]"
)


def _topic_options(func):
    for name in reversed(("records", "partials", "metrics", "deadletter")):
        own = name == "partials"  # named from the app id unless given
        func = click.option(
            f"--{name}-topic",
            default=None if own else getattr(DEFAULTS.topics, name),
            show_default=not own,
            help=_PARTIALS_HELP if own else f"Name of the {name} topic.",
        )(func)
    return func


@click.command(cls=Command, epilog=KAFKA_ENV_HELP)
@broker_option
@_topic_options
@click.option(
    "--app-id",
    default=DEFAULTS.app_id,
    show_default=True,
    help="The deployment's name: its consumer groups (<app-id>-stage1, -stage2), changelog topics and partials "
    "topic are named from it, so two deployments on one cluster (staging beside production, two experiments) "
    "need two app ids; give each its own --metrics-topic too.",
)
@click.option(
    "--partitions",
    type=Number(1, integer=True),
    default=DEFAULTS.partitions,
    show_default=True,
    help="Partitions of the records topic (state topics use the same).",
)
@click.option(
    "--replication-factor",
    type=Number(1, 32767, integer=True),
    default=DEFAULTS.replication_factor,
    show_default="the cluster's default.replication.factor",
    metavar="N",
    help="Replicas of each topic the worker creates (topics that exist keep theirs). A production cluster "
    "wants 3, with min.insync.replicas=2.",
)
@click.option(
    "--batch-timeout",
    type=Number(0.1),
    default=DEFAULTS.batch_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="Close a batch this long after its last input when its markers never complete.",
)
@click.option(
    "--grace",
    type=Number(0),
    default=DEFAULTS.grace_s,
    show_default=True,
    metavar="SECONDS",
    help="Keep a closed batch this long; later records are dead-lettered as 'late'.",
)
@click.option(
    "--expired-retention",
    type=Number(1),
    default=DEFAULTS.expired_retention_s,
    show_default=True,
    metavar="SECONDS",
    help="Remember a batch this long after its grace ended: its stragglers are dead-lettered as 'late', "
    "never opening it again (8-16 B of memory per batch).",
)
@click.option(
    "--session-timeout",
    type=Number(1),
    default=DEFAULTS.session_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="How long a silent worker keeps its partitions before others take them. Keep it well above the "
    "brokers' session timeout (9 s): when a broker that coordinates the group goes, its successor expires "
    "members that do not reach it within this, and the group rebalances.",
)
@click.option(
    "--ready-write-timeout",
    type=Number(1),
    default=DEFAULTS.ready_write_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="Readiness (/specmeter/readyz) drops when the worker's writes have waited this long with none "
    "acknowledged, or when no broker answers; one broker away while the others serve leaves it ready.",
)
@click.option(
    "--max-poll-interval",
    type=Number(1),
    default=DEFAULTS.max_poll_interval_s,
    show_default=True,
    metavar="SECONDS",
    help="A worker alive but stuck: a stage that asks for no input this long leaves its consumer group, and "
    "the other workers take its partitions over.",
)
@click.option(
    "--delivery-timeout",
    type=Number(1),
    default=None,
    show_default=f"{DEFAULTS.delivery_timeout_s:g}, or 4/5 of --max-poll-interval when that is lower",
    metavar="SECONDS",
    help="How long a state write or output is retried through a Kafka outage; past it the worker stops, "
    "writing nothing more (restart it: it resumes from the changelog). Below --max-poll-interval: a worker "
    "blocked on writes must not leave its group holding them.",
)
@click.option(
    "--max-open-generations",
    type=Number(1, integer=True),
    default=DEFAULTS.max_open_generations,
    show_default=True,
    metavar="N",
    help="Distinct generations one partition may hold (about 300 B of worker memory each with the native "
    "core, 85-130 B of it dedup state; twice that with the Python core: docs/operations.md); the batch that "
    "crosses it is closed early as 'incomplete' and its later input dead-lettered as 'overflow'.",
)
@click.option(
    "--max-message-bytes",
    type=Number(1024, integer=True),
    default=DEFAULTS.max_message_bytes,
    show_default=True,
    metavar="BYTES",
    help="Larger input messages are dead-lettered as 'too_large'.",
)
@click.option(
    "--max-queued-output-bytes",
    type=Number(65_536, integer=True),
    default=DEFAULTS.max_queued_output_bytes,
    show_default=True,
    metavar="BYTES",
    help="Back-pressure: after a chunk the worker waits while more than this is queued for Kafka and not yet "
    "sent (its changelog writes, partials, metrics), so a backlog is written out as it is read.",
)
@click.option(
    "--chunk-bytes",
    type=Number(1024, integer=True),
    default=DEFAULTS.chunk_bytes,
    show_default=True,
    metavar="BYTES",
    help="Input bytes applied and checkpointed together, per partition: a batch marker waits behind at most "
    "one such chunk of each partition (1 MiB is about 60 ms of work). Smaller: lower close latency, more "
    "changelog writes.",
)
@click.option(
    "--fetch-wait-ms",
    type=Number(0, 10_000, integer=True),
    default=DEFAULTS.fetch_wait_ms,
    show_default=True,
    metavar="MS",
    help="How long the broker may hold a fetch that finds nothing new (one that finds data returns at once).",
)
@click.option(
    "--web-port",
    type=Number(0, 65535, integer=True),
    default=DEFAULTS.web_port,
    show_default=True,
    help="HTTP port for health, stats and Prometheus metrics (0: any free port; the log names it).",
)
@click.option(
    "--web-host",
    default=DEFAULTS.web_host,
    show_default=True,
    metavar="ADDRESS",
    help="HTTP bind address: this machine only by default; 0.0.0.0 opens it on every interface (a container, "
    "a Prometheus on another host). /metrics and /specmeter/stats need no credentials.",
)
@click.option("--no-web", is_flag=True, help="Do not start the HTTP server.")
@click.option(
    "--max-exported-tasks",
    type=Number(0, 1024, integer=True),
    default=DEFAULTS.max_exported_tasks,
    show_default=True,
    metavar="N",
    help="Tasks (the records' task field) with Prometheus counters of their own, per run and algorithm, "
    'first come; later ones are summed under task="(other)", unknown ones under task="(unknown)". '
    "Each task costs 8 series per run and algorithm.",
)
@click.option(
    "--data-dir",
    default=DEFAULTS.data_dir,
    show_default=True,
    help="Faust's local data folder; created readable by its owner alone (0700).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=DEFAULTS.log_level,
    show_default=True,
    help="Worker log level.",
)
@one_line_errors
def worker(
    broker: str,
    records_topic: str,
    partials_topic: str | None,
    metrics_topic: str,
    deadletter_topic: str,
    app_id: str,
    partitions: int,
    replication_factor: int | None,
    batch_timeout: float,
    grace: float,
    expired_retention: float,
    session_timeout: float,
    ready_write_timeout: float,
    max_poll_interval: float,
    delivery_timeout: float | None,
    max_open_generations: int,
    max_message_bytes: int,
    chunk_bytes: int,
    max_queued_output_bytes: int,
    fetch_wait_ms: int,
    web_port: int,
    web_host: str,
    no_web: bool,
    max_exported_tasks: int,
    data_dir: str,
    log_level: str,
) -> None:
    """Run a stream worker: records topic in, BatchMetrics on the metrics topic.

    Creates missing topics, deduplicates each batch per partition (durable
    state in changelog topics), closes batches on their producers' markers or
    after --batch-timeout, and publishes one BatchMetrics JSON message per
    batch and revision. Start more workers with the same --app-id to scale out
    (up to --partitions): each stage's partitions are shared by a consumer group
    (<app-id>-stage1, <app-id>-stage2), a rebalance moves only what must move, and
    a worker frozen while its partitions moved can no longer change them. Stop
    with Ctrl-C or SIGTERM.

    Before starting it checks that the broker answers, that every topic of
    its own that exists has --partitions partitions (the records, partials and
    state topics; nothing is created otherwise) and that the web port is free.
    """
    from ..settings import TopicNames, WorkerSettings

    delivery_timeout = _delivery_timeout(delivery_timeout, max_poll_interval)
    security = preflight.security_from_env()
    settings = WorkerSettings(
        broker=broker,
        app_id=app_id,
        partitions=partitions,
        replication_factor=replication_factor,
        batch_timeout_s=batch_timeout,
        grace_s=grace,
        expired_retention_s=expired_retention,
        session_timeout_s=session_timeout,
        ready_write_timeout_s=ready_write_timeout,
        max_poll_interval_s=max_poll_interval,
        delivery_timeout_s=delivery_timeout,
        max_open_generations=max_open_generations,
        max_message_bytes=max_message_bytes,
        chunk_bytes=chunk_bytes,
        max_queued_output_bytes=max_queued_output_bytes,
        fetch_wait_ms=fetch_wait_ms,
        web_enabled=not no_web,
        web_port=web_port,
        web_host=web_host,
        max_exported_tasks=max_exported_tasks,
        data_dir=data_dir,
        log_level=log_level.lower(),
        security=security,
        topics=TopicNames(
            records=records_topic, partials=partials_topic or "", metrics=metrics_topic, deadletter=deadletter_topic
        ),
    )
    preflight.check_before_start(broker, security, settings)
    if not no_web:
        preflight.check_web_port(web_host, web_port)
    from ..worker.run import run_worker

    run_worker(settings)


def _delivery_timeout(given: float | None, max_poll_interval: float) -> float:
    """``--delivery-timeout``, by default the settings' own or 0.8 of the poll interval if
    less; one not below ``--max-poll-interval`` refused (a worker blocked on writes would
    leave its group holding them)."""
    delivery_timeout = min(DEFAULTS.delivery_timeout_s, 0.8 * max_poll_interval) if given is None else given
    if not delivery_timeout < max_poll_interval:
        raise click.BadParameter(
            f"{delivery_timeout:g} s is not below --max-poll-interval ({max_poll_interval:g} s): a worker blocked on "
            "writes would leave its group holding them; lower it or raise --max-poll-interval",
            param_hint="--delivery-timeout",
        )
    return delivery_timeout
