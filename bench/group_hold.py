"""A group of workers over a long run: do they keep their partitions?

    python bench/group_hold.py [--workers 2] [--minutes 35] [--every-s 60] [--partitions 8]
                               [--max-poll-interval 300] [--smoke] [--json]

``--workers`` workers of one app, with the real ``--max-poll-interval`` (300 s), read a
small batch every ``--every-s`` seconds for ``--minutes`` minutes. Every 10 s each worker's
``/specmeter/stats`` is read (the partitions it holds), and the members of each group.
Printed: how often any worker's partitions changed after the group settled (0 is the
target), how many batches came out complete, the groups' members at the end.

The baseline, measured in the same run: as many plain aiokafka consumers, in a group of
their own on the same topic with the same poll interval, that join and then never poll
again, as Faust's consumer never did with its input paused (the worker before issue 30).
Its members leave their group once the poll interval has passed (two workers, 8
partitions and a batch a minute lost one worker at t ≈ 1,000 s, Faust's interval, and
it never came back). ``--smoke``: 2 minutes, a batch every 10 s, a 20 s poll interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, delete_topics, free_port, fresh_topic, report
from _pipeline import app_topics, start_workers, stop_workers

from specmeter.producers import PublisherSettings
from specmeter.streams.fleet.publish import publish_fleet
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet


def partitions_of(port: int) -> tuple[int, ...] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=5) as response:
            return tuple(json.loads(response.read())["partitions"])
    except OSError:
        return None


#: a baseline member: joins its group, polls once, then never again (``PausedMembers``)
_PAUSED_MEMBER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer

async def main():
    consumer = AIOKafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3],
                                max_poll_interval_ms=int(float(sys.argv[4]) * 1000), session_timeout_ms=10000,
                                heartbeat_interval_ms=3000, enable_auto_commit=False)
    await consumer.start()
    await consumer.getmany(timeout_ms=3000)
    print("joined", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def group_members(bootstrap: str, group: str) -> int:
    """How many members a consumer group has now."""

    async def describe() -> int:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            [found] = await admin.describe_consumer_groups([group])
            return len(found.to_object()["groups"][0]["members"])
        finally:
            await admin.close()

    try:
        return asyncio.run(describe())
    except Exception:  # noqa: BLE001 - a group being rebalanced: counted at the next look
        return -1


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
    parser.add_argument("--max-poll-interval", type=float, default=300.0)
    parser.add_argument("--smoke", action="store_true", help="2 minutes, a batch every 10 s, a 20 s poll interval")
    add_json_flag(parser)
    args = parser.parse_args()
    minutes, every_s, poll_s = (2.0, 10.0, 20.0) if args.smoke else (args.minutes, args.every_s, args.max_poll_interval)
    bootstrap = broker_address()
    n = args.partitions
    topic = fresh_topic(bootstrap, "hold", n)
    ports = [free_port() for _ in range(args.workers)]
    extra = ("--batch-timeout", "30", "--max-poll-interval", str(poll_s))
    name, procs = start_workers(bootstrap, topic, n, args.workers, web_ports=ports, extra=extra)
    paused_group = f"{name}-paused"
    paused = [
        subprocess.Popen(
            [sys.executable, "-c", _PAUSED_MEMBER, bootstrap, topic, paused_group, str(poll_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # aiokafka's lines about the rebalances it goes through
            text=True,
        )
        for _ in range(args.workers)
    ]
    settings = PublisherSettings(bootstrap_servers=bootstrap, topic=topic, linger_ms=5)
    changes, sent, history = 0, 0, []
    paused_left_at: float | None = None
    try:
        deadline = time.monotonic() + 60
        while any(partitions_of(p) in (None, ()) for p in ports) and time.monotonic() < deadline:
            time.sleep(1)
        for member in paused:
            member.stdout.readline()  # "joined"
        time.sleep(10)  # the groups settle
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
            if paused_left_at is None and 0 <= group_members(bootstrap, paused_group) < args.workers:
                paused_left_at = time.monotonic() - started
        time.sleep(5)
        complete = complete_batches(bootstrap, f"{name}.metrics")
        members = group_members(bootstrap, f"{name}-stage1"), group_members(bootstrap, paused_group)
    finally:
        for member in paused:
            member.kill()
        stop_workers(procs)
        delete_topics(bootstrap, [topic, *app_topics(name)])
    data = {
        "workers": args.workers,
        "minutes": minutes,
        "max_poll_interval_s": poll_s,
        "partition_changes": changes,
        "members_at_end": members[0],
        "baseline_members_at_end": members[1],
        "baseline_left_after_s": None if paused_left_at is None else round(paused_left_at),
        "batches_sent": sent,
        "batches_complete": complete,
        "held_at_end": [list(h or ()) for h in held],
        "changes": history,
        "core": core_name(),
    }
    report(
        "group hold: workers keep their partitions",
        [
            (
                "run",
                f"{args.workers} workers, {n} partitions, {minutes:.0f} min, a batch every {every_s:.0f} s, "
                f"poll interval {poll_s:.0f} s",
            ),
            ("partition changes after settling", str(changes)),
            ("batches complete", f"{complete} of {sent}"),
            ("held at the end", "; ".join(str(list(h or ())) for h in held)),
            (
                "members at the end: workers / baseline",
                f"{members[0]} / {members[1]} of {args.workers} (baseline: members that never poll"
                + ("" if paused_left_at is None else f", the first left after {paused_left_at:.0f} s")
                + ")",
            ),
            ("ratio of members kept (workers over baseline)", f"{members[0]}:{max(members[1], 0)}"),
        ],
        data,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
