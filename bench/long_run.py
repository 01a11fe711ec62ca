"""A run that lasts: the worker's CPU per batch stays flat, and a straggler for the
run's first batch is dead-lettered ``late`` (issue 21).

    python bench/long_run.py [--batches 12000] [--rate 60] [--grace 2] [--batch-timeout 10] [--smoke] [--json]

One worker on a 4-partition records topic with ``--grace 2``; one producer publishes
small batches (a few records each, its markers to every partition) paced at ``--rate``
batches per second: a long training run's steps (12,000 batches are about 4 hours of
1.3-second steps), here in minutes. Each batch expires 2 s after it closes, so every
partition lets go of every batch as the run goes on.

Measured: the worker process's CPU time (user + system, from /proc) against the
batches it has published, per batch in the first and in the last fifth of the run.
The first fifth is the baseline of the same run; target: the last fifth within 1.1x
of it (nothing the worker does per batch grows with the batches before it). Then one
straggler -- a record and a marker for the run's first batch, long expired -- must be
dead-lettered ``late`` (the record and the marker on every partition), with no
second revision 0 of that batch published.

The worker holds some state per batch for a fixed time, not for a number of batches:
stage 1 a closed batch for grace, stage 2 a merged one (and the /metrics series of
a published one) for grace + batch timeout. That window fills in its first seconds,
and the first fifth must come after it, or the ratio measures the warm-up: hence
``--batch-timeout 10`` (batches close on their markers; the timeout only bounds how
long stage 2 waits). CPU per batch is printed for every fifth, so a plateau and a
growth tell apart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, fresh_topic, report
from _pipeline import start_workers, stop_workers, worker_logs

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import GenerationRecord, decode_dead_letter, decode_metrics
from specmeter.streams.fleet.publish import publish_fleet
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

PARTITIONS = 4


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_ready(log_path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(log_path) and "Worker ready" in Path(log_path).read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the worker was not ready in {timeout_s:.0f} s (log: {log_path})")


def per_batch(samples: list[tuple[int, float]], start: int, end: int) -> float:
    """CPU seconds per batch between the first samples with ``start`` and ``end`` batches published."""
    first = next(s for s in samples if s[0] >= start)
    last = next(s for s in samples if s[0] >= end)
    return (last[1] - first[1]) / max(1, last[0] - first[0])


async def measure(
    bootstrap: str, name: str, records_topic: str, spec: FleetSpec, rate: float, grace_s: float, pid: int
) -> dict:
    """Publish the fleet paced, sample (batches published, worker CPU), then the straggler."""
    from aiokafka import AIOKafkaConsumer

    events = list(synthetic_fleet(spec))
    records = sum(1 for e in events if e.kind == "record")
    first_batch = events[0].batch_id
    revisions: dict[str, list[int]] = {}
    samples: list[tuple[int, float]] = []
    consumer = AIOKafkaConsumer(
        f"{name}.metrics",
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    stop = asyncio.Event()

    async def consume() -> None:
        while not stop.is_set():
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                for message in messages:
                    m = decode_metrics(message.value)
                    revisions.setdefault(m.batch_id, []).append(m.revision)
            samples.append((len(revisions), cpu_s(pid)))

    consuming = asyncio.create_task(consume())
    started = time.monotonic()
    try:
        settings = PublisherSettings(bootstrap_servers=bootstrap, topic=records_topic, linger_ms=5)
        await publish_fleet(events, settings, rate=rate * records / spec.batches)
        deadline = time.monotonic() + 300
        while len(revisions) < spec.batches and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        run_s = time.monotonic() - started
        if len(revisions) < spec.batches:
            raise SystemExit(f"only {len(revisions)} of {spec.batches} batches were published")
        rss_end = rss_mib(pid)
        await asyncio.sleep(grace_s + 2)  # every batch has expired, the first long ago
        straggler = GenerationRecord(
            batch_id=first_batch, session_id="stuck-session", generation_id="stuck-gen", accepted=3, proposed=4
        )
        async with Publisher(
            PublisherSettings(bootstrap_servers=bootstrap, topic=records_topic, producer_id="stuck-rollout-worker")
        ) as stuck:
            await stuck.publish(straggler)
            await stuck.close_batch(first_batch, expected_producers=1)  # a marker to every partition
        late = await read_late(bootstrap, f"{name}.deadletter", first_batch, want=1 + PARTITIONS)
        await asyncio.sleep(3)  # a reopened batch would close on its marker and publish by now
    finally:
        stop.set()
        await consuming
        await consumer.stop()
    return {
        "records": records,
        "run_s": run_s,
        "samples": samples,
        "rss_end_mib": rss_end,
        "first_batch": first_batch,
        "late_letters": late,
        "first_batch_revisions": revisions[first_batch],
    }


async def read_late(bootstrap: str, topic: str, batch_id: str, want: int, timeout_s: float = 30.0) -> int:
    """Dead letters with reason ``late`` for ``batch_id``, read until ``want`` arrive or the timeout."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    late = 0
    deadline = time.monotonic() + timeout_s
    try:
        while late < want and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                for message in messages:
                    letter = decode_dead_letter(message.value)
                    late += letter.reason == "late" and letter.batch_id == batch_id
    finally:
        await consumer.stop()
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=12_000)
    parser.add_argument("--rate", type=float, default=60.0, help="batches per second")
    parser.add_argument("--grace", type=float, default=2.0, help="the worker's --grace, seconds")
    parser.add_argument("--batch-timeout", type=float, default=10.0, help="the worker's --batch-timeout, seconds")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    batches = 200 if args.smoke else args.batches
    spec = FleetSpec(
        batches=batches,
        sessions_per_batch=3,
        producers=1,
        max_samples_per_session=2,
        max_turns=2,
        redelivery_rate=0.0,
        conflict_rate=0.0,
        missing_rate=0.0,
        invalid_rate=0.0,
        seed=21,
        batch_prefix=f"long-{uuid.uuid4().hex[:6]}-",
    )
    bootstrap = broker_address()
    records_topic = fresh_topic(bootstrap, "records", PARTITIONS)
    extra = ("--grace", str(args.grace), "--batch-timeout", str(args.batch_timeout))
    name, procs = start_workers(bootstrap, records_topic, PARTITIONS, workers=1, extra=extra)
    try:
        wait_ready(worker_logs(name, 1)[0])
        pid = procs[0].pid
        cpu_ready = cpu_s(pid)
        result = asyncio.run(measure(bootstrap, name, records_topic, spec, args.rate, args.grace, pid))
    finally:
        stop_workers(procs)
    samples = result["samples"]
    fifth = batches // 5
    fifths = [per_batch(samples, max(1, k * fifth), (k + 1) * fifth if k < 4 else batches) for k in range(5)]
    first, last = fifths[0], fifths[-1]
    ratio = last / first
    revisions = result["first_batch_revisions"]
    late_ok = result["late_letters"] >= 1 + PARTITIONS and revisions == [0]
    outcome = (
        f"dead-lettered late ({result['late_letters']} letters: the record and {PARTITIONS} markers), "
        f"published once (revisions {revisions})"
        if late_ok
        else f"NOT late: {result['late_letters']} late letters, revisions published {revisions}"
    )
    report(
        f"a long run ({batches:,} batches, {result['records']:,} records, --grace {args.grace:g}, "
        f"--batch-timeout {args.batch_timeout:g}, "
        f"{args.rate:g} batches/s, {PARTITIONS} partitions, {core_name()} core)",
        [
            ("run (publishing to the last batch's metrics)", f"{result['run_s']:.0f} s"),
            ("worker CPU per batch, first fifth (baseline)", f"{first * 1000:.2f} ms"),
            ("worker CPU per batch, last fifth", f"{last * 1000:.2f} ms"),
            ("ratio last / first fifth", f"{ratio:.2f}x   (target <= 1.1x)"),
            ("worker CPU per batch, each fifth", "  ".join(f"{x * 1000:.2f}" for x in fifths) + " ms"),
            ("worker CPU from ready to the end", f"{samples[-1][1] - cpu_ready:.1f} s"),
            ("worker resident memory at the end", f"{result['rss_end_mib']:.0f} MiB"),
            ("straggler for the first batch", outcome),
        ],
        {
            "batches": batches,
            "records": result["records"],
            "grace_s": args.grace,
            "batch_timeout_s": args.batch_timeout,
            "cpu_ms_per_batch_by_fifth": [x * 1000 for x in fifths],
            "rate_batches_per_s": args.rate,
            "core": core_name(),
            "run_s": result["run_s"],
            "cpu_ms_per_batch_first_fifth": first * 1000,
            "cpu_ms_per_batch_last_fifth": last * 1000,
            "ratio": ratio,
            "rss_end_mib": result["rss_end_mib"],
            "straggler_late_letters": result["late_letters"],
            "first_batch_revisions": revisions,
            "straggler_late": late_ok,
        },
        as_json=args.json,
    )
    if not late_ok:
        raise SystemExit("the straggler for the first batch was not dead-lettered late (issue 21)")


if __name__ == "__main__":
    main()
