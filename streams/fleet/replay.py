"""A saved dump published to Kafka as the fleet would have (``specmeter replay``, the demo).

Each ``producer_id`` (per run) found in the file gets its own publisher, so a
marker line closes that producer's batch exactly as the protocol does (flush,
wait for acknowledgements, marker with per-partition ``records_sent`` to every
partition). Batches still open at the end of the file are closed then. A line
that names no ``run_id`` belongs to ``settings.run_id``'s run; a batch is
``(run_id, batch_id)``, so two runs' ``step-3`` are two batches.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import BatchMarker, GenerationRecord

from .dumps import dump_lines, parse_dump_line

__all__ = ["replay_lines", "ReplaySummary"]

DEFAULT_PRODUCER = "specmeter-replay"
MAX_PRODUCERS = 256


#: lines read between two yields to the event loop, so Ctrl-C (a cancellation) lands at once
YIELD_EVERY_LINES = 256
#: on Ctrl-C, how long the publishers may take to deliver what they had accepted
STOP_AFTER_INTERRUPT_S = 10.0


@dataclass
class ReplaySummary:
    """What a replay sent; filled in as it goes, so a caller still has it after Ctrl-C."""

    records: int = 0
    invalid: int = 0
    markers: int = 0
    batches_closed_at_end: int = 0
    producers: int = 0
    seconds: float = 0.0
    #: records and invalid lines Kafka acknowledged (known once the publishers stopped)
    acknowledged: int = 0
    #: the replay was cancelled (Ctrl-C) before the end of the file
    interrupted: bool = False
    #: (run_id, batch_id) of batches with input sent but not every producer's marker:
    #: the worker closes them only by timeout, as incomplete (filled when interrupted)
    half_sent: list[tuple[str | None, str]] = field(default_factory=list)


async def replay_lines(
    lines: Iterable[bytes],
    settings: PublisherSettings,
    *,
    rate: float | None = None,
    speculative_algorithm: str | None = None,
    on_line: Callable[[int], None] | None = None,
    summary: ReplaySummary | None = None,
) -> ReplaySummary:
    """Publish every line; ``rate`` paces records per second. Returns what was sent.

    ``summary`` is filled in place (pass one to still have it after a cancellation:
    then ``interrupted`` is set and ``half_sent`` names the batches left without
    their markers). Cancelled, the publishers still deliver what they had accepted
    (up to ``STOP_AFTER_INTERRUPT_S``) and send no marker.
    """
    publishers: dict[tuple[str, str | None], Publisher] = {}
    batch_producers: dict[tuple[str | None, str], set[str]] = defaultdict(set)
    algorithms: dict[tuple[str | None, str], str] = {}
    #: producers whose marker was sent (acknowledged), and the producers the markers expect, per batch
    marked: dict[tuple[str | None, str], set[str]] = defaultdict(set)
    expected_of: dict[tuple[str | None, str], int] = {}
    summary = ReplaySummary() if summary is None else summary
    started = time.monotonic()
    default_run = settings.run_id

    async def publisher_for(producer_id: str, run_id: str | None) -> Publisher:
        publisher = publishers.get((producer_id, run_id))
        if publisher is None:
            if len(publishers) >= MAX_PRODUCERS:
                raise RuntimeError(f"more than {MAX_PRODUCERS} (producer_id, run_id) pairs in the dump")
            publisher = publishers[(producer_id, run_id)] = Publisher(
                msgspec.structs.replace(settings, producer_id=producer_id, run_id=run_id)
            )
            await publisher.start()
        return publisher

    def closed(key: tuple[str | None, str], producer: str, expected: int) -> None:
        marked[key].add(producer)
        expected_of[key] = max(expected_of.get(key, 0), expected)

    def half_sent() -> list[tuple[str | None, str]]:
        keys = dict.fromkeys([*batch_producers, *marked])
        return [
            key
            for key in keys
            if len(marked.get(key, ())) < max(expected_of.get(key, 0), len(batch_producers.get(key, ())), 1)
        ]

    stop_timeout_s = 30.0
    try:
        for number, line in enumerate(dump_lines(lines), start=1):
            if number % YIELD_EVERY_LINES == 0:
                await asyncio.sleep(0)
            if on_line is not None:
                on_line(len(line))
            if not line.strip():
                continue
            item = parse_dump_line(line)
            if isinstance(item, GenerationRecord):
                producer = item.producer_id or DEFAULT_PRODUCER
                run = item.run_id or default_run
                if item.producer_id is None or item.run_id != run:  # the replayer is its producer: markers
                    item = msgspec.structs.replace(item, producer_id=producer, run_id=run)  # must count it
                batch_producers[(run, item.batch_id)].add(producer)
                await (await publisher_for(producer, run)).publish(item)
                summary.records += 1
            elif isinstance(item, BatchMarker):
                run = item.run_id or default_run
                if item.speculative_algorithm:
                    algorithms[(run, item.batch_id)] = item.speculative_algorithm
                publisher = await publisher_for(item.producer_id, run)
                await publisher.close_batch(
                    item.batch_id, item.speculative_algorithm or speculative_algorithm, item.expected_producers
                )
                closed((run, item.batch_id), item.producer_id, item.expected_producers)
                summary.markers += 1
            else:
                producer = item.producer_id or DEFAULT_PRODUCER
                obj = None
                try:
                    obj = msgspec.json.decode(item.raw)
                except msgspec.DecodeError:
                    pass
                run = default_run
                if isinstance(obj, dict):
                    named = obj.get("run_id")
                    if isinstance(named, str) and named:
                        run = named
                    elif named is None and default_run is not None:
                        obj["run_id"] = default_run  # counted in the run it is replayed in
                    if not obj.get("producer_id"):
                        obj["producer_id"] = producer
                if item.batch_id:
                    batch_producers[(run, item.batch_id)].add(producer)
                value = msgspec.msgpack.encode(obj) if obj is not None else item.raw
                session = obj.get("session_id") if isinstance(obj, dict) else None
                (await publisher_for(producer, run)).publish_raw(
                    value, session_id=session if isinstance(session, str) and session else None, batch_id=item.batch_id
                )
                summary.invalid += 1
            if rate:
                ahead = (summary.records + summary.invalid) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        for (_, run), publisher in publishers.items():
            for batch_id in publisher.open_batches():
                expected = len(batch_producers.get((run, batch_id), ())) or 1
                await publisher.close_batch(batch_id, algorithms.get((run, batch_id), speculative_algorithm), expected)
                closed((run, batch_id), publisher.settings.producer_id, expected)
                summary.batches_closed_at_end += 1
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: asyncio.run cancels, a second one raises
        summary.interrupted = True
        summary.half_sent = half_sent()
        stop_timeout_s = STOP_AFTER_INTERRUPT_S
        raise
    finally:
        try:
            for publisher in publishers.values():
                await publisher.stop(stop_timeout_s)
        finally:
            summary.acknowledged = sum(p.stats["records_acked"] for p in publishers.values())
            summary.producers = len({producer for producer, _ in publishers})
            summary.seconds = time.monotonic() - started
    return summary
