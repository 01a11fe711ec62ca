"""examples/advise_in_trainer.py (issue 45): a trainer calls the advice library on the
metrics it read, with no command line imported, and gets the budget worked out by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specmeter.schemas import encode_metrics

from .test_advise import batch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "advise_in_trainer.py"

#: runs the example as __main__, then says whether any command-line module was imported
RUN = """
import runpy, sys
sys.argv = [{example!r}, {path!r}, "--draft-cost", "0.25"]
try:
    runpy.run_path({example!r}, run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("cli imported:", sorted(m for m in sys.modules if m.startswith(("specmeter.streams.cli", "click", "rich"))))
sys.exit(code)
"""


def test_the_trainer_example_recommends_the_budget_without_the_command_line(tmp_path):
    # every step accepted both drafts: E_1 = 2, E_2 = 3; at c = 0.25 the speedups are
    # 2 / 1.25 = 1.6 and 3 / 1.5 = 2.0, so k = 2 (by hand)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(encode_metrics(batch(f"step-{i}", [0, 0, 4])) + b"\n" for i in (1, 2)))
    code = RUN.format(example=str(EXAMPLE), path=str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "batches step-1 .. step-2: budget 2, speedup 2.000"
    assert "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in lines[1]
    assert lines[-1] == "cli imported: []"


def test_the_trainer_example_says_why_there_is_no_advice(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(encode_metrics(batch("step-1", None)) + b"\n")
    code = RUN.format(example=str(EXAMPLE), path=str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "no advice:" in done.stderr and "no acceptance histogram" in done.stderr
