"""Two workers for half an hour on a three-broker cluster that loses two brokers of three
(twice), a broker's disk and a broker: every batch still exact, the workers alive and
ready, except while the cluster truly refuses writes.

    python bench/cluster_hold.py [--minutes 30] [--rate 120] [--sessions-per-batch 40]
                                 [--ready-write-timeout 30] [--session-timeout 30] [--drain-allowance 30]
                                 [--smoke] [--json]

A private KRaft cluster (``deploy/kafka/broker cluster``: a controller and brokers 1, 2, 3,
replication factor 3, ``min.insync.replicas=2``; its state in a temporary folder) and two
workers of one app on it, the 4 partitions split between them. ``loadgen`` publishes a
paced stream across the whole run (``--rate`` records per second, batches of about 7
records per session; ``--expect`` writes what each batch must come out as). Faults, at
these shares of the run (of 30 minutes: 3, 10.5, 16.5 and 22.5 min), quiet stretches
between:

  1. at 10 %: brokers 3 and 2 SIGKILLed for 75 s (two of three lost: one in-sync replica,
     fewer than min.insync.replicas, so the cluster refuses every write), then started;
  2. at 35 %: broker 2's disk lost (SIGKILL, data emptied), started again 20 s later,
     empty: it copies every partition back from the others;
  3. at 55 %: broker 1 SIGKILLed for 60 s, then started;
  4. at 75 %: brokers 1 and 3 SIGKILLed for 75 s (two of three again), then started.

After each fault, the time until every partition has all three replicas in sync again is
measured (the next fault waits for it: a broker killed while another still catches up
would be a fault of two brokers the schedule did not mean).

Measured: each worker's ``/specmeter/readyz``, twice a second (what a readiness probe
sees), from the moment both are ready to the end; its unready seconds inside the windows
of two brokers lost (allowed: the cluster takes no write), in the ``--drain-allowance``
seconds after those brokers are back (allowed: the writes queued meanwhile drain; how
long it really took is printed) and anywhere else: target none, but for a rebalance of
the group shorter than 5 s (a group coordinator's move can make the group rebalance once,
the likelier the shorter ``--session-timeout``; a Kubernetes readiness probe, period 10 s
and failureThreshold 3, never sees it). The workers run at their default session timeout
(30 s): at 10 s a rebalance right after two lost brokers are back, while the writes they
refused drain, stopped a worker (its revoked partitions' writes were still in flight past
half the session timeout, and it stops rather than let them land under the next owner).
Each stretch elsewhere is printed with its time and the page's reason.
When the stream has ended: every batch of
the expect file published complete and exact (record count, invalid records, accept
histogram, every metric), one content per (batch, revision) over every message
published, both workers alive throughout (never restarted) and ready at the end. Exit 1
when a target is missed. The workers' logs are kept (their path is printed) and their
WARNING/ERROR lines and tracebacks counted.

``--smoke``: a 2-minute stream, the faults compressed (two brokers lost for 20 s,
broker 1 away for 15 s, 10 s quiet at least between faults) and
``--ready-write-timeout 10``, so the refused writes show within the short windows.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import logging
import math
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from bench._common import add_json_flag, core_name, report
from specmeter.streams.cli.base import exit_status
from specmeter.streams.cli.lifetime import Reaper, stop_signals_raise
from specmeter.streams.settings import WorkerSettings
from tests.support.golden_cases import assert_metrics_equal
from tests.support.kafka_broker import KafkaCluster, local_broker_tools_missing
from tests.support.readiness import PROBE_EVERY_S, ReadinessProbe, wait_ready_over_http
from tests.support.tools import free_port, get_json
from tests.support.worker_harness import Deployment, latest_by_batch

PARTITIONS = 4


@dataclasses.dataclass
class Fault:
    """One fault of the schedule and, once done, when each of its steps happened (seconds
    since the stream started)."""

    action: str  # "kill" or "wipe"
    brokers: tuple[int, ...]
    at_s: float  # planned start
    down_s: float
    started: float | None = None
    back: float | None = None  # every broker of it serving again
    replicated_after_s: float | None = None  # from back until every partition has 3 replicas in sync
    under_replicated_left: int = 0  # partitions still short when the wait gave up
    error: str | None = None

    @property
    def refuses_writes(self) -> bool:
        """Two brokers of three away: fewer in-sync replicas than min.insync.replicas."""
        return len(self.brokers) >= 2

    def describe(self) -> str:
        names = " and ".join(map(str, self.brokers))
        return (
            f"broker {names} disk lost"
            if self.action == "wipe"
            else f"broker{'s' * (len(self.brokers) > 1)} {names} killed"
        )


def schedule(stream_s: float, smoke: bool) -> list[Fault]:
    if smoke:
        return [
            Fault("kill", (3, 2), at_s=10, down_s=20),
            Fault("wipe", (2,), at_s=45, down_s=5),
            Fault("kill", (1,), at_s=70, down_s=15),
            Fault("kill", (1, 3), at_s=100, down_s=20),
        ]
    return [
        Fault("kill", (3, 2), at_s=0.10 * stream_s, down_s=75),
        Fault("wipe", (2,), at_s=0.35 * stream_s, down_s=20),
        Fault("kill", (1,), at_s=0.55 * stream_s, down_s=60),
        Fault("kill", (1, 3), at_s=0.75 * stream_s, down_s=75),
    ]


def under_replicated(bootstrap: str) -> int:
    """Partitions of the cluster (every topic) with fewer replicas in sync than assigned;
    -1 when the cluster did not answer."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def count() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        await admin.start()
        try:
            topics = await admin.describe_topics()
            return sum(1 for t in topics for p in t["partitions"] if len(p["isr"]) < len(p["replicas"]))
        finally:
            await admin.close()

    try:
        return asyncio.run(asyncio.wait_for(count(), 20))
    except Exception:  # noqa: BLE001 - a cluster between states: asked again
        return -1


