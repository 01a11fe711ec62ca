"""Records and a marker through a real Kafka topic with aiokafka and the schemas."""

from __future__ import annotations

import asyncio

import pytest

from specmeter.schemas import (
    BatchMarker,
    GenerationRecord,
    RecordBatch,
    decode_records_message,
    encode_records_message,
)

pytestmark = pytest.mark.kafka


def test_records_and_marker_roundtrip(kafka_bootstrap, new_topic, unique_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = new_topic(partitions=4)
    record = GenerationRecord(
        batch_id="b1",
        session_id="s1",
        generation_id="g1",
        accepted=3,
        proposed=4,
        verify=2,
        completion=7,
        accept_histogram=[0, 1, 1],
        producer_id="p0",
    )
    packed = RecordBatch(
        records=[
            record,
            GenerationRecord(batch_id="b1", session_id="s1", generation_id="g2", sample_id="t1", completion=5),
        ],
        producer_id="p0",
    )
    marker = BatchMarker(batch_id="b1", producer_id="p0", records_sent=3, speculative_algorithm="EAGLE3")
    sent = [record, packed, marker]

    async def run() -> list:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            for message in sent:
                await producer.send_and_wait(topic, encode_records_message(message), key=b"s1")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=unique_name("g"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        received = []
        try:
            async with asyncio.timeout(30):
                while len(received) < len(sent):
                    for messages in (await consumer.getmany(timeout_ms=1000)).values():
                        received.extend(messages)
        finally:
            await consumer.stop()
        return received

    received = asyncio.run(run())
    assert len({m.partition for m in received}) == 1, "one key, one partition"
    decoded = [decode_records_message(m.value) for m in received]
    assert decoded[0].records == [record] and not decoded[0].invalid
    assert decoded[1].records == packed.records and decoded[1].producer_id == "p0"
    assert decoded[2].marker == marker and decoded[2].records == []
