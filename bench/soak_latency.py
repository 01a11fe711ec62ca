"""Close latency under sustained load: minutes of a realistic fleet, latency per batch split by hop.

    python bench/soak_latency.py [--rate 18000] [--duration 300] [--batch-records 20000] [--json] [--smoke]

One worker (web server on, ``--grace``) runs on a fresh 4-partition records topic
while a synthetic fleet (loadgen's own publish path, in a process of its own:
four producers, 20 % redeliveries, shared ancestors, 1 % conflicts, 5 % unknown
counters, 0.5 % invalid records) publishes at ``--rate`` for ``--duration``.

Every time is a BROKER timestamp: the records, partials and metrics topics are
created here with ``message.timestamp.type=LogAppendTime``, so each message
carries the moment the broker appended it, on one clock (the broker's). Per batch:

* end to end: the batch's last marker (the latest of its producers' markers on
  any partition) to its first BatchMetrics on the metrics topic;
* hop 1, marker -> partial: to the last partition's first partial on the partials
  topic (stage 1 closed the batch on every partition and the partial was sent);
  its part ``marker -> close`` uses the partials' ``closed_at_ms`` (the worker's
  clock, the same machine's);
* hop 2, partial -> metrics: stage 2 merged and published.

Batches whose last marker falls in the first ``--warmup`` seconds of load are
reported but left out of the figures. Baseline, same run: the produce -> consume
round trip of one message through the same broker, once a second during the load.
Sampled once a second from the worker's ``/specmeter/stats``: lag (log end minus
the worker's checkpoint, in messages, all partitions), resident memory, CPU and
open generations (resident bytes per open generation = RSS / open generations).
Progress goes to stderr; ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

from _common import broker_address, free_port, fresh_topic, machine
from _pipeline import FLEET_SHAPE, start_workers, stop_workers

LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
#: what the worker's own partials topic would get (a partial can be large)
PARTIALS_CONFIG = {**LOG_APPEND, "max.message.bytes": str(16 * 1024 * 1024)}
PRODUCERS = 4


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(values: list[float], digits: int = 1) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}

    def r(v: float) -> float | int:
        return round(v, digits) if digits else round(v)

    return {
        "n": len(values),
        "p50": r(statistics.median(values)),
        "p99": r(percentile(values, 0.99)),
        "max": r(max(values)),
    }


def fleet_spec(rate: float, duration_s: float, batch_records: int, seed: int, prefix: str):
    """A fleet of ≈ rate * duration records in batches of ≈ batch_records (agentic sessions of
    up to 8 trajectories and 24 turns: ≈95 records each)."""
    from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

    shape = {**FLEET_SHAPE, "producers": PRODUCERS, "invalid_rate": 0.005, "seed": seed}
    probe = FleetSpec(batches=1, sessions_per_batch=200, **shape)
    per_session = sum(e.kind != "marker" for e in synthetic_fleet(probe)) / 200
    sessions = max(1, round(batch_records / per_session))
    batches = max(1, round(rate * duration_s / (sessions * per_session)))
    return FleetSpec(batches=batches, sessions_per_batch=sessions, batch_prefix=prefix, **shape)


def _load(bootstrap: str, topic: str, spec, rate: float, results) -> None:
    """The load process: loadgen's publish path (one Publisher per producer, markers per batch)."""
    from specmeter.producers import PublisherSettings
    from specmeter.streams.fleet.publish import publish_fleet
    from specmeter.streams.fleet.synthetic import synthetic_fleet

    done = asyncio.run(
        publish_fleet(synthetic_fleet(spec), PublisherSettings(bootstrap_servers=bootstrap, topic=topic), rate=rate)
    )
    results.put(
        {
            "records": done.records,
            "invalid": done.invalid,
            "markers": done.markers,
            "seconds": done.seconds,
            "rate": done.rate,
        }
    )


@dataclass
class Batch:
    markers: int = 0
    last_marker_ms: int = 0
    partials: dict[int, int] = field(default_factory=dict)  # partition -> first partial's append time
    closed_at_ms: dict[int, int] = field(default_factory=dict)  # partition -> stage-1 close (worker clock)
    metrics_ms: int | None = None
    complete: bool | None = None
    close_reason: str | None = None


