"""The previous release of specmeter, runnable beside this checkout (rolling upgrades).

``PREVIOUS_RELEASE`` is the commit before the day-two work (issue 47): the worker a fleet
runs today. Its three source folders are exported from this clone's git history into a
folder laid out as the installed ``specmeter`` namespace, and a worker started with
``previous_release_env`` imports that code instead of this checkout's. It runs on its
pure-Python core (``SPECMETER_NO_NATIVE=1``): the reference core, which writes the same
changelog as the native one, and needs no build of the old Rust sources.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: main before issue 47 (and 43): takeover records without a format, no confirmations
PREVIOUS_RELEASE = "37714f1e6a3fbf2f42a6670f2b7fe55bad34543d"
FOLDERS = ("schemas", "producers", "streams")


class NoPreviousRelease(RuntimeError):
    """The clone lacks the commit (a shallow clone): say how to get it."""


def export_previous_release(into: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """Export ``commit``'s source folders under ``into``; returns the folder to put on
    PYTHONPATH (it holds ``specmeter/{schemas,producers,streams}``)."""
    probe = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if probe.returncode != 0:
        raise NoPreviousRelease(f"commit {commit[:12]} is not in this clone (shallow?): git fetch --unshallow")
    tree = into / "tree"
    site = into / "site" / "specmeter"
    tree.mkdir(parents=True, exist_ok=True)
    site.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, *FOLDERS], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for name in FOLDERS:
        link = site / name
        if not link.exists():
            link.symlink_to(tree / name, target_is_directory=True)
    return site.parent


def previous_release_env(site: Path) -> dict[str, str]:
    """The environment that makes ``python -m specmeter.streams.cli`` the previous release's."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SPECMETER_NO_NATIVE": "1"}
