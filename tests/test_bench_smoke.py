"""Every benchmark script runs at a tiny size, so none can rot (figures are not checked),
and prints its figures as one JSON object with ``--json`` (the table goes to stderr)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_runs_at_smoke_size(script, kafka_bootstrap):
    proc = subprocess.run([sys.executable, str(script), "--smoke", "--json"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ratio" in proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(figures, dict) and "machine" in figures and "load" in figures
    if script.stem == "throughput":
        for key in ("records", "steady_state_records_per_s", "end_to_end_records_per_s", "baseline_records_per_s",
                    "fetch_only_records_per_s", "startup_to_ready_s"):
            assert figures[key] > 0, key
