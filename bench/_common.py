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
    """KAFKA_BOOTSTRAP_SERVERS, else the local broker of deploy/kafka/broker: one running is
    used and left alone; one started here is tied to this benchmark (it stops when the
    benchmark ends, however it ends: SPECMETER_KAFKA_PARENT_PID)."""
    from specmeter.streams.cli.lifetime import tied_to_me

    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        return configured
    proc = subprocess.run([str(BROKER), "start"], capture_output=True, text=True, check=True, env=tied_to_me())
    return proc.stdout.strip().splitlines()[-1]


def fresh_topic(
    bootstrap: str,
    prefix: str,
    partitions: int,
    *,
    name: str | None = None,
    topic_configs: dict[str, str] | None = None,
) -> str:
    from specmeter.streams.worker.topics import create_topic

    name = name or f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(bootstrap, name, partitions, topic_configs=topic_configs))
    asyncio.run(_wait_for_leaders(bootstrap, name, partitions))
    return name


async def _wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """A fresh topic's partitions need leaders before producing without retries."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            (described,) = await admin.describe_topics([topic])
            leaders = [p["leader"] for p in described.get("partitions", ())]
            if len(leaders) == partitions and all(leader is not None and leader >= 0 for leader in leaders):
                return
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete a run's topics (best effort): a broker that serves many runs holds a few files
    per partition, and runs that leave their topics behind reach its open-file limit."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            if gone := [n for n in names if n in existing]:
                await admin.delete_topics(gone)
        finally:
            await admin.close()

    try:
        asyncio.run(asyncio.wait_for(delete(), 30))
    except Exception as exc:  # noqa: BLE001 - clean-up only
        print(f"(could not delete {len(names)} topic(s): {exc!r})", file=sys.stderr)


def topic_messages(bootstrap: str, topic: str, partitions: int) -> int:
    """Kafka messages in a topic of ``partitions`` partitions now (end offsets minus starts)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    async def count() -> int:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
            return sum(ends[tp] - starts[tp] for tp in tps)
        finally:
            await consumer.stop()

    return asyncio.run(count())


def free_port() -> int:
    """A TCP port nobody listens on now (for a worker's web server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to ``port`` (Linux: its socket
    descriptors matched against /proc/net/tcp and tcp6)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    from specmeter.streams.core.cores import CORE

    return CORE.name
