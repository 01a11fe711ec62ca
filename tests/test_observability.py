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

from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

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
    # acceptance by draft position: steps that accepted at least k drafts, over every batch
    histograms = [m.accept_histogram or [] for m in latest.values()]
    assert _counter(families, "position_verify_steps") == sum(sum(h) for h in histograms)
    positions = {s.labels["position"]: s.value for s in families["specmeter_position_accepted_steps"].samples}
    taken = {s.labels["position"]: s.value for s in families["specmeter_position_accepted_steps_retracted"].samples}
    width = max(map(len, histograms))
    assert width > 2 and {k: positions[k] - taken[k] for k in positions} == {
        str(k): sum(sum(h[k:]) for h in histograms) for k in range(1, min(width - 1, 16) + 1)
    }
    # the newest batch (by close time; of batches closed in one chunk, the one published
    # last) of the run: its newest revision, no batch label
    newest = published[0]
    for m in published[1:]:
        if (m.run_id, m.batch_id) == (newest.run_id, newest.batch_id) or m.closed_at >= newest.closed_at:
            newest = m

    def value(name, **labels):
        [sample] = [s for s in families[name].samples if labels.items() <= s.labels.items()]
        assert "batch_id" not in sample.labels
        return sample.value

    assert value("specmeter_batch_closed_timestamp_seconds") == newest.closed_at
    assert value("specmeter_batch_accept_rate_ratio") == newest.metrics["spec/accept_rate"]
    assert value("specmeter_batch_tokens_per_verify") == newest.metrics["spec/tokens_per_verify"]
    assert value("specmeter_batch_accept_coverage_ratio") == newest.metrics["spec/accept_count_coverage"]
    assert value("specmeter_batch_generations") == newest.metrics["spec/unique_generation_count"]
    assert value("specmeter_batch_records") == newest.record_count
    assert value("specmeter_batch_revision") == newest.revision
    assert value("specmeter_batch_complete") == 1.0
    for k, rate in enumerate(newest.accept_rate_by_position, start=1):
        assert value("specmeter_batch_position_accept_rate_ratio", position=str(k)) == rate
    assert [s.labels["close_reason"] for s in families["specmeter_batch_info"].samples] == [newest.close_reason]
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
    applied = {s.labels["partition"]: s.value for s in families["specmeter_partition_applied_offset"].samples}
    assert set(applied) == set(last_event) and all(offset >= 0 for offset in applied.values()), applied
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


def _series(port: int) -> set[tuple]:
    """The specmeter series of one scrape of a worker, as (name, sorted labels)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if s.name.startswith("specmeter_")
    }


def test_the_series_a_worker_exports_do_not_grow_with_the_batches_it_publishes(kafka_bootstrap):
    """Issue #24: a batch_id label (and a weight_version one) made new series at every
    training step. Through a real worker: after 9 and after 18 published batches, each
    with newer policy versions, /metrics holds the very same series."""
    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    port = free_port()
    worker = d.start_worker("--web-port", str(port), "--web-host", "127.0.0.1")
    spec = FleetSpec(
        batches=18,
        sessions_per_batch=40,
        producers=2,
        seed=24,
        stale_versions=1,  # every batch mixes the current version and the one before (ages 0 and 1)
        invalid_rate=0.0,
        batch_prefix="churn-",
    )
    events = list(synthetic_fleet(spec))
    ids = sorted({e.batch_id for e in events})
    series: list[set[tuple]] = []
    try:
        d.wait_ready(worker)
        for wave in (ids[:3], ids[3:9], ids[9:]):
            wanted = set(wave)
            asyncio.run(publish_events(kafka_bootstrap, d.topics.records, [e for e in events if e.batch_id in wanted]))
            done = len(ids[: ids.index(wave[-1]) + 1])
            d.metrics(until=lambda ms, n=done: len({m.batch_id for m in ms if m.complete}) >= n, timeout_s=90)
            scraped = _scrape(port, lambda f, n=done: "specmeter_batches" in f and _counter(f, "batches") == n)
            assert _counter(scraped, "batches") == done, "every published batch reached /metrics"
            series.append(_series(port))
    except BaseException:
        print(d.log_tail())
        raise
    finally:
        d.close()
    assert series[1] == series[2], (
        f"new: {sorted(series[2] - series[1])[:10]}, gone: {sorted(series[1] - series[2])[:10]}"
    )
    assert len(series[0]) <= len(series[1])
    labels = {name for _, pairs in series[2] for name, _ in pairs}
    assert not labels & {"batch_id", "weight_version", "session_id", "generation_id"}, labels
