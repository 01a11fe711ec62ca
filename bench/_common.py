"""Shared by the benchmark scripts: a broker address, topics, and how results print."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
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


def fresh_topic(
    bootstrap: str,
    prefix: str,
    partitions: int,
    *,
    name: str | None = None,
    topic_configs: dict[str, str] | None = None,
) -> str:
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


def load() -> str:
    """The machine's load average (1, 5, 15 min): benchmarks share it with other work."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with the figures on stdout (the table goes to stderr)",
    )


def report(title: str, rows: list[tuple[str, str]], data: dict | None = None, *, as_json: bool = False) -> None:
    """The table of results; with ``as_json``, the table on stderr and ``data`` (plus
    the machine and its load) as one JSON object on stdout."""
    out = sys.stderr if as_json else sys.stdout
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}  [{machine()}; load {load()}]", file=out)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}", file=out)
    if as_json:
        print(json.dumps({**(data or {}), "machine": machine(), "load": load()}))


def core_name() -> str:
    """The stage-1 core this process runs (native or python)."""
    from specmeter.streams._core import CORE

    return CORE.name
