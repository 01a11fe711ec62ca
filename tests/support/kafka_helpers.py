"""Small helpers for tests that talk to a real broker."""

from __future__ import annotations

import asyncio
from typing import Any

from specmeter.streams.worker.topics import create_topic

__all__ = ["create_topic", "read_topic", "send_to_partitions"]


async def read_topic(
    bootstrap: str, topic: str, *, until: Any = None, timeout_s: float = 30.0, idle_s: float | None = None
) -> list:
    """Every message of ``topic`` from the beginning (no group), until ``until(messages)``
    is true, ``idle_s`` passes without a new message, or the timeout."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last_new = loop.time()
    try:
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                out.extend(messages)
            if batch:
                last_new = loop.time()
            if until is not None and until(out):
                break
            if idle_s is not None and loop.time() - last_new > idle_s:
                break
    finally:
        await consumer.stop()
    return out


async def send_to_partitions(bootstrap: str, topic: str, items: list[tuple[int, bytes]]) -> None:
    """Produce each (partition, value) in order, each acknowledged before the next is sent
    (requests up to 4 MiB: some tests send messages past the 1 MiB default)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        for partition, value in items:
            await producer.send_and_wait(topic, value, partition=partition)
    finally:
        await producer.stop()


async def topic_names(bootstrap: str) -> set[str]:
    """Every topic of the cluster (to check that nothing was created)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: list[str], timeout_s: float = 15.0) -> None:
    """Delete topics a test made, best effort: those that do not exist, or a broker that is
    gone (a test stopped it), are no failure of the test."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            gone = [name for name in names if name in existing]
            if gone:
                await admin.delete_topics(gone)
        finally:
            await admin.close()

    try:
        await asyncio.wait_for(delete(), timeout_s)
    except Exception:  # noqa: BLE001 - clean-up only
        pass
