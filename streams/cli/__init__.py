"""The ``specmeter`` command line: click wiring only; each command calls a ``run``.

Heavy imports (Faust, aiokafka, the producer) happen inside the commands that
need them, so ``specmeter --help`` and ``specmeter aggregate`` stay fast.

A command that cannot work (no broker, a port in use, a topic of another shape,
bad security settings) ends with one or two lines on stderr that say what is
wrong and which flag or environment variable to set: ``_explain`` is the one
place that maps a failure to those lines; anything it does not know is a bug
and keeps its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Coroutine
from typing import IO, Any, TypeVar

import click
from click.core import ParameterSource

from specmeter.schemas import MAX_ID, encode_metrics

from ..core.offline import LineError, OfflineAggregator
from ..errors import SpecmeterError
from ..settings import WorkerSettings

#: every worker flag's default is the settings object's (one home for each default)
_DEFAULTS = WorkerSettings()
#: what a command's coroutine returns (``_folded``)
T = TypeVar("T")

#: the environment every command that talks to Kafka reads (producers/_security.py)
KAFKA_ENV_HELP = """\b
Environment (besides each flag's own variable, shown with the flag):
  KAFKA_BOOTSTRAP_SERVERS    broker address(es), as --broker
  KAFKA_SECURITY_PROTOCOL    PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
  KAFKA_SASL_MECHANISM       PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
  KAFKA_SASL_USERNAME        or KAFKA_SASL_USERNAME_FILE
  KAFKA_SASL_PASSWORD        or KAFKA_SASL_PASSWORD_FILE
  KAFKA_SSL_CAFILE           CA bundle that verifies the brokers (SSL, SASL_SSL)
"""


class CommandFailed(click.ClickException):
    """What went wrong and, on a second line, what to set; no traceback."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None, command: str | None = None) -> None:
        super().__init__(problem)
        self.fix = fix
        if command is None:
            ctx = click.get_current_context(silent=True)
            command = ctx.command_path if ctx is not None else "specmeter"
        self.command = command

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.command}: {self.message}", err=True)
        if self.fix:
            click.echo(f"  {self.fix}", err=True)


def _reason(messages: list[str]) -> str:
    """aiokafka's connection errors, as a person says them."""
    text = " ".join(messages)
    for needle, said in (
        ("Connect call failed", "connection refused"),
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host"),
        ("nodename nor servname", "unknown host"),
        ("Temporary failure in name resolution", "unknown host"),
        ("timed out", "timed out"),
        ("TimeoutError", "timed out"),
    ):
        if needle in text:
            return said
    last = messages[-1] if messages else "no answer"
    return last if len(last) <= 160 else last[:157] + "..."


def _env_naming(path: str | None) -> list[str]:
    return [name for name, value in os.environ.items() if path and value == path and name.startswith("KAFKA_")]


