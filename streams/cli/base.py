"""What every command shares: a failure said in one or two lines, the shared options,
and aiokafka's outage lines folded.

A command that cannot work (no broker, a port in use, a topic of another shape,
bad security settings) ends with one or two lines on stderr that say what is
wrong and which flag or environment variable to set: ``_explain`` is the one
place that maps a failure to those lines; anything it does not know is a bug
and keeps its traceback.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import IO, Any, TypeVar

import click
from click.core import ParameterSource

from specmeter.producers._kafka_logs import connection_reason as _reason
from specmeter.schemas import MAX_ID

from ..errors import SpecmeterError
from ..settings import WorkerSettings

#: every worker flag's default is the settings object's (one home for each default)
DEFAULTS = WorkerSettings()
#: what a command's coroutine returns (``folded``)
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


def _env_naming(path: str | None) -> list[str]:
    return [name for name, value in os.environ.items() if path and value == path and name.startswith("KAFKA_")]


#: what to set when the broker is not the one meant, or not running
_SET_BROKER = "set --broker or KAFKA_BOOTSTRAP_SERVERS to a running broker's HOST:PORT"
#: what to check when the broker refuses the credentials
_CREDENTIALS = "check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD (or their _FILE forms) and KAFKA_SASL_MECHANISM"


def _explain(exc: BaseException, command: str, params: dict[str, Any]) -> tuple[str, str | None] | None:
    """(what is wrong, what to set) for a failure a person can fix; None for a bug."""
    broker = params.get("broker", "the broker")
    for explain in (_preflight_failure, _missing_topic, _kafka_failure, _publisher_failure, _local_failure):
        explained = explain(exc, command, broker)
        if explained is not None:
            return explained
    return None


def _preflight_failure(exc: BaseException, command: str, broker: str) -> tuple[str, str | None] | None:
    """What the checks before a command's start found: security, the broker, the web port, the topics."""
    from ..worker.topics import TopicProblem
    from .preflight import BadSecurity, BrokerUnreachable, PortInUse, WebHostInvalid

    if isinstance(exc, BadSecurity):
        return str(exc), None
    if isinstance(exc, BrokerUnreachable):
        return _unreachable(exc, broker)
    if isinstance(exc, PortInUse):
        return (
            f"web port {exc.port} on {exc.host} is in use by another process",
            "pass --web-port N (env SPECMETER_WORKER_WEB_PORT) or --no-web (env SPECMETER_WORKER_NO_WEB=1)",
        )
    if isinstance(exc, WebHostInvalid):
        return str(exc), "pass --web-host ADDRESS (env SPECMETER_WORKER_WEB_HOST), e.g. 0.0.0.0 or 127.0.0.1"
    if isinstance(exc, TopicProblem):
        return str(exc), exc.fix
    return None


def _unreachable(exc: Any, broker: str) -> tuple[str, str]:
    """Why no broker answered: refused credentials, no TLS, or nothing there."""
    if exc.authentication_failed:
        return f"the broker at {broker} refused authentication ({_reason(exc.reasons)})", _CREDENTIALS
    if exc.tls_failed:
        return (
            f"no TLS connection to the broker at {broker} ({_reason(exc.reasons)})",
            "check KAFKA_SECURITY_PROTOCOL (SSL or SASL_SSL only for a TLS listener) and KAFKA_SSL_CAFILE",
        )
    return f"no Kafka broker answers at {broker} ({_reason(exc.reasons)})", _SET_BROKER


def _missing_topic(exc: BaseException, command: str, broker: str) -> tuple[str, str | None] | None:
    """A reader's topic that does not exist (a reader never creates one)."""
    from ..readers.topic_lookup import TopicNotFound

    if not isinstance(exc, TopicNotFound):
        return None
    return f"topic {exc.topic!r} does not exist at {exc.broker} ({command} never creates one)", _topic_fix(exc, command)


def _topic_fix(exc: Any, command: str) -> str:
    """The topic meant: a similar name, another metrics topic there, or the worker's."""
    variable = f"SPECMETER_{command.upper()}_TOPIC"
    if exc.similar:
        others = f" (or {', '.join(exc.similar[1:])})" if len(exc.similar) > 1 else ""
        return f"did you mean --topic {exc.similar[0]}{others}? (env {variable})"
    role = getattr(exc, "role", "metrics")
    if exc.of_role:
        return f"pass one of the {role} topics there as --topic NAME (env {variable}): {', '.join(exc.of_role)}"
    return f"pass --topic NAME (env {variable}), the worker's --{role}-topic, or start `specmeter worker` first"


