"""Nothing left running (issue 47.3): the demo, a benchmark that starts a cluster and a
test cluster helper, interrupted at their awkward moments (during a broker's start, while
workers start, mid-run) by SIGINT, SIGTERM or SIGKILL of the program itself, leave no JVM,
watchdog, worker, reaper or temporary folder behind; a broker the demo found running is
left alone.

Each case runs under a private root (tests/support/leftovers.py: SPECMETER_KAFKA_DIR and
TMPDIR inside it), so the shared broker is never touched; ``python -m
tests.support.leftovers --rounds 20`` runs the random version of the same.
"""

from __future__ import annotations

import signal

import pytest

from .support.kafka_broker import local_broker_tools_missing
from .support.leftovers import demo, helper_parent, interrupt_once, processes_naming, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _tools():
    if missing := local_broker_tools_missing():
        pytest.skip(missing)


@pytest.mark.parametrize(
    ("program", "moment", "signum", "status"),
    [
        ("demo", "broker start", signal.SIGINT, 130),
        ("demo", "worker start", signal.SIGKILL, -9),
        ("cluster_hold", "cluster start", signal.SIGTERM, 143),
        ("cluster_hold", "cluster start", signal.SIGKILL, -9),
    ],
    ids=["demo-broker-start-INT", "demo-worker-start-KILL", "bench-cluster-start-TERM", "bench-cluster-start-KILL"],
)
def test_an_interrupted_program_leaves_nothing(tmp_path, program, moment, signum, status):
    exit_status, left = interrupt_once(tmp_path, program, moment, signum)
    assert left == [], f"{program} stopped by {signal.Signals(signum).name} at {moment} left:\n" + "\n".join(left)
    assert exit_status == status, (tmp_path / "err").read_text()[-3000:]


def test_a_demo_leaves_a_broker_it_found_running_and_a_killed_helper_takes_its_broker_along(tmp_path):
    """The demo on a private broker a test helper started (the demo finds it running):
    SIGTERM mid-run ends the demo's worker and folder, not the broker; the helper's parent
    SIGKILLed, its broker goes too."""
    helper = helper_parent(tmp_path / "helper")
    try:
        helper.wait_for(lambda: helper.said("127.0.0.1:"), 240, "the helper's broker serving")
        state = str(helper.root / "helper")
        run = demo(tmp_path / "demo", SPECMETER_KAFKA_DIR=state)
        try:
            run.wait_for(lambda: run.said("worker: ready"), 240, "the demo's worker ready")
            assert run.interrupt(signal.SIGTERM) == 143, run.tail()
            assert run.leftovers() == []
        finally:
            run.close()
        assert any(" kafka.Kafka " in line for line in processes_naming(state)), "the demo stopped a broker not its own"
        helper.proc.kill()
        assert wait_until(lambda: not processes_naming(state), 60), processes_naming(state)
        assert helper.leftovers() == []
    finally:
        helper.close()
