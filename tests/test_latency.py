"""Close latency under sustained load (issue #16), measured by bench/soak_latency.py.

Half a minute of 18k records/s with a 10 s grace, so closed batches expire while
the load goes on: the worker reads its input with a fetch wait of 1.5 s behind
Faust, handed it over a few messages at a time and produced one message per
event-loop turn; every batch then waited 1-3 s for its metrics. The bound here
is the issue's "no batch over 1 s after warm-up", with room for a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_no_batch_waits_a_second_for_its_metrics_under_sustained_load(kafka_bootstrap):
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "soak_latency.py"),
            "--rate",
            "18000",
            "--duration",
            "30",
            "--grace",
            "10",
            "--warmup",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    slow = [
        (r["batch_id"], r["at_s"], r["e2e_ms"])
        for r in result["per_batch"]
        if r["at_s"] >= result["warmup_s"] and r["e2e_ms"] > 1000
    ]
    assert result["batches_without_metrics"] == 0 and result["incomplete_batches"] == 0
    assert not slow, f"batches over 1 s: {slow}; e2e {result['e2e_ms']}, hops {result['hops_ms']}"
    assert result["lag_messages"]["max"] < 2000, result["lag_messages"]  # the worker kept up


def test_the_consumer_group_commits_what_stage_1_applied(deployment):
    """Stage 1 reads its input through its route, a member of the stage's group
    (``<app-id>-stage1``); the group's committed offsets (what lag dashboards read)
    reach the log end once the input is applied."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    from .support.worker_harness import fleet_events, publish_events, wait_complete

    events = fleet_events(seed=16, batches=3, sessions=12)
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events))
    wait_complete(deployment, {e.batch_id for e in events})

    async def committed_and_ends() -> tuple[dict, dict]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=deployment.bootstrap, group_id=f"{deployment.name}-stage1", enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [TopicPartition(deployment.topics.records, p) for p in range(deployment.partitions)]
            ends = await consumer.end_offsets(tps)
            return {tp.partition: await consumer.committed(tp) for tp in tps}, {tp.partition: ends[tp] for tp in tps}
        finally:
            await consumer.stop()

    deadline = time.monotonic() + 20
    while True:
        committed, ends = asyncio.run(committed_and_ends())
        if committed == ends or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert committed == ends
    assert worker.poll() is None