def _kafka_failure(exc: BaseException, command: str, broker: str) -> tuple[str, str | None] | None:
    """What aiokafka raised: a denied principal, refused credentials, a lost or silent broker."""
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
        return f"the broker at {broker} refused authentication ({name}: {exc})", _CREDENTIALS
    if isinstance(exc, kafka.KafkaConnectionError):
        return f"lost the Kafka broker at {broker} ({exc})", f"check the broker; {_SET_BROKER}"
    if isinstance(exc, kafka.KafkaTimeoutError):
        return f"the broker at {broker} did not answer in time ({name})", f"check the broker; {_SET_BROKER}"
    return None


def _publisher_failure(exc: BaseException, command: str, broker: str) -> tuple[str, str | None] | None:
    """What the producers' library raised: a missing topic, or its own first line."""
    from specmeter.producers import PublisherError, TopicMissingError

    if isinstance(exc, TopicMissingError):
        return str(exc).splitlines()[0], f"or pass --topic NAME (env SPECMETER_{command.upper()}_TOPIC)"
    if isinstance(exc, PublisherError):
        return str(exc).splitlines()[0], None
    return None


def _local_failure(exc: BaseException, command: str, broker: str) -> tuple[str, str | None] | None:
    """What failed here: a file a KAFKA_ variable names, the TLS setup, or specmeter's own error."""
    import ssl

    if isinstance(exc, OSError) and _env_naming(exc.filename):  # none for an error that names no file
        return (f"cannot read {exc.filename}: {exc.strerror}", f"check {' and '.join(_env_naming(exc.filename))}")
    if isinstance(exc, ssl.SSLError):
        return f"TLS setup failed ({exc})", "check KAFKA_SSL_CAFILE (a PEM CA bundle) and KAFKA_SECURITY_PROTOCOL"
    if isinstance(exc, SpecmeterError):  # the rest of specmeter's own: the message says it, ``fix`` what to do
        return str(exc).splitlines()[0], exc.fix
    return None


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; turn a failure ``_explain`` knows into ``CommandFailed``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (``Stopped``)
            explained = None
            status = 128 + getattr(exc, "signum", signal.SIGINT)
        except Exception as exc:
            explained = _explain(exc, ctx.info_name or "", ctx.params)
            if explained is None:
                raise
        # raised outside the except block: no chained traceback keeps the failed clients alive
        if explained is None:  # Ctrl-C or SIGTERM: no traceback, the shell's exit status for the signal
            ctx.exit(status)
        raise CommandFailed(*explained, command=ctx.command_path)

    return wrapper


