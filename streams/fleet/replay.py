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
from typing import Any, TypeGuard

import msgspec

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import BatchMarker, GenerationRecord, InvalidRecord

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


class _Replay:
    """One replay: a publisher per (producer, run) found in the dump, and what was sent of
    each batch (which producers sent input, which sent their marker)."""

    def __init__(self, settings: PublisherSettings, speculative_algorithm: str | None, summary: ReplaySummary) -> None:
        self.settings = settings
        self.speculative_algorithm = speculative_algorithm
        self.summary = summary
        self.default_run = settings.run_id
        self.started = time.monotonic()
        self.publishers: dict[tuple[str, str | None], Publisher] = {}
        self.batch_producers: dict[tuple[str | None, str], set[str]] = defaultdict(set)
        self.algorithms: dict[tuple[str | None, str], str] = {}
        #: producers whose marker was sent (acknowledged), and the producers the markers expect, per batch
        self.marked: dict[tuple[str | None, str], set[str]] = defaultdict(set)
        self.expected_of: dict[tuple[str | None, str], int] = {}

    async def publisher_for(self, producer_id: str, run_id: str | None) -> Publisher:
        publisher = self.publishers.get((producer_id, run_id))
        if publisher is None:
            if len(self.publishers) >= MAX_PRODUCERS:
                raise RuntimeError(f"more than {MAX_PRODUCERS} (producer_id, run_id) pairs in the dump")
            publisher = self.publishers[(producer_id, run_id)] = Publisher(
                msgspec.structs.replace(self.settings, producer_id=producer_id, run_id=run_id)
            )
            await publisher.start()
        return publisher

    async def line(self, line: bytes) -> None:
        """Publish one line of the dump: a record, a marker or an invalid line."""
        item = parse_dump_line(line)
        if isinstance(item, GenerationRecord):
            await self.record(item)
        elif isinstance(item, BatchMarker):
            await self.marker(item)
        else:
            await self.invalid(item)

    async def record(self, item: GenerationRecord) -> None:
        producer = item.producer_id or DEFAULT_PRODUCER
        run = item.run_id or self.default_run
        if item.producer_id is None or item.run_id != run:  # the replayer is its producer: markers
            item = msgspec.structs.replace(item, producer_id=producer, run_id=run)  # must count it
        self.batch_producers[(run, item.batch_id)].add(producer)
        await (await self.publisher_for(producer, run)).publish(item)
        self.summary.records += 1

    async def marker(self, item: BatchMarker) -> None:
        run = item.run_id or self.default_run
        if item.speculative_algorithm:
            self.algorithms[(run, item.batch_id)] = item.speculative_algorithm
        publisher = await self.publisher_for(item.producer_id, run)
        await publisher.close_batch(
            item.batch_id, item.speculative_algorithm or self.speculative_algorithm, item.expected_producers
        )
        self.closed((run, item.batch_id), item.producer_id, item.expected_producers)
        self.summary.markers += 1

    async def invalid(self, item: InvalidRecord) -> None:
        """An invalid line goes out as it is (re-encoded when it is JSON), counted in its
        batch and run as the worker will count it."""
        producer = item.producer_id or DEFAULT_PRODUCER
        obj, run = _as_replayed(item.raw, producer, self.default_run)
        if item.batch_id:
            self.batch_producers[(run, item.batch_id)].add(producer)
        value = msgspec.msgpack.encode(obj) if obj is not None else item.raw
        (await self.publisher_for(producer, run)).publish_raw(
            value, session_id=_session_of(obj), batch_id=item.batch_id
        )
        self.summary.invalid += 1

    async def pace(self, rate: float) -> None:
        """Wait while the replay is ahead of ``rate`` records per second."""
        ahead = (self.summary.records + self.summary.invalid) / rate - (time.monotonic() - self.started)
        if ahead > 0:
            await asyncio.sleep(ahead)

    async def close_open_batches(self) -> None:
        """The end of the file: close every batch a producer left open, as its marker would."""
        for (_, run), publisher in self.publishers.items():
            for batch_id in publisher.open_batches():
                await self._close_at_end(publisher, run, batch_id)

    async def _close_at_end(self, publisher: Publisher, run: str | None, batch_id: str) -> None:
        """Close one open batch of a producer, expecting every producer that sent it input."""
        expected = len(self.batch_producers.get((run, batch_id), ())) or 1
        algorithm = self.algorithms.get((run, batch_id), self.speculative_algorithm)
        await publisher.close_batch(batch_id, algorithm, expected)
        self.closed((run, batch_id), publisher.settings.producer_id, expected)
        self.summary.batches_closed_at_end += 1

    def closed(self, key: tuple[str | None, str], producer: str, expected: int) -> None:
        self.marked[key].add(producer)
        self.expected_of[key] = max(self.expected_of.get(key, 0), expected)

    def half_sent(self) -> list[tuple[str | None, str]]:
        """The batches with input sent but not every producer's marker."""
        keys = dict.fromkeys([*self.batch_producers, *self.marked])
        return [key for key in keys if len(self.marked.get(key, ())) < self._producers_expected(key)]

    def _producers_expected(self, key: tuple[str | None, str]) -> int:
        return max(self.expected_of.get(key, 0), len(self.batch_producers.get(key, ())), 1)

    async def stop(self, timeout_s: float) -> None:
        """Stop every publisher (each delivers what it accepted, up to ``timeout_s``) and
        fill in what Kafka acknowledged."""
        try:
            for publisher in self.publishers.values():
                await publisher.stop(timeout_s)
        finally:
            self._tally()

    def _tally(self) -> None:
        """Fill in what Kafka acknowledged, the producers and the time taken."""
        self.summary.acknowledged = sum(p.stats["records_acked"] for p in self.publishers.values())
        self.summary.producers = len({producer for producer, _ in self.publishers})
        self.summary.seconds = time.monotonic() - self.started

    async def send(self, lines: Iterable[bytes], rate: float | None, on_line: Callable[[int], None] | None) -> None:
        """Publish every non-blank line of the dump, paced, yielding to the event loop now and then."""
        for number, line in enumerate(dump_lines(lines), start=1):
            if number % YIELD_EVERY_LINES == 0:
                await asyncio.sleep(0)
            if on_line is not None:
                on_line(len(line))
            if not line.strip():
                continue
            await self.line(line)
            if rate:
                await self.pace(rate)