class Chaos(threading.Thread):
    """Runs the faults at their times (never closer than ``quiet_s`` after the previous
    one's brokers are back and in sync)."""

    def __init__(self, cluster: KafkaCluster, faults: list[Fault], t0: float, quiet_s: float, sync_wait_s: float):
        super().__init__(daemon=True)
        self.cluster, self.faults, self.t0 = cluster, faults, t0
        self.quiet_s, self.sync_wait_s = quiet_s, sync_wait_s
        self.cancelled = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> None:
        ready_at = 0.0
        for fault in self.faults:
            if self.cancelled.wait(max(0.0, max(fault.at_s, ready_at) - self.now())):
                return
            fault.started = self.now()
            try:
                for broker in fault.brokers:
                    (self.cluster.wipe if fault.action == "wipe" else self.cluster.kill)(broker)
                if self.cancelled.wait(fault.down_s):
                    return
                self._start(fault.brokers)
            except Exception as exc:  # noqa: BLE001 - said in the report; the brokers started again
                fault.error = f"{exc!r}"[-1500:]
                self._start(KafkaCluster.BROKERS, quiet=True)
            fault.back = self.now()
            deadline = time.monotonic() + self.sync_wait_s
            while (short := under_replicated(self.cluster.bootstrap)) != 0 and time.monotonic() < deadline:
                if self.cancelled.wait(1.0):
                    return
            if short == 0:
                fault.replicated_after_s = self.now() - fault.back
            else:
                fault.under_replicated_left = short
            ready_at = self.now() + self.quiet_s

    def _start(self, brokers: tuple[int, ...], quiet: bool = False) -> None:
        """Start brokers together (each its own ``cluster start N``), as machines come back."""
        errors: list[BaseException] = []

        def one(broker: int) -> None:
            try:
                self.cluster.start_broker(broker)
            except BaseException as exc:  # noqa: BLE001 - raised below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(b,)) for b in brokers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors and not quiet:
            raise errors[0]


def records_per_batch(sessions: int, seed: int, run_dir: Path) -> float:
    """Records (and invalid records: ``--rate`` paces both) of a batch of this loadgen
    stream, from a dump of its first batches."""
    dump = run_dir / "sizing.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "specmeter.streams.cli",
            "loadgen",
            "--batches",
            "4",
            "--sessions-per-batch",
            str(sessions),
            "--seed",
            str(seed),
            "--dump",
            str(dump),
        ],
        check=True,
        capture_output=True,
    )
    lines = dump.read_text().splitlines()
    dump.unlink()
    return sum(1 for line in lines if '"type":"marker"' not in line) / 4


