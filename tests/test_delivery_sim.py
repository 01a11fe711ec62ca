"""The worker under a deterministic simulation (``tests/support/delivery_sim.py``): three
workers (the worker's own stages, or checkpoint-only ones) over an in-memory Kafka, with
group restarts, members expired while frozen, workers killed at any await, writes landing
late, twice or answered without an offset, compaction and takeover records appended twice.
``SPECMETER_SIM_SCHEDULES`` sets how many schedules CI runs (10,000).

And the evidence that it can fail: each fix of issues 37 and 43 reverted in the worker's own
code (``tests/support/sim_reverts.py``), the simulation finds a violation within a stated
number of seeds."""

from __future__ import annotations

import os
import time

import pytest

from .support.delivery_sim import first_failure, run_many, run_simulation
from .support.sim_reverts import REVERTS, reverted

SCHEDULES = int(os.environ.get("SPECMETER_SIM_SCHEDULES", "10000"))


@pytest.mark.slow
def test_no_schedule_breaks_an_invariant(capsys):
    """``SCHEDULES`` schedules (10,000 in CI) over a process per core; each violation is
    reported with its seed and the trace of the shortest prefix of its schedule that fails."""
    began = time.monotonic()
    found = run_many(SCHEDULES)
    with capsys.disabled():
        print(f"\nsimulation: {SCHEDULES:,} schedules in {time.monotonic() - began:.1f} s, {len(found)} violations")
    assert not found, "\n\n".join(found[:3])


def test_a_schedule_replays_exactly():
    """One seed is one schedule: the same seed gives the same trace, step for step."""
    assert run_simulation(7).trace == run_simulation(7).trace


# the seeds within which the simulation must find each fix reverted (the first seed found,
# when measured, in docs/ownership.md; the bound leaves room for the schedules to change).
# Measured again on 2026-12-07, evening, once the checkpoint-only stages restored as the
# worker's stages do; three fixes that the restore's deletions also cover are searched with
# stages whose restore writes nothing ("bare": the delivery layer's own rules alone)
FOUND_WITHIN = {
    (37, "4, 6"): 200,  # found at seed 149
    (37, "2"): 200,  # 79
    (37, "6"): 1200,  # 975, the worker's own stages in every schedule
    (37, "10"): 200,  # 138
    (43, "9"): 1000,  # 228, with stages whose restore writes nothing (bare)
    (43, "2"): 5000,  # 3349
    (43, "2a"): 200,  # 91
    (43, "2b"): 400,  # 304
    (43, "2c"): 100,  # 0
    (43, "2d"): 20000,  # 16810, bare
    (43, "7"): 6000,  # 4256, bare
    (43, "stage 2"): 1100,  # 875, the worker's own stages in every schedule
    (43, "11"): 600,  # 439
}


def test_every_fix_has_a_bound():
    assert {(r.issue, r.rule) for r in REVERTS} == set(FOUND_WITHIN)


@pytest.mark.slow
# rule 2d's search runs 16,810 schedules: 150 s alone on two cores, 320 s under CI's load,
# past the suite's 300 s per test (CI's first run stopped it there)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("revert", REVERTS, ids=lambda r: f"issue{r.issue}-rule{r.rule.replace(', ', '+')}")
def test_the_simulation_finds_each_fix_reverted(revert):
    """Each fix of issues 37 and 43 reverted in the worker's own code (the reverse patch of
    the functions it touched): the simulation finds a violation within its bound."""
    limit = FOUND_WITHIN[(revert.issue, revert.rule)]
    with reverted(revert):
        found = first_failure(limit, real=revert.real, bare=revert.bare)
    assert found is not None, f"{revert.what}: reverted, no violation within {limit} seeds"
