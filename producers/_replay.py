"""``specmeter replay``: publish a saved dump to Kafka as the fleet would have.

Each ``producer_id`` found in the file gets its own publisher, so a marker
line closes that producer's batch exactly as the protocol does (flush, wait
for acknowledgements, marker with per-partition ``records_sent`` to every
partition). Batches still open at the end of the file are closed then.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from specmeter.schemas import BatchMarker, GenerationRecord

from ._dump import parse_dump_line
from ._publisher import Publisher
from ._settings import PublisherSettings

__all__ = ["replay_lines", "ReplaySummary"]

DEFAULT_PRODUCER = "specmeter-replay"
MAX_PRODUCERS = 256


@dataclass
class ReplaySummary:
    records: int = 0
    invalid: int = 0
    markers: int = 0
    batches_closed_at_end: int = 0
    producers: int = 0
    seconds: float = 0.0
    sent_by_batch: dict[str, int] = field(default_factory=dict)


async def replay_lines(
    lines: Iterable[bytes],
    settings: PublisherSettings,
    *,
    rate: float | None = None,
    speculative_algorithm: str | None = None,
    on_line: Callable[[int], None] | None = None,
) -> ReplaySummary:
    """Publish every line; ``rate`` paces records per second. Returns what was sent."""
    publishers: dict[str, Publisher] = {}
    batch_producers: dict[str, set[str]] = defaultdict(set)
    algorithms: dict[str, str] = {}
    summary = ReplaySummary()
    started = time.monotonic()

    async def publisher_for(producer_id: str) -> Publisher:
        publisher = publishers.get(producer_id)
        if publisher is None:
            if len(publishers) >= MAX_PRODUCERS:
                raise RuntimeError(f"more than {MAX_PRODUCERS} producer_ids in the dump")
            publisher = publishers[producer_id] = Publisher(msgspec.structs.replace(settings, producer_id=producer_id))
            await publisher.start()
        return publisher

    try:
        for number, line in enumerate(lines, start=1):
            if on_line is not None:
                on_line(len(line))
            if not line.strip():
                continue
            item = parse_dump_line(line)
            if isinstance(item, GenerationRecord):
                producer = item.producer_id or DEFAULT_PRODUCER
                if item.producer_id is None:  # the replayer is its producer: markers must count it
                    item = msgspec.structs.replace(item, producer_id=producer)
                batch_producers[item.batch_id].add(producer)
                await (await publisher_for(producer)).publish(item)
                summary.records += 1
            elif isinstance(item, BatchMarker):
                if item.speculative_algorithm:
                    algorithms[item.batch_id] = item.speculative_algorithm
                publisher = await publisher_for(item.producer_id)
                await publisher.close_batch(item.batch_id, item.speculative_algorithm or speculative_algorithm,
                                            item.expected_producers)
                summary.markers += 1
            else:
                producer = item.producer_id or DEFAULT_PRODUCER
                if item.batch_id:
                    batch_producers[item.batch_id].add(producer)
                obj = None
                try:
                    obj = msgspec.json.decode(item.raw)
                except msgspec.DecodeError:
                    pass
                if isinstance(obj, dict) and not obj.get("producer_id"):
                    obj["producer_id"] = producer
                value = msgspec.msgpack.encode(obj) if obj is not None else item.raw
                session = obj.get("session_id") if isinstance(obj, dict) else None
                (await publisher_for(producer)).publish_raw(
                    value, session_id=session if isinstance(session, str) and session else None,
                    batch_id=item.batch_id)
                summary.invalid += 1
            if rate:
                ahead = (summary.records + summary.invalid) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        for producer_id, publisher in publishers.items():
            for batch_id in publisher.open_batches():
                expected = len(batch_producers.get(batch_id, ())) or 1
                await publisher.close_batch(batch_id, algorithms.get(batch_id, speculative_algorithm), expected)
                summary.batches_closed_at_end += 1
    finally:
        for publisher in publishers.values():
            await publisher.stop()
    summary.producers = len(publishers)
    summary.seconds = time.monotonic() - started
    return summary
