"""What a program starts ends with it (issue 47.3): the brokers, workers and folders of
the demo, a benchmark or a test cluster go when it ends, however it ends.

* ``tied_to_me``: the environment for ``deploy/kafka/broker`` with
  SPECMETER_KAFKA_PARENT_PID set to this process: a watchdog beside each JVM the script
  starts stops it once this process has ended (SIGKILL included, and during the start).
* ``stop_signals_raise``: SIGTERM and SIGHUP raise ``Stopped`` where Ctrl-C raises
  KeyboardInterrupt, so ``finally`` blocks run (Python's default ends the process
  without them).
* ``Reaper``: a process of its own, in its own session, that outlives a SIGKILL of this
  one; it is told the process groups and folders this one owns, and removes them once
  this one has ended without saying ``done`` (a clean end says it, having cleaned up).

This module runs as a script too (the reaper: ``python lifetime.py``), so it imports
nothing of specmeter at its top.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: deploy/kafka/broker's variable: the pid whose end stops the JVMs the script starts
PARENT_PID = "SPECMETER_KAFKA_PARENT_PID"
#: how long the reaper gives a process group after SIGTERM before SIGKILL
GRACE_S = 30.0
#: how long the reaper waits for a folder's brokers (their watchdogs stop them) before removing it
BROKER_WAIT_S = 60.0


def tied_to_me(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the brokers it starts tied to this process."""
    return {**(os.environ if env is None else env), PARENT_PID: str(os.getpid())}


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within: SIGTERM (``kill``, ``timeout``, a container's stop) and SIGHUP (the terminal
    closed) raise ``Stopped`` in the main thread, handled where Ctrl-C is, so the program's
    clean-up runs (exit status 128 + the signal where the command uses ``base.exit_status``)."""
    import threading

    from .base import Stopped

    def handler(signum: int, frame: object) -> None:
        raise Stopped(signum)

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def identity(pid: int) -> str:
    """A process's start time while it runs ('' once it ended, a zombie too): a pid the
    system gave to another process since has another identity. Without /proc: 'up' or ''."""
    if not Path("/proc/self/stat").exists():  # not Linux
        return _alive(pid)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:  # no such process
        return ""
    return "" if fields[0] == "Z" else fields[19]


def _alive(pid: int) -> str:
    try:
        os.kill(pid, 0)
    except OSError:
        return ""
    return "up"


class Reaper:
    """The clean-up that survives this process: told each process group (a child started
    with ``start_new_session``) and folder this process owns, it ends those groups (SIGTERM,
    SIGKILL after ``GRACE_S``) and removes those folders once this process has ended
    without calling ``done``. It learns of that end from its stdin: the pipe closes when
    this process ends, however it ends."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            # -I: nothing beside it imported; the parent's pid names the reaper in ps
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "reaper-of", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # no inherited pipe: a caller reading ours must see it close
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at the terminal reaches this process, not the reaper
        )

    def _say(self, *words: object) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write((" ".join(map(str, words)) + "\n").encode())
        self._proc.stdin.flush()

    def group(self, pid: int) -> None:
        """The process group led by ``pid`` (a child started with ``start_new_session``)."""
        self._say("group", pid, identity(pid))

    def folder(self, path: Path) -> None:
        """A folder to remove (after the brokers whose pid files are in it have ended)."""
        self._say("folder", Path(path).resolve())

    def done(self) -> None:
        """This process cleaned up itself: the reaper ends and removes nothing."""
        if self._proc.poll() is None:
            self._say("done")
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(10)


def _reap(groups: list[tuple[int, str]], folders: list[Path]) -> None:
    """End the groups still led by the processes registered, then remove the folders."""
    _end_groups(groups)
    for folder in folders:
        _wait_for_brokers(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _end_groups(groups: list[tuple[int, str]]) -> None:
    """SIGTERM to each group whose leader is still the process registered (a pid given to
    another process since is left alone), SIGKILL to those still running after ``GRACE_S``."""
    live = [pid for pid, ident in groups if ident and identity(pid) == ident]
    for pid in live:
        _signal_group(pid, signal.SIGTERM)
    for pid in _still_running(live, GRACE_S):
        _signal_group(pid, signal.SIGKILL)


def _still_running(pids: list[int], timeout_s: float) -> list[int]:
    """The processes of ``pids`` that have not ended within ``timeout_s`` (none once all have)."""
    deadline = time.monotonic() + timeout_s
    while (pids := [pid for pid in pids if identity(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except OSError:  # ended meanwhile
        pass


def _wait_for_brokers(folder: Path) -> None:
    """Until no broker whose pid file lies in ``folder`` runs (their watchdogs stop them,
    SPECMETER_KAFKA_PARENT_PID): a JVM still shutting down would write into a removed folder."""
    deadline = time.monotonic() + BROKER_WAIT_S
    while time.monotonic() < deadline and any(map(_pid_file_runs, _pid_files(folder))):
        time.sleep(0.5)


def _pid_files(folder: Path) -> Iterator[Path]:
    """The broker script's pid files in ``folder``: a state dir's, a cluster's nodes', one level deeper."""
    for pattern in ("*.pid", "*/*.pid", "*/*/*.pid"):
        yield from folder.glob(pattern)


def _pid_file_runs(path: Path) -> bool:
    try:
        return bool(identity(int(path.read_text().strip())))
    except (OSError, ValueError):
        return False


def _serve(lines: Iterator[bytes]) -> None:
    """The reaper: read what the parent owns until ``done`` (nothing to do) or the end of
    the pipe (the parent ended without cleaning up: reap)."""
    groups: list[tuple[int, str]] = []
    folders: list[Path] = []
    for line in lines:
        kind, _, rest = line.decode().rstrip("\n").partition(" ")
        if kind == "done":
            return
        if kind == "group":
            pid, _, ident = rest.partition(" ")
            groups.append((int(pid), ident))
        elif kind == "folder":
            folders.append(Path(rest))
    _reap(groups, folders)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the end of the pipe ends the reaper's wait
    _serve(iter(sys.stdin.buffer.readline, b""))
