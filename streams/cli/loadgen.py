"""``specmeter loadgen``: a synthetic fleet published (or written as a dump), with progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import click

from . import preflight
from .base import (
    DEFAULTS,
    KAFKA_ENV_HELP,
    Command,
    Number,
    broker_option,
    ended_by,
    exit_status,
    folded,
    one_line_errors,
    run_id_option,
)

if TYPE_CHECKING:
    from specmeter.producers import KafkaSecurity

    from ..fleet.synthetic import FleetEvent, FleetSpec


def _share_option(name: str, default: float, help: str) -> Callable[[Any], Any]:
    """A ``loadgen`` option that is a share of records or generations, in [0, 1]."""
    return click.option(name, type=Number(0, 1), default=default, show_default=True, help=help)


def _tasks(ctx: click.Context, param: click.Parameter, value: str) -> tuple[tuple[str, float], ...]:
    """``loadgen --tasks``: ``NAME:FACTOR,...``, or ``none``."""
    if value.strip().lower() in ("", "none"):
        return ()
    return tuple(_task(item) for item in value.split(","))


def _task(item: str) -> tuple[str, float]:
    """One ``NAME:FACTOR`` of ``--tasks``, the factor in (0, 1]: a name without its factor
    is refused (issue 47.7: ``--tasks garbage`` made a task called garbage)."""
    name, colon, factor = item.strip().partition(":")
    try:
        number = float(factor) if colon else -1.0
    except ValueError:
        number = -1.0
    if not name or not 0 < number <= 1:
        raise click.BadParameter(
            f"{item.strip()!r} is not NAME:FACTOR with a factor in (0, 1] (e.g. gsm8k:1,chat:0.9, or none)"
        )
    return name, number


#: the most sessions one batch may hold: a batch's events are drawn into memory before the
#: first is sent (the producers' streams interleave at random, and each marker counts its
#: records), about 2.6 KB a session: 100,000 take about 260 MB and 17 s (issue 47.7:
#: 100,000,000 grew to 800 MB with no output before it was killed)
MAX_SESSIONS_PER_BATCH = 100_000


def _sessions_per_batch(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """``--sessions-per-batch``, refused past ``MAX_SESSIONS_PER_BATCH`` with why and what to do."""
    if value > MAX_SESSIONS_PER_BATCH:
        raise click.BadParameter(
            f"{value:,} is past {MAX_SESSIONS_PER_BATCH:,}: a batch's events are drawn into memory before the "
            f"first is sent (about 2.6 KB a session, {MAX_SESSIONS_PER_BATCH:,} take about 260 MB); give more "
            "--batches of fewer sessions instead"
        )
    return value


@click.command(cls=Command, epilog=KAFKA_ENV_HELP)
@broker_option
@click.option("--topic", default=DEFAULTS.topics.records, show_default=True, help="The records topic.")
@run_id_option
@click.option(
    "--producers", type=Number(1, integer=True), default=4, show_default=True, help="Simulated rollout workers."
)
@click.option(
    "--batches", type=Number(0, integer=True), default=10, show_default=True, help="Training steps to simulate."
)
@click.option(
    "--sessions-per-batch",
    type=Number(1, integer=True),
    default=200,
    show_default=True,
    callback=_sessions_per_batch,
    help=f"Agentic sessions per training step, spread over the producers; at most {MAX_SESSIONS_PER_BATCH:,} "
    "(a batch is drawn in memory before it is sent).",
)
@click.option(
    "--max-samples-per-session",
    type=Number(1, integer=True),
    default=3,
    show_default=True,
    help="Trajectories a session branches into (sharing ancestor generations).",
)
@click.option(
    "--max-turns",
    type=Number(1, integer=True),
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
    type=Number(0, integer=True),
    default=3,
    show_default=True,
    help="Older policy versions mixed into each batch besides the current one (0: on-policy).",
)
@click.option(
    "--draft-refresh",
    type=Number(0, integer=True),
    default=8,
    show_default=True,
    metavar="BATCHES",
    help="Retrain the draft model on the current policy every this many batches (0: never).",
)
@click.option(
    "--drift",
    type=Number(0, 1, max_open=True),
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
    "Share of records redelivered with different counters: the only source of conflicting generations (0: none).",
)
@_share_option(
    "--missing-rate",
    0.05,
    "Share of generations with some counters unknown, drawn once per generation: a shared ancestor is "
    "reported alike in every trajectory that holds it (never a conflict).",
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
    "--draft-lags/--no-draft-lags",
    default=True,
    show_default=True,
    help="Records name their draft lag (how many policy versions the draft model is behind, "
    "by_draft_lag); --no-draft-lags: they name none.",
)
@click.option(
    "--rate",
    type=Number(min=0, min_open=True),
    default=None,
    metavar="RECORDS/S",
    help="Target rate (default: as fast as the broker takes it).",
)
@click.option("--seed", type=Number(integer=True), default=0, show_default=True, help="Same seed, same events.")
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
@one_line_errors
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
    draft_lags: bool,
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
    back up at each draft refresh (each record names its draft lag); each
    session's prompt comes from one task, on which the draft accepts more or
    less. Each simulated worker closes its batches with markers. With --expect, the metrics the worker must publish are
    written first, so a run can be checked end to end.
    """
    from ..fleet.publish import LoadSummary
    from ..fleet.synthetic import FleetSpec

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
        draft_lags=draft_lags,
    )
    security = _broker_security(broker, topic, dump)
    if _written(spec, expect, dump, no_progress):
        return
    assert security is not None  # no dump: the broker run, checked above
    summary = LoadSummary()
    try:
        _publish(spec, broker, topic, run_id, security, rate, producers, batches, no_progress, summary)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (base.Stopped): what was sent
        _report_interrupted_load(summary, interrupt)
        click.get_current_context().exit(exit_status(interrupt))
    click.echo(
        f"loadgen: {summary.records} records, {summary.invalid} invalid, {summary.markers} markers in "
        f"{summary.seconds:.1f}s ({summary.rate:,.0f} records/s)",
        err=True,
    )