def held_partitions(port: int) -> list[int] | None:
    try:
        return list(get_json(port, "/specmeter/stats")[1]["partitions"])
    except Exception:  # noqa: BLE001 - no answer
        return None


def classify(answers: list[tuple[float, int, dict]], faults: list[Fault], drain_s: float, end: float):
    """Unready seconds (each answer weighs the time since the one before) inside windows of
    two brokers lost, in the drain allowance after them, and elsewhere; the stretches
    elsewhere (start, end, each reason the page gave with its first and last time); per
    fault, the unready seconds from its start to ``drain_s`` after its brokers are back (or
    the next fault's start), and how long after they were back the last unready answer of
    that span came."""
    seconds = {"two_lost": 0.0, "drain": 0.0, "outside": 0.0}
    per_fault = [{"unready_s": 0.0, "ready_again_after_back_s": 0.0} for _ in faults]
    stretches: list[list] = []
    previous = answers[0][0] - PROBE_EVERY_S if answers else 0.0
    last_outside = False
    for t, status, body in answers:
        weight, previous = t - previous, t
        if status == 200:
            last_outside = False
            continue
        where = "outside"
        for i, f in enumerate(faults):
            if f.started is None:
                continue
            back = end if f.back is None else f.back
            until = back + drain_s  # or the next fault's start, whichever comes first
            following = faults[i + 1].started if i + 1 < len(faults) else None
            if f.started <= t <= until and (following is None or t < following):
                per_fault[i]["unready_s"] += weight
                if t > back:
                    per_fault[i]["ready_again_after_back_s"] = max(per_fault[i]["ready_again_after_back_s"], t - back)
                if f.refuses_writes:
                    where = "two_lost" if t <= back else "drain"
        seconds[where] += weight
        if where == "outside":
            reason = str(body.get("reason") or body.get("error") or status)
            if not last_outside:
                stretches.append([t, t, {}])
            stretches[-1][1] = t
            stretches[-1][2].setdefault(reason, [t, t])[1] = t
            last_outside = True
        else:
            last_outside = False
    return seconds, per_fault, stretches


#: the readiness page's reason while a worker's group rebalances (streams/report/readiness.py)
REBALANCING = "partitions being assigned or their state restored"
#: a rebalance shorter than this is not a miss: a Kubernetes readiness probe (period 10 s,
#: failureThreshold 3 by default) never sees it; docs/operations.md describes the blip
REBALANCE_BLIP_S = 5.0


def rebalance_blip(stretch: list) -> bool:
    """Whether an unready stretch outside the windows was a short rebalance and nothing else
    (the group coordinator's broker back from a restart makes the group rebalance once)."""
    start, stop, reasons = stretch
    return set(reasons) == {REBALANCING} and stop - start + PROBE_EVERY_S < REBALANCE_BLIP_S


def near(t: float, faults: list[Fault]) -> str:
    """Where ``t`` falls among the faults: during one, or how long after one's brokers were back."""
    before = [(i, f) for i, f in enumerate(faults) if f.started is not None and f.started <= t]
    if not before:
        return "before the first fault"
    i, f = before[-1]
    if f.back is None or t <= f.back:
        return f"during fault {i + 1}"
    return f"{t - f.back:.1f} s after fault {i + 1}'s brokers were back"


