"""A group of three workers frozen, killed, stopped and restarted many times over while
a stream runs (issue 37's probe): every batch exact, one content per (batch, revision),
every record counted once.

The schedule of faults is drawn from a seed; their timing against the stream is the
machine's. Each fault is one of:

* ``freeze``: SIGSTOP for less than the session timeout (the group keeps the worker);
* ``freeze-long``: SIGSTOP past the session (its partitions move; woken, it holds
  fetched input and writes that no longer count);
* ``kill``: SIGKILL, then a fresh worker in its place (new data dir, state from the
  changelogs);
* ``term``: SIGTERM (a clean stop), then a fresh worker;
* ``freeze-kill-other``: one worker frozen past the session, another killed and
  restarted while it is frozen, then the first woken (a stale owner waking beside a
  successor that restores);
* ``kill-freeze-new``: a worker killed and its replacement frozen past the session a
  few seconds after it starts (frozen mid-takeover or mid-restore).

The kinds come in rounds, each round every kind once in a drawn order, so any six
faults in a row hold each kind. ``run_chaos`` is used by ``tests/test_group_chaos.py`` (a few faults, in CI) and by
``bench/group_chaos.py`` (as many as asked).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from specmeter.streams.fleet.synthetic import FleetEvent

from .kafka_helpers import create_topic
from .worker_harness import (
    Deployment,
    assert_conserved,
    assert_duplicates_identical,
    assert_matches_offline,
    fleet_events,
    produced_records,
    publish_events,
    wait_complete,
)

KINDS = ("freeze", "freeze-long", "kill", "term", "freeze-kill-other", "kill-freeze-new")
WORKERS = 3


@dataclass
class ChaosReport:
    """What a run did and what came out."""

    faults: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    records: int = 0
    published: int = 0
    revisions_above_0: int = 0
    restarts: int = 0
    fenced_lines: int = 0
    not_counted_lines: int = 0
    tracebacks: int = 0
    seconds: float = 0.0
    conserved: dict[str, int] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)


class Group:
    """Three worker slots of one deployment; a slot's process is replaced on restart."""

    def __init__(self, deployment: Deployment, report: ChaosReport, started: float) -> None:
        self.d = deployment
        self.report = report
        self.started = started
        self.slots: list[subprocess.Popen] = []
        self.frozen: set[int] = set()

    def note(self, text: str) -> None:
        self.report.timeline.append(f"{time.monotonic() - self.started:7.1f}s {text}")

    def start(self, slot: int | None = None) -> None:
        proc = self.d.start_worker()
        if slot is None:
            self.slots.append(proc)
        else:
            self.slots[slot] = proc
            self.report.restarts += 1

    def freeze(self, slot: int) -> None:
        os.killpg(self.slots[slot].pid, signal.SIGSTOP)
        self.frozen.add(slot)

    def wake(self, slot: int) -> None:
        os.killpg(self.slots[slot].pid, signal.SIGCONT)
        self.frozen.discard(slot)

    def kill(self, slot: int) -> None:
        self.d.kill(self.slots[slot])
        self.frozen.discard(slot)

    def term(self, slot: int) -> None:
        self.d.stop(self.slots[slot], timeout_s=60)

    def wake_all(self) -> None:
        for slot in list(self.frozen):
            self.wake(slot)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.slots)


def fault_kinds(rng: random.Random, faults: int) -> list[str]:
    """``faults`` kinds: rounds of every kind once, each round in a drawn order."""
    kinds: list[str] = []
    while len(kinds) < faults:
        kinds.extend(rng.sample(KINDS, len(KINDS)))
    return kinds[:faults]


def _fault(group: Group, kind: str, rng: random.Random) -> None:
    session = group.d.session_timeout_s
    slot = rng.randrange(WORKERS)
    other = rng.choice([s for s in range(WORKERS) if s != slot])
    group.note(f"{kind} worker {slot}" + (f" (other {other})" if kind == "freeze-kill-other" else ""))
    if kind == "freeze":
        group.freeze(slot)
        time.sleep(rng.uniform(1.0, session * 0.7))
        group.wake(slot)
    elif kind == "freeze-long":
        group.freeze(slot)
        time.sleep(session + rng.uniform(2.0, 20.0))
        group.wake(slot)
    elif kind == "kill":
        group.kill(slot)
        time.sleep(rng.uniform(0.0, 8.0))
        group.start(slot)
    elif kind == "term":
        group.term(slot)
        time.sleep(rng.uniform(0.0, 5.0))
        group.start(slot)
    elif kind == "freeze-kill-other":
        group.freeze(slot)
        time.sleep(session + rng.uniform(0.0, 4.0))  # its partitions move to the others
        group.kill(other)
        time.sleep(rng.uniform(0.0, 3.0))
        group.start(other)  # restores beside a frozen former owner
        time.sleep(rng.uniform(0.0, 8.0))
        group.wake(slot)
    elif kind == "kill-freeze-new":
        group.kill(slot)
        group.start(slot)
        time.sleep(rng.uniform(0.5, 8.0))  # joining, taking over, restoring...
        group.freeze(slot)
        time.sleep(session + rng.uniform(1.0, 12.0))
        group.wake(slot)
    else:  # pragma: no cover - KINDS lists them
        raise ValueError(kind)
    group.report.faults[kind] += 1


