"""A group of workers against a real broker (issue 30): membership that lasts while the
routes work and ends when they stop, a frozen owner fenced, writes that fail fast, and
rebalances that restore only what moved. Every test ends with exact results, every
record accounted for, and one content per (batch, revision)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time

import pytest

from specmeter.streams.core.layout import changelog_topics
from specmeter.streams.worker.faults import WRITE_KINDS

from .support.kafka_helpers import create_topic
from .support.worker_harness import (
    Deployment,
    assert_conserved,
    assert_duplicates_identical,
    assert_matches_offline,
    batch_slices,
    fleet_events,
    produced_records,
    publish_events,
    wait_complete,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _log(deployment: Deployment, worker) -> str:
    return deployment.logs[deployment.workers.index(worker)].read_text(errors="replace")


def _ready_lines(deployment: Deployment, worker) -> list[str]:
    return [line for line in _log(deployment, worker).splitlines() if "Worker ready" in line]


def _publish(deployment: Deployment, events) -> None:
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events))


def _finish(deployment: Deployment, events, *, timeout_s: float = 120) -> None:
    published = wait_complete(deployment, {e.batch_id for e in events}, timeout_s=timeout_s)
    assert_matches_offline(published, events, partitions=deployment.partitions)
    assert_duplicates_identical(published)
    assert_conserved(produced_records(events), published, deployment.dead_letters())


@pytest.mark.timeout(600)
def test_two_workers_keep_their_partitions_for_many_poll_intervals(deployment):
    """A worker whose consumer delivered no input used to leave its group once it had been
    idle for the poll interval, and never came back: here the routes are the group members
    and poll as long as they work (30 intervals of 3 s, a batch every few seconds)."""
    first = deployment.start_worker("--max-poll-interval", "3")
    deployment.wait_ready(first)
    second = deployment.start_worker("--max-poll-interval", "3")
    deployment.wait_ready(second)
    time.sleep(5)  # the group settles: the first worker gave half its partitions
    settled = (len(_ready_lines(deployment, first)), len(_ready_lines(deployment, second)))
    events = fleet_events(seed=301, batches=9, sessions=8)
    for part in batch_slices(events, 9):
        _publish(deployment, part)
        time.sleep(10)
    _finish(deployment, events)
    assert (len(_ready_lines(deployment, first)), len(_ready_lines(deployment, second))) == settled, (
        "a worker's assignment changed: it left its group\n" + deployment.log_tail()
    )
    assert first.poll() is None and second.poll() is None


@pytest.mark.timeout(300)
def test_a_worker_whose_stage_stops_making_progress_leaves_its_group(deployment):
    """Liveness: the stage-1 route of one worker hangs in its work; within the poll
    interval it leaves its group, and the other worker takes its partitions over."""
    events = fleet_events(seed=302, batches=4, sessions=10)
    stuck = deployment.start_worker("--max-poll-interval", "5", env={"SPECMETER_HANG_AT": "stage1-processed:1"})
    deployment.wait_ready(stuck)
    healthy = deployment.start_worker("--max-poll-interval", "5")
    deployment.wait_ready(healthy)
    time.sleep(3)
    started = time.monotonic()
    _publish(deployment, events)
    _finish(deployment, events)
    assert "hang point stage1-processed reached" in _log(deployment, stuck)
    assert time.monotonic() - started < 60
    assert stuck.poll() is None  # alive, out of its group: the bound is the poll interval


def _freeze(deployment: Deployment, worker, seconds: float) -> None:
    os.killpg(worker.pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.killpg(worker.pid, signal.SIGCONT)


@pytest.mark.timeout(600)
def test_a_frozen_worker_woken_after_its_partitions_moved_changes_nothing(kafka_bootstrap):
    """Two workers, 6 partitions; one frozen (SIGSTOP) for 20 s past a 6 s session while the
    stream goes on, then woken; then the other, roles swapped. Before issue 30, 22 of 30
    batches came out exact: the woken worker's late deltas were restored beside its
    successor's. Now its late writes never count and its outputs never leave."""
    deployment = Deployment(kafka_bootstrap, partitions=6)
    try:
        asyncio.run(create_topic(kafka_bootstrap, deployment.topics.records, 6))
        a = deployment.start_worker()
        b = deployment.start_worker()
        deployment.wait_ready(a)
        deployment.wait_ready(b)
        time.sleep(3)
        events = fleet_events(seed=303, batches=30, sessions=40)
        parts = batch_slices(events, 6)
        for part, frozen in zip(parts, (a, None, None, b, None, None), strict=True):
            if frozen is None:
                _publish(deployment, part)
                continue
            feeder = threading.Thread(target=_publish, args=(deployment, part))
            feeder.start()
            time.sleep(0.3)  # mid-stream: the worker has input fetched and writes in flight
            _freeze(deployment, frozen, deployment.session_timeout_s + 20)
            feeder.join()
        _finish(deployment, events, timeout_s=180)
        woken = _log(deployment, a) + _log(deployment, b)
        assert a.poll() is None and b.poll() is None, deployment.log_tail()
        print("fencings seen:", woken.count("no longer count"))
    finally:
        deployment.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", WRITE_KINDS)
