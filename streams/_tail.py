"""``specmeter tail``: follow the metrics topic, as a live table or JSON lines.

Like ``tail`` it starts with what is already there (the last ``last`` messages of
each partition), then follows. The table fits the terminal (80 columns
included): fixed numeric columns, the rest shared by the batch name and a
compact drift view, the accept rate per weight version (``v7 .75 v8 .71``).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from specmeter.schemas import BatchMetrics, WeightVersionMetrics, decode_metrics, encode_metrics

__all__ = ["follow_metrics", "metrics_table", "drift_text", "batch_label", "run_tail"]

#: (header, content width) of the fixed columns, between "batch" and "drift"
_FIXED = (("rev", 3), ("accept", 6), ("tok/v", 5), ("cov", 4), ("gens", 5), ("c/i/l", 5), ("close", 8))
#: below this width "gens" is left out, so batch names and the drift view keep room
_WIDE = 100
_GAP = 2  # between columns: the (blank) divider and one space of right padding


def _fixed(width: int) -> tuple[tuple[str, int], ...]:
    return _FIXED if width >= _WIDE else tuple(c for c in _FIXED if c[0] != "gens")


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
    """
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **(kafka or {}),
    )
    seen = 0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        await consumer.start()  # inside try: a failed start must still close the client
        if not from_beginning and last > 0:
            await _rewind(consumer, last)
        while (max_messages is None or seen < max_messages) and (deadline is None or time.monotonic() < deadline):
            for messages in (await consumer.getmany(timeout_ms=250)).values():
                for message in messages:
                    if max_messages is not None and seen >= max_messages:
                        break
                    try:
                        metrics = decode_metrics(message.value)
                    except Exception as exc:  # noqa: BLE001 - a foreign message must not stop the tail
                        print(f"specmeter tail: skipped offset {message.offset}: {exc}", file=sys.stderr)
                        continue
                    on_metrics(metrics)
                    seen += 1
    finally:
        await consumer.stop()
    return seen


async def _rewind(consumer: Any, last: int) -> None:
    """Seek every assigned partition to ``last`` messages before its end."""
    partitions = list(consumer.assignment())
    if not partitions:
        return
    begins = await consumer.beginning_offsets(partitions)
    ends = await consumer.end_offsets(partitions)
    for tp in partitions:
        consumer.seek(tp, max(begins[tp], ends[tp] - last))


def _natural(version: str | None) -> tuple:
    """v9 before v10; the unknown version last."""
    if version is None:
        return (1, ())
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", version) if p))


