"""Three workers frozen, killed, stopped and restarted while a stream runs (issue 37):
every batch exact, one content per (batch, revision), every record counted once.

``tests/support/group_chaos.py`` draws the faults; CI runs one seeded schedule of
``SPECMETER_CHAOS_FAULTS`` faults (8 by default: every kind of fault at least once);
``bench/group_chaos.py`` runs as many as asked.
"""

from __future__ import annotations

import os

import pytest

from .support.group_chaos import KINDS, run_chaos

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAULTS = int(os.environ.get("SPECMETER_CHAOS_FAULTS", "8"))


@pytest.mark.timeout(1200)
def test_a_group_of_three_through_freezes_kills_and_restarts_stays_exact(kafka_bootstrap):
    report = run_chaos(kafka_bootstrap, seed=37, faults=FAULTS, progress=print)
    print("\n".join(report.timeline))
    print(dict(report.faults), report.conserved, f"{report.batches} batches, {report.published} publications")
    print(f"fenced lines {report.fenced_lines}, takeovers that did not count {report.not_counted_lines}")
    assert sum(report.faults.values()) == FAULTS
    assert report.batches >= FAULTS, "the stream ran through the faults"
    if len(KINDS) <= FAULTS:
        assert set(report.faults) == set(KINDS)
    assert report.tracebacks == 0