def _explain(exc: BaseException, command: str, params: dict[str, Any]) -> tuple[str, str | None] | None:
    """(what is wrong, what to set) for a failure a person can fix; None for a bug."""
    from ..worker.topics import TopicProblem
    from .preflight import BadSecurity, BrokerUnreachable, PortInUse, WebHostInvalid

    broker = params.get("broker", "the broker")
    set_broker = "set --broker or KAFKA_BOOTSTRAP_SERVERS to a running broker's HOST:PORT"
    credentials = "check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD (or their _FILE forms) and KAFKA_SASL_MECHANISM"
    if isinstance(exc, BadSecurity):
        return str(exc), None
    if isinstance(exc, BrokerUnreachable):
        if exc.authentication_failed:
            return f"the broker at {broker} refused authentication ({_reason(exc.reasons)})", credentials
        if exc.tls_failed:
            return (
                f"no TLS connection to the broker at {broker} ({_reason(exc.reasons)})",
                "check KAFKA_SECURITY_PROTOCOL (SSL or SASL_SSL only for a TLS listener) and KAFKA_SSL_CAFILE",
            )
        return f"no Kafka broker answers at {broker} ({_reason(exc.reasons)})", set_broker
    if isinstance(exc, PortInUse):
        return (
            f"web port {exc.port} on {exc.host} is in use by another process",
            "pass --web-port N (env SPECMETER_WORKER_WEB_PORT) or --no-web (env SPECMETER_WORKER_NO_WEB=1)",
        )
    if isinstance(exc, WebHostInvalid):
        return str(exc), "pass --web-host ADDRESS (env SPECMETER_WORKER_WEB_HOST), e.g. 0.0.0.0 or 127.0.0.1"
    if isinstance(exc, TopicProblem):
        return str(exc), exc.fix
    from ..readers.topic_lookup import TopicNotFound

    if isinstance(exc, TopicNotFound):
        variable = f"SPECMETER_{command.upper()}_TOPIC"
        if exc.similar:
            others = f" (or {', '.join(exc.similar[1:])})" if len(exc.similar) > 1 else ""
            fix = f"did you mean --topic {exc.similar[0]}{others}? (env {variable})"
        elif exc.of_role:
            fix = f"pass one of the metrics topics there as --topic NAME (env {variable}): {', '.join(exc.of_role)}"
        else:
            fix = f"pass --topic NAME (env {variable}), the worker's --metrics-topic, or start `specmeter worker` first"
        return f"topic {exc.topic!r} does not exist at {exc.broker} ({command} never creates one)", fix
    from aiokafka import errors as kafka

    name = type(exc).__name__
    if isinstance(exc, kafka.KafkaError) and "Authorization" in name:
        return (
            f"the broker at {broker} denied this principal ({name}: {exc})",
            "grant it the ACLs docs/operations.md lists for `specmeter " + command + "`, or check KAFKA_SASL_USERNAME",
        )
    if isinstance(
        exc, (kafka.SaslAuthenticationFailed, kafka.AuthenticationFailedError, kafka.UnsupportedSaslMechanismError)
    ):
        return f"the broker at {broker} refused authentication ({name}: {exc})", credentials
    if isinstance(exc, kafka.KafkaConnectionError):
        return f"lost the Kafka broker at {broker} ({exc})", f"check the broker; {set_broker}"
    if isinstance(exc, kafka.KafkaTimeoutError):
        return f"the broker at {broker} did not answer in time ({name})", f"check the broker; {set_broker}"
    from specmeter.producers import PublisherError, TopicMissingError

    if isinstance(exc, TopicMissingError):
        return str(exc).splitlines()[0], f"or pass --topic NAME (env SPECMETER_{command.upper()}_TOPIC)"
    if isinstance(exc, PublisherError):
        return str(exc).splitlines()[0], None
    if isinstance(exc, OSError) and exc.filename and _env_naming(exc.filename):
        return (f"cannot read {exc.filename}: {exc.strerror}", f"check {' and '.join(_env_naming(exc.filename))}")
    import ssl

    if isinstance(exc, ssl.SSLError):
        return f"TLS setup failed ({exc})", "check KAFKA_SSL_CAFILE (a PEM CA bundle) and KAFKA_SECURITY_PROTOCOL"
    if isinstance(exc, SpecmeterError):  # the rest of specmeter's own: the message says it, ``fix`` what to do
        return str(exc).splitlines()[0], exc.fix
    return None


def _one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; turn a failure ``_explain`` knows into ``CommandFailed``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            explained = None
        except Exception as exc:
            explained = _explain(exc, ctx.info_name or "", ctx.params)
            if explained is None:
                raise
        # raised outside the except block: no chained traceback keeps the failed clients alive
        if explained is None:  # Ctrl-C: no traceback, the shell's exit status for SIGINT
            ctx.exit(130)
        raise CommandFailed(*explained, command=ctx.command_path)

    return wrapper


def _security() -> Any:
    """KAFKA_* security from the environment, checked before anything connects."""
    from specmeter.producers import KafkaSecurity

    from .preflight import check_security

    security = KafkaSecurity.from_env()
    check_security(security)
    security.aiokafka_kwargs()  # reads KAFKA_SSL_CAFILE now, not in the middle of a run
    return security


def _preflight(broker: str, security: Any, settings: WorkerSettings | None = None) -> None:
    import asyncio

    from .preflight import check_broker

    asyncio.run(check_broker(broker, security, settings=settings))


class EnvValueInvalid(CommandFailed):
    """A flag's environment variable holds a value the flag does not take: blamed on the variable."""

    exit_code = 2  # a usage error, as click's own