def _rate(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    text = f"{value:.2f}"
    return text[1:] if text.startswith("0.") else text


def _fit_left(text: str, width: int) -> str:
    """``text``, or its end behind an ellipsis when it is too long."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def drift_text(entries: list[WeightVersionMetrics] | None, width: int) -> str:
    """Accept rate per weight version, oldest first, as many of the newest as fit: ``v7 .75 v8 .71``."""
    if not entries:
        return "-"
    parts = [
        f"{_fit_left(e.weight_version or '?', 10)} {_rate(e.metrics.get('spec/accept_rate'))}"
        for e in sorted(entries, key=lambda e: _natural(e.weight_version))
    ]
    text = " ".join(parts)
    while len(text) > width and len(parts) > 1:
        parts.pop(0)
        text = "… " + " ".join(parts)
    return _fit_left(text, width)


def batch_label(m: BatchMetrics, width: int) -> str:
    """``run/batch`` (just the batch in the default run), shortened from the run's side."""
    if m.run_id is None:
        return _fit_left(m.batch_id, width)
    room = width - len(m.batch_id) - 1
    if room >= 2:
        run = m.run_id if len(m.run_id) <= room else m.run_id[: room - 1] + "…"
        return f"{run}/{m.batch_id}"
    return _fit_left(f"{m.run_id}/{m.batch_id}", width)


def _count(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 100_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:.0f}"


def _widths(total: int, labels: list[str], drifts: list[str]) -> tuple[int, int]:
    """Widths of the batch and drift columns in a table ``total`` columns wide: each
    what it needs when both fit, else the batch name gets at most half the room."""
    fixed = _fixed(total)
    room = max(20, total - sum(w for _, w in fixed) - _GAP * (len(fixed) + 1))
    batch_need = max([len(s) for s in labels] + [10])
    drift_need = max([len(s) for s in drifts] + [10])
    if batch_need + drift_need <= room:
        return batch_need, drift_need
    batch = min(batch_need, max(10, room - drift_need, room // 2))
    return batch, max(10, room - batch)


def metrics_table(latest: dict[Any, BatchMetrics], rows: int = 20, width: int = 80, title: str | None = None) -> Any:
    """The latest ``rows`` batches as a rich Table no wider than ``width`` (without
    the unique-generation count when narrower than 100 columns)."""
    from rich import box
    from rich.table import Table

    shown = list(latest.values())[-rows:]
    full_labels = [m.batch_id if m.run_id is None else f"{m.run_id}/{m.batch_id}" for m in shown]
    full_drifts = [drift_text(m.by_weight_version, 200) for m in shown]
    batch_w, drift_w = _widths(width, full_labels, full_drifts)
    table = Table(
        title=title or f"specmeter: latest {len(shown)} batches",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
        caption="c/i/l conflicting/invalid/late · ! incomplete · drift: accept rate by version",
    )
    table.add_column("batch", width=batch_w, no_wrap=True, overflow="ellipsis")
    fixed = _fixed(width)
    for name, w in fixed:
        table.add_column(name, width=w, justify="right", no_wrap=True, overflow="ellipsis")
    table.add_column("drift", width=drift_w, no_wrap=True, overflow="ellipsis")

    def ratio(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"

    def share(v: Any) -> str:
        return "-" if v is None else f"{v * 100:.0f}%"

    for m in shown:
        x = m.metrics
        problems = "/".join(
            _count(n)
            for n in (x.get("spec/conflicting_generation_count", 0), m.invalid_record_count, m.late_record_count)
        )
        cells = {
            "rev": str(m.revision),
            "accept": ratio(x.get("spec/accept_rate")),
            "tok/v": ratio(x.get("spec/tokens_per_verify")),
            "cov": share(x.get("spec/accept_count_coverage")),
            "gens": _count(x.get("spec/unique_generation_count")),
            "c/i/l": problems,
            "close": m.close_reason if m.complete else f"{m.close_reason[:7]}!",
        }
        table.add_row(
            batch_label(m, batch_w),
            *(cells[name] for name, _ in fixed),
            drift_text(m.by_weight_version, drift_w),
            style=None if m.complete else "yellow",
        )
    return table


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
) -> int:
    """Follow ``topic`` until a limit or Ctrl-C; a terminal gets a live table, a pipe the final one."""

    def follow(on_metrics: Callable[[BatchMetrics], None]) -> int:
        try:
            return asyncio.run(
                follow_metrics(
                    broker,
                    topic,
                    on_metrics,
                    from_beginning=from_beginning,
                    last=last,
                    max_messages=max_messages,
                    timeout_s=timeout_s,
                    kafka=kafka,
                )
            )
        except KeyboardInterrupt:  # Ctrl-C is how a tail ends
            return -1

    if as_json:

        def emit(m: BatchMetrics) -> None:
            sys.stdout.buffer.write(encode_metrics(m) + b"\n")
            sys.stdout.flush()

        return follow(emit)
    from rich.console import Console
    from rich.live import Live

    console = Console()
    latest: dict[tuple[str | None, str], BatchMetrics] = {}
    seen = 0

    def keep(m: BatchMetrics) -> None:
        nonlocal seen
        seen += 1
        key = (m.run_id, m.batch_id)
        previous = latest.pop(key, None)
        latest[key] = m if previous is None or m.revision >= previous.revision else previous

    def table() -> Any:
        return metrics_table(
            latest, rows, console.width, title=f"specmeter tail {topic}: latest {min(rows, len(latest))} batches"
        )

    if not console.is_terminal:  # piped: no animation, the final table once, ending with a newline
        follow(keep)
        console.print(table())
        return seen
    with Live(table(), refresh_per_second=4, console=console) as live:

        def update(m: BatchMetrics) -> None:
            keep(m)
            live.update(table())

        follow(update)
    return seen
