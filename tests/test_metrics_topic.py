"""The metrics topic is the durable record of a run (issue 33): it kept the broker's
default retention (a day on the dev broker, a week on most clusters), and a trainer
backfilling a dashboard with ``consume_metrics(from_beginning=True)`` silently got
less than the run. The worker now creates it compacted on ``(run_id, batch_id)``:
past any time retention, the newest revision of every batch of every run is there.

The broker here runs its retention check and its log cleaner every half second, and
the topic gets a retention of one second and segments of half a second: on a topic
that deletes by time, everything but the last segment would be gone within seconds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from specmeter.schemas import GenerationRecord, decode_metrics, encode_metrics_key

from .support.kafka_broker import PrivateBroker, local_broker_tools_missing
from .support.kafka_helpers import create_topic, read_topic
from .support.worker_harness import Deployment, latest_by_batch

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BATCHES = [f"step-{i}" for i in range(1, 6)]

#: what time passing looks like, in seconds: retention checked and logs cleaned every half second
FAST_RETENTION = (
    "log.retention.check.interval.ms=500 log.cleaner.backoff.ms=500 log.segment.delete.delay.ms=0 "
    "log.cleaner.min.compaction.lag.ms=0"
)


def test_the_key_names_the_run_and_the_batch():
    assert encode_metrics_key("grpo-7", "step-12") == b'["grpo-7","step-12"]'
    assert encode_metrics_key(None, "step-12") == b'[null,"step-12"]'
    assert encode_metrics_key("a", "step-1") != encode_metrics_key("b", "step-1")
    assert encode_metrics_key("a,b", "c") != encode_metrics_key("a", "b,c"), "no separator to confuse"


@pytest.fixture
def fast_retention_broker(tmp_path):
    missing = local_broker_tools_missing()
    if missing:
        pytest.skip(missing)
    broker = PrivateBroker(tmp_path / "broker", SPECMETER_KAFKA_OVERRIDES=FAST_RETENTION)
    yield broker
    broker.stop(purge=True)


async def _time_passes(bootstrap: str, topic: str) -> None:
    """A retention of one second and segments of half a second on ``topic``, keeping the
    settings the worker created it with (AlterConfigs replaces a topic's settings whole)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from specmeter.streams.worker.topics import topic_configs

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        kept = (await topic_configs(admin, [topic], ("cleanup.policy", "max.message.bytes")))[topic]
        fast = {"retention.ms": "1000", "segment.ms": "500", "min.cleanable.dirty.ratio": "0.01"}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {**kept, **fast})])
    finally:
        await admin.close()


async def _publish(bootstrap: str, topic: str, run_id: str, batches: list[str], *, late: bool = False) -> None:
    """Three generations per batch and its marker; ``late``: one more generation per
    batch, after it closed (within grace: a new revision)."""
    from specmeter.producers import Publisher, PublisherSettings

    settings = PublisherSettings(bootstrap_servers=bootstrap, topic=topic, producer_id="p", run_id=run_id)
    async with Publisher(settings) as publisher:
        for batch_id in batches:
            for i in (9,) if late else range(3):
                publisher.publish_nowait(
                    GenerationRecord(
                        batch_id=batch_id, session_id=f"s{i}", generation_id=f"g{i}", accepted=i, proposed=4
                    )
                )
            if not late:
                await publisher.close_batch(batch_id, "EAGLE3", 1)


def _revisions(d: Deployment, want: dict[tuple[str, str], int], timeout_s: float = 90) -> None:
    """Until the metrics topic has each (run, batch) at ``want``'s revision (or later)."""

    def done(published) -> bool:
        have = {(m.run_id, m.batch_id): m.revision for m in published}
        return all(have.get(key, -1) >= revision for key, revision in want.items())

    published = d.metrics(until=done, timeout_s=timeout_s)
    assert done(published), (want, [(m.run_id, m.batch_id, m.revision) for m in published], d.log_tail())


def test_a_reader_after_the_retention_still_gets_the_newest_revision_of_every_batch(fast_retention_broker):
    from specmeter.streams import consume_metrics_sync

    bootstrap = fast_retention_broker.start()
    d = Deployment(bootstrap, grace_s=120.0, batch_timeout_s=60.0)
    asyncio.run(create_topic(bootstrap, d.topics.records, d.partitions))
    worker = d.start_worker()
    try:
        d.wait_ready(worker)  # it created the metrics topic
        asyncio.run(_time_passes(bootstrap, d.topics.metrics))

        # run a: every batch, then a late generation for each (revision 1)
        asyncio.run(_publish(bootstrap, d.topics.records, "run-a", BATCHES))
        _revisions(d, {("run-a", b): 0 for b in BATCHES})
        asyncio.run(_publish(bootstrap, d.topics.records, "run-a", BATCHES, late=True))
        _revisions(d, {("run-a", b): 1 for b in BATCHES})
        # run b, restarted from a checkpoint: the same batch ids, published after run a's
        asyncio.run(_publish(bootstrap, d.topics.records, "run-b", BATCHES))
        _revisions(d, {("run-b", b): 0 for b in BATCHES})
        published = d.metrics(idle_s=1.0)
        newest = {(m.run_id, m.batch_id): m for m in published}  # the topic's order: the newest last
        # a last batch, a moment later, rolls the segment that holds the others
        time.sleep(1.5)
        asyncio.run(_publish(bootstrap, d.topics.records, "run-c", ["step-1"]))
        _revisions(d, {("run-c", "step-1"): 0})

        # the broker cleans: on this topic it compacts away the older revisions (on one
        # that deleted by time it would delete every closed segment)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = asyncio.run(read_topic(bootstrap, d.topics.metrics, idle_s=1.0, timeout_s=20))
            if len(left) < len(published):
                break
            time.sleep(1.0)
        assert len(left) < len(published), "the broker never cleaned the topic: nothing was proved"
        assert all(m.key == encode_metrics_key(*decode_key(m.value)) for m in left), "keyed by (run, batch)"

        # a trainer backfilling its dashboard after the retention has passed
        for run in ("run-a", "run-b"):
            got = list(
                consume_metrics_sync(
                    bootstrap, topic=d.topics.metrics, run_id=run, from_beginning=True, stop_at_end=True
                )
            )
            assert {m.batch_id: m.revision for m in got} == dict.fromkeys(BATCHES, 1 if run == "run-a" else 0), run
            assert got == [newest[(run, m.batch_id)] for m in got], "each batch's newest revision, as published"
            assert latest_by_batch(got).keys() == set(BATCHES)
    finally:
        d.close()


def decode_key(value: bytes) -> tuple[str | None, str]:
    m = decode_metrics(value)
    return m.run_id, m.batch_id