@dataclass
class Run:
    batches: dict[str, Batch] = field(default_factory=dict)
    first_record_ms: int | None = None
    records_messages: int = 0
    pings_ms: list[float] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # once a second: t, lag, rss, cpu, open generations
    ends: dict[int, int] = field(default_factory=dict)
    gc: dict | None = None  # the worker's garbage-collector pauses per generation (0, 1, 2)

    def batch(self, batch_id: str) -> Batch:
        b = self.batches.get(batch_id)
        if b is None:
            b = self.batches[batch_id] = Batch()
        return b


async def _follow(bootstrap: str, topic: str, handle, stop: asyncio.Event) -> None:
    """Every message of a topic from its beginning, until ``stop``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    try:
        while not stop.is_set():
            for messages in (await consumer.getmany(timeout_ms=100)).values():
                for message in messages:
                    handle(message)
    finally:
        await consumer.stop()


async def _ping(bootstrap: str, topic: str, run: Run, stop: asyncio.Event, every_s: float) -> None:
    """Baseline: produce one message, consume it back; once every ``every_s``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="latest", fetch_max_wait_ms=100
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await consumer.start()
    await producer.start()
    try:
        await consumer.getmany(timeout_ms=300)
        while not stop.is_set():
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, b"ping")
            while not await consumer.getmany(timeout_ms=1000):
                pass
            run.pings_ms.append((time.perf_counter() - t0) * 1000)
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass
    finally:
        await producer.stop()
        await consumer.stop()


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


