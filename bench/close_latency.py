"""Close latency: from a batch's last marker produced to its BatchMetrics on the output topic.

    python bench/close_latency.py [--rate 20000] [--batches 60] [--smoke] [--json]

A worker runs on a 4-partition records topic while a synthetic fleet publishes at
a sustained rate; each batch's latency is measured in this process (one clock):
the moment the last producer's marker is acknowledged to the moment the batch's
complete BatchMetrics is consumed. Baseline, same run: produce-to-consume round
trip of a single message through the same broker. Goal: p99 under 250 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, fresh_topic, report
from _pipeline import FLEET_SHAPE, start_workers, stop_workers

from specmeter.producers import PublisherSettings
from specmeter.schemas import decode_metrics
from specmeter.streams.fleet.publish import publish_fleet
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def ping_baseline(bootstrap: str, topic: str, n: int) -> list[float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="latest", fetch_max_wait_ms=100
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await consumer.start()
    await producer.start()
    out = []
    try:
        await consumer.getmany(timeout_ms=500)
        for _ in range(n):
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, b"ping")
            while not await consumer.getmany(timeout_ms=1000):
                pass
            out.append(time.perf_counter() - t0)
    finally:
        await producer.stop()
        await consumer.stop()
    return out


async def measure(bootstrap: str, records_topic: str, metrics_topic: str, spec: FleetSpec, rate: float) -> dict:
    from aiokafka import AIOKafkaConsumer

    last_marker: dict[str, float] = {}
    markers_seen: dict[str, int] = {}
    arrived: dict[str, float] = {}
    consumer = AIOKafkaConsumer(
        metrics_topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=50
    )
    await consumer.start()

    def on_event(event) -> None:
        if event.kind == "marker":
            markers_seen[event.batch_id] = markers_seen.get(event.batch_id, 0) + 1
            if markers_seen[event.batch_id] == spec.producers:
                last_marker[event.batch_id] = time.perf_counter()

    async def consume() -> None:
        while len(arrived) < spec.batches:
            for messages in (await consumer.getmany(timeout_ms=100)).values():
                now = time.perf_counter()
                for message in messages:
                    m = decode_metrics(message.value)
                    if m.complete and m.batch_id not in arrived:
                        arrived[m.batch_id] = now

    consuming = asyncio.create_task(consume())
    summary = await publish_fleet(
        synthetic_fleet(spec),
        PublisherSettings(bootstrap_servers=bootstrap, topic=records_topic, linger_ms=5, max_message_bytes=64 * 1024),
        rate=rate,
        on_event=on_event,
    )
    try:
        await asyncio.wait_for(consuming, 120)
    finally:
        await consumer.stop()
    latencies = [arrived[b] - last_marker[b] for b in last_marker if b in arrived]
    return {"latencies": latencies, "rate": summary.rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20_000)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    batches, rate, sessions = (3, 2_000, 2) if args.smoke else (args.batches, args.rate, 20)
    bootstrap = broker_address()
    prefix = f"lat-{uuid.uuid4().hex[:4]}-"
    spec = FleetSpec(batches=batches, sessions_per_batch=sessions, seed=2, batch_prefix=prefix, **FLEET_SHAPE)
    records_topic = fresh_topic(bootstrap, "records", 4)
    name, procs = start_workers(bootstrap, records_topic, 4, workers=1)
    try:
        time.sleep(8)  # let the worker join and own its partitions
        result = asyncio.run(measure(bootstrap, records_topic, f"{name}.metrics", spec, rate))
    finally:
        stop_workers(procs)
    pings = asyncio.run(ping_baseline(bootstrap, fresh_topic(bootstrap, "ping", 1), 5 if args.smoke else 50))
    lat = result["latencies"]
    p99, base99 = percentile(lat, 0.99), percentile(pings, 0.99)
    report(
        f"close latency ({len(lat)} batches at {result['rate']:,.0f} records/s, 4 partitions, {core_name()} core)",
        [
            ("p50", f"{statistics.median(lat) * 1000:.0f} ms"),
            ("p99", f"{p99 * 1000:.0f} ms   (goal < 250 ms)"),
            ("max", f"{max(lat) * 1000:.0f} ms"),
            ("baseline produce->consume p99", f"{base99 * 1000:.1f} ms   ratio {p99 / base99:.1f}x"),
        ],
        {
            "batches": len(lat),
            "records_per_s": result["rate"],
            "core": core_name(),
            "p50_ms": statistics.median(lat) * 1000,
            "p99_ms": p99 * 1000,
            "max_ms": max(lat) * 1000,
            "baseline_p99_ms": base99 * 1000,
        },
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