class _Command(click.Command):
    """A command that blames a bad value read from the environment on the variable
    (``SPECMETER_WORKER_PARTITIONS='abc' ...``), not on a flag the person never typed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:
            param = exc.param
            name = None if param is None else _envvar_set(param)
            if (
                param is None
                or name is None
                or ctx.get_parameter_source(param.name or "") is not (ParameterSource.ENVIRONMENT)
            ):
                raise
            flag = (param.opts or [param.human_readable_name])[0]
            raise EnvValueInvalid(
                f"{name}={os.environ[name]!r} is not a valid value for {flag}: {exc.message}",
                f"set {name} to a valid value or unset it (`{ctx.command_path} --help` explains {flag})",
                command=ctx.command_path,
            ) from None


class _Group(click.Group):
    command_class = _Command


def _print_versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: specmeter's and its stream libraries' versions, and which core runs."""
    if not value or ctx.resilient_parsing:
        return
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from ..core.cores import NATIVE_CORE, NATIVE_DISABLED, NATIVE_IMPORT_ERROR

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    click.echo(f"specmeter {of('specmeter')}")
    click.echo(
        f"faust-streaming {of('faust-streaming')}, aiokafka {of('aiokafka')}, msgspec {of('msgspec')}, "
        f"python {platform.python_version()}"
    )
    if NATIVE_CORE:
        click.echo("native core loaded")
    elif NATIVE_DISABLED:
        click.echo("python core (native switched off by SPECMETER_NO_NATIVE)")
    else:
        click.echo(f"python core (native core not built: {NATIVE_IMPORT_ERROR})")
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SPECMETER"})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_versions,
    help="Show the versions of specmeter, Faust, aiokafka and msgspec, and which core runs, and exit.",
)
def main() -> None:
    """specmeter: correct speculative-decoding metrics for RL rollout fleets.

    Rollout workers publish one record per committed generation (accepted and
    proposed draft tokens, verify steps, completion tokens); specmeter
    deduplicates them per batch and publishes weighted metrics with coverage.

    \b
    Offline:   specmeter aggregate dump.jsonl
    Budget:    specmeter aggregate dump.jsonl --format jsonl | specmeter advise -
    """


@main.command()
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
def aggregate(file: IO[bytes], speculative_algorithm: str | None, output_format: str, quiet: bool) -> None:
    """Aggregate a JSON-lines rollout dump without Kafka; '-' reads stdin.

    Each line is a record (batch_id, session_id, generation_id, sample_id,
    state_hash, accepted, proposed, verify, completion, accept_histogram,
    producer_id; missing fields are unknown), a batch marker
    ({"type": "marker", "batch_id", "producer_id", "records_sent",
    "speculative_algorithm", "expected_producers"}), or an SGLang output
    ({"meta_info": {...}, "batch_id", "session_id", "sample_id", ...}). Prints the
    BatchMetrics of each batch, in order of first appearance (the table sorts by
    run and batch). A bad line is reported on stderr with its line number and
    reason, counted in its batch when the batch is readable, and never stops the
    run; the exit status is 1 when no line at all could be read (an empty file
    included). A UTF-8 byte-order mark is ignored.
    """

    def report(error: LineError) -> None:
        if not quiet:
            click.echo(f"specmeter aggregate: {error}", err=True)

    from specmeter.streams.fleet.dumps import DumpEncodingError, dump_lines, parse_dump_line

    given = getattr(file, "name", "-")
    name = "stdin" if given in ("-", "<stdin>") or not isinstance(given, str) else click.format_filename(given)
    aggregator = OfflineAggregator(speculative_algorithm=speculative_algorithm, on_error=report, parse=parse_dump_line)
    try:
        aggregator.feed_lines(dump_lines(file))
    except DumpEncodingError as exc:
        raise CommandFailed(f"cannot read {name}: {exc}", "save it as UTF-8 (e.g. Out-File -Encoding utf8)") from None
    results = aggregator.results()
    fmt = output_format.lower()
    if fmt == "auto":
        fmt = "table" if sys.stdout.isatty() else "jsonl"
    _print_metrics(results, fmt, f"specmeter aggregate {name}: {len(results)} batch(es)")
    if aggregator.errors and not quiet:
        click.echo(f"specmeter aggregate: {aggregator.errors} bad line(s) reported above", err=True)
    if aggregator.read == 0:
        a_dump = "a dump has one record, marker or SGLang output per line (`specmeter aggregate --help`)"
        if aggregator.errors == 0:
            raise CommandFailed(f"{name} is empty: no records to aggregate", a_dump)
        raise CommandFailed(f"none of the {aggregator.errors} line(s) of {name} could be read", a_dump)


def _print_metrics(results: list[Any], fmt: str, title: str) -> None:
    """``aggregate``'s output: JSON lines, one JSON document, or a table."""
    out = sys.stdout.buffer
    if fmt == "jsonl":
        out.writelines(encode_metrics(m) + b"\n" for m in results)
    elif fmt == "json":  # one object per line inside the list: readable, and one document
        out.write(b"[\n" + b",\n".join(encode_metrics(m) for m in results) + (b"\n]\n" if results else b"]\n"))
    elif results:
        from rich.console import Console

        from .tables import metrics_table, task_table

        console = Console()
        latest = {(m.run_id, m.batch_id): m for m in results}
        console.print(metrics_table(latest, len(latest), console.width, title=title))
        by_task = task_table(list(latest.values()), console.width, title="by task")
        if by_task is not None:
            console.print(by_task)
    out.flush()


