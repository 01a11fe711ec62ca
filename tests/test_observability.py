"""The worker's /metrics under real traffic, and `specmeter tail` against the broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specmeter.streams.synthetic import FleetSpec, synthetic_fleet

from .support.kafka_helpers import create_topic
from .support.tools import find_tool, free_port
from .support.worker_harness import Deployment, latest_by_batch, publish_events

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def fed_worker(kafka_bootstrap):
    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    port = free_port()
    worker = d.start_worker("--web-port", str(port), "--web-host", "127.0.0.1")
    events = list(
        synthetic_fleet(FleetSpec(batches=2, sessions_per_batch=20, producers=2, seed=21, batch_prefix="obs-"))
    )
    try:
        d.wait_ready(worker)
        asyncio.run(publish_events(kafka_bootstrap, d.topics.records, events))
        batches = {e.batch_id for e in events}
        published = d.metrics(until=lambda ms: batches <= {m.batch_id for m in ms if m.complete}, timeout_s=90)
        yield d, port, published, events
    finally:
        d.close()


def _scrape(port: int, until) -> dict:
    """The worker's /metrics as families, once ``until(families)`` holds (publication and
    scrape race: the last batch may reach the topic a moment before the counters)."""
    families: dict = {}
    for _ in range(100):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            families["__body__"] = body
            if until(families):
                break
        except OSError:
            pass
        time.sleep(0.2)
    return families


def _counter(families: dict, stem: str) -> float:
    """total - retracted of a counter of published batches, over every label set."""
    total = sum(s.value for s in families[f"specmeter_{stem}"].samples if s.name.endswith("_total"))
    taken = sum(s.value for s in families[f"specmeter_{stem}_retracted"].samples if s.name.endswith("_total"))
    return total - taken


def test_metrics_endpoint_adds_up_to_the_published_batches(fed_worker):
    _d, port, published, events = fed_worker
    latest = latest_by_batch(published)
    families = _scrape(port, lambda f: "specmeter_batches" in f and _counter(f, "batches") == len(latest))
    body = families.pop("__body__")
    # counters of published batches: each batch's latest revision, summed, exactly
    for stem, key in (
        ("paired_accepted_tokens", "spec/paired_accepted_total"),
        ("paired_proposed_tokens", "spec/paired_proposed_total"),
        ("paired_completion_tokens", "spec/paired_completion_total"),
        ("paired_verify_steps", "spec/paired_verify_total"),
        ("accepted_tokens", "spec/accepted_total"),
        ("accept_covered_generations", "spec/accept_covered_count"),
        ("generations", "spec/unique_generation_count"),
    ):
        assert _counter(families, stem) == sum(m.metrics[key] for m in latest.values()), stem
    assert _counter(families, "published_records") == sum(m.record_count for m in latest.values())
    assert {s.labels["algorithm"] for s in families["specmeter_batches"].samples} == {"EAGLE3"}
    # the latest batches' gauges: each one's newest revision
    gauges = {s.labels["batch_id"]: s for s in families["specmeter_batch_accept_rate_ratio"].samples}
    assert gauges and set(gauges) <= set(latest)
    for batch_id, sample in gauges.items():
        assert sample.value == latest[batch_id].metrics["spec/accept_rate"]

    def value(name, batch_id):
        return next(s.value for s in families[name].samples if s.labels["batch_id"] == batch_id)

    for batch_id in gauges:
        m = latest[batch_id]
        assert value("specmeter_batch_tokens_per_verify", batch_id) == m.metrics["spec/tokens_per_verify"]
        assert value("specmeter_batch_accept_coverage_ratio", batch_id) == m.metrics["spec/accept_count_coverage"]
        assert value("specmeter_batch_generations", batch_id) == m.metrics["spec/unique_generation_count"]
        assert value("specmeter_batch_records", batch_id) == m.record_count
        assert value("specmeter_batch_revision", batch_id) == m.revision
        assert value("specmeter_batch_complete", batch_id) == 1.0
    assert {s.labels["batch_id"] for s in families["specmeter_batch_info"].samples} == set(gauges)
    records = sum(1 for e in events if e.kind == "record")
    invalid = sum(1 for e in events if e.kind == "invalid")
    worker = lambda name: families[name].samples[0].value  # noqa: E731
    counted = sum(worker(f"specmeter_records_{k}") for k in ("aggregated", "redelivered", "late", "dead_lettered"))
    assert counted == records + invalid, "every record is aggregated, redelivered, late or dead-lettered"
    assert families["specmeter_batch_close_latency_seconds"].samples, "close latency histogram"
    last_event = {
        s.labels["partition"]: s.value for s in families["specmeter_partition_last_event_timestamp_seconds"].samples
    }
    assert set(last_event) == {"0", "1", "2", "3"}
    assert all(time.time() - 600 < t <= time.time() for t in last_event.values()), last_event
    assert "process_resident_memory_bytes" in families and "python_info" in families
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    ready = urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/readyz", timeout=5)
    assert json.loads(ready.read()) == {"ready": True}


def test_stats_page_reports_checkpoints_memory_cpu_and_gc_pauses(fed_worker):
    """What bench/soak_latency.py samples (issue #16): lag is the log end minus the
    checkpoint, plus the worker's resident memory, CPU time and collector pauses."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    d, port, _published, _events = fed_worker

    async def log_ends() -> dict[str, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=d.bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(d.topics.records, p) for p in range(d.partitions)]
            ends = await consumer.end_offsets(tps)
            return {str(tp.partition): ends[tp] - 1 for tp in tps}
        finally:
            await consumer.stop()

    ends = asyncio.run(log_ends())
    stats = {}
    for _ in range(50):  # every message applied: checkpoints at the log end
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=5).read())
        if stats["checkpoints"] == ends:
            break
        time.sleep(0.2)
    assert stats["checkpoints"] == ends
    assert stats["rss_bytes"] > 10 * 2**20 and stats["cpu_seconds"] > 0 and stats["producer_pending"] >= 0
    counters = stats["counters"]
    assert len(counters["gc_collections"]) == len(counters["gc_max_seconds"]) == 3
    assert all(m >= 0 for m in counters["gc_max_seconds"]) and sum(counters["gc_collections"]) >= 0


def _tail(d, *flags: str, timeout_s: int) -> subprocess.CompletedProcess:
    """`specmeter tail` on the deployment's metrics topic, as a user runs it."""
    command = [sys.executable, "-m", "specmeter.streams.cli", "tail", "--broker", d.bootstrap]
    return subprocess.run(
        [*command, "--topic", d.topics.metrics, "--from-beginning", *flags],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_tail_json_from_beginning(fed_worker):
    d, _port, published, _events = fed_worker
    proc = _tail(d, "--json", "--max-messages", str(len(published)), "--timeout", "60", timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(lines) == len(published)
    latest = latest_by_batch(published)
    for line in lines:
        if line["revision"] == latest[line["batch_id"]].revision:
            assert line["metrics"] == latest[line["batch_id"]].metrics


def test_tail_table_renders(fed_worker):
    d, _port, _published, _events = fed_worker
    proc = _tail(d, "--timeout", "3", timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    assert "obs-00000" in proc.stdout and "accept rate" in proc.stdout
