"""``specmeter tail``: follow the metrics topic, as a live table or JSON lines."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

from specmeter.schemas import BatchMetrics, decode_metrics, encode_metrics

__all__ = ["follow_metrics", "metrics_table"]


async def follow_metrics(broker: str, topic: str, on_metrics: Callable[[BatchMetrics], None], *,
                         from_beginning: bool = False, max_messages: int | None = None,
                         timeout_s: float | None = None, kafka: dict | None = None) -> int:
    """Call ``on_metrics`` for each message until ``max_messages`` or ``timeout_s``; returns the count."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker, group_id=None,
                                auto_offset_reset="earliest" if from_beginning else "latest", **(kafka or {}))
    await consumer.start()
    seen = 0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while (max_messages is None or seen < max_messages) and (deadline is None or time.monotonic() < deadline):
            for messages in (await consumer.getmany(timeout_ms=250)).values():
                for message in messages:
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


def metrics_table(latest: dict[str, BatchMetrics], rows: int = 20) -> Any:
    from rich.table import Table

    table = Table(title=f"specmeter: latest {min(rows, len(latest))} batches", expand=False)
    for name in ("batch", "rev", "accept rate", "tokens/verify", "accept cov.", "verify cov.", "generations",
                 "conflicts", "invalid", "late", "close", "complete"):
        table.add_column(name, justify="left" if name == "batch" else "right")

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)

    for m in list(latest.values())[-rows:]:
        x = m.metrics
        table.add_row(m.batch_id, str(m.revision), fmt(x.get("spec/accept_rate")), fmt(x.get("spec/tokens_per_verify")),
                      fmt(x.get("spec/accept_count_coverage")), fmt(x.get("spec/verify_count_coverage")),
                      fmt(x.get("spec/unique_generation_count")), fmt(x.get("spec/conflicting_generation_count")),
                      str(m.invalid_record_count), str(m.late_record_count), m.close_reason,
                      "yes" if m.complete else "no")
    return table


def run_tail(broker: str, topic: str, *, as_json: bool, from_beginning: bool, rows: int,
             max_messages: int | None, timeout_s: float | None, kafka: dict | None = None) -> int:
    if as_json:
        def emit(m: BatchMetrics) -> None:
            sys.stdout.buffer.write(encode_metrics(m) + b"\n")
            sys.stdout.flush()

        return asyncio.run(follow_metrics(broker, topic, emit, from_beginning=from_beginning,
                                          max_messages=max_messages, timeout_s=timeout_s, kafka=kafka))
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if not console.is_terminal:  # piped: a fixed, wide rendering instead of 80 columns
        console = Console(width=160)
    latest: dict[str, BatchMetrics] = {}
    with Live(metrics_table(latest, rows), refresh_per_second=4, console=console) as live:
        def update(m: BatchMetrics) -> None:
            latest.pop(m.batch_id, None)
            latest[m.batch_id] = m
            live.update(metrics_table(latest, rows))

        return asyncio.run(follow_metrics(broker, topic, update, from_beginning=from_beginning,
                                          max_messages=max_messages, timeout_s=timeout_s, kafka=kafka))
