"""Interrupting what starts brokers, and looking for what it left (issue 47.3).

Each scenario runs a program (the demo, ``bench/cluster_hold.py``, a test cluster
helper's parent) with every state folder under one private root (SPECMETER_KAFKA_DIR,
TMPDIR: never the shared broker at <repo>/.kafka), interrupts it at a moment named by
what has appeared on disk or in its output, and then looks for any process whose command
line names the root (a JVM, its watchdog, a worker) or the program's pid (its reaper),
and for anything left in its temporary directory.

``python -m tests.support.leftovers --rounds 20`` interrupts the three at random moments
with random signals and prints one line per round (the issue's target; the test file
runs a few fixed cases).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: how long what a program started may take to go once it has ended (a clean broker stop,
#: the watchdog's one-second poll, a worker's SIGTERM)
GONE_WITHIN_S = 60.0


def processes_naming(*needles: str) -> list[str]:
    """The command lines (pid first) of the processes that name any of ``needles``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in line for n in needles):
            found.append(f"{proc.name} {_shortened(line)}")
    return found


def _shortened(line: str, keep: int = 200) -> str:
    """A command line for a message, its middle elided: its end stays, where a JVM's main
    class (`` kafka.Kafka ``) and arguments follow a classpath and paths whose length varies
    (a head of 300 characters cut the main class off a broker under a deeper temporary folder)."""
    return line if len(line) <= 2 * keep else f"{line[:keep]} ... {line[-keep:]}"


def wait_until(check: Callable[[], object], timeout_s: float, every_s: float = 0.2) -> object:
    """``check()``'s first true answer within ``timeout_s`` (None if none came)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answer := check():
            return answer
        time.sleep(every_s)
    return None


@dataclass
class Run:
    """A program run under ``root`` (its brokers' state, its temporary folders) and what it prints."""

    root: Path
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def start(self) -> Run:
        self.tmp.mkdir(parents=True, exist_ok=True)
        own = {"TMPDIR": str(self.tmp), "SPECMETER_KAFKA_DIR": str(self.root / "kafka"), "SPECMETER_KAFKA_HEAP": "512m"}
        env = {**os.environ, **own, **self.env}
        if "KAFKA_BOOTSTRAP_SERVERS" not in self.env:  # the program starts its broker (under root)
            env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        with (self.root / "out").open("wb") as out, (self.root / "err").open("wb") as err:
            # a session of its own: Ctrl-C reaches its whole process group, as at a terminal
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, env=env, cwd=REPO, start_new_session=True)
        return self

    def said(self, text: str) -> bool:
        return text in (self.root / "err").read_text(errors="replace") + (self.root / "out").read_text(errors="replace")

    def wait_for(self, check: Callable[[], object], timeout_s: float, what: str) -> None:
        """Until ``check()`` holds; the program ending first, or the time running out, fails."""
        assert self.proc is not None
        ok = wait_until(lambda: check() or self.proc.poll() is not None, timeout_s)
        if not ok or self.proc.poll() is not None:
            raise AssertionError(f"never saw {what} (exit {self.proc.poll()}):\n{self.tail()}")

    def interrupt(self, signum: int, timeout_s: float = 90.0) -> int:
        """SIGINT to its process group (Ctrl-C at a terminal: the broker script it runs gets it
        too), another signal to it alone (``kill``, ``timeout``); its exit status once it has ended."""
        assert self.proc is not None
        if signum == signal.SIGINT:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        return self.proc.wait(timeout_s)

    def leftovers(self) -> list[str]:
        """What remains GONE_WITHIN_S after the end: processes naming the root or this
        run's pid (its reaper), then anything in its temporary directory."""
        assert self.proc is not None
        needles = (str(self.root), f"reaper-of {self.proc.pid}")
        wait_until(lambda: not processes_naming(*needles) and not any(self.tmp.iterdir()), GONE_WITHIN_S, 0.5)
        return processes_naming(*needles) + [f"left in {self.tmp}: {p.name}" for p in self.tmp.iterdir()]

    def tail(self) -> str:
        return (self.root / "err").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        """Kill what a failed scenario left (by pid, nothing broader)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def demo(root: Path, timeout: str = "120", *args: str, **env: str) -> Run:
    """The demo (``deploy/dev demo``), starting its own broker unless ``env`` names one."""
    return Run(root, [sys.executable, "-m", "specmeter.streams.demo", "--timeout", timeout, *args], env).start()


def cluster_hold(root: Path) -> Run:
    """The benchmark that starts the most: a controller, three brokers, two workers, loadgen."""
    return Run(root, [sys.executable, str(REPO / "bench" / "cluster_hold.py"), "--smoke"]).start()


#: a test cluster helper's parent: a private broker (tests/support/kafka_broker.PrivateBroker), started, then idle
HELPER_PARENT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.support.kafka_broker import PrivateBroker
print(PrivateBroker(Path(sys.argv[2])).start(), flush=True)
time.sleep(3600)
"""


