"""The ``specmeter`` command line: the group, ``--version``, and one module per command.

Each command is its own module (``aggregate``, ``worker``, ``replay``, ``loadgen``,
``tail``, ``advise``; the demo, ``demo``, is a program of its own): click wiring, then
a ``run`` of the layer below. What they share is ``base`` (failures said in one line,
the shared options) and ``preflight`` (what is checked before anything starts). Heavy
imports (Faust, aiokafka, the producer) happen inside the commands that need them, so
``specmeter --help`` and ``specmeter aggregate`` stay fast.
"""

from __future__ import annotations

import click

from . import advise, aggregate, loadgen, replay, tail, worker
from .base import Group


def _print_versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: specmeter's and its stream libraries' versions, and which core runs."""
    if not value or ctx.resilient_parsing:
        return
    import platform
    from importlib.metadata import PackageNotFoundError, version

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
    click.echo(_core_line())
    ctx.exit()


def _core_line() -> str:
    """Which core runs: the native one, or the Python one and why."""
    from ..core.cores import NATIVE_CORE, NATIVE_DISABLED, NATIVE_IMPORT_ERROR

    if NATIVE_CORE:
        return "native core loaded"
    if NATIVE_DISABLED:
        return "python core (native switched off by SPECMETER_NO_NATIVE)"
    return f"python core (native core not built: {NATIVE_IMPORT_ERROR})"


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SPECMETER"})
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


for _command in (aggregate.aggregate, worker.worker, replay.replay, loadgen.loadgen, tail.tail, advise.advise_command):
    main.add_command(_command)


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
                _name_envvar(name, param)


def _name_envvar(command: str, option: click.Option) -> None:
    """One option's variable: the rule's, unless it reads a shared one; shown in --help."""
    if option.envvar is None:
        option.envvar = envvar_of(command, option)
    option.show_envvar = True


_name_envvars(main)
