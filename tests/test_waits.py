"""Waits that explain themselves (issue #24 point 3): what an open batch or merge waits for,
in /specmeter/stats and, once, in the worker's log."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import pytest

from specmeter.schemas import BatchMarker, GenerationRecord, encode_records_message
from specmeter.streams.core.stage1 import PartitionProcessor
from specmeter.streams.core.stage2 import MergeWaiting
from specmeter.streams.report.waits import WaitReporter, stage1_waits

TIMEOUT_MS = 60_000


def _processor(core, partition: int = 0) -> PartitionProcessor:
    return PartitionProcessor(partition, core=core, source_topic="t", batch_timeout_ms=TIMEOUT_MS, grace_ms=60_000)


def _record(i: int) -> bytes:
    return encode_records_message(GenerationRecord(batch_id="step-1", session_id=f"s{i}", generation_id="g", verify=1))


def _marker(producer: str, expected: int = 8) -> bytes:
    return encode_records_message(
        BatchMarker(batch_id="step-1", producer_id=producer, records_sent=1, expected_producers=expected)
    )


def test_an_open_batch_says_whose_markers_arrived_and_when_it_times_out(core):
    p = _processor(core)
    p.process([(0, _record(0)), (1, _marker("rollout-0"))], now_ms=1_000)
    (wait,) = p.waiting(now_ms=4_000)
    assert wait.marker_producers == {"rollout-0"} and wait.expected_producers == 8
    assert wait.idle_ms == 3_000 and wait.closes_in_ms == TIMEOUT_MS - 3_000
    # the same after a restore from the changelog the processor wrote
    log = dict(p.process([(2, _marker("rollout-1"))], now_ms=5_000).changelog)
    restored = _processor(core)
    restored.restore([(k, v) for k, v in log.items() if v is not None], now_ms=6_000)
    assert {w.batch_id for w in restored.waiting(6_000)} == {"step-1"}


def test_the_restored_processor_knows_every_marker_that_arrived(core):
    p = _processor(core)
    log: dict = {}
    for offset, data in enumerate([_record(0), _marker("a"), _marker("b")]):
        log.update(p.process([(offset, data)], now_ms=1_000 + offset).changelog)
    restored = _processor(core)
    restored.restore([(k, v) for k, v in log.items() if v is not None], now_ms=2_000)
    (wait,) = restored.waiting(2_000)
    assert wait.marker_producers == {"a", "b"}


def test_a_wait_is_said_once_and_again_only_if_it_comes_back(core):
    p0, p1 = _processor(core, 0), _processor(core, 1)
    p0.process([(0, _record(0)), (1, _marker("rollout-0"))], now_ms=1_000)
    p1.process([(0, _marker("rollout-0"))], now_ms=1_000)
    reporter = WaitReporter(batch_timeout_ms=TIMEOUT_MS)

    def said(now_ms: int) -> list[str]:
        return reporter.lines(stage1_waits([(0, p0.waiting(now_ms)), (1, p1.waiting(now_ms))]), [])

    (line,) = said(2_000)
    assert "markers from 1 of 8 producers (rollout-0)" in line and "waiting for 7 more" in line
    assert re.search(r"closes by timeout in 59 s", line), line
    assert said(2_500) == [] and said(3_000) == []  # once
    merge = MergeWaiting(
        run_id=None, batch_id="b9", partitions_reported=(0, 2), partitions_expected=4, waited_ms=6_000,
        publishes_in_ms=54_000,
    )  # fmt: skip
    (merge_line,) = reporter.lines(stage1_waits([(0, p0.waiting(3_000))]), [merge])
    assert "partials from 2 of 4 records partitions" in merge_line and "partition(s) 1, 3" in merge_line


def test_a_batch_without_any_marker_is_said_once_its_input_stopped_for_half_the_timeout(core):
    p = _processor(core)
    p.process([(0, _record(0))], now_ms=0)
    reporter = WaitReporter(batch_timeout_ms=TIMEOUT_MS)
    assert reporter.lines(stage1_waits([(0, p.waiting(10_000))]), []) == []  # records still coming: normal
    (line,) = reporter.lines(stage1_waits([(0, p.waiting(31_000))]), [])
    assert "no producer's marker yet" in line and "closes by timeout in 29 s" in line


@pytest.mark.kafka
@pytest.mark.slow
def test_one_publisher_of_eight_sees_its_wait_in_the_log_once_and_on_the_stats_page(deployment):
    """The README's snippet run by one process (it says expected_producers=8): the worker says
    at once that it waits for 7 more producers' markers, or the timeout."""
    from specmeter.producers import Publisher, PublisherSettings, record_from_meta_info

    from .support.sglang_meta_info import SGLANG_OUTPUTS

    port = _free_port()
    worker = deployment.start_worker("--web-port", str(port), "--web-host", "127.0.0.1", "--batch-timeout", "60")
    deployment.wait_ready(worker)

    async def one_rollout_worker() -> None:
        settings = PublisherSettings(
            bootstrap_servers=deployment.bootstrap, topic=deployment.topics.records, producer_id="rollout-worker-3"
        )
        async with Publisher(settings) as pub:
            for i, (meta_info, _) in enumerate(SGLANG_OUTPUTS.values()):
                pub.publish_nowait(record_from_meta_info(meta_info, batch_id="step-12", session_id=f"s{i}"))
            await pub.close_batch("step-12", speculative_algorithm="EAGLE3", expected_producers=8)

    asyncio.run(one_rollout_worker())
    log = deployment.logs[0]
    deadline = time.monotonic() + 20
    while "waiting for 7 more" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=5) as response:
        stats = json.loads(response.read())
    time.sleep(1.0)  # several ticks: still said once
    lines = [line for line in log.read_text().splitlines() if "step-12" in line and "waiting for" in line]
    assert len(lines) == 1, lines
    assert "markers from 1 of 8 producers (rollout-worker-3)" in lines[0]
    (batch,) = [b for b in stats["waiting"]["batches"] if b["batch_id"] == "step-12"]
    assert batch["markers_from"] == ["rollout-worker-3"] and batch["expected_producers"] == 8
    assert 0 < batch["closes_by_timeout_in_s"] <= 60
    assert sorted(batch["partitions"]) == list(range(deployment.partitions))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