def helper_parent(root: Path) -> Run:
    """A process that started a PrivateBroker (its state in ``root/helper``) and idles."""
    return Run(root, [sys.executable, "-c", HELPER_PARENT, str(REPO), str(root / "helper")]).start()


def launched(folder: Path) -> Callable[[], bool]:
    """A JVM launched: a broker script's pid file under ``folder``."""
    return lambda: folder.exists() and any(folder.rglob("*.pid"))


def printed(run: Run, text: str) -> Callable[[], bool]:
    return lambda: run.said(text)


def worker_logs(run: Run) -> Callable[[], bool]:
    """A benchmark's workers started (Deployment's logs, in the benchmark's folder)."""
    return lambda: any(run.tmp.glob("*/*-worker-*.log"))


#: each program, how it starts, and the moments to interrupt it at (what shows each has come)
SCENARIOS: dict[str, tuple[Callable[[Path], Run], dict[str, Callable[[Run], Callable[[], bool]]]]] = {
    "demo": (
        demo,
        {
            "broker start": lambda r: launched(r.root / "kafka"),
            "worker start": lambda r: printed(r, "worker log: "),
            "run": lambda r: printed(r, "worker: ready"),
        },
    ),
    "cluster_hold": (
        cluster_hold,
        {"cluster start": lambda r: launched(r.tmp), "workers start": worker_logs},
    ),
    "helper": (
        helper_parent,
        {"broker start": lambda r: launched(r.root / "helper"), "serving": lambda r: printed(r, "127.0.0.1:")},
    ),
}


def interrupt_once(root: Path, program: str, moment: str, signum: int, after_s: float = 0.0) -> tuple[int, list[str]]:
    """Start ``program`` under ``root``, send ``signum`` ``after_s`` after ``moment``:
    its exit status and what it left."""
    start, moments = SCENARIOS[program]
    run = start(root)
    try:
        run.wait_for(moments[moment](run), 300, moment)
        time.sleep(after_s)
        status = run.interrupt(signum)
        return status, run.leftovers()
    finally:
        run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="interrupt the demo, a benchmark and a test cluster at random")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=47)
    args = parser.parse_args()
    # started in the background (nohup, &), this process and its children would ignore
    # SIGINT: a program's Ctrl-C handler comes back where the handler is Python's again
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = random.Random(args.seed)
    import tempfile

    left = 0
    for i in range(args.rounds):
        program = rng.choice(sorted(SCENARIOS))
        moment = rng.choice(sorted(SCENARIOS[program][1]))
        signum = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
        after = round(rng.uniform(0, 5), 1)
        root = Path(tempfile.mkdtemp(prefix="leftovers-"))
        t = time.monotonic()
        status, leftovers = interrupt_once(root, program, moment, signum, after)
        left += bool(leftovers)
        print(
            f"{i + 1:2d} {program:12s} {moment:13s} +{after:.1f}s {signal.Signals(signum).name:7s} exit {status:4d} "
            f"{time.monotonic() - t:5.1f}s left: {leftovers or 'nothing'}",
            flush=True,
        )
        if not leftovers:
            subprocess.run(["rm", "-rf", str(root)], check=False)
    print(f"{left} of {args.rounds} rounds left something behind")
    sys.exit(1 if left else 0)


if __name__ == "__main__":
    main()
