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
import subprocess
import sys
from pathlib import Path

import pytest

from .support.kafka_broker import BROKER_SCRIPT, local_broker_tools_missing
from .support.leftovers import demo, helper_parent, interrupt_once, processes_naming, wait_until

#: a parent that registers a child's process group and a folder with a reaper, then idles
REAPER_PARENT = """
import subprocess, sys, time
from pathlib import Path
from specmeter.streams.cli.lifetime import Reaper
reaper = Reaper()
sleeper = [sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]]
child = subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.DEVNULL)
reaper.group(child.pid)
reaper.folder(Path(sys.argv[1]))
if sys.argv[2] == "done":
    reaper.done()
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("clean_end", [False, True], ids=["killed", "said-done"])
def test_the_reaper_ends_a_killed_programs_groups_and_folders_and_nothing_after_done(tmp_path, clean_end):
    folder = tmp_path / "owned"
    folder.mkdir()
    (folder / "file").write_text("x")
    parent = subprocess.Popen(
        [sys.executable, "-c", REAPER_PARENT, str(folder), "done" if clean_end else "-"], stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip()
        parent.kill()
        parent.wait(10)
        # the reaper acts within a second of the parent's end: 5 s show it did not
        gone = wait_until(lambda: not processes_naming(str(folder)) and not folder.exists(), 5 if clean_end else 30)
        if clean_end:  # the program cleaned up itself (said done): the reaper touched nothing
            assert not gone and folder.exists() and processes_naming(str(folder))
        else:
            assert gone, processes_naming(str(folder))
    finally:
        parent.kill()
        parent.communicate()
        for line in processes_naming(str(folder)):  # the sleep a passing case left (by pid)
            subprocess.run(["kill", line.split()[0]], check=False)


def test_the_broker_watchdog_stops_its_process_once_the_parent_ends_and_then_ends(tmp_path):
    """``deploy/kafka/broker _watch PARENT PIDFILE`` (SPECMETER_KAFKA_PARENT_PID's
    watchdog), on a stand-in for the JVM: it lives while the parent does, ends with it,
    and the pid file goes."""
    parent = subprocess.Popen(["sleep", "600"])
    jvm = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(tmp_path)], start_new_session=True
    )
    pidfile = tmp_path / "broker.pid"
    pidfile.write_text(f"{jvm.pid}\n")
    watchdog = subprocess.Popen([str(BROKER_SCRIPT), "_watch", str(parent.pid), str(pidfile)])
    try:
        assert watchdog.poll() is None and not wait_until(lambda: jvm.poll() is not None, 3)
        parent.kill()
        parent.wait(10)  # reaped at once: a zombie parent counts as ended too
        assert jvm.wait(15) == -signal.SIGTERM and watchdog.wait(15) == 0
        assert not pidfile.exists()
    finally:
        for proc in (parent, jvm, watchdog):
            proc.kill()


@pytest.fixture
def _tools():
    if missing := local_broker_tools_missing():
        pytest.skip(missing)


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.usefixtures("_tools")
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


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.usefixtures("_tools")
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


@pytest.mark.kafka
@pytest.mark.slow
def test_a_failed_demo_keeps_only_its_workers_log_and_says_where(tmp_path, kafka_bootstrap):
    """A demo that fails (here: its worker refuses to start, its TLS settings naming no
    file) stops, leaves the broker it was given alone, and keeps the worker's log (its data
    goes), printing the path."""
    tls = {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": str(tmp_path / "no-ca.pem")}
    run = demo(tmp_path, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, **tls)
    try:
        assert run.proc is not None
        status = run.proc.wait(180)
    finally:
        run.close()
    kept = [line.removeprefix("worker log kept: ") for line in run.tail().splitlines() if "worker log kept: " in line]
    assert status == 1 and len(kept) == 1, run.tail()
    log = Path(kept[0])
    assert log.is_file() and "KAFKA_SSL_CAFILE" in log.read_text()
    assert [p.name for p in run.tmp.iterdir()] == [log.parent.name]
    assert [p.name for p in log.parent.iterdir()] == [log.name]
    assert wait_until(lambda: not processes_naming(str(tmp_path), f"reaper-of {run.proc.pid}"), 10)
