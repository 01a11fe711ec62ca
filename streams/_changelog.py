"""The workers' own state changelogs: compacted topics, one per stage.

Faust writes them (through its producer, so its revocation and commit paths
flush them before anything else moves on); a standalone consumer reads a
partition back when a worker takes it over. Faust's table recovery is not
used: it can hang on rebalances (faust-streaming#21, #74, robinhood/faust#218).
"""

from __future__ import annotations

from typing import Any

__all__ = ["changelog_topics", "read_changelog_partition"]


def changelog_topics(app_id: str) -> tuple[str, str]:
    """Names of the stage-1 and stage-2 state changelogs of an app."""
    return f"{app_id}-stage1-state-changelog", f"{app_id}-stage2-state-changelog"


async def read_changelog_partition(broker: str, topic: str, partition: int, *, kafka: dict[str, Any] | None = None,
                                   timeout_s: float = 120.0) -> list[tuple[bytes, bytes]]:
    """Every live (key, value) of one changelog partition, read to its end (latest value
    per key; tombstones remove keys)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_uncommitted",
                                max_partition_fetch_bytes=16 * 1024 * 1024, **(kafka or {}))
    await consumer.start()
    live: dict[bytes, bytes] = {}
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] up to offset {end} took over {timeout_s}s")
            for message in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if message.value is None:
                    live.pop(message.key, None)
                else:
                    live[message.key] = message.value
    finally:
        await consumer.stop()
    return list(live.items())


async def read_range(broker: str, topic: str, partition: int, start: int, end: int | None = None, *,
                     kafka: dict[str, Any] | None = None, timeout_s: float = 120.0,
                     max_messages: int | None = None) -> tuple[list[tuple[int, bytes]], int]:
    """Messages of one partition with offsets in [start, end) (end None: the log end now).

    Used to fill what Faust's consumer skipped: it is the authority on which
    offsets exist. Returns the (offset, value) pairs and the offset read up to
    (exclusive): ``end``, or less when ``max_messages`` stopped the read early.
    """
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024,
                                **(kafka or {}))
    await consumer.start()
    out: list[tuple[int, bytes]] = []
    try:
        consumer.assign([tp])
        if end is None:
            end = (await consumer.end_offsets([tp]))[tp]
        if start >= end:
            return out, end
        consumer.seek(tp, max(start, 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] {start}..{end} took over {timeout_s}s")
            for message in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if start <= message.offset < end:
                    out.append((message.offset, message.value))
            if max_messages is not None and len(out) >= max_messages:
                return out, await consumer.position(tp)
    finally:
        await consumer.stop()
    return out, end
