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

On a three-broker cluster (``cluster``: a ``KafkaCluster``, replication factor 3,
``min.insync.replicas=2``, as ``bench/cluster_hold.py`` runs one; ``three_brokers``
starts one), broker faults join the kinds, drawn from the same seed:

* ``broker-kill``: a broker SIGKILLed, started again after a drawn pause;
* ``broker-restart``: a broker stopped cleanly and started again (a rolling restart's step).

A broker fault runs beside the worker faults that follow it (its broker away while they
run), one at a time: the next waits until the previous one's broker is back and every
partition has its three replicas in sync again, so one broker at most is away and every
write still has the two in-sync replicas it needs.

The kinds come in rounds, each round every kind once in a drawn order, so any six
faults in a row hold each kind (eight on a cluster). ``run_chaos`` is used by
``tests/test_group_chaos.py`` (a few faults, in CI) and by ``bench/group_chaos.py`` (as
many as asked; ``--cluster`` on a cluster of its own).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specmeter.streams.cli.lifetime import Reaper
from specmeter.streams.fleet.synthetic import FleetEvent

from .kafka_broker import KafkaCluster, NoBroker, local_broker_tools_missing
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
#: the broker faults a run on a cluster adds to ``KINDS``
BROKER_KINDS = ("broker-kill", "broker-restart")
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
    #: per broker fault: seconds its broker was away, and from its return until every
    #: partition had its replicas in sync again (None: not within the wait)
    broker_away_s: list[float] = field(default_factory=list)
    in_sync_after_s: list[float | None] = field(default_factory=list)


class Group:
    """Three worker slots of one deployment; a slot's process is replaced on restart."""

    def __init__(self, deployment: Deployment, report: ChaosReport, started: float) -> None:
        self.d = deployment
        self.report = report
        self.started = started
        self.slots: list[subprocess.Popen] = []
        self.frozen: set[int] = set()

    def note(self, text: str) -> str:
        line = f"{time.monotonic() - self.started:7.1f}s {text}"
        self.report.timeline.append(line)
        return line

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


def fault_kinds(rng: random.Random, faults: int, brokers: bool = False) -> list[str]:
    """``faults`` kinds: rounds of every kind once (the broker kinds too with
    ``brokers``), each round in a drawn order."""
    every = KINDS + BROKER_KINDS if brokers else KINDS
    kinds: list[str] = []
    while len(kinds) < faults:
        kinds.extend(rng.sample(every, len(every)))
    return kinds[:faults]


@contextmanager
def three_brokers(progress=None) -> Iterator[KafkaCluster]:
    """A private cluster, started as ``bench/cluster_hold.py`` starts one (``KafkaCluster``:
    a controller and brokers 1-3, replication factor 3, ``min.insync.replicas=2``) in a
    temporary folder; stopped and its folder removed on the way out, Ctrl-C included. Its
    nodes are tied to this process (their watchdogs stop them when it ends, however it
    ends) and a reaper removes the folder when this process is killed before its clean-up."""
    if missing := local_broker_tools_missing():
        raise NoBroker(missing)
    reaper = Reaper()
    run_dir = Path(tempfile.mkdtemp(prefix="group-chaos-cluster-"))
    reaper.folder(run_dir)
    cluster = KafkaCluster(run_dir / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop(purge=True)
        except Exception as exc:  # noqa: BLE001 - clean-up only; the watchdogs end the nodes with this process
            if progress is not None:
                progress(f"(could not stop the cluster: {exc!r})")
        shutil.rmtree(run_dir, ignore_errors=True)
        reaper.done()  # not reached when this clean-up is itself interrupted: the reaper finishes it


class Brokers:
    """The broker faults of a run on a cluster, one at a time, each in a thread of its own
    beside the worker faults that follow it; the next starts once the previous one's broker
    is back and every partition in sync again (two brokers away would leave fewer in-sync
    replicas than ``min.insync.replicas``: writes refused)."""

    def __init__(self, cluster: KafkaCluster, group: Group, sync_wait_s: float = 300.0) -> None:
        self.cluster = cluster
        self.group = group
        self.sync_wait_s = sync_wait_s
        self.cancelled = threading.Event()
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def fault(self, kind: str, rng: random.Random) -> str:
        """Start one (drawn here, in the caller's thread: the schedule stays the seed's); its line."""
        self.settle()
        broker = rng.choice(KafkaCluster.BROKERS)
        away_s = rng.uniform(1.0, 15.0) if kind == "broker-kill" else 0.0
        line = self.group.note(f"{kind} broker {broker}" + (f" for {away_s:.1f} s" if away_s else ""))
        self._thread = threading.Thread(target=self._run, args=(kind, broker, away_s), daemon=True)
        self._thread.start()
        return line

    def _run(self, kind: str, broker: int, away_s: float) -> None:
        report = self.group.report
        try:
            left = time.monotonic()
            if kind == "broker-kill":
                self.cluster.kill(broker)
                if self.cancelled.wait(away_s):
                    return
                self.cluster.start_broker(broker)
            else:
                self.cluster.restart(broker)
            back = time.monotonic()
            in_sync = self._in_sync_after(back)
            report.faults[kind] += 1
            report.broker_away_s.append(back - left)
            report.in_sync_after_s.append(in_sync)
            self.group.note(
                f"broker {broker} back after {back - left:.1f} s, "
                + (
                    "partitions not in sync yet"
                    if in_sync is None
                    else f"every partition in sync {in_sync:.1f} s later"
                )
            )
        except Exception as exc:  # noqa: BLE001 - raised by settle, in the run's thread
            self.error = f"{kind} broker {broker}: {exc!r}"[-1500:]
            for b in KafkaCluster.BROKERS:  # every broker back, as bench/cluster_hold.py does
                try:
                    self.cluster.start_broker(b)
                except Exception:  # noqa: BLE001 - the error above is reported
                    pass

    def _in_sync_after(self, back: float) -> float | None:
        from bench.cluster_hold import under_replicated

        deadline = back + self.sync_wait_s
        while under_replicated(self.cluster.bootstrap) != 0:
            if time.monotonic() > deadline or self.cancelled.wait(1.0):
                return None
        return time.monotonic() - back

    def settle(self) -> None:
        """Until the broker fault running (if any) is over; raises when one failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise RuntimeError(f"a broker fault did not run as planned: {self.error}")

    def cancel(self) -> None:
        self.cancelled.set()
        if self._thread is not None:
            self._thread.join(60)  # a broker start in flight ends with the cluster's stop


def _fault(group: Group, kind: str, rng: random.Random) -> str:
    session = group.d.session_timeout_s
    slot = rng.randrange(WORKERS)
    other = rng.choice([s for s in range(WORKERS) if s != slot])
    line = group.note(f"{kind} worker {slot}" + (f" (other {other})" if kind == "freeze-kill-other" else ""))
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
    return line


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
    cluster: KafkaCluster | None = None,
) -> ChaosReport:
    """Three workers, ``faults`` faults drawn from ``seed`` while a stream runs; then
    every worker awake, every broker back, the stream stopped, and the results checked
    (AssertionError when a batch is not exact, a (batch, revision) has two contents, or
    a record is not counted once). ``cluster``: the cluster ``bootstrap`` names, whose
    broker faults join the worker faults."""
    rng = random.Random(seed)
    report = ChaosReport()
    started = time.monotonic()
    # batches close on their markers (a freeze never outlasts the timeout), and grace
    # keeps every closed batch long enough that no record of a moved partition is late
    d = Deployment(
        bootstrap, partitions=partitions, batch_timeout_s=120.0, grace_s=900.0, session_timeout_s=session_timeout_s
    )
    group = Group(d, report, started)
    brokers = None if cluster is None else Brokers(cluster, group)
    feeder = Feeder(d, seed, every_s, sessions)
    try:
        # on a cluster the records topic is replicated as the workers' own topics are
        asyncio.run(
            create_topic(bootstrap, d.topics.records, partitions, replication_factor=1 if cluster is None else 3)
        )
        for _ in range(WORKERS):
            group.start()
        for proc in group.slots:
            d.wait_ready(proc, timeout_s=120 if cluster is None else 240)
        feeder.start()
        for i, kind in enumerate(fault_kinds(rng, faults, brokers=brokers is not None)):
            time.sleep(rng.uniform(*pause_s))
            if feeder.error is not None:
                raise RuntimeError(f"the feeder failed: {feeder.error!r}")
            if kind in BROKER_KINDS:
                assert brokers is not None
                line = brokers.fault(kind, rng)
            else:
                line = _fault(group, kind, rng)
            for slot, proc in enumerate(group.slots):
                assert proc.poll() is None, f"worker {slot} exited with {proc.returncode}\n{d.log_tail()}"
            if progress is not None:
                progress(f"fault {i + 1}/{faults} at {time.monotonic() - started:.0f} s: {line}")
        if brokers is not None:
            brokers.settle()  # every broker back and in sync
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
            brokers_said = "" if cluster is None else "\n" + cluster.log_tails(20)
            progress("\n".join(report.timeline) + "\n" + d.log_tail(6000) + brokers_said)
        raise
    finally:
        report.seconds = time.monotonic() - started
        try:
            if brokers is not None:
                brokers.cancel()
            feeder.stop()
            group.wake_all()
        finally:
            d.close()  # the workers killed whatever else failed
