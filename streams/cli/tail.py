"""``specmeter tail``: follow the metrics topic, as a live table, rows or JSON lines.

Like ``tail`` it starts with what is already there (the last ``last`` messages of
each partition), then follows. Piped, it prints a line per message as it arrives
(flushed: ``timeout 60 specmeter tail | head`` shows rows at once) and the table when
it ends, at a limit, Ctrl-C or SIGTERM; a terminal gets the table live
(``tables``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from specmeter.schemas import BatchMetrics, decode_metrics, encode_metrics

from ..readers.topic_lookup import subscribe_existing
from . import preflight
from .base import (
    DEFAULTS,
    KAFKA_ENV_HELP,
    Command,
    Number,
    Stopped,
    broker_option,
    folded,
    one_line_errors,
    reader_left,
)

if TYPE_CHECKING:
    from .tables import RowPrinter

__all__ = ["follow_metrics", "run_tail", "tail"]


@click.command(cls=Command, epilog=KAFKA_ENV_HELP)
@broker_option
@click.option("--topic", default=DEFAULTS.topics.metrics, show_default=True, help="The metrics topic.")
@click.option("--json", "as_json", is_flag=True, help="Print each BatchMetrics as a JSON line (for scripts).")
@click.option("--from-beginning", is_flag=True, help="Start at the topic's first message.")
@click.option(
    "--last",
    type=Number(0, integer=True),
    default=10,
    show_default=True,
    metavar="N",
    help="Start N messages before the end of each partition, as `tail` shows the last lines (0: only new ones).",
)
@click.option("--rows", type=Number(1, integer=True), default=20, show_default=True, help="Batches in the table.")
@click.option(
    "--max-messages",
    type=Number(1, integer=True),
    default=None,
    metavar="N",
    help="Stop after this many messages (those read back at start count).",
)
@click.option("--timeout", type=Number(0), default=None, metavar="SECONDS", help="Stop after this long.")
@click.option(
    "--wide",
    is_flag=True,
    help="Piped: no column cut, the drift view whole, however long the lines (default: the terminal's width or "
    "$COLUMNS, 80 for a pipe; ids are never cut).",
)
@one_line_errors
def tail(
    broker: str,
    topic: str,
    as_json: bool,
    from_beginning: bool,
    last: int,
    rows: int,
    max_messages: int | None,
    timeout: float | None,
    wide: bool,
) -> None:
    """Follow the metrics topic: a live table of the latest batches, or JSON lines.

    The table fits the terminal: per batch (run/batch when it names a run) the
    accept rate, tokens per verify step, coverage (the lower of accept and verify
    coverage; 50%v: the verify pair is the lower), unique generations,
    conflicting/invalid/late counts, how it closed (! when incomplete), where
    there is room the accept rate by draft position (.81 .62 .40) and per task
    (gsm8k .88 chat .71), and the drift view: the accept rate of each weight
    version (v7 .75 v8 .71), newest kept when they do not all fit. Piped, it
    prints a line per message as it arrives, then the final table when it ends
    (a limit, Ctrl-C or SIGTERM); run/batch ids are never cut (a long one widens
    the line), and with --wide no other column either. The exit status after
    Ctrl-C is 130, after SIGTERM 143 (as loadgen and replay), after a limit 0.
    """
    security = preflight.security_from_env()
    preflight.check_before_start(broker, security)
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
        wide=wide,
    )


async def follow_metrics(
    broker: str,
    topic: str,
    on_metrics: Callable[[BatchMetrics], None],
    *,
    from_beginning: bool = False,
    last: int = 0,
    max_messages: int | None = None,
    timeout_s: float | None = None,
    kafka: dict | None = None,
) -> int:
    """Call ``on_metrics`` for each message until ``max_messages`` or ``timeout_s``; returns the count.

    Starts at the topic's beginning (``from_beginning``), else ``last`` messages
    before the end of each partition (those count towards ``max_messages``).

    Raises:
        TopicNotFound: ``topic`` does not exist (it is never created).
    """
    consumer = _consumer(broker, from_beginning, kafka)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        await consumer.start()  # inside try: a failed start must still close the client
        await _subscribe(consumer, topic, broker, from_beginning, last)
        return await _consume(consumer, on_metrics, max_messages, deadline)
    finally:
        await consumer.stop()


async def _consume(
    consumer: Any, on_metrics: Callable[[BatchMetrics], None], max_messages: int | None, deadline: float | None
) -> int:
    """Hand the messages on until ``max_messages`` or the deadline (the consumer's start and
    stop are the caller's); how many were."""
    seen = 0
    while _room(seen, max_messages) and _before(deadline):
        for messages in (await consumer.getmany(timeout_ms=250)).values():
            seen = _deliver(messages, on_metrics, seen, max_messages)
    return seen


async def _subscribe(consumer: Any, topic: str, broker: str, from_beginning: bool, last: int) -> None:
    """Subscribe to the topic once it is found (never creating it) and seek to where reading starts."""
    await subscribe_existing(consumer, topic, broker, fix=_missing_topic_fix)
    if not from_beginning and last > 0:
        await _rewind(consumer, last)


def _consumer(broker: str, from_beginning: bool, kafka: dict | None) -> Any:
    """A consumer of no group, not started, subscribed to nothing: subscribing to a missing
    topic would create it."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        bootstrap_servers=broker,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **(kafka or {}),
    )


def _room(seen: int, max_messages: int | None) -> bool:
    """Whether ``max_messages`` leaves room for another message."""
    return max_messages is None or seen < max_messages


def _before(deadline: float | None) -> bool:
    """Whether the deadline (None: none) is still ahead."""
    return deadline is None or time.monotonic() < deadline


def _deliver(
    messages: list[Any], on_metrics: Callable[[BatchMetrics], None], seen: int, max_messages: int | None
) -> int:
    """Hand each message that decodes to ``on_metrics`` while there is room; the count so far."""
    for message in messages:
        if not _room(seen, max_messages):
            break
        metrics = _decoded(message)
        if metrics is not None:
            on_metrics(metrics)
            seen += 1
    return seen


def _decoded(message: Any) -> BatchMetrics | None:
    """The message's BatchMetrics; None, with a line on stderr, for a foreign message."""
    try:
        return decode_metrics(message.value)
    except Exception as exc:  # noqa: BLE001 - a foreign message must not stop the tail
        print(f"specmeter tail: skipped offset {message.offset}: {exc}", file=sys.stderr)
        return None


def _missing_topic_fix(similar: list[str], of_role: list[str]) -> str:
    if similar:
        return f"did you mean {' or '.join(similar)}?"
    named = f" (metrics topics there: {', '.join(of_role)})" if of_role else ""
    return f"start `specmeter worker` first, or name its --metrics-topic{named}"


async def _rewind(consumer: Any, last: int) -> None:
    """Seek every assigned partition to ``last`` messages before its end."""
    partitions = list(consumer.assignment())
    if not partitions:
        return
    begins = await consumer.beginning_offsets(partitions)
    ends = await consumer.end_offsets(partitions)
    for tp in partitions:
        consumer.seek(tp, max(begins[tp], ends[tp] - last))


def run_tail(
    broker: str,
    topic: str,
    *,
    as_json: bool,
    from_beginning: bool,
    rows: int,
    last: int,
    max_messages: int | None,
    timeout_s: float | None,
    kafka: dict | None = None,
    wide: bool = False,
) -> int:
    """Follow ``topic`` until a limit, Ctrl-C or SIGTERM (``timeout 60 specmeter tail``):
    a terminal gets a live table; a pipe gets a line per message as it arrives (flushed
    at once) and, at the end, the table; ``as_json`` a JSON line per message.

    Raises:
        Stopped: Ctrl-C (SIGINT) or SIGTERM ended it, after the table is printed: the
            command exits 130 or 143 as ``loadgen`` and ``replay`` do (issue 47.7: 0).
    """
    signals: list[int] = []
    follow = _follower(
        broker,
        topic,
        signals,
        from_beginning=from_beginning,
        last=last,
        max_messages=max_messages,
        timeout_s=timeout_s,
        kafka=kafka,
    )
    try:
        seen = _follow_json(follow) if as_json else _follow_table(follow, topic, rows, wide)
    except BrokenPipeError:  # the reader left (`| head`): end quietly, as tail does
        reader_left()
        return 0
    if signals:
        raise Stopped(signals[0])
    return seen


Follow = Callable[[Callable[[BatchMetrics], None]], None]


def _follower(broker: str, topic: str, signals: list[int], **options: Any) -> Follow:
    """What follows the topic, handing each message on, until a limit, Ctrl-C or SIGTERM;
    the signal that ended it is appended to ``signals`` (the table is printed first)."""

    def follow(on_metrics: Callable[[BatchMetrics], None]) -> None:
        async def until_stopped() -> None:
            try:  # aiokafka's outage lines folded, SIGTERM raised as Stopped (``base.folded``)
                await folded("tail", follow_metrics(broker, topic, on_metrics, **options))
            except Stopped as stopped:  # SIGTERM ends it as a limit does
                signals.append(stopped.signum)

        try:
            asyncio.run(until_stopped())
        except KeyboardInterrupt:  # Ctrl-C is how a tail ends
            signals.append(signal.SIGINT)

    return follow


def _follow_json(follow: Follow) -> int:
    """A JSON line per message, flushed at once; the count."""
    seen = 0

    def emit(m: BatchMetrics) -> None:
        nonlocal seen
        seen += 1
        sys.stdout.buffer.write(encode_metrics(m) + b"\n")
        sys.stdout.flush()

    follow(emit)
    return seen


class _Latest:
    """What the table shows: each batch's newest revision, the batch last updated last, and
    how many messages came."""

    def __init__(self) -> None:
        self.batches: dict[tuple[str | None, str], BatchMetrics] = {}
        self.seen = 0

    def keep(self, m: BatchMetrics) -> None:
        """Count a message; its batch moves to the end, at the newer of the two revisions."""
        self.seen += 1
        key = (m.run_id, m.batch_id)
        previous = self.batches.pop(key, None)
        self.batches[key] = m if previous is None or m.revision >= previous.revision else previous


def _follow_table(follow: Follow, topic: str, rows: int, wide: bool = False) -> int:
    """The table of the latest batches: live on a terminal; piped, a line per message as it
    comes, then the final table (a long id or drift view never cut). The count."""
    from rich.console import Console
    from rich.live import Live

    from .tables import RowPrinter, metrics_table, output_console

    console = output_console()  # piped: no line wrapped (ids never cut; --wide: no cell)
    piped = not console.is_terminal
    layout_width = Console().width if piped else console.width  # piped: the columns of COLUMNS (80)
    latest = _Latest()

    def table() -> Any:
        return metrics_table(
            latest.batches,
            rows,
            layout_width,
            title=f"specmeter tail {topic}: latest {min(rows, len(latest.batches))} batches",
            whole=piped and wide,
            ids=piped,
        )

    if piped:
        _print_rows(follow, latest, RowPrinter(layout_width, whole=wide))
        console.print(table())
        sys.stdout.flush()
        return latest.seen
    with Live(table(), refresh_per_second=4, console=console) as live:

        def update(m: BatchMetrics) -> None:
            latest.keep(m)
            live.update(table())

        follow(update)
    return latest.seen


def _print_rows(follow: Follow, latest: _Latest, printer: RowPrinter) -> None:
    """Piped: a line per message as it comes (flushed, the header before the first), kept
    in ``latest`` for the table that follows, then a blank line."""

    def line(m: BatchMetrics) -> None:
        if not latest.seen:
            print(printer.header())
        latest.keep(m)
        print(printer.row(m), flush=True)

    follow(line)
    print(flush=True)