def _as_replayed(raw: bytes, producer: str, default_run: str | None) -> tuple[Any, str | None]:
    """An invalid line's JSON value (None when it is not JSON) and the run it is counted
    in; an object that names no producer gets the replay's, one that names no run the
    default run (it is counted in the run it is replayed in)."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None, default_run
    if not isinstance(obj, dict):
        return obj, default_run
    run = _replayed_run(obj, default_run)
    if not obj.get("producer_id"):
        obj["producer_id"] = producer
    return obj, run


def _replayed_run(obj: dict, default_run: str | None) -> str | None:
    """The run an invalid object is counted in: the one it names, else the default run
    (written into it, where it names none)."""
    named = obj.get("run_id")
    if _is_name(named):
        return named
    if named is None and default_run is not None:
        obj["run_id"] = default_run
    return default_run


def _session_of(obj: Any) -> str | None:
    """The session an invalid line names, where it names one (a non-empty string)."""
    session = obj.get("session_id") if isinstance(obj, dict) else None
    return session if _is_name(session) else None


def _is_name(value: Any) -> TypeGuard[str]:
    """A non-empty string: what an invalid line's run or session must be to name one."""
    return isinstance(value, str) and value != ""


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
    replay = _Replay(settings, speculative_algorithm, ReplaySummary() if summary is None else summary)
    stop_timeout_s = 30.0
    try:
        await replay.send(lines, rate, on_line)
        await replay.close_open_batches()
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: asyncio.run cancels, a second one raises
        replay.summary.interrupted = True
        replay.summary.half_sent = replay.half_sent()
        stop_timeout_s = STOP_AFTER_INTERRUPT_S
        raise
    finally:
        await replay.stop(stop_timeout_s)
    return replay.summary
