"""The worker before Faust runs (``streams/worker/early.py``, issue 46 point 2).

The worker checks its topics, joins its groups, restores and reads while a thread imports
Faust; Faust's worker then runs the same loop. These tests hold Faust's import back in the
worker process (a ``sitecustomize`` the test writes: the import thread waits for a file the
test creates), so that what happens before Faust runs is decided by the test, not by timing:

* the worker is ready and publishes exact metrics before Faust is imported;
* a SIGTERM that comes meanwhile stops it as gracefully as any other, once Faust's worker runs;
* the main thread loads no module while the thread imports (two threads loading modules at
  once wait on each other's import locks, and in a cycle fail).
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from .support.worker_harness import assert_matches_offline, fleet_events, publish_events, wait_complete

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: imported by every Python process whose path holds its folder: in the worker's, it holds
#: the import thread back until the release file exists, and writes the modules the main
#: thread loaded while that thread lived
SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, os, sys, threading, time

    RELEASE, SEEN = os.environ["EARLY_TEST_RELEASE"], os.environ["EARLY_TEST_SEEN"]
    loaded_meanwhile = []

    def importing_faust():
        return any(t.name == "specmeter-import-faust" and t.is_alive() for t in threading.enumerate())

    def audit(event, args):
        if event != "import":
            return
        if threading.current_thread().name == "specmeter-import-faust" and args[0] == "faust":
            deadline = time.monotonic() + 60
            while not os.path.exists(RELEASE) and time.monotonic() < deadline:
                time.sleep(0.02)
        elif threading.current_thread() is threading.main_thread() and importing_faust():
            loaded_meanwhile.append(args[0])

    def write_seen():
        with open(SEEN, "w") as f:
            f.write("\\n".join(loaded_meanwhile))

    sys.addaudithook(audit)
    atexit.register(write_seen)
    """
)


def _held_back(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """The worker's environment with Faust's import held back, the release file, the seen file."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    release, seen = tmp_path / "release", tmp_path / "seen"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "EARLY_TEST_RELEASE": str(release), "EARLY_TEST_SEEN": str(seen)}
    return env, release, seen


def _log(deployment, worker) -> str:
    return deployment.logs[deployment.workers.index(worker)].read_text(errors="replace")


def test_the_worker_reads_before_faust_runs_and_a_sigterm_meanwhile_stops_it_gracefully(deployment, tmp_path):
    env, release, seen = _held_back(tmp_path)
    worker = deployment.start_worker(env=env)
    deployment.wait_ready(worker)
    events = fleet_events(seed=46, batches=2)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events))
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert not release.exists() and worker.poll() is None  # all of it before Faust was imported
    assert_matches_offline(published, events)

    worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "while Faust is imported" not in _log(deployment, worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.poll() is None  # noted, not killed: it stops once Faust's worker runs
    release.touch()
    assert worker.wait(30) == 0, _log(deployment, worker)
    log = _log(deployment, worker)
    assert "SIGTERM while Faust is imported" in log
    assert "stopping on SIGTERM: leaving its consumer groups" in log
    assert "left its consumer groups" in log and "stopped (on SIGTERM)" in log
    assert seen.read_text() == ""  # the main thread loaded no module while Faust was imported


def test_a_worker_whose_faust_import_is_not_held_back_runs_as_before(deployment, tmp_path):
    env, release, seen = _held_back(tmp_path)
    release.touch()  # not held back: whichever ends first, the import or the start
    worker = deployment.start_worker(env=env)
    deployment.wait_ready(worker)
    events = fleet_events(seed=47, batches=2)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events))
    assert_matches_offline(wait_complete(deployment, {e.batch_id for e in events}), events)
    deployment.stop(worker)
    assert worker.returncode == 0
    assert "stopped (on SIGTERM)" in _log(deployment, worker)
    assert seen.read_text() == ""
