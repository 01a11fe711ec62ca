"""Producers end to end: loadgen --expect and replay through a real worker, and the
publisher's bounded queue while its broker is away."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import msgspec
import pytest

from specmeter.producers import Publisher, PublisherSettings, QueueFullError
from specmeter.schemas import GenerationRecord, decode_records_message

from .support.golden_cases import assert_metrics_equal
from .support.kafka_broker import BROKER_SCRIPT, tied_to_me
from .support.kafka_helpers import create_topic, read_topic
from .support.worker_harness import Deployment, latest_by_batch

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", *args], capture_output=True, timeout=300, **kwargs
    )


def _wait_complete(d: Deployment, batches: set[str]):
    published = d.metrics(
        until=lambda ms: batches <= set(latest_by_batch(ms)) and all(latest_by_batch(ms)[b].complete for b in batches),
        timeout_s=120,
    )
    latest = latest_by_batch(published)
    assert batches <= set(latest), d.log_tail()
    assert all(latest[b].complete for b in batches), [latest[b] for b in batches if not latest[b].complete]
    return latest


def test_loadgen_expect_is_what_the_worker_publishes(kafka_bootstrap, tmp_path):
    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        d.wait_ready(d.start_worker())
        expect = tmp_path / "expect.jsonl"
        proc = _cli(
            "loadgen",
            "--broker",
            kafka_bootstrap,
            "--topic",
            d.topics.records,
            "--producers",
            "3",
            "--batches",
            "3",
            "--sessions-per-batch",
            "40",
            "--algorithm",
            "NGRAM",
            "--invalid-rate",
            "0.01",
            "--seed",
            "5",
            "--expect",
            str(expect),
            "--no-progress",
        )
        assert proc.returncode == 0, proc.stderr.decode()
        expected = {m["batch_id"]: m for m in map(json.loads, expect.read_text().splitlines())}
        latest = _wait_complete(d, set(expected))
        for batch_id, want in expected.items():
            got = latest[batch_id]
            assert_metrics_equal(got.metrics, want["metrics"], batch_id)
            assert got.accept_histogram == want["accept_histogram"]
            assert got.record_count == want["record_count"] and got.complete
            # revision 4: the fleet's tasks and contradicting histograms, as --expect says
            assert msgspec.to_builtins(got.by_task) == want["by_task"] and want["by_task"], batch_id
            assert got.tokens_per_verify_by_budget == want["tokens_per_verify_by_budget"], batch_id
            # revision 5: the fleet's draft lags and the spread, as --expect says
            assert msgspec.to_builtins(got.by_draft_lag) == want["by_draft_lag"] and want["by_draft_lag"], batch_id
            assert got.tokens_per_verify_distribution == want["tokens_per_verify_distribution"], batch_id
    finally:
        d.close()


def test_replay_equals_aggregate_including_sglang_outputs(kafka_bootstrap, tmp_path):
    from .support.sglang_meta_info import RESUMED, SGLANG_OUTPUTS

    lines = []
    for i, (_version, (meta_info, _)) in enumerate(sorted(SGLANG_OUTPUTS.items())):
        lines.append(
            {
                "meta_info": dict(meta_info, id=f"req-{i}"),
                "batch_id": "replay-b1",
                "session_id": f"sess-{i % 2}",
                "sample_id": "t0",
                "producer_id": "w0",
                "task": ("gsm8k", "chat")[i % 2],  # the prompt's dataset, named by the dump line
                "draft_lag": i % 3,  # revision 5: the draft's lag, named by the dump line too
            }
        )
    lines.append({"attempts": RESUMED[0], "batch_id": "replay-b1", "session_id": "sess-9", "producer_id": "w1"})
    lines.append(
        {
            "batch_id": "replay-b1",
            "session_id": "sess-0",
            "generation_id": "req-0",
            "sample_id": "t1",
            "accepted": 1,
            "producer_id": "w1",
        }
    )  # conflicts with req-0 of the 0.5.11 output
    lines.append({"batch_id": "replay-b2", "session_id": "s", "generation_id": "g", "accepted": -1})  # invalid
    lines.append({"batch_id": "replay-b2", "session_id": "s", "generation_id": "g2", "accepted": 2, "proposed": 3})
    lines.append(
        {
            "type": "marker",
            "batch_id": "replay-b1",
            "producer_id": "w0",
            "speculative_algorithm": "EAGLE3",
            "expected_producers": 2,
        }
    )
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))

    offline = {
        json.loads(line)["batch_id"]: json.loads(line)
        for line in _cli("aggregate", "-q", str(dump)).stdout.decode().splitlines()
    }
    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        d.wait_ready(d.start_worker())
        proc = _cli("replay", str(dump), "--broker", kafka_bootstrap, "--topic", d.topics.records, "--no-progress")
        assert proc.returncode == 0, proc.stderr.decode()
        assert b"closed 2 open batch(es) at the end" in proc.stderr  # w1's share of b1, and b2
        latest = _wait_complete(d, set(offline))
        for batch_id, want in offline.items():
            assert_metrics_equal(latest[batch_id].metrics, want["metrics"], batch_id)
            assert latest[batch_id].invalid_record_count == want["invalid_record_count"]
            assert latest[batch_id].complete and latest[batch_id].missing_record_count == 0
            assert msgspec.to_builtins(latest[batch_id].by_task) == want["by_task"], batch_id
            assert msgspec.to_builtins(latest[batch_id].by_draft_lag) == want["by_draft_lag"], batch_id
            spread = latest[batch_id].tokens_per_verify_distribution
            assert spread == want["tokens_per_verify_distribution"], batch_id
        assert latest["replay-b1"].metrics["spec/conflicting_generation_count"] == 1
        assert [e.task for e in latest["replay-b1"].by_task] == ["chat", "gsm8k", None]
        lags = [e.draft_lag for e in latest["replay-b1"].by_draft_lag]
        assert lags[-1] is None and lags[:-1] == sorted(lags[:-1]) and len(lags) >= 3, lags
    finally:
        d.close()


def _generations_once_marked(address: str, topic: str, *, markers: int) -> set[str]:
    """The generation ids of every record in ``topic`` once ``markers`` batch markers
    are there (a producer sends its marker after its records are acknowledged)."""
    messages = asyncio.run(
        read_topic(
            address,
            topic,
            until=lambda ms: sum(1 for m in ms if decode_records_message(m.value).marker) == markers,
            timeout_s=60,
        )
    )
    return {r.generation_id for m in messages for r in decode_records_message(m.value).records}


def test_queue_bound_while_the_broker_is_away(tmp_path, unique_name):
    """publish keeps returning until the bound, then raises the documented error; nothing
    accepted is lost once the broker is back. Uses a private broker it can stop."""
    # tied to this test run: a run killed meanwhile takes the private broker along
    env = tied_to_me({**os.environ, "SPECMETER_KAFKA_DIR": str(tmp_path / "kafka")})
    broker = [str(BROKER_SCRIPT)]
    start = subprocess.run([*broker, "start"], env=env, capture_output=True, text=True, timeout=300)
    assert start.returncode == 0, start.stderr
    address = start.stdout.strip().splitlines()[-1]
    topic = unique_name("away")
    records = [
        GenerationRecord(batch_id="b", session_id=f"s{i % 7}", generation_id=f"g{i}", completion=i) for i in range(120)
    ]

    async def run() -> None:
        await create_topic(address, topic, 2)
        settings = PublisherSettings(
            bootstrap_servers=address,
            topic=topic,
            producer_id="p-away",
            max_queued_records=50,
            queue_full_timeout_s=1.0,
            request_timeout_ms=3000,
            retry_backoff_ms=200,
            linger_ms=5,
        )
        async with Publisher(settings) as publisher:
            for record in records[:20]:
                publisher.publish_nowait(record)
            await publisher.flush()
            subprocess.run([*broker, "stop"], env=env, capture_output=True, timeout=120, check=True)
            for record in records[20:70]:  # up to the bound: accepted at once
                t0 = time.monotonic()
                publisher.publish_nowait(record)
                assert time.monotonic() - t0 < 0.05
            with pytest.raises(QueueFullError, match="max_queued_records=50"):
                publisher.publish_nowait(records[70])
            t0 = time.monotonic()
            with pytest.raises(QueueFullError):
                await publisher.publish(records[70])
            assert 0.9 < time.monotonic() - t0 < 5
            restart = await asyncio.to_thread(
                subprocess.run, [*broker, "start"], env=env, capture_output=True, text=True, timeout=300
            )
            assert restart.returncode == 0, restart.stderr
            assert restart.stdout.strip().splitlines()[-1] == address, "same address after a restart"
            await asyncio.wait_for(publisher.flush(), 120)
            assert publisher.queued == 0
            for record in records[70:]:
                await publisher.publish(record)
            await publisher.close_batch("b")

    try:
        asyncio.run(run())
        got = _generations_once_marked(address, topic, markers=2)
        assert got == {r.generation_id for r in records}, "every accepted record arrived"
    finally:
        subprocess.run([*broker, "stop", "--purge"], env=env, capture_output=True, timeout=120)


@pytest.mark.slow
def test_sends_that_timed_out_through_a_broker_restart_are_delivered_after_it(private_broker, tmp_path):
    """Batches that time out while the broker is away are sent again once it is back. The
    idempotent producer gave the resends new sequence numbers while the broker had never
    seen the old ones: every later send to those partitions was refused as out of order,
    forever, and the open batch closed incomplete. A renewed producer (new producer id)
    delivers them; nothing accepted is lost."""
    broker = private_broker
    address = broker.start()
    topic = "restart-" + tmp_path.name[-8:]
    sent = 400

    async def run() -> dict:
        await create_topic(address, topic, 4)
        settings = PublisherSettings(
            bootstrap_servers=address, topic=topic, producer_id="p", request_timeout_ms=1500, retry_backoff_ms=100
        )
        async with Publisher(settings, linger_ms=1) as publisher:
            for i in range(sent):
                if i == 100:
                    await asyncio.to_thread(broker.stop)
                if i == 300:
                    await asyncio.to_thread(broker.start)
                publisher.publish_nowait(
                    GenerationRecord(batch_id="b", session_id=f"s{i}", generation_id=f"g{i}", completion=i)
                )
                await asyncio.sleep(0.01 if i < 100 or i >= 300 else 0.03)  # records keep coming meanwhile
            await asyncio.wait_for(publisher.flush(), 90)
            await publisher.close_batch("b")
            return dict(publisher.stats)

    stats = asyncio.run(run())
    generations = _generations_once_marked(address, topic, markers=4)
    assert generations == {f"g{i}" for i in range(sent)}, (sent - len(generations), stats)
