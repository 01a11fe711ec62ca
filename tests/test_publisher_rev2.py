"""The publisher and revision 2: a publisher's records are its own, in its run; its
start fails clearly and leaves nothing open; it never creates the records topic."""

from __future__ import annotations

import asyncio
import gc
import socket

import pytest

from specmeter.producers import (
    BrokerUnavailableError,
    Publisher,
    PublisherError,
    PublisherSettings,
    TopicMissingError,
    plain_bootstrap,
)
from specmeter.schemas import BatchMarker, GenerationRecord, decode_records_message

from .support.kafka_helpers import create_topic, read_topic


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("given", "plain"),
    [
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://a:1, kafka://b:2/", "a:1,b:2"),
        ("KAFKA://a:1,b:2", "a:1,b:2"),
    ],
)
def test_faust_style_addresses_are_accepted(given, plain):
    assert plain_bootstrap(given) == plain


@pytest.mark.parametrize("given", ["http://a:1", "", " , "])
def test_other_addresses_are_refused_with_a_hint(given):
    with pytest.raises(ValueError, match="KAFKA_BOOTSTRAP_SERVERS"):
        plain_bootstrap(given)


def test_start_without_a_broker_fails_clearly_and_leaves_nothing_open(recwarn):
    port = _closed_port()

    async def run():
        publisher = Publisher(PublisherSettings(bootstrap_servers=f"kafka://127.0.0.1:{port}", topic="t"))
        with pytest.raises(BrokerUnavailableError, match=f"no Kafka broker answers at 127.0.0.1:{port}") as info:
            await asyncio.wait_for(publisher.start(), 30)
        assert "KAFKA_BOOTSTRAP_SERVERS" in str(info.value) and "\n" not in str(info.value)
        assert isinstance(info.value, PublisherError)

    asyncio.run(run())
    gc.collect()
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]


@pytest.mark.kafka
def test_the_publisher_never_creates_the_records_topic(kafka_bootstrap, unique_name):
    from aiokafka.admin import AIOKafkaAdminClient

    topic = unique_name("missing")

    async def run():
        publisher = Publisher(PublisherSettings(bootstrap_servers=kafka_bootstrap, topic=topic))
        with pytest.raises(TopicMissingError, match="specmeter worker --partitions N"):
            await publisher.start()
        await asyncio.sleep(1.0)  # an auto-creation would have happened by now
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    assert topic not in asyncio.run(run())


@pytest.mark.kafka
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_records_and_markers_name_the_publishers_producer_and_run(kafka_bootstrap, unique_name, pack):
    topic = unique_name("records")
    records = [
        GenerationRecord(batch_id="step-1", session_id=f"s{i}", generation_id="g", accepted=1, proposed=2)
        for i in range(12)
    ]

    async def run():
        await create_topic(kafka_bootstrap, topic, 4)
        settings = PublisherSettings(
            bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="worker-7", run_id="attempt-2", pack=pack
        )
        async with Publisher(settings) as publisher:
            for record in records:
                publisher.publish_nowait(record)
            with pytest.raises(PublisherError, match="one Publisher publishes one run"):
                publisher.publish_nowait(
                    GenerationRecord(batch_id="step-1", session_id="s", generation_id="x", run_id="attempt-1")
                )
            await publisher.close_batch("step-1", speculative_algorithm="EAGLE")
        # markers follow every record's acknowledgement: once all four are read, so is the rest
        return await read_topic(
            kafka_bootstrap,
            topic,
            until=lambda ms: sum(decode_records_message(m.value).marker is not None for m in ms) >= 4,
        )

    messages = asyncio.run(run())
    markers, seen = [], 0
    for message in messages:
        decoded = decode_records_message(message.value)
        if decoded.marker is not None:
            markers.append(decoded.marker)
            continue
        for record in decoded.records:
            seen += 1
            # whose it is: its own fields, or the envelope's
            assert (record.producer_id or decoded.producer_id) == "worker-7"
            assert (record.run_id or decoded.run_id) == "attempt-2"
    assert seen == len(records)
    assert len(markers) == 4 and all(isinstance(m, BatchMarker) and m.run_id == "attempt-2" for m in markers)
    assert sum(m.records_sent for m in markers) == len(records)
