"""Preloading a records topic and timing workers over it (throughput, scaling)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import NamedTuple

from _common import cpu_seconds, delete_topics, fresh_topic

from specmeter.producers import PublisherSettings
from specmeter.schemas import decode_records_message
from specmeter.streams.fleet.publish import publish_fleet
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

#: the fleet every pipeline benchmark publishes: four producers, agentic sessions of up to
#: 8 trajectories and 24 turns, 20 % redeliveries, 1 % conflicts, 5 % missing counters
FLEET_SHAPE = {
    "producers": 4,
    "max_samples_per_session": 8,
    "max_turns": 24,
    "redelivery_rate": 0.2,
    "conflict_rate": 0.01,
    "missing_rate": 0.05,
    "invalid_rate": 0.0,
}


def fleet(records_target: int, batches: int | None = None, *, tasks: bool = True) -> FleetSpec:
    """≈ records_target records: ``batches`` batches (default 100, fewer when small), 20 %
    redeliveries, shared ancestors, 1 % conflicts, 5 % missing counters; each session of
    one of three tasks (``tasks=False``: no record names a task, as before revision 4,
    and no histogram contradicts its counters: the fleet the benchmarks ran before)."""
    if batches is None:
        batches = 100 if records_target >= 200_000 else max(2, records_target // 2_000)
    sessions = max(1, round(records_target / batches / 101))
    without = {} if tasks else {"tasks": (), "inconsistent_rate": 0.0, "draft_lags": False}
    return FleetSpec(
        batches=batches, sessions_per_batch=sessions, seed=1, batch_prefix="bench-", **FLEET_SHAPE, **without
    )


def preload(bootstrap: str, spec: FleetSpec, partitions: int, records_per_message: int = 500) -> tuple[str, int, int]:
    """A fresh records topic holding the whole fleet; returns (topic, records, batches)."""
    topic = fresh_topic(bootstrap, "records", partitions)
    settings = PublisherSettings(
        bootstrap_servers=bootstrap,
        topic=topic,
        max_message_bytes=records_per_message * 120,
        linger_ms=50,
        max_queued_records=2_000_000,
    )
    summary = asyncio.run(publish_fleet(synthetic_fleet(spec), settings))
    return topic, summary.records, spec.batches


def bare_consumer(bootstrap: str, topic: str, records: int) -> float:
    """Baseline: aiokafka getmany + msgspec decode + dict dedup, nothing else. Records/s."""
    from aiokafka import AIOKafkaConsumer

    async def run() -> float:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"bare-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        )
        await consumer.start()
        seen: dict = {}
        count = 0
        t0 = time.perf_counter()
        try:
            while count < records:
                for messages in (await consumer.getmany(timeout_ms=500, max_records=2000)).values():
                    for message in messages:
                        decoded = decode_records_message(message.value)
                        for r in decoded.records:
                            seen[(r.session_id, r.generation_id)] = (r.accepted, r.proposed, r.verify, r.completion)
                        count += len(decoded.records)
        finally:
            await consumer.stop()
        return count / (time.perf_counter() - t0)

    return asyncio.run(run())


def start_workers(
    bootstrap: str,
    records_topic: str,
    partitions: int,
    workers: int,
    *,
    name: str | None = None,
    web_port: int | None = None,
    web_ports: list[int] | None = None,
    first: int = 0,
    extra: tuple[str, ...] = (),
    profile_to: str | None = None,
) -> tuple[str, list]:
    """Start worker processes of a fresh app (or more of app ``name``); returns (app name,
    processes).

    ``web_port``: serve the (first) worker's web pages there instead of none; ``web_ports``:
    one port per worker; ``first``: the number of the first worker's log (workers already
    started); ``extra``: more ``specmeter worker`` flags (e.g. ``--grace 60``);
    ``profile_to``: run the (one) worker under cProfile, its stats written to that file when
    it stops."""
    name = name or f"bench-{uuid.uuid4().hex[:8]}"
    topics = [
        "--records-topic",
        records_topic,
        "--partials-topic",
        f"{name}.partials",
        "--metrics-topic",
        f"{name}.metrics",
        "--deadletter-topic",
        f"{name}.deadletter",
    ]
    procs: list[subprocess.Popen] = []
    for i in range(workers):
        port = web_ports[i] if web_ports else web_port if not procs else None
        web = ["--web-port", str(port), "--web-host", "127.0.0.1"] if port else ["--no-web"]
        flags = ["--partitions", str(partitions), "--batch-timeout", "120", *web, "--log-level", "info"]
        profiler = ["-m", "cProfile", "-o", profile_to] if profile_to else []
        command = [sys.executable, *profiler, "-m", "specmeter.streams.cli", "worker", "--broker", bootstrap]
        command += ["--app-id", name]
        command += [*topics, *flags, "--data-dir", tempfile.mkdtemp(prefix="bench-"), *extra]
        with open(worker_logs(name, first + workers)[first + len(procs)], "wb") as log:  # the worker keeps its own
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return name, procs


def app_topics(name: str) -> list[str]:
    """The topics ``start_workers`` names and the worker creates for app ``name``."""
    from specmeter.streams.core.layout import changelog_topics

    return [f"{name}.partials", f"{name}.metrics", f"{name}.deadletter", *changelog_topics(name)]


def worker_logs(name: str, workers: int) -> list[str]:
    """Where each worker process of an app writes its log."""
    return [os.path.join(tempfile.gettempdir(), f"{name}-{i}.log") for i in range(workers)]


def stop_workers(procs: list) -> None:
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def fetch_only(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """The I/O limit: aiokafka getmany over the whole topic, no decoding. Records/s."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    async def run() -> float:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        )
        await consumer.start()
        try:
            assigned = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(assigned)
            total = sum((await consumer.end_offsets(assigned)).values())
            fetched = 0
            t0 = time.perf_counter()
            while fetched < total:
                for messages in (await consumer.getmany(timeout_ms=500, max_records=2000)).values():
                    fetched += len(messages)
            return records / (time.perf_counter() - t0)
        finally:
            await consumer.stop()

    return asyncio.run(run())


