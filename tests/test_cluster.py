"""A worker on a three-broker cluster (the shape production has) while one broker
crashes and comes back as a replaced machine, with an empty disk, another gets a
rolling restart and a third is SIGKILLed (issue 21.1).

At replication factor 1 (the worker's topics before issue 21) the lost disk took
input and state with it: 5 of 24 batches exact. At the cluster's replication
factor 3 every batch must be exact, and the worker must never need a restart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from .support.golden_cases import assert_metrics_equal
from .support.worker_harness import Deployment, latest_by_batch

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: sized for two shared cores: ~750 records a batch, paced over about a minute
BATCHES = 20
SESSIONS_PER_BATCH = 200
RATE = 300


@pytest.mark.timeout(900)
def test_a_broker_replaced_with_an_empty_disk_a_rolling_restart_and_a_sigkill_mid_stream(
    kafka_cluster, tmp_path, request
):
    cluster = kafka_cluster
    d = Deployment(cluster.bootstrap, batch_timeout_s=120.0, grace_s=300.0, session_timeout_s=10.0)
    # the worker creates every topic (records included) at the cluster's replication factor
    worker = d.start_worker()
    faults: list[str] = []
    try:
        d.wait_ready(worker, timeout_s=120)
        expect = tmp_path / "expect.jsonl"
        loadgen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specmeter.streams.cli",
                "loadgen",
                "--broker",
                cluster.bootstrap,
                "--topic",
                d.topics.records,
                "--batches",
                str(BATCHES),
                "--sessions-per-batch",
                str(SESSIONS_PER_BATCH),
                "--rate",
                str(RATE),
                "--seed",
                "21",
                "--expect",
                str(expect),
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def chaos() -> None:
            time.sleep(8)
            cluster.kill(2)  # a crash mid-stream
            faults.append(f"killed 2 at {time.monotonic():.0f}")
            time.sleep(6)
            cluster.wipe(2)  # the machine is replaced: its disk is empty
            cluster.start_broker(2)
            faults.append(f"2 back, empty, at {time.monotonic():.0f}")
            time.sleep(4)
            cluster.restart(3)  # a rolling restart's step, while 2 still copies its partitions back
            faults.append(f"3 restarted at {time.monotonic():.0f}")
            time.sleep(4)
            cluster.kill(1)  # and a third crash
            faults.append(f"killed 1 at {time.monotonic():.0f}")
            time.sleep(5)
            cluster.start_broker(1)
            faults.append(f"1 back at {time.monotonic():.0f}")

        fault = threading.Thread(target=chaos)
        fault.start()
        _, err = loadgen.communicate(timeout=600)
        fault.join(120)
        assert loadgen.returncode == 0, err[-3000:]
        assert len(faults) == 5, faults
        assert worker.poll() is None, "the worker was not supposed to need a restart"

        expected = {m["batch_id"]: m for m in map(json.loads, expect.read_text().splitlines())}
        assert len(expected) == BATCHES
        published = d.metrics(
            until=lambda ms: (
                set(expected) <= set(latest_by_batch(ms)) and all(latest_by_batch(ms)[b].complete for b in expected)
            ),
            timeout_s=240,
        )
        latest = latest_by_batch(published)
        assert set(expected) <= set(latest), sorted(set(expected) - set(latest))
        for batch_id, want in expected.items():
            got = latest[batch_id]
            assert got.complete and got.close_reason == "markers", got
            assert got.record_count == want["record_count"], (batch_id, got.record_count, want["record_count"])
            assert got.invalid_record_count == want["invalid_record_count"], batch_id
            assert got.accept_histogram == want["accept_histogram"], batch_id
            assert_metrics_equal(got.metrics, want["metrics"], batch_id)
        assert worker.poll() is None, "the worker was alive throughout"
    finally:
        d.close()
        cluster.start()  # every broker up again for the next test
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(faults, d.log_tail(), cluster.log_tails())