def test_a_refused_write_stops_the_worker_and_its_successor_resumes_exactly(kafka_bootstrap, kind):
    """The broker refuses one write (padded past the topic's max.message.bytes, 1 MiB here):
    the worker hands nothing more to Kafka, stops without flushing and says why; the next
    worker resumes from what is whole. Before issue 30 the worker went on writing after a
    refused delta, and a checkpoint after it made every later restore skip its records."""
    d = Deployment(kafka_bootstrap, batch_timeout_s=20.0)
    try:
        t = d.topics
        stage1_log, stage2_log = changelog_topics(d.name)
        compact = {"cleanup.policy": "compact"}
        for name, configs in (
            (t.records, None),
            (t.partials, None),
            (stage1_log, compact),
            (stage2_log, compact),
        ):
            asyncio.run(create_topic(kafka_bootstrap, name, d.partitions, topic_configs=configs))
        for name in (t.metrics, t.deadletter):
            asyncio.run(create_topic(kafka_bootstrap, name, 1))
        events = fleet_events(seed=304, batches=4, sessions=16)
        # every restore writes its owner's checkpoint (docs/ownership.md, rule 8): the
        # partitions' first checkpoints, one per stage, come before any input
        nth = 2 * d.partitions + 2 if kind == "checkpoint" else 2
        worker = d.start_worker(env={"SPECMETER_FAIL_WRITE": f"{kind}:{nth}"})
        d.wait_ready(worker)
        _publish(d, events)
        worker.wait(timeout=90)
        log = _log(d, worker)
        assert worker.returncode == 1, log[-3000:]
        assert re.search(r"specmeter worker: producing to .* failed .* the worker stops, writing nothing more", log)
        d.start_worker()
        _finish(d, events)
    finally:
        d.close()


@pytest.mark.timeout(300)
def test_a_fourth_worker_takes_three_of_twelve_partitions_and_only_those_are_restored(kafka_bootstrap):
    d = Deployment(kafka_bootstrap, partitions=12)
    try:
        asyncio.run(create_topic(kafka_bootstrap, d.topics.records, 12))
        events = fleet_events(seed=305, batches=3, sessions=30)
        workers = [d.start_worker() for _ in range(3)]
        for w in workers:
            d.wait_ready(w)
        time.sleep(5)
        _publish(d, events)
        wait_complete(d, {e.batch_id for e in events})
        before = {w.pid: len(_ready_lines(d, w)) for w in workers}
        fourth = d.start_worker()
        d.wait_ready(fourth)
        time.sleep(5)
        line = _ready_lines(d, fourth)[-1]
        restored = int(re.search(r"\((\d+) restored", line).group(1))
        # 3 records and 3 partials partitions moved to it, nothing else was restored anywhere
        assert restored == 6, line
        for w in workers:
            lines = _ready_lines(d, w)
            if len(lines) > before[w.pid]:
                counts = re.search(r"\((\d+) restored, (\d+) kept", lines[-1])
                assert counts is not None and int(counts.group(1)) == int(
                    re.search(r"\((\d+) restored", lines[before[w.pid] - 1]).group(1)
                ), lines
        more = fleet_events(seed=306, batches=2, sessions=30)  # batches of their own (s306-b...)
        _publish(d, more)
        _finish(d, events + more)
    finally:
        d.close()


@pytest.mark.timeout(600)
def test_a_worker_frozen_past_every_timeout_mid_stream_changes_nothing(kafka_bootstrap):
    """Two workers with every timeout short (session 6 s, poll interval 20 s, delivery
    15 s, batch timeout 10 s); one is frozen mid-stream for 45 s, longer than all of them,
    while the stream goes on, then woken. Its partitions moved at the session; woken, its
    fetched input and writes in flight are past their delivery timeout and its membership
    past the poll interval: none of it may count. A woken worker that stopped itself
    (writes that failed for good) is restarted, as its orchestrator would. Every batch
    exact, one content per (batch, revision), every record counted once."""
    d = Deployment(kafka_bootstrap, partitions=6, batch_timeout_s=10.0, grace_s=600.0)
    short = ("--max-poll-interval", "20", "--delivery-timeout", "15")
    try:
        asyncio.run(create_topic(kafka_bootstrap, d.topics.records, 6))
        a = d.start_worker(*short)
        b = d.start_worker(*short)
        d.wait_ready(a)
        d.wait_ready(b)
        time.sleep(3)
        events = fleet_events(seed=307, batches=24, sessions=30)
        parts = batch_slices(events, 8)
        for n, part in enumerate(parts):
            if n != 2:
                _publish(d, part)
                time.sleep(2)
                continue
            feeder = threading.Thread(target=_publish, args=(d, part))
            feeder.start()
            time.sleep(0.3)  # mid-stream: input fetched, writes in flight
            os.killpg(a.pid, signal.SIGSTOP)
            feeder.join()
            for later in parts[n + 1 : n + 4]:  # the stream goes on while it is frozen
                _publish(d, later)
                time.sleep(8)
            os.killpg(a.pid, signal.SIGCONT)
            parts[n + 1 : n + 4] = [[]] * 3
        time.sleep(25)  # past the woken worker's poll interval and delivery timeout
        if a.poll() is not None:
            assert "stopping" in _log(d, a) or "stopped" in _log(d, a), _log(d, a)[-3000:]
            d.wait_ready(d.start_worker(*short))
        _finish(d, events, timeout_s=240)
        assert b.poll() is None, d.log_tail()
        assert "Traceback" not in _log(d, b)
    finally:
        d.close()
