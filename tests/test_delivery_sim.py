"""The worker's delivery layer under a deterministic simulation (``tests/support/delivery_sim.py``):
the real ``DeliveryDriver`` of three workers over an in-memory Kafka with group restarts,
members expired while frozen, writes landing late, compaction and takeover records appended
twice. ``SPECMETER_SIM_SCHEDULES`` sets how many schedules CI runs.

And the evidence that it can fail: a fix of issue 43 reverted in a copy of the worker's own
function (its source with the fix's lines reversed, compiled in the function's module), the
simulation finds a violation within a stated number of seeds."""

from __future__ import annotations

import inspect
import os
import textwrap
import time
from types import ModuleType

import pytest

from specmeter.streams.core import ownership
from specmeter.streams.delivery import routes, writes

from .support.delivery_sim import Violation, run_many, run_simulation

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


def _reverted(monkeypatch, module: ModuleType, qualname: str, fixed: str, before: str) -> None:
    """Replace a function of the worker by a copy of its source with ``fixed`` put back to
    ``before`` (the reverse patch of a fix), compiled in the function's own module."""
    owner_name, _, name = qualname.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
    assert fixed in source, f"{qualname} no longer holds the fix's line: update this test"
    namespace: dict = {}
    exec(compile(source.replace(fixed, before), f"<{qualname}, fix reverted>", "exec"), module.__dict__, namespace)
    monkeypatch.setattr(owner, name, namespace[name])


def _first_violation(limit: int) -> str | None:
    for seed in range(limit):
        try:
            run_simulation(seed)
        except Violation as exc:
            return str(exc)
    return None


# what is reverted -> (the module, the function, the fix's line, the line before it), the
# seeds within which the simulation finds it, and what it finds
REVERTS = {
    "a takeover that does not count is asked for again": (
        (routes, "DeliveryDriver._ask_again", "delay_s = self.RETRY_S", "return"),
        30,  # found at seed 6
        "liveness",
    ),
    "a confirmation says where its takeover landed": (
        (ownership, "ChangelogView._owners", "owner.position = confirmation.epoch", "pass"),
        60,  # found at seed 13
        "below",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("fix", sorted(REVERTS))
def test_the_simulation_finds_a_fix_of_issue_43_reverted(monkeypatch, fix):
    (module, qualname, fixed, before), seeds, found = REVERTS[fix]
    _reverted(monkeypatch, module, qualname, fixed, before)
    if module is ownership and qualname == "counts_after":
        monkeypatch.setattr(writes, "counts_after", ownership.counts_after)  # the writer's imported name
    violation = _first_violation(seeds)
    assert violation is not None and found in violation, violation