class Feeder(threading.Thread):
    """The stream: one small fleet of whole batches after another, paced, until stopped."""

    def __init__(self, deployment: Deployment, seed: int, every_s: float, sessions: int) -> None:
        super().__init__(daemon=True)
        self.d = deployment
        self.seed = seed
        self.every_s = every_s
        self.sessions = sessions
        self.events: list[FleetEvent] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        chunk = 0
        try:
            while not self._done.is_set():
                events = fleet_events(seed=self.seed * 10_000 + chunk, batches=2, sessions=self.sessions)
                asyncio.run(publish_events(self.d.bootstrap, self.d.topics.records, events))
                self.events.extend(events)
                chunk += 1
                self._done.wait(self.every_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc

    def stop(self) -> None:
        self._done.set()
        self.join(120)


def run_chaos(
    bootstrap: str,
    *,
    seed: int,
    faults: int,
    partitions: int = 6,
    session_timeout_s: float = 6.0,
    every_s: float = 2.0,
    sessions: int = 10,
    pause_s: tuple[float, float] = (2.0, 8.0),
    progress=None,
) -> ChaosReport:
    """Three workers, ``faults`` faults drawn from ``seed`` while a stream runs; then
    every worker awake, the stream stopped, and the results checked (AssertionError
    when a batch is not exact, a (batch, revision) has two contents, or a record is
    not counted once)."""
    rng = random.Random(seed)
    report = ChaosReport()
    started = time.monotonic()
    # batches close on their markers (a freeze never outlasts the timeout), and grace
    # keeps every closed batch long enough that no record of a moved partition is late
    d = Deployment(
        bootstrap, partitions=partitions, batch_timeout_s=120.0, grace_s=900.0, session_timeout_s=session_timeout_s
    )
    group = Group(d, report, started)
    feeder = Feeder(d, seed, every_s, sessions)
    try:
        asyncio.run(create_topic(bootstrap, d.topics.records, partitions))
        for _ in range(WORKERS):
            group.start()
        for proc in group.slots:
            d.wait_ready(proc, timeout_s=120)
        feeder.start()
        for i, kind in enumerate(fault_kinds(rng, faults)):
            time.sleep(rng.uniform(*pause_s))
            if feeder.error is not None:
                raise RuntimeError(f"the feeder failed: {feeder.error!r}")
            _fault(group, kind, rng)
            for slot, proc in enumerate(group.slots):
                assert proc.poll() is None, f"worker {slot} exited with {proc.returncode}\n{d.log_tail()}"
            if progress is not None:
                progress(f"fault {i + 1}/{faults} at {time.monotonic() - started:.0f} s: {report.timeline[-1]}")
        time.sleep(5.0)
        feeder.stop()
        if feeder.error is not None:
            raise RuntimeError(f"the feeder failed: {feeder.error!r}")
        group.note("stream stopped")
        events = feeder.events
        published = wait_complete(d, {e.batch_id for e in events}, timeout_s=300)
        report.batches = len({e.batch_id for e in events})
        report.records = produced_records(events)
        report.published = len(published)
        report.revisions_above_0 = sum(1 for m in published if m.revision > 0)
        assert_matches_offline(published, events, partitions=partitions)
        assert_duplicates_identical(published)
        report.conserved = assert_conserved(report.records, published, d.dead_letters())
        assert group.alive(), "a worker exited\n" + d.log_tail()
        logs = "".join(p.read_text(errors="replace") for p in d.logs)
        report.fenced_lines = logs.count("no longer count, and it gives the partition up")
        report.not_counted_lines = logs.count("does not count (a newer generation")
        report.tracebacks = logs.count("Traceback (most recent call last)")
        return report
    except BaseException:
        if progress is not None:
            progress("\n".join(report.timeline) + "\n" + d.log_tail(6000))
        raise
    finally:
        report.seconds = time.monotonic() - started
        try:
            feeder.stop()
            group.wake_all()
        finally:
            d.close()  # the workers killed whatever else failed
