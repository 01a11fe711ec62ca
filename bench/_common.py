"""Shared by the benchmark scripts: a broker address, topics, and how results print."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BROKER = REPO / "deploy" / "kafka" / "broker"


def broker_address() -> str:
    """KAFKA_BOOTSTRAP_SERVERS, else the local broker of deploy/kafka/broker (started if needed)."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        return configured
    proc = subprocess.run([str(BROKER), "start"], capture_output=True, text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]


def fresh_topic(bootstrap: str, prefix: str, partitions: int, *, name: str | None = None,
                topic_configs: dict[str, str] | None = None) -> str:
    from specmeter.streams._topics import create_topic

    name = name or f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(bootstrap, name, partitions, topic_configs=topic_configs))
    asyncio.run(_wait_for_leaders(bootstrap, name, partitions))
    return name


async def _wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """A fresh topic's partitions need leaders before producing without retries."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            await consumer._client.force_metadata_update()
            cluster = consumer._client.cluster
            leaders = [cluster.leader_for_partition(_tp(topic, p)) for p in range(partitions)]
            if all(leader is not None and leader >= 0 for leader in leaders):
                return
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


def _tp(topic: str, partition: int):
    from aiokafka.structs import TopicPartition

    return TopicPartition(topic, partition)


def free_port() -> int:
    """A TCP port nobody listens on now (for a worker's web server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def report(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}  [{machine()}]")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
