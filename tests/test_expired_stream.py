"""Late for the whole life of a run, through a real worker (issue 21, SPEC §4 Late records).

More batches than the 10,000 a partition's checkpoint used to remember go through one
worker with a short grace; then stragglers for the first batches -- a rollout worker
that was stuck and flushed its buffer -- are dead-lettered ``late``, before and after
the worker is killed and restarted, and no second revision 0 is ever published
(identical repeats of the one there is aside: a restart may repeat a publication).
Before, the first batch was published again as a revision 0 of its own, then revision 1.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from specmeter.schemas import BatchMarker, GenerationRecord, decode_dead_letter, decode_metrics, encode_records_message

from .support.kafka_helpers import create_topic
from .support.worker_harness import Deployment

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: past the 10,000 ids the old checkpoint held
BATCHES = 10_200


def _batch_id(i: int) -> str:
    return f"step-{i:05d}"


def _messages(i: int, session: str = "s", producer: str = "p") -> list[bytes]:
    record = GenerationRecord(
        batch_id=_batch_id(i), session_id=session, generation_id="g", accepted=1, proposed=2, producer_id=producer
    )
    marker = BatchMarker(batch_id=_batch_id(i), producer_id=producer, records_sent=1, expected_producers=1)
    return [encode_records_message(record), encode_records_message(marker)]


async def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        for value in values:
            await producer.send(topic, value, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


class _Reader:
    """Follows a topic from its beginning (one consumer, kept)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.values: list[bytes] = []

    async def read_until(self, done, timeout_s: float, idle_s: float | None = None) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap, group_id=None, auto_offset_reset="earliest"
        )
        await consumer.start()
        self.values = []
        deadline = last_new = time.monotonic()
        deadline += timeout_s
        try:
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                for messages in batch.values():
                    self.values.extend(m.value for m in messages)
                if batch:
                    last_new = time.monotonic()
                if done():
                    return
                if idle_s is not None and time.monotonic() - last_new > idle_s:
                    return
        finally:
            await consumer.stop()


def test_stragglers_for_batches_long_expired_are_late_before_and_after_a_restart(kafka_bootstrap):
    d = Deployment(kafka_bootstrap, partitions=1, batch_timeout_s=30.0, grace_s=1.0)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        values = [v for i in range(BATCHES) for v in _messages(i)]
        asyncio.run(_send(kafka_bootstrap, d.topics.records, values))
        worker = d.start_worker()
        d.wait_ready(worker)
        metrics = _Reader(kafka_bootstrap, d.topics.metrics)

        def revisions() -> dict[str, dict[int, set[bytes]]]:
            """batch -> revision -> the distinct messages published for it"""
            out: dict[str, dict[int, set[bytes]]] = {}
            for value in metrics.values:
                m = decode_metrics(value)
                out.setdefault(m.batch_id, {}).setdefault(m.revision, set()).add(value)
            return out

        asyncio.run(metrics.read_until(lambda: len(metrics.values) >= BATCHES, timeout_s=240))
        assert len(revisions()) == BATCHES, f"{len(revisions())} of {BATCHES} batches published\n{d.log_tail()}"
        time.sleep(3.0)  # grace is 1 s: every batch has expired, the first 10,000 batches ago

        letters = _Reader(kafka_bootstrap, d.topics.deadletter)

        def late_for(i: int) -> int:
            decoded = [decode_dead_letter(v) for v in letters.values]
            return sum(x.reason == "late" and x.batch_id == _batch_id(i) for x in decoded)

        asyncio.run(_send(kafka_bootstrap, d.topics.records, _messages(0, session="stuck", producer="stuck")))
        asyncio.run(letters.read_until(lambda: late_for(0) >= 2, timeout_s=60))
        assert late_for(0) == 2, f"the straggler's record and marker must be late\n{d.log_tail()}"

        # a restarted worker knows every expired batch at once (restored from the changelog)
        d.kill(worker)
        worker = d.start_worker()
        d.wait_ready(worker)
        asyncio.run(_send(kafka_bootstrap, d.topics.records, _messages(1, session="stuck", producer="stuck")))
        asyncio.run(letters.read_until(lambda: late_for(1) >= 2, timeout_s=90))
        assert late_for(1) == 2, d.log_tail()

        asyncio.run(metrics.read_until(lambda: False, timeout_s=30, idle_s=3.0))
        published = revisions()
        assert len(published) == BATCHES
        for i in (0, 1):
            # identical repeats of a publication are allowed (a restart may repeat it); a
            # reopened batch would publish a revision 0 of its own, or a revision 1
            by_revision = published[_batch_id(i)]
            assert list(by_revision) == [0] and len(by_revision[0]) == 1, f"batch {i} opened again: {by_revision}"
    finally:
        d.close()