def log_summary(log: Path) -> dict:
    """A worker log's WARNING and ERROR lines (counted by their text with digits as #) and tracebacks."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        level = re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)
        if level:
            lines[re.sub(r"\d+", "#", line[level.start() :])[:160]] += 1
    return {
        "warnings": sum(n for k, n in lines.items() if k.startswith("WARNING")),
        "errors": sum(n for k, n in lines.items() if not k.startswith("WARNING")),
        "tracebacks": text.count("Traceback (most recent call last)"),
        "top": lines.most_common(8),
    }


def check_batches(expected: dict[str, dict], published: list) -> dict:
    """Each expected batch's latest revision against the expect file; one content per (batch, revision)."""
    latest = latest_by_batch(published)
    missing = sorted(set(expected) - set(latest))
    incomplete: list[str] = []
    wrong: list[str] = []
    close_reasons: collections.Counter[str | None] = collections.Counter()
    for batch_id, want in expected.items():
        got = latest.get(batch_id)
        if got is None:
            continue
        close_reasons[got.close_reason] += 1
        if not got.complete:
            incomplete.append(batch_id)
            continue
        try:
            assert got.record_count == want["record_count"], ("record_count", got.record_count, want["record_count"])
            assert got.invalid_record_count == want["invalid_record_count"], "invalid_record_count"
            assert got.accept_histogram == want["accept_histogram"], "accept_histogram"
            assert_metrics_equal(got.metrics, want["metrics"], batch_id)
        except AssertionError as exc:
            wrong.append(f"{batch_id}: {exc}"[:300])
    contents: dict[tuple[str, int], bytes] = {}
    conflicting = set()
    for m in published:
        key, body = (m.batch_id, m.revision), msgspec.json.encode(m)
        if contents.setdefault(key, body) != body:
            conflicting.add(key)
    revisions = collections.Counter(m.revision for m in latest.values() if m.batch_id in expected)
    return {
        "expected": len(expected),
        "exact": len(expected) - len(missing) - len(incomplete) - len(wrong),
        "missing": missing,
        "incomplete": incomplete,
        "wrong": wrong,
        "messages": len(published),
        "distinct_revisions": len(contents),
        "conflicting": sorted(conflicting),
        "latest_revision_counts": dict(sorted(revisions.items())),
        "close_reasons": dict(close_reasons),
    }


#: how long the end's readiness waits for the group to settle: the last fault's brokers can be
#: back after the session timeout, and the group then rebalances (its members expired while
#: the coordinator was away) just as the last batch completes
FINAL_READY_WAIT_S = 60.0


def settled_readiness(ports: list[int], wait_s: float) -> tuple[list[tuple[int, dict]], float]:
    """Each worker's ``/specmeter/readyz`` once all answer ready, or their last answers after
    ``wait_s``; and how long that took. A worker that is not ready at the end is one that
    does not come back within the wait, not one caught in the rebalance the last outage left."""
    began = time.monotonic()
    while True:
        answers = [_readyz(port) for port in ports]
        waited = time.monotonic() - began
        if all(status == 200 for status, _ in answers) or waited >= wait_s:
            return answers, waited
        time.sleep(0.5)