def _broker_security(broker: str, topic: str, dump: IO[bytes] | None) -> KafkaSecurity | None:
    """The KAFKA_* security, checked with the broker and its records topic before ``--expect``
    is written or a progress bar drawn (a broker that is not there fails first); None for
    ``--dump``, which needs no broker."""
    if dump is not None:
        return None
    security = preflight.security_from_env()
    preflight.check_before_start(broker, security, records_topic=topic)
    return security


def _report_interrupted_load(summary: Any, interrupt: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM: what was sent, and how the worker closes a batch left half-sent."""
    by = ended_by(interrupt)
    click.echo(
        f"loadgen: {by} after {summary.seconds:.1f}s: {summary.records} records, {summary.invalid} invalid, "
        f"{summary.markers} markers sent; a batch whose markers were not all sent is closed by the worker's "
        "--batch-timeout, incomplete",
        err=True,
    )


def _publish(
    spec: FleetSpec,
    broker: str,
    topic: str,
    run_id: str | None,
    security: Any,
    rate: float | None,
    producers: int,
    batches: int,
    no_progress: bool,
    summary: Any,
) -> None:
    """The fleet published to the broker, with a progress bar of the batches; counted into ``summary``."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from specmeter.producers import PublisherSettings

    from ..fleet.publish import publish_fleet
    from ..fleet.synthetic import synthetic_fleet

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=no_progress,
    ) as progress:
        task = progress.add_task("batches", total=batches)

        def on_event(event: FleetEvent) -> None:
            if _ends_a_batch(event, producers):
                progress.advance(task)

        asyncio.run(
            folded(
                "loadgen",
                publish_fleet(
                    synthetic_fleet(spec),
                    PublisherSettings(bootstrap_servers=broker, topic=topic, run_id=run_id, security=security),
                    rate=rate,
                    on_event=on_event,
                    summary=summary,
                ),
            )
        )


def _written(spec: FleetSpec, expect: IO[bytes] | None, dump: IO[bytes] | None, no_progress: bool = True) -> bool:
    """Write ``--expect`` (first: a run can be checked end to end), then ``--dump``; True
    when the events went to the dump instead of the broker."""
    from ..fleet.publish import write_dump, write_expected

    if expect is not None:
        n = write_expected(_progressed(spec, "expected metrics", no_progress), expect)
        click.echo(f"loadgen: expected metrics of {n} batch(es) written to {expect.name}", err=True)
    if dump is None:
        return False
    n = write_dump(_progressed(spec, "dump", no_progress), dump)
    click.echo(f"loadgen: {n} events written to {dump.name}", err=True)
    return True


def _progressed(spec: FleetSpec, what: str, no_progress: bool) -> Iterator[FleetEvent]:
    """The fleet's events, with a progress bar of its batches on stderr where stderr is a
    terminal (issue 47.7: a big --dump ran minutes with no output; stdout may be the dump)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ..fleet.synthetic import synthetic_fleet

    console = Console(stderr=True)
    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=no_progress or not console.is_terminal) as progress:
        task = progress.add_task(f"batches ({what})", total=spec.batches)
        for event in synthetic_fleet(spec):
            yield event
            if _ends_a_batch(event, spec.producers):
                progress.advance(task)


def _ends_a_batch(event: FleetEvent, producers: int) -> bool:
    """The last producer's marker: a whole batch sent (the producers' markers close it in
    their order), a step of either progress bar."""
    return event.kind == "marker" and event.producer_id.endswith(f"-{producers - 1}")
