"""Finding the command-line tools the test extras install (validators, promtool), free ports,
and running the real ``specmeter`` command."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path


def find_tool(name: str) -> str | None:
    """On PATH, or beside this interpreter (a virtual environment run without activating it)."""
    found = shutil.which(name)
    if found is None:
        beside = Path(sys.executable).parent / name
        found = str(beside) if beside.is_file() else None
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(port: int, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET on a worker's web page at 127.0.0.1, 503 and the like included."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _clean_env(env: dict[str, str] | None) -> dict[str, str]:
    """This shell's environment without its KAFKA_*/SPECMETER_* settings, then ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "SPECMETER_"))}
    environ.update(env or {})
    return environ


def run_specmeter(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 90,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """The real command, to its end, with none of this shell's KAFKA_*/SPECMETER_* settings
    unless given in ``env`` (``input``: its stdin)."""
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", *args],
        capture_output=True,
        text=True,
        env=_clean_env(env),
        cwd=cwd,
        timeout=timeout,
        input=input,
    )


def start_specmeter(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The real command, started (environment as ``run_specmeter``), for a test that sends it
    Ctrl-C: the child gets SIGINT's default disposition back. A suite started in the
    background of a non-interactive shell (``.ci/run &``, ``nohup``) inherits SIGINT
    *ignored*, as POSIX has it for asynchronous commands, and Python then installs no
    KeyboardInterrupt handler: the test's Ctrl-C would never arrive."""
    return subprocess.Popen(
        [sys.executable, "-m", "specmeter.streams.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(env),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
