"""What building the command line imports (issue 46, point 2: the worker's start-up).

``specmeter worker`` imports the command line first: every command's module is built with
it, so what a command's module imports at its top every command pays, the worker's start
among them. Modules only some commands, or a later path, need are imported where they are
used; these tests fail when one comes back to the top of a module."""

from __future__ import annotations

import json
import subprocess
import sys

#: imported by a command or a path the worker's start never takes
LAZY = (
    "specmeter.streams.advice",  # advise's library (cli/advise.py: on first use)
    "specmeter.streams.advice._plot",
    "specmeter.streams.cli.tables",  # the terminal's tables of aggregate, tail and the demo
    "specmeter.streams.worker.app",  # the worker's Faust app: once the checks before the start passed
    "specmeter.streams.delivery.routes",
    "faust",
    "aiohttp",
    "aiokafka",
    "rich",
)


def imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_building_the_command_line_imports_no_command_s_heavy_modules():
    modules = imported_by("import specmeter.streams.cli")
    assert "specmeter.streams.cli.worker" in modules  # the check sees what it should
    assert sorted(m for m in LAZY if m in modules) == []


def test_the_advise_module_still_gives_the_library_s_names():
    modules = imported_by(
        "from specmeter.streams.cli.advise import Advice, advise\n"
        "from specmeter.streams.advice import Advice as A, advise as a\n"
        "assert (Advice, advise) == (A, a)"
    )
    assert "specmeter.streams.advice" in modules