class WorkerRun(NamedTuple):
    """Wall-clock times (time.time()) of one timed worker run."""

    started: float  # the worker processes were started
    ready: float  # the last worker restored its state: it fetches records from here on
    #: the last batch's complete BatchMetrics was produced (its Kafka timestamp, the
    #: worker's clock: not when this process's consumer got round to reading it)
    last_metrics: float
    #: CPU seconds the worker processes used from ready to the last metrics (user +
    #: system, read from /proc every 10 ms); None where /proc cannot tell
    steady_cpu_s: float | None = None

    @property
    def seconds(self) -> float:
        return self.last_metrics - self.started

    @property
    def startup_s(self) -> float:
        """Start-up to ready: from start to the state restored, records about to be fetched."""
        return self.ready - self.started

    @property
    def steady_s(self) -> float:
        return self.last_metrics - self.ready


def run_workers(
    bootstrap: str, records_topic: str, partitions: int, batches: int, workers: int, timeout_s: float = 900.0
) -> float:
    """Seconds from starting ``workers`` worker processes to the last batch's BatchMetrics."""
    return run_workers_timed(bootstrap, records_topic, partitions, batches, workers, timeout_s).seconds


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def _ready_at(log_path: str) -> float | None:
    """When a worker's log says its last partition's state was restored (the worker
    logs ``partition=N restored ...`` per stage and partition; fetching follows)."""
    ready = None
    with open(log_path, "rb") as f:
        for raw in f:
            line = raw.decode(errors="replace")
            match = _LOG_TIME.match(line)
            if match and " restored " in line:
                when = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000
                ready = when if ready is None else max(ready, when)
    return ready


def run_workers_timed(
    bootstrap: str,
    records_topic: str,
    partitions: int,
    batches: int,
    workers: int,
    timeout_s: float = 900.0,
    profile_to: str | None = None,
) -> WorkerRun:
    """Start ``workers`` worker processes and time them to the last batch's BatchMetrics
    (and to ready, read from their logs); ``profile_to``: the one worker under cProfile."""
    from aiokafka import AIOKafkaConsumer

    from specmeter.schemas import decode_metrics

    started = time.time()
    name, procs = start_workers(bootstrap, records_topic, partitions, workers, profile_to=profile_to)
    cpu = _CpuSampler([proc.pid for proc in procs])

    async def wait_metrics() -> float:
        deadline = time.time() + timeout_s
        while True:  # the metrics topic appears when the worker starts
            consumer = AIOKafkaConsumer(
                f"{name}.metrics", bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
            )
            await consumer.start()
            done: dict[str, float] = {}  # batch -> when its first complete BatchMetrics was produced
            try:
                while len(done) < batches and time.time() < deadline:
                    for messages in (await consumer.getmany(timeout_ms=200)).values():
                        for message in messages:
                            m = decode_metrics(message.value)
                            if m.complete and m.batch_id not in done:
                                done[m.batch_id] = message.timestamp / 1000
                if len(done) >= batches:
                    return max(done.values())
                raise TimeoutError(f"{len(done)}/{batches} batches within {timeout_s}s")
            finally:
                await consumer.stop()

    try:
        last = asyncio.run(wait_metrics())
    finally:
        cpu.stop()
        stop_workers(procs)
        delete_topics(bootstrap, app_topics(name))
    # a worker that was assigned no partition restores nothing
    readies = [r for r in map(_ready_at, worker_logs(name, workers)) if r is not None]
    if not readies:
        raise RuntimeError(f"no worker log ({worker_logs(name, workers)}) has a 'restored' line: cannot time ready")
    ready = max(readies)
    return WorkerRun(started=started, ready=ready, last_metrics=last, steady_cpu_s=cpu.between(ready, last))


class _CpuSampler:
    """The CPU seconds a set of processes has used, sampled every 10 ms in a thread, so that
    the CPU of a window known only afterwards (ready is read from the logs) can be told.
    The worker is CPU-bound while it reads a backlog: its CPU seconds are its own cost,
    without the broker's stalls that its wall time also holds."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, float]] = []  # (time.time(), CPU seconds of all pids)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> bool:
        try:
            self.samples.append((time.time(), sum(cpu_seconds(pid) for pid in self.pids)))
        except (OSError, ValueError, IndexError):
            return False  # a process is gone, or no /proc here
        return True

    def _run(self) -> None:
        while not self._stopped.is_set() and self._sample():
            self._stopped.wait(0.01)

    def stop(self) -> None:
        """Stop sampling, with one last sample (the window may end just before this)."""
        self._stopped.set()
        self._thread.join()
        self._sample()

    def _at(self, when: float) -> float | None:
        """The CPU seconds at ``when``, interpolated between the samples around it."""
        for (t0, cpu0), (t1, cpu1) in itertools.pairwise(self.samples):
            if t0 <= when <= t1:
                return cpu0 + (cpu1 - cpu0) * ((when - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return None

    def between(self, start: float, end: float) -> float | None:
        """CPU seconds used from ``start`` to ``end``; None outside the samples."""
        first, last = self._at(start), self._at(end)
        return None if first is None or last is None else last - first
