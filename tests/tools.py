"""Finding the command-line tools the test extras install (validators, promtool)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find_tool(name: str) -> str | None:
    """On PATH, or beside this interpreter (a virtual environment run without activating it)."""
    found = shutil.which(name)
    if found is None:
        beside = Path(sys.executable).parent / name
        found = str(beside) if beside.is_file() else None
    return found
