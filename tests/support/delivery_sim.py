"""The simulation's first address, kept for the code and the docs that name it
(``tests/test_delivery_sim.py``, ``tests/support/sim_reverts.py``, ``docs/ownership.md``) and
for its long mode: ``python -m tests.support.delivery_sim --schedules N``.

The simulation itself is ``tests/support/sim/``, a module per part; this re-exports their
names. A setting is changed where it is defined (``sim.runs.REAL_EVERY``, not here): that is
the module its functions read it from."""

from __future__ import annotations

from .sim.changelog_records import _checkpoint_in, _may_fence, _takeover_at
from .sim.deployment import CL, PARTITIONS, SETTINGS, R
from .sim.fleet_input import SimInput, _fleet, _marker, _messages
from .sim.kafka import InFlight, SimConsumer, SimLogs, SimProducer, _answer, _ignore, _nothing, _wake
from .sim.loop import VirtualLoop, _NoSelector
from .sim.outcomes import InjectedFault, Stopped, Violation, _stops_by_design
from .sim.runs import (
    REAL_EVERY,
    STEPS,
    WORKERS,
    _violation_of,
    failures_among,
    first_failure,
    main,
    run_many,
    run_simulation,
    runs_real_stages,
    shortest_failure,
)
from .sim.scheduler import Group, Simulation, _lose_after, _next_of_a_partition
from .sim.worker import Worker

__all__ = [
    "CL",
    "PARTITIONS",
    "R",
    "REAL_EVERY",
    "SETTINGS",
    "STEPS",
    "WORKERS",
    "Group",
    "InFlight",
    "InjectedFault",
    "SimConsumer",
    "SimInput",
    "SimLogs",
    "SimProducer",
    "Simulation",
    "Stopped",
    "VirtualLoop",
    "Violation",
    "Worker",
    "_NoSelector",
    "_answer",
    "_checkpoint_in",
    "_fleet",
    "_ignore",
    "_lose_after",
    "_marker",
    "_may_fence",
    "_messages",
    "_next_of_a_partition",
    "_nothing",
    "_stops_by_design",
    "_takeover_at",
    "_violation_of",
    "_wake",
    "failures_among",
    "first_failure",
    "main",
    "run_many",
    "run_simulation",
    "runs_real_stages",
    "shortest_failure",
]

if __name__ == "__main__":
    raise SystemExit(main())
