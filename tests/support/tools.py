"""Finding the command-line tools the test extras install (validators, promtool), and free ports."""

from __future__ import annotations

import shutil
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
