"""Producer overhead: µs per publish call on the caller, and sustained records/s.

    python bench/producer_overhead.py [--records N] [--smoke] [--json]

Caller cost: ``publish_nowait`` (encode + partition + enqueue) against the bare
minimum measured in the same run (msgspec encode + list append). Sustained:
the publisher to a real broker, against a naive aiokafka producer sending one
keyed message per record. Targets: < 5 µs per call; >= 100k records/s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, fresh_topic, report

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import GenerationRecord, encode_records_message
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet


def make_records(n: int) -> list[GenerationRecord]:
    out: list[GenerationRecord] = []
    spec = FleetSpec(
        batches=max(1, n // 2000), sessions_per_batch=400, producers=1, seed=3, invalid_rate=0.0, redelivery_rate=0.0
    )
    for event in synthetic_fleet(spec):
        if event.kind == "record":
            out.append(event.payload)
            if len(out) == n:
                break
    while len(out) < n:
        out.extend(out[: n - len(out)])
    return out


def baseline_caller_us(records: list[GenerationRecord]) -> float:
    sink = []
    append = sink.append
    t0 = time.perf_counter()
    for r in records:
        append(encode_records_message(r))
    return (time.perf_counter() - t0) / len(records) * 1e6


async def publisher_run(bootstrap: str, topic: str, records: list[GenerationRecord]) -> tuple[float, float]:
    settings = PublisherSettings(
        bootstrap_servers=bootstrap, topic=topic, producer_id="bench", max_queued_records=len(records) + 1
    )
    async with Publisher(settings) as publisher:
        publish = publisher.publish_nowait
        t0 = time.perf_counter()
        for r in records:
            publish(r)
        caller_us = (time.perf_counter() - t0) / len(records) * 1e6
        await publisher.flush()
        total = time.perf_counter() - t0
    return caller_us, len(records) / total


async def naive_run(bootstrap: str, topic: str, records: list[GenerationRecord]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", compression_type="lz4", linger_ms=5
    )
    await producer.start()
    try:
        t0 = time.perf_counter()
        futures = [await producer.send(topic, encode_records_message(r), key=r.session_id.encode()) for r in records]
        await asyncio.gather(*futures)
        return len(records) / (time.perf_counter() - t0)
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--naive-records", type=int, default=50_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    n, naive_n = (2_000, 500) if args.smoke else (args.records, args.naive_records)
    bootstrap = broker_address()
    records = make_records(n)
    gc.collect()
    base_us = min(baseline_caller_us(records) for _ in range(3))
    caller_us, sustained = asyncio.run(publisher_run(bootstrap, fresh_topic(bootstrap, "pub", 8), records))
    naive = asyncio.run(naive_run(bootstrap, fresh_topic(bootstrap, "naive", 8), records[:naive_n]))
    report(
        f"producer overhead ({n:,} records, 8 partitions)",
        [
            ("publish_nowait, per call", f"{caller_us:.2f} µs   (target < 5 µs)"),
            ("baseline encode+append", f"{base_us:.2f} µs   ratio {caller_us / base_us:.2f}x"),
            ("sustained to the broker", f"{sustained:,.0f} records/s   (target >= 100,000)"),
            ("naive aiokafka, 1 msg/record", f"{naive:,.0f} records/s   ratio {sustained / naive:.1f}x"),
        ],
        {
            "records": n,
            "publish_us_per_call": caller_us,
            "baseline_us_per_call": base_us,
            "sustained_records_per_s": sustained,
            "naive_records_per_s": naive,
        },
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
