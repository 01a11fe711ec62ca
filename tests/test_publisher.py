"""The publisher against a real broker: placement, markers, packing, sync facade."""

from __future__ import annotations

import asyncio

import pytest

from specmeter.producers import Publisher, PublisherSettings, SyncPublisher, partition_for_key
from specmeter.producers._errors import PublisherNotStartedError
from specmeter.schemas import GenerationRecord, decode_records_message

from .support.kafka_helpers import create_topic, read_topic

# Kafka's own Java murmur2 (org.apache.kafka.common.utils.UtilsTest#testMurmur2), as signed ints.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "java"), JAVA_MURMUR2.items())
def test_partitioner_matches_java_murmur2(key, java):
    for partitions in (1, 4, 7, 12):
        assert partition_for_key(key, partitions) == (java & 0x7FFFFFFF) % partitions


def test_publish_before_start_says_what_to_do():
    publisher = Publisher(PublisherSettings())
    with pytest.raises(PublisherNotStartedError, match="start"):
        publisher.publish_nowait(GenerationRecord(batch_id="b", session_id="s", generation_id="g"))


def _records(batch_id: str, sessions: int, per_session: int) -> list[GenerationRecord]:
    return [
        GenerationRecord(
            batch_id=batch_id,
            session_id=f"session-{s}",
            generation_id=f"g{g}",
            accepted=g,
            proposed=g + 1,
            producer_id="p-test",
        )
        for s in range(sessions)
        for g in range(per_session)
    ]


@pytest.mark.kafka
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_records_land_where_kafka_partitioner_puts_their_key_and_markers_follow(kafka_bootstrap, unique_name, pack):
    from aiokafka.partitioner import DefaultPartitioner

    topic = unique_name("records")
    records = _records("b1", sessions=40, per_session=5)

    async def run():
        await create_topic(kafka_bootstrap, topic, 4)
        settings = PublisherSettings(
            bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="p-test", pack=pack, max_message_bytes=2048
        )
        async with Publisher(settings) as publisher:
            for record in records:
                publisher.publish_nowait(record)
            sent = await publisher.close_batch("b1", speculative_algorithm="NGRAM", expected_producers=2)
        messages = await read_topic(
            kafka_bootstrap, topic, until=lambda m: sum(1 for x in m if decode_records_message(x.value).marker) == 4
        )
        return sent, messages

    sent, messages = asyncio.run(run())
    partitioner = DefaultPartitioner()
    seen_per_partition = dict.fromkeys(range(4), 0)
    marker_offsets = {}
    for message in messages:
        decoded = decode_records_message(message.value)
        assert not decoded.invalid
        if decoded.marker:
            marker = decoded.marker
            assert marker.producer_id == "p-test" and marker.expected_producers == 2
            assert marker.speculative_algorithm == "NGRAM"
            assert marker.records_sent == seen_per_partition[message.partition], "marker counts what came before it"
            marker_offsets[message.partition] = message.offset
            continue
        assert message.partition not in marker_offsets, "a record after its partition's marker"
        for record in decoded.records:
            key = record.session_id.encode()
            assert message.partition == partitioner(key, [0, 1, 2, 3], [0, 1, 2, 3])
            seen_per_partition[message.partition] += 1
    assert set(marker_offsets) == {0, 1, 2, 3}, "a marker reaches every partition"
    assert sum(seen_per_partition.values()) == len(records) == sum(sent.values())
    if pack:
        assert len(messages) - 4 < len(records) / 5, "records are packed"


@pytest.mark.kafka
def test_sync_facade(kafka_bootstrap, unique_name):
    topic = unique_name("records")
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))
    records = _records("b2", sessions=10, per_session=3)
    with SyncPublisher(PublisherSettings(bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="p-sync")) as pub:
        for record in records:
            pub.publish(record)
        sent = pub.close_batch("b2", expected_producers=1)
    assert sum(sent.values()) == len(records)
    messages = asyncio.run(
        read_topic(
            kafka_bootstrap, topic, until=lambda m: len([x for x in m if decode_records_message(x.value).marker]) == 2
        )
    )
    got = [r for m in messages for r in decode_records_message(m.value).records]
    assert sorted(got, key=lambda r: (r.session_id, r.generation_id)) == sorted(
        records, key=lambda r: (r.session_id, r.generation_id)
    )


@pytest.mark.kafka
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_sync_facade_publishes_in_its_run(kafka_bootstrap, unique_name, pack):
    """SyncPublisher is a Publisher behind a thread: records without ids are its own, in
    its run (envelope or filled in), and its markers name the run."""
    topic = unique_name("records")
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))
    records = [GenerationRecord(batch_id="b3", session_id=f"s{i}", generation_id="g", completion=i) for i in range(6)]
    settings = PublisherSettings(
        bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="p-sync", run_id="r2", pack=pack
    )
    with SyncPublisher(settings) as pub:
        for record in records:
            pub.publish(record)
        pub.close_batch("b3")
    messages = asyncio.run(
        read_topic(
            kafka_bootstrap, topic, until=lambda m: len([x for x in m if decode_records_message(x.value).marker]) == 2
        )
    )
    decoded = [decode_records_message(m.value) for m in messages]
    got = [(r.run_id or d.run_id, r.producer_id or d.producer_id) for d in decoded for r in d.records]
    assert got == [("r2", "p-sync")] * len(records)
    assert sorted(d.marker.run_id for d in decoded if d.marker) == ["r2", "r2"]
