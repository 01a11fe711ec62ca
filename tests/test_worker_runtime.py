"""A real worker's footprint and surface (issue #22): Kafka clients that do not grow with the
partitions, one committer of the input offsets, a quiet start-up that names its web port,
``--web-port 0`` as a real choice, and none of Faust's own pages."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .support.kafka_helpers import create_topic
from .support.worker_harness import Deployment, fleet_events, publish_events, wait_complete

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _common import broker_connections  # the benchmark's own measure, shared

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _deployment(kafka_bootstrap: str, partitions: int) -> Deployment:
    d = Deployment(kafka_bootstrap, partitions=partitions)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, partitions))
    return d


def _web_port(log_text: str) -> int:
    match = re.search(r"web server on http://[^:]+:(\d+)", log_text)
    assert match, log_text[-3000:]
    return int(match.group(1))


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _ready_over_http(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, body = _get(port, "/specmeter/readyz")
            if status == 200 and json.loads(body)["ready"]:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("not ready over HTTP")


def test_a_worker_holds_as_many_broker_connections_at_16_partitions_as_at_4(kafka_bootstrap):
    port = int(kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])
    counts = {}
    for partitions in (4, 16):
        d = _deployment(kafka_bootstrap, partitions)
        try:
            worker = d.start_worker("--web-port", "0", "--web-host", "127.0.0.1")
            d.wait_ready(worker)
            _ready_over_http(_web_port(d.logs[0].read_text()))
            time.sleep(1.0)  # the restore's reader is closed once the restores are done
            counts[partitions] = broker_connections(worker.pid, port)
        finally:
            d.close()
    assert counts[16] <= 12, counts
    assert counts[16] <= counts[4], counts  # no client per partition


def test_start_up_is_quiet_names_the_web_port_and_exposes_only_specmeter_s_pages(kafka_bootstrap):
    d = _deployment(kafka_bootstrap, 8)
    try:
        worker = d.start_worker("--web-port", "0", "--web-host", "127.0.0.1", "--log-level", "info")
        d.wait_ready(worker)
        text = d.logs[0].read_text()
        port = _web_port(text)  # --web-port 0: a free port, named in the log
        _ready_over_http(port)
        assert "Traceback" not in text
        # the worker starts before Faust runs its web server: "ready" is said once the pages answer
        assert text.index("web server on") < text.index("Worker ready"), text
        assert "Updating subscribed topics" not in text and "+---" not in text  # Faust's boxed tables
        assert len(text.splitlines()) < 25, text
        assert _get(port, "/metrics")[0] == 200
        for faust_page in ("/router/", "/table/", "/graph/"):
            assert _get(port, faust_page)[0] == 404, faust_page
        # issue 47.6: the start-up line names the status page, and its address without the slash leads there
        assert re.search(r"web server on http://\S+: .*/specmeter/ \(status page\)", text), text
        assert _status_and_location(port, "/specmeter") == (301, "/specmeter/")
        status, body = _get(port, "/specmeter")  # followed, as a browser does
        assert status == 200 and body.startswith(b"<!DOCTYPE html>")
    finally:
        d.close()


def _status_and_location(port: int, path: str) -> tuple[int, str | None]:
    """The answer's status and Location header, the redirect not followed."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Location")
    finally:
        connection.close()


def test_the_group_s_committed_offsets_follow_the_checkpoints(kafka_bootstrap):
    """The routes commit the worker's checkpoints for each stage's group, so its lag (what
    operators watch) reaches 0 once everything is applied."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    d = _deployment(kafka_bootstrap, 4)
    try:
        worker = d.start_worker()
        d.wait_ready(worker)
        events = fleet_events(seed=3, batches=2, sessions=12)
        asyncio.run(publish_events(kafka_bootstrap, d.topics.records, events))
        wait_complete(d, {e.payload.batch_id for e in events if e.kind == "marker"})

        async def lag() -> dict[int, int]:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=kafka_bootstrap, group_id=f"{d.name}-stage1", enable_auto_commit=False
            )
            await consumer.start()
            try:
                tps = [TopicPartition(d.topics.records, p) for p in range(4)]
                ends = await consumer.end_offsets(tps)
                return {tp.partition: ends[tp] - ((await consumer.committed(tp)) or 0) for tp in tps}
            finally:
                await consumer.stop()

        deadline = time.monotonic() + 20
        while (left := asyncio.run(lag())) and any(left.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == dict.fromkeys(range(4), 0)
    finally:
        d.close()
