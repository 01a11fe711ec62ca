"""Ctrl-C during `specmeter replay` (issue 24, point 5): a summary of what was sent, a
warning naming each batch left half-sent (its markers not sent, so the worker will
close it by timeout), exit status 130, and on the broker exactly that: the records
sent, the finished batch's markers, none for the interrupted one."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import pytest

from specmeter.schemas import decode_records_message

from .support.kafka_helpers import read_topic
from .support.tools import start_specmeter

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RECORDS_PER_BATCH = 600


def _dump(path) -> None:
    with open(path, "w") as f:
        for step in (1, 2):
            for i in range(RECORDS_PER_BATCH):
                line = {"batch_id": f"step-{step}", "session_id": f"s{i}", "generation_id": "g", "accepted": 1}
                f.write(json.dumps(line | {"proposed": 2, "producer_id": "worker-0"}) + "\n")
            marker = {"type": "marker", "batch_id": f"step-{step}", "producer_id": "worker-0"}
            f.write(json.dumps(marker | {"expected_producers": 1}) + "\n")


def test_ctrl_c_reports_what_was_sent_and_the_half_sent_batch(kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=2, prefix="replay-int")
    dump = tmp_path / "dump.jsonl"
    _dump(dump)
    args = ["replay", str(dump), "--broker", kafka_bootstrap, "--topic", topic, "--rate", "200", "--no-progress"]
    proc = start_specmeter(*args)
    # step-1 (600 records) goes out in 3 s at 200/s, then its marker; interrupt inside step-2
    messages = asyncio.run(read_topic(kafka_bootstrap, topic, until=_marker_of("step-1"), timeout_s=90))
    assert _marker_of("step-1")(messages), "step-1's markers never arrived"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)

    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    summary = re.search(r"interrupted after [\d.]+s: sent ([\d,]+) records, 0 invalid, 1 marker", stderr)
    assert summary, stderr
    sent = int(summary.group(1).replace(",", ""))
    assert RECORDS_PER_BATCH < sent < 2 * RECORDS_PER_BATCH, stderr
    assert f"{sent:,} records and invalid lines acknowledged by Kafka" in stderr, stderr
    assert "1 batch(es) left half-sent, their markers not sent: step-2" in stderr, stderr
    assert "--batch-timeout" in stderr and "'timeout'" in stderr

    on_topic = asyncio.run(read_topic(kafka_bootstrap, topic, idle_s=2.0, timeout_s=60))
    decoded = [decode_records_message(m.value) for m in on_topic]
    assert sum(len(d.records) for d in decoded) == sent, "the summary counts what reached Kafka"
    markers = [d.marker.batch_id for d in decoded if d.marker is not None]
    assert markers == ["step-1", "step-1"], "one marker per partition for step-1, none for step-2"


def _marker_of(batch_id: str):
    def seen(messages) -> bool:
        return any(
            (d := decode_records_message(m.value)).marker is not None and d.marker.batch_id == batch_id
            for m in messages
        )

    return seen
