"""The layers are a checked contract (issue 32): ``deploy/dev lint`` runs lint-imports with
pyproject.toml's contracts, and it fails when an import runs the wrong way.

Each case copies the three source folders to a scratch folder, under the names they
install as (``specmeter/schemas``, ``specmeter/producers``, ``specmeter/streams``, as
``deploy/dev lint`` links them), adds one wrong import and runs the linter's command line
there: the untouched copy passes, each wrong import fails and is named."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy(tmp: Path) -> Path:
    """pyproject.toml and the source folders (Python files only) under tmp; returns tmp."""
    for folder in ("schemas", "producers", "streams"):
        shutil.copytree(
            REPO / folder,
            tmp / "src" / "specmeter" / folder,
            ignore=shutil.ignore_patterns("native", "__pycache__", "*.so", "data"),
        )
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """What ``deploy/dev lint`` runs, on the copy (the copy's folders shadow the installed ones)."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _add(root: Path, module: str, line: str) -> None:
    path = root / "src" / "specmeter" / module
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_deploy_dev_lint_runs_the_contracts():
    script = (REPO / "deploy" / "dev").read_text()
    lint = script[script.index("  lint)") : script.index(";;", script.index("  lint)"))]
    assert re.search(r'lint-imports" --config pyproject.toml --no-cache --no-logo', lint), lint
    assert "deploy/dev lint" in (REPO / ".ci" / "run").read_text()


def test_the_untouched_source_keeps_every_contract(tmp_path):
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and " kept" in result.stdout


#: (file, the wrong import added at its end, what the failure names)
WRONG = [
    pytest.param(
        "streams/core/exact.py",
        "from ..delivery import ledger  # noqa",
        "specmeter.streams.core is not allowed to import specmeter.streams.delivery",
        id="the-core-imports-the-delivery",
    ),
    pytest.param(
        "streams/core/stage2.py",
        "def _later():\n    from ..worker import app  # noqa",
        "specmeter.streams.core is not allowed to import specmeter.streams.worker",
        id="a-lazy-import-inside-a-function-counts",
    ),
    pytest.param(
        "streams/delivery/writes.py",
        "from ..cli import base  # noqa",
        "specmeter.streams.delivery is not allowed to import specmeter.streams.cli",
        id="the-delivery-imports-the-commands",
    ),
    pytest.param(
        "streams/report/waits.py",
        "from ..delivery import output  # noqa",
        "specmeter.streams.report is not allowed to import specmeter.streams.delivery",
        id="siblings-of-one-layer-stay-apart",
    ),
    pytest.param(
        "streams/worker/faults.py",
        "from ..cli import tables  # noqa",
        "specmeter.streams.worker is not allowed to import specmeter.streams.cli",
        id="the-worker-imports-the-commands",
    ),
    pytest.param(
        "streams/cli/advise.py",
        "from . import tail  # noqa",
        "specmeter.streams.cli.advise is not allowed to import specmeter.streams.cli.tail",
        id="a-command-imports-another",
    ),
    pytest.param(
        "streams/fleet/synthetic.py",
        "import faust  # noqa",
        "specmeter.streams.fleet is not allowed to import faust",
        id="faust-outside-the-worker",
    ),
    pytest.param(
        "schemas/_types.py",
        "import specmeter.streams  # noqa",
        "specmeter.schemas is not allowed to import specmeter.streams",
        id="the-wire-contract-imports-the-stream-side",
    ),
    pytest.param(
        "producers/_sync.py",
        "from aiokafka.consumer import AIOKafkaConsumer  # noqa",
        "specmeter.producers is not allowed to import aiokafka.consumer",
        id="the-producer-library-imports-a-consumer",
    ),
]


@pytest.mark.parametrize(("module", "line", "named"), WRONG)
def test_an_import_that_runs_the_wrong_way_fails_the_lint(tmp_path, module, line, named):
    root = _copy(tmp_path)
    _add(root, module, line)
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())  # the report wraps long lines
    assert named in said, result.stdout


def test_a_new_folder_must_take_its_place_in_the_layers(tmp_path):
    root = _copy(tmp_path)
    (root / "src" / "specmeter" / "streams" / "extras").mkdir()
    (root / "src" / "specmeter" / "streams" / "extras" / "__init__.py").write_text('"""Somewhere new."""\n')
    result = _lint(root)
    assert result.returncode != 0 and "specmeter.streams.extras" in result.stdout, result.stdout


def test_the_public_module_paths_outlive_the_folders():
    """Issue 32 moved every module; the names users import stay (the synthetic fleet's
    module, the package's API, the commands' entry points)."""
    import specmeter.streams as streams
    from specmeter.streams import synthetic
    from specmeter.streams.cli import main
    from specmeter.streams.fleet import synthetic as moved
    from specmeter.streams.settings import WorkerSettings

    assert synthetic.FleetSpec is moved.FleetSpec and synthetic.synthetic_fleet is moved.synthetic_fleet
    assert callable(streams.consume_metrics) and callable(main) and WorkerSettings


_CIRCLES = """
import sys
import grimp

graph = grimp.build_graph("specmeter")  # imports under TYPE_CHECKING included
index, low, stack, on, found = {}, {}, [], set(), []


def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    on.add(module)
    for imported in graph.find_modules_directly_imported_by(module):
        if imported not in index:
            visit(imported)
            low[module] = min(low[module], low[imported])
        elif imported in on:
            low[module] = min(low[module], index[imported])
    if low[module] == index[module]:
        circle = []
        while not circle or circle[-1] != module:
            circle.append(stack.pop())
            on.discard(circle[-1])
        if len(circle) > 1:
            found.append(" <-> ".join(sorted(circle)))


sys.setrecursionlimit(10_000)
for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print("\\n".join(found))
"""


def _circles(root: Path) -> list[str]:
    """The import circles among the copy's modules (strongly connected groups), one line each."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run(
        [sys.executable, "-c", _CIRCLES], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_no_module_imports_itself_round_a_circle(tmp_path):
    """Issue 45: no import circle, imports for the type checker included (a protocol stands
    where a module would import back the one that imports it)."""
    root = _copy(tmp_path)
    assert _circles(root) == []
    _add(root, "streams/delivery/route.py", "if TYPE_CHECKING:\n    from .routes import DeliveryDriver")
    assert _circles(root) == ["specmeter.streams.delivery.route <-> specmeter.streams.delivery.routes"]
