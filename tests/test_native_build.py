"""Which stage-1 core runs, and how to tell (issue #14)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specmeter.streams.cli import main
from specmeter.streams.core import cores


def _loaded(env: dict[str, str]) -> str:
    code = "import specmeter.streams as s, specmeter.streams.core.cores as c; print(s.NATIVE_CORE, c.CORE.name)"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout.strip()


def test_ci_builds_and_runs_the_native_core():
    """CI's install builds the extension: a silent fallback to Python would skip every native test."""
    if not os.environ.get("CI") or cores.NATIVE_DISABLED:
        pytest.skip("only CI must have the native core (and not when it is switched off)")
    assert cores.NATIVE_CORE, f"the native core did not load ({cores.NATIVE_IMPORT_ERROR}): is cargo on PATH?"


def test_SPECMETER_NO_NATIVE_forces_the_python_core():
    assert _loaded({"SPECMETER_NO_NATIVE": "1"}) == "False python"
    if cores.NATIVE is not None:
        assert _loaded({"SPECMETER_NO_NATIVE": ""}) == "True native"
        assert _loaded({"SPECMETER_NO_NATIVE": "0"}) == "True native"


def test_the_loaded_core_is_the_public_batch_state():
    import specmeter.streams as streams

    assert streams.BatchState is cores.CORE.BatchState
    assert streams.NATIVE_CORE is (cores.CORE.name == "native")


def test_version_names_the_libraries_and_the_core():
    out = CliRunner().invoke(main, ["--version"]).output
    for name in ("specmeter ", "faust-streaming ", "aiokafka ", "msgspec "):
        assert name in out, out
    assert ("native core loaded" in out) is cores.NATIVE_CORE, out
