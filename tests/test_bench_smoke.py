"""Every benchmark script runs at a tiny size, so none can rot (figures are not checked),
and prints its figures as one JSON object with ``--json`` (the table goes to stderr)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
#: soak_latency has a test of its own below (its JSON is checked too)
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_") and p.stem != "soak_latency")

#: a smoke is a whole run (cluster_hold starts a cluster of its own: about 3 min on 2 cores);
#: its own limit comes first, so a run that hangs fails with the tail of its output
SMOKE_LIMIT_S = 480
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(SMOKE_LIMIT_S + 60)]


def run_smoke(script: Path, kafka_bootstrap: str) -> subprocess.CompletedProcess:
    """The smoke run; one past its limit is stopped as Ctrl-C stops it (its clean-up runs:
    cluster_hold stops its cluster and workers), killed if that takes too long (its
    brokers' watchdogs and its reaper then stop what it started), and fails the test."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--smoke", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
    )
    try:
        out, err = proc.communicate(timeout=SMOKE_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} --smoke ran past {SMOKE_LIMIT_S} s; its stderr ended:\n{interrupt(proc)[-3000:]}")
    except BaseException:  # the test ended otherwise (its own timeout, Ctrl-C)
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def interrupt(proc: subprocess.Popen, grace_s: float = 45) -> str:
    """SIGINT, SIGKILL after ``grace_s``: the run's stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=grace_s)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_runs_at_smoke_size(script, kafka_bootstrap):
    proc = run_smoke(script, kafka_bootstrap)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ratio" in proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(figures, dict) and "machine" in figures and "load" in figures
    if script.stem == "throughput":
        for key in (
            "records",
            "steady_state_records_per_s",
            "end_to_end_records_per_s",
            "baseline_records_per_s",
            "fetch_only_records_per_s",
            "startup_to_ready_s",
        ):
            assert figures[key] > 0, key


def test_soak_latency_reports_every_batch_split_by_hop(kafka_bootstrap):
    """A few seconds of load: one JSON object with every batch's latency, its hops, the
    baseline and the worker's lag and memory series (issue #16)."""
    proc = run_smoke(BENCH / "soak_latency.py", kafka_bootstrap)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["batches"] == result["batches_expected"] >= 3 and result["batches_without_metrics"] == 0
    assert result["incomplete_batches"] == 0
    e2e, hops = result["e2e_ms"], result["hops_ms"]
    assert e2e["n"] == result["batches"] - result["warmup_excluded"] and 0 <= e2e["p50"] <= e2e["p99"] <= e2e["max"]
    for hop in ("marker_to_partial", "marker_to_close", "partial_to_metrics"):
        assert hops[hop]["n"] == e2e["n"] and hops[hop]["p50"] is not None, hop
    for row in result["per_batch"]:  # the hops of a batch add up to its end-to-end latency
        assert row["marker_to_partial_ms"] + row["partial_to_metrics_ms"] == row["e2e_ms"]
        assert row["markers"] == result["expected_markers_per_batch"]
    assert result["baseline_round_trip_ms"]["n"] >= 1 and result["p99_over_baseline_p99"] is not None
    assert result["lag_messages"]["samples"] >= 1 and result["rss_mib"]["max"] > 0
    assert result["resident_bytes_per_open_generation"] > 0
    assert "progress" not in result and "batches" in proc.stderr  # progress goes to stderr