class Number(click.FloatRange):
    """The one numeric parameter type of the whole CLI: a finite number (``nan``, ``inf``
    refused: they pass every comparison or defeat it, so a range alone lets them through)
    in its range, or one line naming the option. ``integer=True`` takes whole numbers.
    ``--help`` shows the range as click shows its own ranges ([x>=0])."""

    def __init__(
        self,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        max_open: bool = False,
        integer: bool = False,
    ) -> None:
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)
        self.integer = integer
        self.name = "integer" if integer else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self._parsed(value, param, ctx)
        if self._out_of_range(number):
            self.fail(f"{number} is not in the range {self._describe_range()}", param, ctx)
        return number

    def _out_of_range(self, number: float) -> bool:
        """Whether ``number`` is below the least or above the most, an open bound itself out."""
        low = self.min is not None and (number <= self.min if self.min_open else number < self.min)
        high = self.max is not None and (number >= self.max if self.max_open else number > self.max)
        return low or high

    def _parsed(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float | int:
        """The value as a finite int or float; a one-line failure otherwise."""
        try:
            number: float | int = (int if self.integer else float)(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{value!r} is not {'a whole number' if self.integer else 'a number'}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:
        """The range as click's help shows it; none for a number without bounds."""
        return "" if self.min is None and self.max is None else super()._describe_range()

    def __repr__(self) -> str:
        return f"Number({self._describe_range()}{', integer' if self.integer else ''})"


class EnvValueInvalid(CommandFailed):
    """A flag's environment variable holds a value the flag does not take: blamed on the variable."""

    exit_code = 2  # a usage error, as click's own


class Command(click.Command):
    """A command that blames a bad value read from the environment on the variable
    (``SPECMETER_WORKER_PARTITIONS='abc' ...``), not on a flag the person never typed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:
            blamed = _env_value_invalid(ctx, exc)
            if blamed is None:
                raise
            raise blamed from None


def _env_value_invalid(ctx: click.Context, exc: click.BadParameter) -> EnvValueInvalid | None:
    """The bad value blamed on the environment variable it came from; None where a flag or
    a default gave it."""
    param = exc.param
    if param is None or ctx.get_parameter_source(param.name or "") is not ParameterSource.ENVIRONMENT:
        return None
    name = envvar_set(param)
    if name is None:
        return None
    flag = (param.opts or [param.human_readable_name])[0]
    return EnvValueInvalid(
        f"{name}={os.environ[name]!r} is not a valid value for {flag}: {exc.message}",
        f"set {name} to a valid value or unset it (`{ctx.command_path} --help` explains {flag})",
        command=ctx.command_path,
    )


class Group(click.Group):
    command_class = Command


def input_name(file: IO[bytes]) -> str:
    """How a command names the file it reads: ``stdin`` for '-', else its path as given."""
    given = getattr(file, "name", "-")
    return "stdin" if given in ("-", "<stdin>") or not isinstance(given, str) else click.format_filename(given)


def _bootstrap(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """HOST:PORT list; a host without a port gets Kafka's 9092, and a line on stderr says so."""
    addresses = _split_bootstrap(value)
    assumed = [address for address, guessed in addresses if guessed]
    if assumed:
        _say_port_assumed(ctx, param, value, assumed)
    return ",".join(address for address, _ in addresses)


def _split_bootstrap(value: str) -> list[tuple[str, bool]]:
    """Each HOST:PORT, and whether its port was assumed; a list that is none a bad parameter."""
    from specmeter.producers._settings import split_bootstrap

    try:
        return split_bootstrap(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _say_port_assumed(ctx: click.Context, param: click.Parameter, value: str, assumed: list[str]) -> None:
    """The line on stderr that names the addresses given Kafka's port, and where they were given."""
    name = envvar_set(param) if ctx.get_parameter_source("broker") is ParameterSource.ENVIRONMENT else None
    given = f"{name}={value}" if name else f"--broker {value}"
    click.echo(f"{ctx.command_path}: {given} names no port: using {', '.join(assumed)} (Kafka's default)", err=True)


def envvar_set(param: click.Parameter) -> str | None:
    """The environment variable ``param`` read its value from."""
    return next((name for name in _envvars(param) if name in os.environ), None)


def _envvars(param: click.Parameter) -> list[str]:
    """The variables ``param`` reads, in click's order (click takes one name or several)."""
    return [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())


def broker_option(func):
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


def run_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not 0 < len(value) <= MAX_ID:
        raise click.BadParameter(f"a run id is 1 to {MAX_ID} characters")
    return value


def run_id_option(func):
    return click.option(
        "--run-id",
        envvar="SPECMETER_RUN_ID",
        default=None,
        metavar="ID",
        callback=run_id,
        help="The training run (attempt) the records belong to; a job restarted from a checkpoint gets a new one, "
        "so its batches never merge into the old attempt's (default: none).",
    )(func)


class Stopped(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a container's stop) ended a command's work: handled
    where Ctrl-C is (a command's summary, then the shell's exit status, 128 + the signal)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's exit status for a command ended by Ctrl-C (130) or SIGTERM (143)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def ended_by(interrupt: KeyboardInterrupt) -> str:
    """What a command's summary says ended it: SIGTERM (``Stopped``) or Ctrl-C."""
    return "stopped by SIGTERM" if isinstance(interrupt, Stopped) else "interrupted"


def reader_left() -> None:
    """stdout's reader is gone (``| head``): what is still buffered goes to /dev/null, so
    Python's flush at exit does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


async def stopped_by_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """``work``, ended by SIGTERM as Ctrl-C ends it (the task cancelled, its clients closed),
    raising ``Stopped`` where Ctrl-C raises KeyboardInterrupt (issue 39.3: ``replay`` exited
    143 with no output on SIGTERM)."""
    import asyncio
    import contextlib

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    signalled: list[int] = []

    def stop() -> None:
        signalled.append(signal.SIGTERM)
        task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signal handlers here (Windows, a thread)
        loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        return await work
    except asyncio.CancelledError:
        if not signalled:
            raise
        task.uncancel()
        raise Stopped(signalled[0]) from None
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)


async def folded(command: str, work: Coroutine[Any, Any, T]) -> T:
    """``work``, with aiokafka's lines about a broker it cannot reach folded as the worker
    folds them (``report.outages.folded_outages``), and SIGTERM handled as Ctrl-C
    (``stopped_by_sigterm``)."""
    from ..report.outages import folded_outages

    async with folded_outages(command):
        return await stopped_by_sigterm(work)