async def _sample(
    bootstrap: str, topic: str, partitions: int, stats_url: str, run: Run, stop: asyncio.Event, t0: float
) -> None:
    """Once a second: the worker's lag (log end - checkpoint - 1), RSS, CPU and open generations."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await ends.start()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        while not stop.is_set():
            offsets = await ends.end_offsets(tps)
            stats = await asyncio.to_thread(_get_json, stats_url)
            if stats is not None and "checkpoints" in stats:
                checkpoints = {int(p): c for p, c in stats["checkpoints"].items()}
                lag = sum(max(0, offsets[tp] - 1 - checkpoints.get(tp.partition, -1)) for tp in tps)
                counters = stats.get("counters", {})
                if "gc_collections" in counters:
                    run.gc = {
                        "collections": counters["gc_collections"],
                        "seconds_total": [round(v, 3) for v in counters["gc_seconds"]],
                        "max_ms": [round(v * 1000, 1) for v in counters["gc_max_seconds"]],
                    }
                run.samples.append(
                    {
                        "t": round(time.monotonic() - t0, 2),
                        "lag": lag,
                        "rss": stats.get("rss_bytes"),
                        "cpu": stats.get("cpu_seconds"),
                        "open": stats.get("open_generations"),
                        "pending": stats.get("producer_pending"),
                    }
                )
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass
    finally:
        await ends.stop()


def _wait_ready(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"the worker was not ready within {timeout_s:.0f}s ({url})")


async def measure(
    bootstrap: str,
    names: dict[str, str],
    spec,
    rate: float,
    partitions: int,
    stats_url: str,
    settle_s: float,
    progress_s: float,
) -> tuple[Run, dict]:
    from specmeter.schemas import decode_metrics, decode_partial, decode_records_message

    run = Run()
    stop = asyncio.Event()
    t0 = time.monotonic()

    def on_record(message) -> None:
        run.records_messages += 1
        if run.first_record_ms is None:
            run.first_record_ms = message.timestamp
        if message.key is None:  # a packed RecordBatch; markers are keyed by their batch_id
            return
        marker = decode_records_message(message.value).marker
        if marker is not None:
            b = run.batch(marker.batch_id)
            b.markers += 1
            b.last_marker_ms = max(b.last_marker_ms, message.timestamp)

    def on_partial(message) -> None:
        partial = decode_partial(message.value)
        b = run.batch(partial.batch_id)
        if partial.partition not in b.partials:
            b.partials[partial.partition] = message.timestamp
            b.closed_at_ms[partial.partition] = partial.closed_at_ms

    def on_metrics(message) -> None:
        m = decode_metrics(message.value)
        b = run.batch(m.batch_id)
        if b.metrics_ms is None:
            b.metrics_ms, b.complete, b.close_reason = message.timestamp, m.complete, m.close_reason

    tasks = [
        asyncio.create_task(_follow(bootstrap, names["records"], on_record, stop)),
        asyncio.create_task(_follow(bootstrap, names["partials"], on_partial, stop)),
        asyncio.create_task(_follow(bootstrap, names["metrics"], on_metrics, stop)),
        asyncio.create_task(_ping(bootstrap, names["ping"], run, stop, 1.0)),
        asyncio.create_task(_sample(bootstrap, names["records"], partitions, stats_url, run, stop, t0)),
    ]
    results = multiprocessing.get_context("spawn").Queue()
    loader = multiprocessing.get_context("spawn").Process(
        target=_load, args=(bootstrap, names["records"], spec, rate, results), daemon=True
    )
    loader.start()
    next_progress = t0 + progress_s
    load: dict = {}
    settle_deadline = None
    try:
        while True:
            await asyncio.sleep(0.25)
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            published = sum(1 for b in run.batches.values() if b.metrics_ms is not None)
            if settle_deadline is None and not loader.is_alive():
                loader.join()
                if loader.exitcode != 0:
                    raise RuntimeError(f"the load process failed (exit code {loader.exitcode})")
                load = results.get(timeout=5)
                settle_deadline = time.monotonic() + settle_s
            if time.monotonic() >= next_progress:
                next_progress += progress_s
                _progress(run, t0, published, spec.batches)
            if settle_deadline is not None and (published >= spec.batches or time.monotonic() > settle_deadline):
                break
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if loader.is_alive():
            loader.terminate()
    return run, load


def _progress(run: Run, t0: float, published: int, batches: int) -> None:
    lat = [b.metrics_ms - b.last_marker_ms for b in run.batches.values() if b.metrics_ms is not None and b.markers]
    recent = lat[-20:]
    sample = run.samples[-1] if run.samples else {}
    rss = sample.get("rss")
    print(
        f"[{time.monotonic() - t0:6.0f}s] batches {published}/{batches}  e2e p50 "
        f"{percentile(lat, 0.5) or 0:.0f} ms p99 {percentile(lat, 0.99) or 0:.0f} ms  last 20 max "
        f"{max(recent) if recent else 0:.0f} ms  lag {sample.get('lag', '?')} msgs  rss "
        f"{rss / 2**20 if rss else 0:.0f} MiB  open gens {sample.get('open', '?')}  load {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
        flush=True,
    )


def analyse(run: Run, spec, partitions: int, warmup_s: float, idle_rss: int | None) -> dict:
    expected_markers = spec.producers * partitions
    rows = []
    for batch_id in sorted(run.batches):
        b = run.batches[batch_id]
        if not b.markers or b.metrics_ms is None:
            continue
        row = {
            "batch_id": batch_id,
            "at_s": round((b.last_marker_ms - (run.first_record_ms or 0)) / 1000, 2),
            "e2e_ms": b.metrics_ms - b.last_marker_ms,
            "complete": b.complete,
            "close_reason": b.close_reason,
            "markers": b.markers,
        }
        if b.partials:
            last_partial = max(b.partials.values())
            row["marker_to_partial_ms"] = last_partial - b.last_marker_ms
            row["partial_to_metrics_ms"] = b.metrics_ms - last_partial
            row["marker_to_close_ms"] = max(b.closed_at_ms.values()) - b.last_marker_ms
        rows.append(row)
    measured = [r for r in rows if r["at_s"] >= warmup_s]
    warm = [r for r in rows if r["at_s"] < warmup_s]
    e2e = [r["e2e_ms"] for r in measured]
    missing = [bid for bid, b in run.batches.items() if b.markers and b.metrics_ms is None]
    samples = run.samples
    lags = [s["lag"] for s in samples]
    rss = [s["rss"] for s in samples if s.get("rss")]
    steady = [s for s in samples if s.get("rss") and s.get("open")]
    steady = steady[len(steady) // 3 :]  # after the first third: past warm-up and the first grace period's growth
    per_gen = [s["rss"] / s["open"] for s in steady]
    per_gen_above_idle = [(s["rss"] - idle_rss) / s["open"] for s in steady] if idle_rss else []
    cpu = []
    for a, b in itertools.pairwise(samples):
        if a.get("cpu") is not None and b.get("cpu") is not None and b["t"] > a["t"]:
            cpu.append(100 * (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]))
    pings = run.pings_ms
    result = {
        "machine": machine(),
        "batches": len(rows),
        "batches_expected": spec.batches,
        "records_topic_messages": run.records_messages,
        "batches_without_metrics": len(missing),
        "incomplete_batches": sum(1 for r in rows if not r["complete"]),
        "warmup_s": warmup_s,
        "warmup_excluded": len(warm),
        "e2e_ms": summary(e2e, 0),
        "hops_ms": {
            "marker_to_partial": summary(
                [r["marker_to_partial_ms"] for r in measured if "marker_to_partial_ms" in r], 0
            ),
            "marker_to_close": summary([r["marker_to_close_ms"] for r in measured if "marker_to_close_ms" in r], 0),
            "partial_to_metrics": summary(
                [r["partial_to_metrics_ms"] for r in measured if "partial_to_metrics_ms" in r], 0
            ),
        },
        "over_250ms": sum(1 for v in e2e if v > 250),
        "over_1s": sum(1 for v in e2e if v > 1000),
        "warmup_e2e_ms": [r["e2e_ms"] for r in warm],
        "end_of_stream_e2e_ms": [r["e2e_ms"] for r in rows[-3:]],
        "slowest": sorted(measured, key=lambda r: -r["e2e_ms"])[:8],
        "baseline_round_trip_ms": summary(pings, 1),
        "p99_over_baseline_p99": (
            round(percentile(e2e, 0.99) / percentile(pings, 0.99), 1)
            if e2e and pings and percentile(pings, 0.99)
            else None
        ),
        "lag_messages": {
            "samples": len(lags),
            **summary([float(v) for v in lags], 0),
            "mean": round(statistics.fmean(lags), 1) if lags else None,
        },
        "worker_cpu_percent": {**summary(cpu, 0), "mean": round(statistics.fmean(cpu), 1) if cpu else None},
        "rss_mib": {
            "idle": round(idle_rss / 2**20, 1) if idle_rss else None,
            "first": round(rss[0] / 2**20, 1) if rss else None,
            "steady_median": round(statistics.median([s["rss"] for s in steady]) / 2**20, 1) if steady else None,
            "max": round(max(rss) / 2**20, 1) if rss else None,
            "last": round(rss[-1] / 2**20, 1) if rss else None,
        },
        "open_generations": {
            "steady_median": statistics.median([s["open"] for s in steady]) if steady else None,
            "max": max((s["open"] or 0 for s in samples), default=None),
        },
        "resident_bytes_per_open_generation": round(statistics.median(per_gen)) if per_gen else None,
        "resident_bytes_per_open_generation_above_idle": (
            round(statistics.median(per_gen_above_idle)) if per_gen_above_idle else None
        ),
        "worker_gc_pauses": run.gc,
        "expected_markers_per_batch": expected_markers,
        "series": {
            "t": [s["t"] for s in samples],
            "lag": lags,
            "rss_mib": [round((s.get("rss") or 0) / 2**20, 1) for s in samples],
            "open": [s["open"] for s in samples],
            "cpu_percent": [round(c) for c in cpu],
            "producer_pending": [s.get("pending") for s in samples],
        },
        "per_batch": rows,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=18_000, help="records/s of the whole fleet")
    parser.add_argument("--duration", type=float, default=300, help="seconds of load")
    parser.add_argument("--batch-records", type=int, default=20_000, help="records per batch (all producers)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--grace", type=float, default=60, help="the worker's --grace (closed batches kept)")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of load whose batches are not counted")
    parser.add_argument("--settle", type=float, default=60, help="how long to wait for metrics after the load")
    parser.add_argument("--progress", type=float, default=10, help="seconds between progress lines (stderr)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object (with per-batch rows and series)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.rate, args.duration, args.batch_records, args.warmup, args.progress = 3_000, 4, 2_000, 0, 2
    bootstrap = broker_address()
    uptime_before = os.getloadavg()
    name = f"soak-{uuid.uuid4().hex[:8]}"
    names = {
        "records": fresh_topic(bootstrap, "records", args.partitions, topic_configs=LOG_APPEND),
        "partials": fresh_topic(bootstrap, "", args.partitions, name=f"{name}.partials", topic_configs=PARTIALS_CONFIG),
        "metrics": fresh_topic(bootstrap, "", 1, name=f"{name}.metrics", topic_configs=LOG_APPEND),
        "ping": fresh_topic(bootstrap, "ping", 1),
    }
    spec = fleet_spec(args.rate, args.duration, args.batch_records, args.seed, f"{name}-")
    port = free_port()
    stats_url = f"http://127.0.0.1:{port}/specmeter/stats"
    _, procs = start_workers(
        bootstrap,
        names["records"],
        args.partitions,
        workers=1,
        name=name,
        web_port=port,
        extra=("--grace", str(args.grace), "--batch-timeout", "60"),
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}/specmeter/readyz")
        idle = _get_json(stats_url) or {}
        print(
            f"worker pid {procs[0].pid} ready (log {tempfile.gettempdir()}/{name}-0.log); "
            f"{spec.batches} batches of ≈{args.batch_records} records at {args.rate:,.0f} records/s "
            f"(load {uptime_before[0]:.2f})",
            file=sys.stderr,
            flush=True,
        )
        run, load = asyncio.run(
            measure(bootstrap, names, spec, args.rate, args.partitions, stats_url, args.settle, args.progress)
        )
    finally:
        stop_workers(procs)
    result = analyse(run, spec, args.partitions, args.warmup, idle.get("rss_bytes"))
    result["records_per_batch"] = round((load.get("records", 0) + load.get("invalid", 0)) / max(1, spec.batches))
    result["config"] = {
        "rate": args.rate,
        "duration_s": args.duration,
        "batch_records": args.batch_records,
        "partitions": args.partitions,
        "producers": spec.producers,
        "grace_s": args.grace,
        "sessions_per_batch": spec.sessions_per_batch,
        "seed": args.seed,
        "timestamps": "LogAppendTime (broker) on records, partials and metrics",
    }
    result["load"] = {
        **load,
        "loadavg_before": [round(v, 2) for v in uptime_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result))
    else:
        _report(result)
    if result["batches_without_metrics"]:
        print(f"{result['batches_without_metrics']} batch(es) got no metrics within --settle", file=sys.stderr)
        sys.exit(1)


def _report(r: dict) -> None:
    def fmt(s: dict) -> str:
        return f"p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms" if s["n"] else "-"

    c, load = r["config"], r["load"]
    rows = [
        (
            "load",
            f"{load.get('rate', 0):,.0f} records/s for {load.get('seconds', 0):.0f}s, {r['batches']} batches "
            f"(≈{c['batch_records']:,} records), {c['partitions']} partitions, grace {c['grace_s']:.0f}s",
        ),
        ("end to end (last marker -> metrics)", fmt(r["e2e_ms"]) + "   (goal p99 < 250 ms)"),
        ("  marker -> last partial", fmt(r["hops_ms"]["marker_to_partial"])),
        ("    of which marker -> close", fmt(r["hops_ms"]["marker_to_close"])),
        ("  partial -> metrics", fmt(r["hops_ms"]["partial_to_metrics"])),
        (
            "batches > 250 ms / > 1 s",
            f"{r['over_250ms']} / {r['over_1s']} of {r['e2e_ms']['n']} "
            f"({r['warmup_excluded']} in the first {r['warmup_s']:.0f}s excluded: "
            f"{r['warmup_e2e_ms']} ms)",
        ),
        ("last 3 batches (end of input)", f"{r['end_of_stream_e2e_ms']} ms"),
        (
            "baseline produce->consume",
            fmt(r["baseline_round_trip_ms"]) + f"   ratio {r['p99_over_baseline_p99']}x (p99)",
        ),
        ("worker lag (messages)", fmt(r["lag_messages"]).replace(" ms", "") + f", mean {r['lag_messages']['mean']}"),
        ("worker CPU %", fmt(r["worker_cpu_percent"]).replace(" ms", "")),
        (
            "worker RSS",
            f"idle {r['rss_mib']['idle']} MiB, steady {r['rss_mib']['steady_median']} MiB, max "
            f"{r['rss_mib']['max']} MiB",
        ),
        (
            "open generations (steady)",
            f"{r['open_generations']['steady_median']}: "
            f"{r['resident_bytes_per_open_generation']} B resident each "
            f"({r['resident_bytes_per_open_generation_above_idle']} B above idle)",
        ),
        (
            "worker GC pauses (gen 0/1/2)",
            "-"
            if not r["worker_gc_pauses"]
            else f"{r['worker_gc_pauses']['collections']} collections, longest {r['worker_gc_pauses']['max_ms']} ms",
        ),
        ("machine load (1 min) before / after", f"{load['loadavg_before'][0]} / {load['loadavg_after'][0]}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nsoak latency  [{r['machine']}]")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    if r["slowest"]:
        print(
            "  slowest: "
            + ", ".join(
                f"{s['batch_id'].rsplit('-', 1)[-1]}@{s['at_s']}s {s['e2e_ms']} ms "
                f"(close {s.get('marker_to_close_ms')}, partial {s.get('marker_to_partial_ms')})"
                for s in r["slowest"][:5]
            )
        )


if __name__ == "__main__":
    main()
