"""Faults against a real broker: the worker killed at seeded crash points, the
broker stopped under a running fleet, hostile bytes and floods at a running
worker. Every test ends with exact results and every record accounted for."""

from __future__ import annotations

import asyncio
import random
import subprocess
import time

import pytest

from specmeter.streams._faults import CRASH_POINTS

from .worker_harness import (
    assert_conserved,
    assert_matches_offline,
    fleet_events,
    produced_records,
    publish_events,
    wait_complete,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CRASH_SEED = 20261202


def _crash_plan(seed: int, kills: int) -> list[tuple[str, int]]:
    """Every crash point at least once, the rest drawn at random; each armed for
    its n-th pass (n small enough that the slice of input it sees reaches it)."""
    rnd = random.Random(seed)
    points = list(CRASH_POINTS) + rnd.choices(CRASH_POINTS, k=kills - len(CRASH_POINTS))
    rnd.shuffle(points)
    return [(p, rnd.randint(1, 3) if p in ("stage1-processed", "stage1-changelog") else
             rnd.randint(1, 2) if p == "stage1-partials" else 1) for p in points]


@pytest.mark.timeout(900)
def test_sigkill_at_seeded_crash_points_changes_nothing(deployment):
    """Ten kills, one per batch of input: each worker arms one crash point
    (SPECMETER_CRASH_AT) and is SIGKILLed there, the next one starts from the
    durable state. The final metrics equal the offline result, repeated output
    is identical per (batch, revision), and no record is lost or counted twice."""
    plan = _crash_plan(CRASH_SEED, kills=10)
    events = fleet_events(seed=31, batches=len(plan), sessions=12)
    slices: dict[str, list] = {}
    for event in events:
        slices.setdefault(event.batch_id, []).append(event)
    reached = []
    for (point, n), part in zip(plan, slices.values()):
        started = time.monotonic()
        worker = deployment.start_worker(env={"SPECMETER_CRASH_AT": f"{point}:{n}"})
        asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, part))
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            deployment.kill(worker)  # not reached in time: still a kill at a random point
        else:
            assert worker.returncode == -9, deployment.log_tail()
        hit = f"crash point {point} reached" in deployment.logs[-1].read_text(errors="replace")
        if hit:
            reached.append(point)
        print(f"{point}:{n} {'reached' if hit else 'not reached, killed from outside'} "
              f"after {time.monotonic() - started:.1f}s")
    assert set(reached) == set(CRASH_POINTS), f"points never reached: {set(CRASH_POINTS) - set(reached)}"
    assert len(reached) >= 8, f"only {len(reached)} of {len(plan)} crash points reached: {reached}"
    deployment.start_worker()
    published = wait_complete(deployment, set(slices), timeout_s=120)
    assert_matches_offline(published, events)
    assert_conserved(produced_records(events), published, deployment.dead_letters())