def _readyz(port: int) -> tuple[int, dict]:
    try:
        return get_json(port, "/specmeter/readyz")
    except Exception as exc:  # noqa: BLE001 - no answer
        return 0, {"error": repr(exc)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the stream (and of the run, about)")
    parser.add_argument("--rate", type=float, default=120.0, help="loadgen's records per second")
    parser.add_argument("--sessions-per-batch", type=int, default=40, help="loadgen's (about 7 records a session)")
    parser.add_argument("--ready-write-timeout", type=float, default=30.0, help="the workers' (their default: 30)")
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=WorkerSettings().session_timeout_s,
        help="the workers' (their default); at 10 a group coordinator's move can expire a member and rebalance "
        "the group, and a rebalance while writes drain after two brokers are back stops a worker",
    )
    parser.add_argument(
        "--drain-allowance",
        type=float,
        default=30.0,
        help="seconds after two lost brokers are back in which unreadiness is allowed",
    )
    parser.add_argument("--smoke", action="store_true", help="a 2-minute stream, faults compressed")
    add_json_flag(parser)
    args = parser.parse_args()
    stream_s = 130.0 if args.smoke else args.minutes * 60
    write_timeout = 10.0 if args.smoke else args.ready_write_timeout
    quiet_s, sync_wait_s = (10.0, 60.0) if args.smoke else (60.0, 300.0)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # this process's readers and admin, brokers away
    if missing_tools := local_broker_tools_missing():
        sys.exit(f"cluster_hold: {missing_tools}")

    began = time.monotonic()
    # what this run starts ends with it (issue 47.3): the cluster's nodes through their watchdogs
    # (KafkaCluster ties them to this process), the workers, loadgen and the folder through the reaper
    reaper = Reaper()
    run_dir = Path(tempfile.mkdtemp(prefix="cluster-hold-"))
    reaper.folder(run_dir)
    tempfile.tempdir = str(run_dir)  # the workers' logs and data folders (Deployment makes them)
    cluster = KafkaCluster(run_dir / "cluster")
    faults = schedule(stream_s, args.smoke)
    procs: list[subprocess.Popen] = []
    probes: list[ReadinessProbe] = []
    loadgen: subprocess.Popen | None = None
    chaos: Chaos | None = None
    d: Deployment | None = None
    figures: dict = {}
    interrupted = False
    try:
        t = time.monotonic()
        bootstrap = cluster.start()
        figures["cluster_start_s"] = round(time.monotonic() - t, 1)
        d = Deployment(
            bootstrap,
            partitions=PARTITIONS,
            batch_timeout_s=120.0,
            grace_s=300.0,
            session_timeout_s=args.session_timeout,
        )
        ports = [free_port(), free_port()]
        for port in ports:  # one after the other: the first creates the topics
            worker = d.start_worker(
                "--web-port", str(port), "--web-host", "127.0.0.1", "--ready-write-timeout", f"{write_timeout:g}"
            )
            procs.append(worker)
            reaper.group(worker.pid)
            d.wait_ready(worker, timeout_s=180)
        for port in ports:
            wait_ready_over_http(port, timeout_s=180.0)
        deadline = time.monotonic() + 120
        while not all(held_partitions(p) for p in ports) and time.monotonic() < deadline:
            time.sleep(1)  # the group's rebalance for the second worker
        figures["held_at_start"] = [held_partitions(p) for p in ports]
        figures["workers_ready_s"] = round(time.monotonic() - began, 1)

        per_batch = records_per_batch(args.sessions_per_batch, 37, run_dir)
        batches = max(4, math.ceil(args.rate * stream_s / per_batch))
        expect = run_dir / "expect.jsonl"
        t0 = time.monotonic()
        probes = [ReadinessProbe(p, t0).start() for p in ports]
        with (run_dir / "loadgen.out").open("wb") as out:
            loadgen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "specmeter.streams.cli",
                    "loadgen",
                    "--broker",
                    bootstrap,
                    "--topic",
                    d.topics.records,
                    "--batches",
                    str(batches),
                    "--sessions-per-batch",
                    str(args.sessions_per_batch),
                    "--rate",
                    f"{args.rate:g}",
                    "--seed",
                    "37",
                    "--expect",
                    str(expect),
                    "--no-progress",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the reaper's to end if this run is killed
            )
        reaper.group(loadgen.pid)
        chaos = Chaos(cluster, faults, t0, quiet_s, sync_wait_s)
        chaos.start()

        died: dict[int, float] = {}
        deadline = t0 + stream_s + 900
        while (loadgen.poll() is None or chaos.is_alive()) and time.monotonic() < deadline:
            for i, proc in enumerate(procs):
                if proc.poll() is not None and i not in died:
                    died[i] = time.monotonic() - t0
            time.sleep(1)
        figures["loadgen_rc"] = loadgen.poll()
        figures["loadgen_s"] = round(time.monotonic() - t0, 1)
        figures["loadgen_tail"] = (run_dir / "loadgen.out").read_text(errors="replace")[-600:]

        expected = (
            {m["batch_id"]: m for m in map(json.loads, expect.read_text().splitlines())} if expect.exists() else {}
        )

        def done(ms: list) -> bool:
            latest = latest_by_batch(ms)
            return all(b in latest and latest[b].complete for b in expected)

        t = time.monotonic()
        published = d.metrics(until=done, timeout_s=300 if args.smoke else 900)
        figures["complete_after_stream_s"] = round(time.monotonic() - t, 1)
        time.sleep(3)  # a few answers of the probes after the last batch
        end = time.monotonic() - t0
        for probe in probes:
            probe.stop()
        for i, proc in enumerate(procs):
            if proc.poll() is not None and i not in died:
                died[i] = end
        final_ready, figures["ready_at_end_after_s"] = settled_readiness(ports, FINAL_READY_WAIT_S)
        figures["held_at_end"] = [held_partitions(p) for p in ports]
        figures["batches"] = check_batches(expected, published)
        figures["records"] = sum(m["record_count"] for m in expected.values())
        figures["final_ready"] = final_ready
        figures["died"] = died
        figures["end_s"] = end
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: what it started goes, its folder too
        interrupted = True
        print("cluster_hold: interrupted: stopping what it started", file=sys.stderr)
        raise
    finally:
        if chaos is not None:
            chaos.cancelled.set()
            chaos.join(30)  # a broker start in flight is ended by the cluster's stop below
        for probe in probes:
            probe.stop()
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
        if d is not None:
            for proc in procs:
                if proc.poll() is None:
                    d.kill(proc)
        try:
            cluster.stop(purge=True)
        except Exception as exc:  # noqa: BLE001 - clean-up only
            print(f"(could not stop the cluster: {exc!r})", file=sys.stderr)
        for folder in run_dir.glob("*-data-*"):
            shutil.rmtree(folder, ignore_errors=True)
        (run_dir / "expect.jsonl").unlink(missing_ok=True)
        if interrupted:  # a run that completes keeps its logs (the report names them)
            shutil.rmtree(run_dir, ignore_errors=True)
        reaper.done()  # not reached when this clean-up is itself interrupted: the reaper finishes it

    assert d is not None
    elapsed = time.monotonic() - began
    end = figures["end_s"]
    windows = []
    for i, probe in enumerate(probes):
        seconds, per_fault, stretches = classify(probe.answers, faults, args.drain_allowance, end)
        windows.append(
            {
                "worker": i,
                "answers": len(probe.answers),
                "unready_s": seconds,
                "per_fault": per_fault,
                "outside_stretches": stretches,
                "longest_outside_s": max((b - a + PROBE_EVERY_S for a, b, _ in stretches), default=0.0),
            }
        )
    logs = [log_summary(log) for log in d.logs]
    b = figures["batches"]

    misses = []
    if figures["loadgen_rc"] != 0:
        misses.append(f"loadgen ended with {figures['loadgen_rc']}")
    if errors := [f"fault {i + 1}: {f.error}" for i, f in enumerate(faults) if f.error or f.back is None]:
        misses.append("a fault did not run as planned: " + "; ".join(map(str, errors)))
    if b["exact"] != b["expected"] or not b["expected"]:
        misses.append(f"{b['expected'] - b['exact']} of {b['expected']} batches not exact")
    if b["conflicting"]:
        misses.append(f"{len(b['conflicting'])} (batch, revision) published with two contents")
    if figures["died"]:
        misses.append(f"workers exited: {figures['died']}")
    if any(status != 200 for status, _ in figures["final_ready"]):
        misses.append(f"not ready at the end: {figures['final_ready']}")
    if outside := [w for w in windows if any(not rebalance_blip(stretch) for stretch in w["outside_stretches"])]:
        misses.append(f"unready outside the windows of two brokers lost: worker(s) {[w['worker'] for w in outside]}")
    verdict = "PASS" if not misses else "FAIL: " + "; ".join(misses)

    def at(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f} s"

    rows = [
        (
            "run",
            f"2 workers, {PARTITIONS} partitions, brokers 1-3 (RF 3, min.insync 2), stream {stream_s / 60:.1f} min "
            f"at {args.rate:g} records/s, --ready-write-timeout {write_timeout:g}, "
            f"--session-timeout {args.session_timeout:g}"
            f"{' (smoke)' if args.smoke else ''}",
        ),
        (
            "cluster started / workers ready",
            f"{figures['cluster_start_s']:.0f} s / {figures['workers_ready_s']:.0f} s "
            f"(partitions {figures['held_at_start']})",
        ),
        (
            "stream",
            f"{b['expected']} batches, {figures['records']:,} records; loadgen exit {figures['loadgen_rc']} "
            f"after {figures['loadgen_s']:.0f} s; every batch complete {figures['complete_after_stream_s']:.0f} s "
            "after",
        ),
    ]
    for i, f in enumerate(faults):
        unready = ", ".join(
            f"w{w['worker']} unready {w['per_fault'][i]['unready_s']:.0f} s"
            + (
                f" (ready {w['per_fault'][i]['ready_again_after_back_s']:.0f} s after back)"
                if w["per_fault"][i]["ready_again_after_back_s"]
                else ""
            )
            for w in windows
        )
        rows.append(
            (
                f"fault {i + 1}: {f.describe()}",
                f"at {at(f.started)}, back at {at(f.back)}; all in sync {at(f.replicated_after_s)} after"
                + (f" (still {f.under_replicated_left} short)" if f.under_replicated_left else "")
                + f"; {unready}"
                + (f"; ERROR {f.error}" if f.error else ""),
            )
        )
    for w in windows:
        s = w["unready_s"]
        rows.append(
            (
                f"worker {w['worker']} unready: two lost / drain / outside",
                f"{s['two_lost']:.1f} s / {s['drain']:.1f} s / {s['outside']:.1f} s (target outside: 0 but for "
                f"rebalances under {REBALANCE_BLIP_S:.0f} s, here "
                f"{sum(rebalance_blip(x) for x in w['outside_stretches'])}; "
                f"{len(w['outside_stretches'])} stretch(es) outside, the longest {w['longest_outside_s']:.1f} s; "
                f"{w['answers']} answers)",
            )
        )
        for start, stop, reasons in w["outside_stretches"][:10]:
            rows.append(
                (
                    f"  worker {w['worker']} unready outside",
                    f"{start:.1f}-{stop:.1f} s ({near(start, faults)}): "
                    + " | ".join(f"{why} ({a:.1f}-{b:.1f} s)" for why, (a, b) in reasons.items()),
                )
            )
    rows += [
        (
            "batches exact",
            f"{b['exact']} of {b['expected']} (missing {len(b['missing'])}, incomplete "
            f"{len(b['incomplete'])}, wrong {len(b['wrong'])})",
        ),
        ("ratio of batches exact (exact / expected)", f"{b['exact'] / max(1, b['expected']):.3f}"),
        (
            "revisions published",
            f"{b['messages']} messages, {b['distinct_revisions']} distinct (batch, revision), "
            f"{len(b['conflicting'])} with two contents; latest revision per batch "
            f"{b['latest_revision_counts']}; close reasons {b['close_reasons']}",
        ),
        (
            "workers alive / ready at the end",
            f"{'both' if not figures['died'] else figures['died']} / "
            f"{[s for s, _ in figures['final_ready']]} after {figures['ready_at_end_after_s']:.0f} s "
            f"(partitions {figures['held_at_end']})",
        ),
    ]
    for i, summary in enumerate(logs):
        rows.append(
            (
                f"worker {i} log",
                f"{summary['warnings']} WARNING, {summary['errors']} ERROR, "
                f"{summary['tracebacks']} tracebacks ({d.logs[i]})",
            )
        )
        for line, n in summary["top"][:5]:
            rows.append(("  ", f"{n} x {line}"))
    if figures["loadgen_rc"] != 0:
        rows.append(("  loadgen said", figures["loadgen_tail"].replace("\n", " / ")))
    for wrong in b["wrong"][:5]:
        rows.append(("  wrong", wrong))
    rows += [("took", f"{elapsed / 60:.1f} min"), ("verdict", verdict)]
    data = {
        "minutes": stream_s / 60,
        "smoke": args.smoke,
        "rate": args.rate,
        "ready_write_timeout_s": write_timeout,
        "session_timeout_s": args.session_timeout,
        "drain_allowance_s": args.drain_allowance,
        "faults": [{**dataclasses.asdict(f), "what": f.describe()} for f in faults],
        "readiness": windows,
        "batches": {k: v for k, v in b.items() if k not in ("missing", "incomplete")}
        | {"missing": b["missing"][:20], "incomplete": b["incomplete"][:20]},
        "records": figures["records"],
        "loadgen_rc": figures["loadgen_rc"],
        "workers_exited": figures["died"],
        "final_ready": figures["final_ready"],
        "logs": logs,
        "log_files": [str(p) for p in d.logs],
        "took_s": round(elapsed),
        "verdict": verdict,
        "core": core_name(),
    }
    report("cluster hold: two workers through two of three brokers lost and a lost disk", rows, data, as_json=args.json)
    if misses:
        sys.exit(1)


if __name__ == "__main__":
    with stop_signals_raise():  # SIGTERM and SIGHUP stop it as Ctrl-C does: its clean-up runs
        try:
            main()
        except KeyboardInterrupt as interrupt:
            sys.exit(exit_status(interrupt))  # 130, 143
