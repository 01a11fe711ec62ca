"""Finding the command-line tools the test extras install (validators, promtool), free ports,
and children that Ctrl-C reaches."""

from __future__ import annotations

import shutil
import signal
import socket
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


def ctrl_c_reaches_child() -> None:
    """``preexec_fn`` of a child a test sends SIGINT: Ctrl-C's default disposition.

    A suite started in the background of a non-interactive shell (``.ci/run &``, ``nohup``)
    inherits SIGINT *ignored*, as POSIX has it for asynchronous commands, and Python then
    installs no KeyboardInterrupt handler: the test's Ctrl-C would never arrive.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
