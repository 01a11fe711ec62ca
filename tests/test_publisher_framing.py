"""Packed messages: the frame decodes to the RecordBatch it stands for, and a packed
message stays within ``max_message_bytes`` even with ids at their 1024-character limit;
a broker that accepts connections but never answers fails ``start()`` in bounded time."""

from __future__ import annotations

import asyncio
import gc
import time

import msgspec
import pytest

from specmeter.producers import BrokerUnavailableError, Publisher, PublisherSettings
from specmeter.producers._framing import frame_batch, frame_overhead
from specmeter.schemas import MAX_ID, GenerationRecord, RecordBatch, decode_records_message, encode_records_message

from .support.kafka_helpers import create_topic, read_topic

RECORDS = [
    GenerationRecord(batch_id="b", session_id=f"s{i}", generation_id=f"g{i}", accepted=i, proposed=i + 1)
    for i in range(40)
]


@pytest.mark.parametrize("count", [0, 1, 15, 16, 40])
@pytest.mark.parametrize(
    ("producer_id", "run_id"), [("w", None), ("w", "attempt-2"), ("p" * MAX_ID, "r" * MAX_ID), (None, None)]
)
def test_frame_is_the_record_batch_and_its_overhead_is_exact_or_less(count, producer_id, run_id):
    encoded = [encode_records_message(r) for r in RECORDS[:count]]
    framed = frame_batch(encoded, producer_id, run_id)
    assert msgspec.msgpack.decode(framed, type=RecordBatch) == RecordBatch(
        records=RECORDS[:count], producer_id=producer_id, run_id=run_id
    )
    assert len(framed) - sum(map(len, encoded)) <= frame_overhead(producer_id, run_id)
    decoded = decode_records_message(framed)
    assert (decoded.producer_id, decoded.run_id, len(decoded.records)) == (producer_id, run_id, count)


@pytest.mark.kafka
def test_packed_messages_stay_within_max_message_bytes_with_the_longest_ids(kafka_bootstrap, unique_name):
    """Regression: the frame's ids were not counted, so with 1024-character producer
    and run ids a packed message overshot ``max_message_bytes`` by about 2 KiB."""
    topic = unique_name("records")
    limit = 4096
    records = [
        GenerationRecord(batch_id="b", session_id="s", generation_id=f"g{i:04d}", accepted=i, proposed=i)
        for i in range(400)
    ]

    async def run():
        await create_topic(kafka_bootstrap, topic, 1)
        settings = PublisherSettings(
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            producer_id="p" * MAX_ID,
            run_id="r" * MAX_ID,
            max_message_bytes=limit,
        )
        async with Publisher(settings) as publisher:
            for record in records:
                publisher.publish_nowait(record)
            await publisher.flush()
        return await read_topic(
            kafka_bootstrap,
            topic,
            until=lambda ms: sum(len(decode_records_message(m.value).records) for m in ms) >= len(records),
        )

    messages = asyncio.run(run())
    assert sum(len(decode_records_message(m.value).records) for m in messages) == len(records)
    assert len(messages) > 1, "the records span several messages"
    assert max(len(m.value) for m in messages) <= limit


def test_start_against_a_broker_that_never_answers_fails_in_bounded_time(recwarn):
    """A port that accepts connections and stays silent (a wrong service, a hung
    broker): ``start()`` gives up after about ``request_timeout_ms`` per address,
    with the one-line error, and leaves no producer open."""

    async def run() -> float:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # until the client hangs up
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        publisher = Publisher(
            PublisherSettings(bootstrap_servers=f"127.0.0.1:{port}", topic="t", request_timeout_ms=1500)
        )
        t0 = time.monotonic()
        try:
            with pytest.raises(BrokerUnavailableError, match=f"no Kafka broker answers at 127.0.0.1:{port}") as info:
                await asyncio.wait_for(publisher.start(), 30)
        finally:
            server.close()
            await server.wait_closed()
        assert "KAFKA_BOOTSTRAP_SERVERS" in str(info.value) and "\n" not in str(info.value)
        return time.monotonic() - t0

    elapsed = asyncio.run(run())
    assert elapsed < 10, f"start() took {elapsed:.1f}s against a silent port"
    gc.collect()
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]