def _bootstrap(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """HOST:PORT list; a host without a port gets Kafka's 9092, and a line on stderr says so."""
    from specmeter.producers._settings import split_bootstrap

    try:
        addresses = split_bootstrap(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    assumed = [address for address, guessed in addresses if guessed]
    if assumed:
        name = _envvar_set(param) if ctx.get_parameter_source("broker") is ParameterSource.ENVIRONMENT else None
        given = f"{name}={value}" if name else f"--broker {value}"
        click.echo(
            f"{ctx.command_path}: {given} names no port: using {', '.join(assumed)} (Kafka's default)",
            err=True,
        )
    return ",".join(address for address, _ in addresses)


def _envvar_set(param: click.Parameter) -> str | None:
    """The environment variable ``param`` read its value from."""
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    return next((name for name in names if name in os.environ), None)


def _broker_option(func):
    return click.option(
        "--broker",
        "--bootstrap",
        "-b",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        default="127.0.0.1:9092",
        show_default=True,
        metavar="HOST:PORT",
        callback=_bootstrap,
        help="Kafka bootstrap address(es), comma-separated; kafka://HOST:PORT (Faust's form) is accepted.",
    )(func)


def _run_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not 0 < len(value) <= MAX_ID:
        raise click.BadParameter(f"a run id is 1 to {MAX_ID} characters")
    return value


def _share_option(name: str, default: float, help: str) -> Callable[[Any], Any]:
    """A ``loadgen`` option that is a share of records or generations, in [0, 1]."""
    return click.option(name, type=click.FloatRange(0, 1), default=default, show_default=True, help=help)


def _tasks(ctx: click.Context, param: click.Parameter, value: str) -> tuple[tuple[str, float], ...]:
    """``loadgen --tasks``: ``NAME:FACTOR,...`` (a name alone: factor 1), or ``none``."""
    if value.strip().lower() in ("", "none"):
        return ()
    out = []
    for item in value.split(","):
        name, _, factor = item.strip().partition(":")
        try:
            number = float(factor) if factor else 1.0
        except ValueError:
            number = -1.0
        if not name or not 0 < number <= 1:
            raise click.BadParameter(
                f"{item.strip()!r} is not NAME:FACTOR with a factor in (0, 1] (e.g. gsm8k:1,chat:0.9, or none)"
            )
        out.append((name, number))
    return tuple(out)


def _run_id_option(func):
    return click.option(
        "--run-id",
        envvar="SPECMETER_RUN_ID",
        default=None,
        metavar="ID",
        callback=_run_id,
        help="The training run (attempt) the records belong to; a job restarted from a checkpoint gets a new one, "
        "so its batches never merge into the old attempt's (default: none).",
    )(func)


def _topic_options(func):
    for name in reversed(("records", "partials", "metrics", "deadletter")):
        func = click.option(
            f"--{name}-topic",
            default=getattr(_DEFAULTS.topics, name),
            show_default=True,
            help=f"Name of the {name} topic.",
        )(func)
    return func


@main.command(epilog=KAFKA_ENV_HELP)
@_broker_option
@_topic_options
@click.option(
    "--app-id",
    default=_DEFAULTS.app_id,
    show_default=True,
    help="Consumer group and prefix of the worker's state topics.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1),
    default=_DEFAULTS.partitions,
    show_default=True,
    help="Partitions of the records topic (state topics use the same).",
)
@click.option(
    "--replication-factor",
    type=click.IntRange(1, 32767),
    default=_DEFAULTS.replication_factor,
    show_default="the cluster's default.replication.factor",
    metavar="N",
    help="Replicas of each topic the worker creates (topics that exist keep theirs). A production cluster "
    "wants 3, with min.insync.replicas=2.",
)
@click.option(
    "--batch-timeout",
    type=click.FloatRange(0.1),
    default=_DEFAULTS.batch_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="Close a batch this long after its last input when its markers never complete.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=_DEFAULTS.grace_s,
    show_default=True,
    metavar="SECONDS",
    help="Keep a closed batch this long; later records are dead-lettered as 'late'.",
)
@click.option(
    "--expired-retention",
    type=click.FloatRange(1),
    default=_DEFAULTS.expired_retention_s,
    show_default=True,
    metavar="SECONDS",
    help="Remember a batch this long after its grace ended: its stragglers are dead-lettered as 'late', "
    "never opening it again (8-16 B of memory per batch).",
)
@click.option(
    "--session-timeout",
    type=click.FloatRange(1),
    default=_DEFAULTS.session_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="How long a silent worker keeps its partitions before others take them.",
)
@click.option(
    "--ready-write-timeout",
    type=click.FloatRange(1),
    default=_DEFAULTS.ready_write_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="Readiness (/specmeter/readyz) drops when the worker's writes have waited this long with none "
    "acknowledged, or when no broker answers; one broker away while the others serve leaves it ready.",
)
@click.option(
    "--max-poll-interval",
    type=click.FloatRange(1),
    default=_DEFAULTS.max_poll_interval_s,
    show_default=True,
    metavar="SECONDS",
    help="A worker alive but stuck: a stage that asks for no input this long leaves its consumer group, and "
    "the other workers take its partitions over.",
)
@click.option(
    "--delivery-timeout",
    type=click.FloatRange(1),
    default=_DEFAULTS.delivery_timeout_s,
    show_default=True,
    metavar="SECONDS",
    help="How long a state write or output is retried through a Kafka outage; past it the worker stops, "
    "writing nothing more (restart it: it resumes from the changelog).",
)
@click.option(
    "--max-open-generations",
    type=click.IntRange(1),
    default=_DEFAULTS.max_open_generations,
    show_default=True,
    metavar="N",
    help="Distinct generations one partition may hold (about 300 B of worker memory each with the native "
    "core, 85-130 B of it dedup state; twice that with the Python core: docs/operations.md); the batch that "
    "crosses it is closed early as 'incomplete' and its later input dead-lettered as 'overflow'.",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(1024),
    default=_DEFAULTS.max_message_bytes,
    show_default=True,
    metavar="BYTES",
    help="Larger input messages are dead-lettered as 'too_large'.",
)
@click.option(
    "--max-queued-output-bytes",
    type=click.IntRange(65_536),
    default=_DEFAULTS.max_queued_output_bytes,
    show_default=True,
    metavar="BYTES",
    help="Back-pressure: after a chunk the worker waits while more than this is queued for Kafka and not yet "
    "sent (its changelog writes, partials, metrics), so a backlog is written out as it is read.",
)
@click.option(
    "--chunk-bytes",
    type=click.IntRange(1024),
    default=_DEFAULTS.chunk_bytes,
    show_default=True,
    metavar="BYTES",
    help="Input bytes applied and checkpointed together, per partition: a batch marker waits behind at most "
    "one such chunk of each partition (1 MiB is about 60 ms of work). Smaller: lower close latency, more "
    "changelog writes.",
)
@click.option(
    "--fetch-wait-ms",
    type=click.IntRange(0, 10_000),
    default=_DEFAULTS.fetch_wait_ms,
    show_default=True,
    metavar="MS",
    help="How long the broker may hold a fetch that finds nothing new (one that finds data returns at once).",
)
@click.option(
    "--web-port",
    type=click.IntRange(0, 65535),
    default=_DEFAULTS.web_port,
    show_default=True,
    help="HTTP port for health, stats and Prometheus metrics (0: any free port; the log names it).",
)
@click.option("--web-host", default=_DEFAULTS.web_host, show_default=True, help="HTTP bind address.")
@click.option("--no-web", is_flag=True, help="Do not start the HTTP server.")
@click.option(
    "--max-exported-tasks",
    type=click.IntRange(0, 1024),
    default=_DEFAULTS.max_exported_tasks,
    show_default=True,
    metavar="N",
    help="Tasks (the records' task field) with Prometheus counters of their own, per run and algorithm, "
    'first come; later ones are summed under task="(other)", unknown ones under task="(unknown)". '
    "Each task costs 8 series per run and algorithm.",
)
@click.option("--data-dir", default=_DEFAULTS.data_dir, show_default=True, help="Faust's local data folder.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=_DEFAULTS.log_level,
    show_default=True,
    help="Worker log level.",
)
@_one_line_errors
def worker(
    broker: str,
    records_topic: str,
    partials_topic: str,
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
    delivery_timeout: float,
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
    from .preflight import check_web_port

    security = _security()
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
            records=records_topic, partials=partials_topic, metrics=metrics_topic, deadletter=deadletter_topic
        ),
    )
    _preflight(broker, security, settings)
    if not no_web:
        check_web_port(web_host, web_port)
    from ..worker.run import run_worker

    run_worker(settings)


@main.command(epilog=KAFKA_ENV_HELP)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True), metavar="FILE.jsonl")
@_broker_option
@click.option("--topic", default=_DEFAULTS.topics.records, show_default=True, help="The records topic.")
@_run_id_option
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
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
@_one_line_errors
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
    from specmeter.streams.fleet.dumps import DumpEncodingError
    from specmeter.streams.fleet.replay import ReplaySummary, replay_lines

    security = _security()
    _preflight(broker, security)
    settings = PublisherSettings(bootstrap_servers=broker, topic=topic, run_id=run_id, security=security)
    stream = sys.stdin.buffer if file == "-" else open(file, "rb")  # noqa: SIM115
    total = None if file == "-" else os.path.getsize(file)
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
                _folded(
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
    except KeyboardInterrupt:
        _report_interrupted_replay(summary)
        click.get_current_context().exit(130)
    except DumpEncodingError as exc:
        raise CommandFailed(f"cannot read {file}: {exc}", "save it as UTF-8 (e.g. Out-File -Encoding utf8)") from None
    click.echo(
        f"replayed {summary.records} records, {summary.invalid} invalid, {summary.markers} markers from "
        f"{summary.producers} producer(s) in {summary.seconds:.1f}s; closed {summary.batches_closed_at_end} "
        f"open batch(es) at the end",
        err=True,
    )


async def _folded(command: str, work: Coroutine[Any, Any, T]) -> T:
    """``work``, with aiokafka's lines about a broker it cannot reach folded as the worker
    folds them (``report.outages.folded_outages``)."""
    from ..report.outages import folded_outages

    async with folded_outages(command):
        return await work


def _report_interrupted_replay(summary: Any, shown: int = 5) -> None:
    """Ctrl-C: what was sent, and which batches the worker will close only by timeout."""
    click.echo(
        f"specmeter replay: interrupted after {summary.seconds:.1f}s: sent {summary.records:,} records, "
        f"{summary.invalid:,} invalid, {summary.markers:,} marker(s) from {summary.producers} producer(s) "
        f"({summary.acknowledged:,} records and invalid lines acknowledged by Kafka)",
        err=True,
    )
    if summary.half_sent:
        names = [batch if run is None else f"{run}/{batch}" for run, batch in summary.half_sent]
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        click.echo(
            f"specmeter replay: warning: {len(names)} batch(es) left half-sent, their markers not sent: "
            f"{', '.join(names[:shown])}{more}",
            err=True,
        )
        click.echo(
            f"  the worker closes them after its --batch-timeout ({_DEFAULTS.batch_timeout_s:g} s by default) "
            "as 'timeout', incomplete",
            err=True,
        )


@main.command(epilog=KAFKA_ENV_HELP)
@_broker_option
@click.option("--topic", default=_DEFAULTS.topics.records, show_default=True, help="The records topic.")
@_run_id_option
@click.option("--producers", type=click.IntRange(1), default=4, show_default=True, help="Simulated rollout workers.")
@click.option("--batches", type=click.IntRange(0), default=10, show_default=True, help="Training steps to simulate.")
@click.option(
    "--sessions-per-batch",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="Agentic sessions per training step, spread over the producers.",
)
@click.option(
    "--max-samples-per-session",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Trajectories a session branches into (sharing ancestor generations).",
)
@click.option(
    "--max-turns",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Generations per trajectory, shared ancestors included.",
)
@click.option(
    "--algorithm",
    type=click.Choice(["NGRAM", "EAGLE", "EAGLE3", "STANDALONE", "none"], case_sensitive=False),
    default="EAGLE3",
    show_default=True,
    metavar="[NGRAM|EAGLE|EAGLE3|STANDALONE|none]",
    help="Counter model (any case); 'none' sends completion-only records.",
)
@click.option(
    "--stale-versions",
    type=click.IntRange(0),
    default=3,
    show_default=True,
    help="Older policy versions mixed into each batch besides the current one (0: on-policy).",
)
@click.option(
    "--draft-refresh",
    type=click.IntRange(0),
    default=8,
    show_default=True,
    metavar="BATCHES",
    help="Retrain the draft model on the current policy every this many batches (0: never).",
)
@click.option(
    "--drift",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.06,
    show_default=True,
    help="Relative drop of per-draft acceptance per version the policy is ahead of the draft.",
)
@_share_option(
    "--redelivery-rate",
    0.2,
    "Share of records delivered twice (deduplicated by the worker).",
)
@_share_option(
    "--conflict-rate",
    0.01,
    "Share of records redelivered with different counters (conflicting generations).",
)
@_share_option(
    "--missing-rate",
    0.05,
    "Share of generations with some counters unknown.",
)
@_share_option(
    "--invalid-rate",
    0.005,
    "Share of records that are invalid (a negative counter): dead-lettered and counted.",
)
@click.option(
    "--tasks",
    default="chat:0.9,gsm8k:1,swe-bench:0.8",
    show_default=True,
    callback=_tasks,
    metavar="NAME:FACTOR,...",
    help="The tasks (datasets) sessions draw their prompts from, each with the factor of per-draft "
    "acceptance the draft shows on it, in (0, 1]; 'none': records name no task.",
)
@_share_option(
    "--inconsistent-rate",
    0.005,
    "Share of generations whose histogram contradicts their own counters (spec/inconsistent_generation_count).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="RECORDS/S",
    help="Target rate (default: as fast as the broker takes it).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same events.")
@click.option(
    "--expect",
    type=click.File("wb"),
    default=None,
    metavar="FILE",
    help="Write the BatchMetrics the offline core computes for the same events (JSON lines).",
)
@click.option(
    "--dump",
    type=click.File("wb"),
    default=None,
    metavar="FILE",
    help="Write the events as a JSON-lines dump instead of publishing them.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@_one_line_errors
def loadgen(
    broker: str,
    topic: str,
    run_id: str | None,
    producers: int,
    batches: int,
    sessions_per_batch: int,
    max_samples_per_session: int,
    max_turns: int,
    algorithm: str,
    stale_versions: int,
    draft_refresh: int,
    drift: float,
    redelivery_rate: float,
    conflict_rate: float,
    missing_rate: float,
    invalid_rate: float,
    tasks: tuple[tuple[str, float], ...],
    inconsistent_rate: float,
    rate: float | None,
    seed: int,
    expect: IO[bytes] | None,
    dump: IO[bytes] | None,
    no_progress: bool,
) -> None:
    """Simulate a rollout fleet: publish synthetic records and batch markers.

    Sessions branch into trajectories that share ancestor generations; counters
    follow a per-step acceptance model of the algorithm; a share of records is
    redelivered, conflicting, missing counters or invalid, and a share of
    generations reports a histogram that contradicts its counters. Each batch mixes
    the current policy version with older ones (weight_version v<N>), and
    acceptance falls as the policy drifts away from the draft model's version,
    back up at each draft refresh; each session's prompt comes from one task, on
    which the draft accepts more or less. Each simulated worker closes its batches
    with markers. With --expect, the metrics the worker must publish are
    written first, so a run can be checked end to end.
    """
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from specmeter.producers import PublisherSettings
    from specmeter.streams.fleet.publish import publish_fleet, write_dump, write_expected
    from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

    spec = FleetSpec(
        batches=batches,
        sessions_per_batch=sessions_per_batch,
        producers=producers,
        max_samples_per_session=max_samples_per_session,
        max_turns=max_turns,
        redelivery_rate=redelivery_rate,
        conflict_rate=conflict_rate,
        missing_rate=missing_rate,
        invalid_rate=invalid_rate,
        algorithm=None if algorithm == "none" else algorithm,
        seed=seed,
        stale_versions=stale_versions,
        draft_refresh_batches=draft_refresh,
        drift_per_version=drift,
        run_id=run_id,
        tasks=tasks,
        inconsistent_rate=inconsistent_rate,
    )
    security = None
    if dump is None:  # fail before writing --expect when the broker is not there
        security = _security()
        _preflight(broker, security)
    if expect is not None:
        n = write_expected(synthetic_fleet(spec), expect)
        click.echo(f"loadgen: expected metrics of {n} batch(es) written to {expect.name}", err=True)
    if dump is not None:
        n = write_dump(synthetic_fleet(spec), dump)
        click.echo(f"loadgen: {n} events written to {dump.name}", err=True)
        return
    assert security is not None  # no dump: the broker run, checked above
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=no_progress,
    ) as progress:
        task = progress.add_task("batches", total=batches)

        def on_event(event) -> None:
            if event.kind == "marker" and event.producer_id.endswith(f"-{producers - 1}"):
                progress.advance(task)

        summary = asyncio.run(
            _folded(
                "loadgen",
                publish_fleet(
                    synthetic_fleet(spec),
                    PublisherSettings(bootstrap_servers=broker, topic=topic, run_id=run_id, security=security),
                    rate=rate,
                    on_event=on_event,
                ),
            )
        )
    click.echo(
        f"loadgen: {summary.records} records, {summary.invalid} invalid, {summary.markers} markers in "
        f"{summary.seconds:.1f}s ({summary.rate:,.0f} records/s)",
        err=True,
    )


@main.command(epilog=KAFKA_ENV_HELP)
@_broker_option
@click.option("--topic", default=_DEFAULTS.topics.metrics, show_default=True, help="The metrics topic.")
@click.option("--json", "as_json", is_flag=True, help="Print each BatchMetrics as a JSON line (for scripts).")
@click.option("--from-beginning", is_flag=True, help="Start at the topic's first message.")
@click.option(
    "--last",
    type=click.IntRange(0),
    default=10,
    show_default=True,
    metavar="N",
    help="Start N messages before the end of each partition, as `tail` shows the last lines (0: only new ones).",
)
@click.option("--rows", type=click.IntRange(1), default=20, show_default=True, help="Batches in the table.")
@click.option(
    "--max-messages",
    type=click.IntRange(1),
    default=None,
    metavar="N",
    help="Stop after this many messages (those read back at start count).",
)
@click.option("--timeout", type=click.FloatRange(0), default=None, metavar="SECONDS", help="Stop after this long.")
@_one_line_errors
def tail(
    broker: str,
    topic: str,
    as_json: bool,
    from_beginning: bool,
    last: int,
    rows: int,
    max_messages: int | None,
    timeout: float | None,
) -> None:
    """Follow the metrics topic: a live table of the latest batches, or JSON lines.

    The table fits the terminal: per batch (run/batch when it names a run) the
    accept rate, tokens per verify step, coverage (the lower of accept and verify
    coverage; 50%v: the verify pair is the lower), unique generations,
    conflicting/invalid/late counts, how it closed, and the drift view: the
    accept rate of each weight version (v7 .75 v8 .71), newest kept when they
    do not all fit. Piped, it prints a line per message as it arrives, then the
    final table when it ends (a limit, Ctrl-C or SIGTERM).
    """
    from .tables import run_tail

    security = _security()
    _preflight(broker, security)
    run_tail(
        broker,
        topic,
        as_json=as_json,
        from_beginning=from_beginning,
        last=last,
        rows=rows,
        max_messages=max_messages,
        timeout_s=timeout,
        kafka=security.aiokafka_kwargs(),
    )


def _advise_run(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--run-id``: not given is every run (one is then required), '' the default run."""
    if value is None:
        return ...
    if value == "":
        return None
    return _run_id(ctx, param, value)


@main.command(epilog=KAFKA_ENV_HELP)
@click.argument("file", type=click.File("rb"), required=False, default=None, metavar="[FILE.jsonl]")
@_broker_option
@click.option(
    "--topic",
    default=_DEFAULTS.topics.metrics,
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
    type=click.IntRange(0),
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
    type=click.FloatRange(0),
    default=None,
    metavar="C",
    help="The time of one draft step relative to one target forward pass (decode, at your serving batch size): "
    "time both from a profile or the engine's step timings and divide; about 0 for NGRAM, a small share for an "
    "EAGLE head, roughly the parameter ratio for a separate draft model. Adds the expected speedup over no "
    "speculation, tokens/verify / (1 + C*k), and marks the best budget.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the curves as one JSON document (for scripts).")
@_one_line_errors
def advise(
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
    from .advise import advise as advise_on
    from .advise import metrics_from_lines

    if file is not None:
        given = getattr(file, "name", "-")
        name = "stdin" if given in ("-", "<stdin>") or not isinstance(given, str) else click.format_filename(given)
        advice = advise_on(metrics_from_lines(file, name), run_id=run_id, last=last, by=by, draft_cost=draft_cost)
    else:
        import asyncio

        from ..readers.consume import consume_metrics

        security = _security()
        _preflight(broker, security)

        async def read() -> list[Any]:  # every run: advise names the runs there when --run-id is not one
            stream = consume_metrics(
                broker,
                topic=topic,
                from_beginning=True,
                stop_at_end=True,
                topic_wait_s=0,
                kafka=security.aiokafka_kwargs(),
            )
            return [m async for m in stream]

        advice = advise_on(
            asyncio.run(_folded("advise", read())), run_id=run_id, last=last, by=by, draft_cost=draft_cost
        )
    if as_json:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(advice.as_document()), indent=2) + b"\n")
        return
    from rich.console import Console

    from .advise_table import advice_notes, advice_tables

    console = Console()
    first, *rest = advice_notes(advice)
    console.print(first, highlight=False)
    for table in advice_tables(advice):
        console.print(table)
    for line in rest:
        console.print(line, highlight=False)


#: variables a flag reads instead of SPECMETER_<COMMAND>_<FLAG>: shared by several commands
SHARED_ENVVARS = ("KAFKA_BOOTSTRAP_SERVERS", "SPECMETER_RUN_ID")


def envvar_of(command: str, option: click.Option) -> str:
    """The rule: ``SPECMETER_<COMMAND>_<FLAG>``, FLAG the first long flag's name
    (``tail --json`` reads ``SPECMETER_TAIL_JSON``, whatever the Python parameter is called)."""
    flag = next(o for o in option.opts if o.startswith("--"))
    return f"SPECMETER_{command}_{flag[2:]}".upper().replace("-", "_")


def _name_envvars(group: click.Group) -> None:
    """Give every option of every command the variable of the rule (click's automatic
    name comes from the Python parameter, e.g. SPECMETER_TAIL_AS_JSON), unless it
    reads a shared one, and show it in --help."""
    for name, command in group.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                if param.envvar is None:
                    param.envvar = envvar_of(name, param)
                param.show_envvar = True


_name_envvars(main)
