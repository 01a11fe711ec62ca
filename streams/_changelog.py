"""The workers' own state changelogs: compacted topics, one per stage.

Faust writes them (through its producer, so its revocation and commit paths
flush them before anything else moves on); a standalone consumer reads a
partition back when a worker takes it over. Faust's table recovery is not
used: it can hang on rebalances (faust-streaming#21, #74, robinhood/faust#218).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._layout import changelog_topics

__all__ = ["changelog_topics", "read_changelog_partition"]


async def _read(
    broker: str,
    topic: str,
    partition: int,
    start: int | None,
    end: int | None,
    visit: Callable[[Any], bool],
    *,
    kafka: dict[str, Any] | None,
    timeout_s: float,
) -> int:
    """Feed the messages of one partition from ``start`` (None: its beginning) up to
    ``end`` (None: its end now) to ``visit`` until it returns False; returns the
    position reached. A standalone consumer, so nothing depends on Faust's."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=16 * 1024 * 1024,
        **(kafka or {}),
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        if end is None:
            end = (await consumer.end_offsets([tp]))[tp]
        if start is None:
            await consumer.seek_to_beginning(tp)
        elif start >= end:
            return end
        else:
            consumer.seek(tp, max(start, 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (position := await consumer.position(tp)) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] from {start} to {end} took over {timeout_s}s")
            for message in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if message.offset < end and not visit(message):
                    return message.offset + 1  # the fetch may have gone further; we read to here
        return position
    finally:
        await consumer.stop()


async def read_changelog_partition(
    broker: str, topic: str, partition: int, *, kafka: dict[str, Any] | None = None, timeout_s: float = 120.0
) -> list[tuple[bytes, bytes]]:
    """Every live (key, value) of one changelog partition, read to its end (latest value
    per key; tombstones remove keys)."""
    live: dict[bytes, bytes] = {}

    def keep(message: Any) -> bool:
        if message.value is None:
            live.pop(message.key, None)
        else:
            live[message.key] = message.value
        return True

    await _read(broker, topic, partition, None, None, keep, kafka=kafka, timeout_s=timeout_s)
    return list(live.items())


async def read_range(
    broker: str,
    topic: str,
    partition: int,
    start: int,
    end: int | None = None,
    *,
    kafka: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    max_messages: int | None = None,
) -> tuple[list[tuple[int, bytes]], int]:
    """Messages of one partition with offsets in [start, end) (end None: the log end now).

    Used to fill what Faust's consumer skipped: it is the authority on which
    offsets exist. Returns the (offset, value) pairs and the offset read up to
    (exclusive): ``end``, or less when ``max_messages`` stopped the read early.
    """
    out: list[tuple[int, bytes]] = []

    def collect(message: Any) -> bool:
        if message.offset >= start:
            out.append((message.offset, message.value))
        return max_messages is None or len(out) < max_messages

    upto = await _read(broker, topic, partition, start, end, collect, kafka=kafka, timeout_s=timeout_s)
    return out, upto
