"""A group of workers over a long run: do they keep their partitions?

    python bench/group_hold.py [--workers 2] [--minutes 35] [--every-s 60] [--partitions 8] [--smoke] [--json]

``--workers`` workers of one app, with the real ``--max-poll-interval`` (300 s), read a
small batch every ``--every-s`` seconds for ``--minutes`` minutes. Every 10 s each worker's
``/specmeter/stats`` is read: the partitions it holds. Printed: how often any worker's
partitions changed after the group settled (0 is the target), how many batches came out
complete, and each worker's partitions at the end. Before issue 30, two workers, 8
partitions and a batch a minute lost one worker at t ≈ 1,000 s (Faust's consumer, paused
and never polled, left the group after its poll interval and never came back); the
baseline is that run's figure, one change and half the workers idle after 17 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, delete_topics, free_port, fresh_topic, report
from _pipeline import app_topics, start_workers, stop_workers

from specmeter.producers import PublisherSettings
from specmeter.streams._loadgen import publish_fleet
from specmeter.streams.synthetic import FleetSpec, synthetic_fleet


def partitions_of(port: int) -> tuple[int, ...] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=5) as response:
            return tuple(json.loads(response.read())["partitions"])
    except OSError:
        return None


def complete_batches(bootstrap: str, topic: str) -> int:
    from specmeter.schemas import decode_metrics

    async def read() -> int:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
        await consumer.start()
        done: set[str] = set()
        try:
            while True:
                got = await consumer.getmany(timeout_ms=2000)
                if not got:
                    return len(done)
                for messages in got.values():
                    done.update(m.batch_id for m in (decode_metrics(x.value) for x in messages) if m.complete)
        finally:
            await consumer.stop()

    return asyncio.run(read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=35.0)
    parser.add_argument("--every-s", type=float, default=60.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="2 minutes, a batch every 10 s")
    add_json_flag(parser)
    args = parser.parse_args()
    minutes, every_s = (2.0, 10.0) if args.smoke else (args.minutes, args.every_s)
    bootstrap = broker_address()
    n = args.partitions
    topic = fresh_topic(bootstrap, "hold", n)
    ports = [free_port() for _ in range(args.workers)]
    name, procs = start_workers(bootstrap, topic, n, args.workers, web_ports=ports, extra=("--batch-timeout", "30"))
    settings = PublisherSettings(bootstrap_servers=bootstrap, topic=topic, linger_ms=5)
    changes, sent, history = 0, 0, []
    try:
        deadline = time.monotonic() + 60
        while any(partitions_of(p) in (None, ()) for p in ports) and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(10)  # the group settles
        held = [partitions_of(p) for p in ports]
        started = time.monotonic()
        next_batch = started
        while time.monotonic() - started < minutes * 60:
            if time.monotonic() >= next_batch:
                spec = FleetSpec(batches=1, sessions_per_batch=20, producers=2, seed=sent, batch_prefix=f"hold-{sent}-")
                asyncio.run(publish_fleet(synthetic_fleet(spec), settings))
                sent += 1
                next_batch += every_s
            time.sleep(10)
            now = [partitions_of(p) for p in ports]
            if now != held:
                changes += 1
                history.append((round(time.monotonic() - started), now))
                held = now
        time.sleep(5)
        complete = complete_batches(bootstrap, f"{name}.metrics")
    finally:
        stop_workers(procs)
        delete_topics(bootstrap, [topic, *app_topics(name)])
    data = {
        "workers": args.workers,
        "minutes": minutes,
        "partition_changes": changes,
        "batches_sent": sent,
        "batches_complete": complete,
        "held_at_end": [list(h or ()) for h in held],
        "changes": history,
        "core": core_name(),
    }
    report(
        "group hold: workers keep their partitions",
        [
            ("run", f"{args.workers} workers, {n} partitions, {minutes:.0f} min, a batch every {every_s:.0f} s"),
            ("partition changes after settling", f"{changes} (before issue 30: 1, and one worker idle from 17 min)"),
            ("batches complete", f"{complete} of {sent}"),
            ("held at the end", "; ".join(str(list(h or ())) for h in held)),
        ],
        data,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
