"""The worker's ordered producer and a route's chunking (issue #16).

Faust's producer handed its buffer to Kafka one message per event-loop turn, so
a partial waited behind every changelog write queued before it; the worker's
own producer must hand a whole queue over at once, keep the order of ``send``
per partition, and say when Kafka refuses a message.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from specmeter.streams.delivery.output import OrderedProducer
from specmeter.streams.delivery.routes import split_chunk

from .support.kafka_helpers import create_topic, read_topic


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "first"),
    [
        ([10, 10, 10], 100, 3),  # all fit
        ([10, 10, 10], 20, 2),  # the message that reaches the bound ends the chunk
        ([500, 10], 100, 1),  # one message larger than the bound is a chunk of its own
        ([10], 1, 1),  # never an empty chunk
    ],
)
def test_a_chunk_is_bounded_by_bytes_and_never_empty(sizes, max_bytes, first):
    messages = [(offset, b"x" * size) for offset, size in enumerate(sizes)]
    chunk, rest = split_chunk(messages, max_bytes)
    assert chunk == messages[:first] and rest == messages[first:]


@pytest.mark.kafka
def test_writes_are_stalled_from_the_first_unacknowledged_one_until_kafka_answers(kafka_bootstrap, unique_name):
    """What readiness reads (issue 33): how long writes have waited with none acknowledged."""
    topic = unique_name("out-stall")
    asyncio.run(create_topic(kafka_bootstrap, topic, 1))

    async def run() -> None:
        out = OrderedProducer(on_failed=lambda topic, exc: None, bootstrap_servers=kafka_bootstrap, acks="all")
        assert out.stalled_s(time.monotonic() + 100) == 0.0, "nothing waits"
        out.send(topic, b"k", b"v")  # queued: nothing takes it before the producer connects
        await asyncio.sleep(0.3)
        assert out.stalled_s(time.monotonic()) >= 0.3
        await out.start()
        await out.flush()
        assert out.stalled_s(time.monotonic() + 100) == 0.0, "acknowledged: nothing waits any more"
        await out.stop()

    asyncio.run(run())


@pytest.mark.kafka
def test_sends_keep_their_order_per_partition_and_flush_waits_for_kafka(kafka_bootstrap, unique_name):
    topic_a, topic_b = unique_name("out-a"), unique_name("out-b")
    asyncio.run(create_topic(kafka_bootstrap, topic_a, 3))
    asyncio.run(create_topic(kafka_bootstrap, topic_b, 1))
    failures: list = []

    async def run() -> None:
        out = OrderedProducer(
            on_failed=lambda topic, exc: failures.append((topic, exc)),
            bootstrap_servers=kafka_bootstrap,
            acks="all",
            linger_ms=0,
        )
        out.send(topic_a, b"k", b"before-start", 0)  # queued until the producer connects
        await out.start()
        for i in range(3000):
            out.send(topic_a, None, f"{i}".encode(), i % 3)
            if i % 100 == 0:
                out.send(topic_b, b"k", f"b{i}".encode())
        await out.flush()
        await out.stop()
        await out.stop()  # idempotent

    asyncio.run(run())
    assert failures == []
    # flush returned: everything is on the broker already, in the order sent per partition
    got = asyncio.run(read_topic(kafka_bootstrap, topic_a, until=lambda ms: len(ms) >= 3001, timeout_s=20))
    by_partition: dict[int, list[bytes]] = {}
    for message in got:
        by_partition.setdefault(message.partition, []).append(message.value)
    assert by_partition[0][0] == b"before-start"
    for p in range(3):
        values = [v for v in by_partition[p] if v != b"before-start"]
        assert values == [f"{i}".encode() for i in range(p, 3000, 3)]
    got_b = asyncio.run(read_topic(kafka_bootstrap, topic_b, until=lambda ms: len(ms) >= 30, timeout_s=20))
    assert [m.value for m in got_b] == [f"b{i}".encode() for i in range(0, 3000, 100)]


@pytest.mark.kafka
def test_a_queue_is_handed_to_kafka_in_a_few_loop_turns_not_one_per_message(kafka_bootstrap, unique_name):
    """The regression of #16: with one hand-over per loop turn, a partial queued behind
    a few hundred changelog writes waited a few hundred turns of a busy worker."""
    topic = unique_name("out")
    asyncio.run(create_topic(kafka_bootstrap, topic, 4))

    async def run() -> int:
        out = OrderedProducer(on_failed=lambda topic, exc: None, bootstrap_servers=kafka_bootstrap, acks="all")
        await out.start()
        try:
            for i in range(4):  # metadata and leaders known (a first send to a topic waits for them)
                out.send(topic, None, b"warm", i)
            await out.flush()
            for i in range(500):
                out.send(topic, None, b"x" * 100, i % 4)
            turns = 0
            while out.pending and turns < 50:
                await asyncio.sleep(0)
                turns += 1
            await out.flush()
            return turns
        finally:
            await out.stop()

    assert asyncio.run(run()) <= 3


@pytest.mark.kafka
def test_a_message_kafka_refuses_is_reported_with_its_topic(kafka_bootstrap, unique_name):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = unique_name("tiny")

    async def run() -> list:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(topic, num_partitions=1, replication_factor=1, topic_configs={"max.message.bytes": "200"})]
            )
        finally:
            await admin.close()
        failures: list = []
        out = OrderedProducer(
            on_failed=lambda t, exc: failures.append((t, type(exc).__name__)),
            bootstrap_servers=kafka_bootstrap,
            acks="all",
        )
        await out.start()
        out.send(topic, None, b"x" * 5000, 0)
        await out.flush()
        await out.stop()
        return failures

    assert asyncio.run(run()) == [(topic, "MessageSizeTooLargeError")]


@pytest.mark.kafka
def test_room_waits_while_more_than_the_limit_is_queued_and_returns_at_half(kafka_bootstrap, unique_name):
    """Back-pressure: a stage that queued more than the limit waits until the producer
    has handed the queue down to half of it; before the producer started it never waits."""
    topic = unique_name("room")
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))

    async def run() -> tuple[int, int, int]:
        out = OrderedProducer(on_failed=lambda t, exc: None, bootstrap_servers=kafka_bootstrap, acks="all")
        for i in range(50):
            out.send(topic, None, b"x" * 10_000, i % 2)
        before_start = out.queued_bytes
        await asyncio.wait_for(out.room(1_000), timeout=1)  # nothing drains the queue yet: no wait
        await out.start()
        try:
            for i in range(200):
                out.send(topic, None, b"y" * 10_000, i % 2)
            queued = out.queued_bytes
            await asyncio.wait_for(out.room(400_000), timeout=20)
            after = out.queued_bytes
            await out.flush()
            assert out.queued_bytes == 0
            return before_start, queued, after
        finally:
            await out.stop()

    before_start, queued, after = asyncio.run(run())
    assert before_start == 500_000
    assert queued == 2_500_000
    assert after <= 200_000


@pytest.mark.kafka
def test_a_keyed_message_goes_where_aiokafka_s_send_puts_it(kafka_bootstrap, unique_name):
    """The producer picks a keyed message's partition itself (``send`` cost O(partitions)
    per message): it must be the partition aiokafka's ``send`` picks, or a batch's partials
    would no longer meet on one partials partition, nor agree with any other client."""
    from aiokafka import AIOKafkaProducer

    ours, theirs = unique_name("keyed-ours"), unique_name("keyed-theirs")
    for topic in (ours, theirs):
        asyncio.run(create_topic(kafka_bootstrap, topic, 7))
    keys = [f"step-{i}".encode() for i in range(200)] + [b"", "ünïcode-batch".encode()]

    async def run() -> list:
        failures: list = []
        out = OrderedProducer(on_failed=lambda t, exc: failures.append(exc), bootstrap_servers=kafka_bootstrap)
        await out.start()
        plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await plain.start()
        try:
            for key in keys:
                out.send(ours, key, key)
                out.send(ours, key, key)  # the second time from what it remembered of the key
                await plain.send(theirs, key, key=key)
            await out.flush()
            await plain.flush()
        finally:
            await out.stop()
            await plain.stop()
        return failures

    assert asyncio.run(run()) == []
    expected = {
        m.key: m.partition
        for m in asyncio.run(read_topic(kafka_bootstrap, theirs, until=lambda ms: len(ms) >= len(keys)))
    }
    got = asyncio.run(read_topic(kafka_bootstrap, ours, until=lambda ms: len(ms) >= 2 * len(keys)))
    assert len(got) == 2 * len(keys) and len(set(expected.values())) == 7
    assert all(m.partition == expected[m.key] for m in got)


@pytest.mark.kafka
def test_partitions_added_to_a_topic_are_used_after_the_next_metadata_refresh(kafka_bootstrap, unique_name):
    """The producer keeps each topic's partition list; a metadata refresh makes it look
    again, as ``send`` would have seen the new partitions."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    topic = unique_name("grows")
    asyncio.run(create_topic(kafka_bootstrap, topic, 1))

    async def run() -> list:
        failures: list = []
        out = OrderedProducer(
            on_failed=lambda t, exc: failures.append(exc), bootstrap_servers=kafka_bootstrap, metadata_max_age_ms=500
        )
        await out.start()
        try:
            out.send(topic, b"before", b"before")
            await out.flush()
            admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
            await admin.start()
            try:
                await admin.create_partitions({topic: NewPartitions(total_count=4)})
            finally:
                await admin.close()
            await asyncio.sleep(2)  # the producer's metadata refreshes every 0.5 s
            for i in range(40):
                out.send(topic, f"after-{i}".encode(), b"after")
            out.send(topic, None, b"explicit", 3)
            await out.flush()
        finally:
            await out.stop()
        return failures

    assert asyncio.run(run()) == []
    got = asyncio.run(read_topic(kafka_bootstrap, topic, until=lambda ms: len(ms) >= 42))
    assert len(got) == 42
    assert {m.partition for m in got if m.value == b"after"} == {0, 1, 2, 3}
    assert [m.partition for m in got if m.value == b"explicit"] == [3]


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("partition", "value", "error", "says"),
    [
        (5, b"to a partition the topic lacks", "ValueError", "no partition 5"),
        (1, b"x" * 20_000, "MessageSizeTooLargeError", "10000"),
    ],
)
def test_a_refused_message_is_reported_and_nothing_after_it_is_sent(
    kafka_bootstrap, unique_name, partition, value, error, says
):
    """A message for a partition the topic lacks, or too large, is reported once; and the
    producer stops there (issue 30, fail fast): the message after it is not sent."""
    topic = unique_name("refused")
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))

    async def run() -> tuple[list, OrderedProducer]:
        failures: list = []
        out = OrderedProducer(
            on_failed=lambda t, exc: failures.append((t, type(exc).__name__, str(exc))),
            bootstrap_servers=kafka_bootstrap,
            max_request_size=10_000,
        )
        await out.start()
        try:
            out.send(topic, b"k", b"before", 1)
            await out.flush()
            out.send(topic, b"k", value, partition)
            out.send(topic, b"k", b"after", 1)
            await out.flush()
            out.send(topic, b"k", b"later", 1)
        finally:
            await out.stop()
        return failures, out

    failures, out = asyncio.run(run())
    assert [(t, kind) for t, kind, _ in failures] == [(topic, error)]
    assert says in failures[0][2] and out.failed is not None
    got = asyncio.run(read_topic(kafka_bootstrap, topic, idle_s=2))
    assert [m.value for m in got] == [b"before"]
