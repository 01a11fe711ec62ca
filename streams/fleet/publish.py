"""A synthetic fleet publishing to Kafka (``specmeter loadgen``, tests, benchmarks), or to a dump file.

One publisher per producer id, records paced at ``rate``, each producer closing
its batches with markers as the protocol says; ``expect`` writes the metrics the
offline core computes for the very same events, so a run can be checked end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import BatchMarker, GenerationRecord, encode_metrics, record_to_builtins

from .synthetic import FleetEvent

if TYPE_CHECKING:
    from ..core.offline import OfflineAggregator

__all__ = ["publish_fleet", "write_dump", "write_expected", "LoadSummary"]


@dataclass
class LoadSummary:
    records: int = 0
    invalid: int = 0
    markers: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return (self.records + self.invalid) / self.seconds if self.seconds else 0.0


async def publish_fleet(
    events: Iterable[FleetEvent],
    settings: PublisherSettings,
    *,
    rate: float | None = None,
    on_event: Callable[[FleetEvent], None] | None = None,
    summary: LoadSummary | None = None,
) -> LoadSummary:
    """Publish every event; ``rate`` paces records per second (None: as fast as possible).
    ``summary``: counted into as events are sent, so an interrupted run says what it sent."""
    publishers: dict[str, Publisher] = {}
    summary = LoadSummary() if summary is None else summary
    started = time.monotonic()
    try:
        async for event in _drawn(events):
            publisher = await _publisher(publishers, settings, event.producer_id)
            await _publish(publisher, event.payload, summary)
            if on_event is not None:
                on_event(event)
            if rate:
                await _pace(summary, rate, started)
    finally:
        summary.seconds = time.monotonic() - started
        await _stop(publishers.values())
    summary.seconds = time.monotonic() - started
    return summary


async def _stop(publishers: Iterable[Publisher]) -> None:
    """Stop the publishers one by one, each delivering what it accepted: the end of a run or its interruption."""
    for publisher in publishers:
        await publisher.stop()


async def _drawn(events: Iterable[FleetEvent]) -> AsyncIterator[FleetEvent]:
    """The events; a generator's drawn in a thread of its own (a sequence's as they are).

    A synthetic batch takes up to seconds to draw: drawn in the event loop, it held off
    Ctrl-C and SIGTERM until it was drawn and the next record waited for Kafka (issue
    47.2: loadgen stopped up to 2 s after the signal). The thread stops at its next event
    once the fleet stops, and is a daemon: a stop never waits for a draw to end."""
    if isinstance(events, Sequence):
        for event in events:
            yield event
        return
    drawer = _Drawer(iter(events), asyncio.get_running_loop())
    try:
        while chunk := await drawer.next_events():
            for event in chunk:
                yield event
    finally:
        drawer.stop()


class _Drawer:
    """Draws events in a daemon thread, up to ``ahead`` of the loop that publishes them."""

    def __init__(self, events: Iterator[FleetEvent], loop: asyncio.AbstractEventLoop, ahead: int = 4096) -> None:
        self._events, self._loop = events, loop
        self._ready: deque[FleetEvent] = deque()
        self._room = threading.Semaphore(ahead)
        self._stopped = threading.Event()
        self._finished = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        threading.Thread(target=self._draw, name="specmeter-fleet-draw", daemon=True).start()

    def _draw(self) -> None:
        """The thread: each event drawn waits for room, and is handed to the loop."""
        try:
            for event in self._events:
                if not self._wait_for_room():
                    return
                self._ready.append(event)
                self._wake()
        except BaseException as exc:  # noqa: BLE001 - raised in the loop by next_events
            self._error = exc
        finally:
            self._finished = True
            self._wake()

    def _wait_for_room(self) -> bool:
        """Wait until fewer than ``ahead`` events wait for the loop; False once the fleet
        stopped (looked at every 0.1 s: a stop never waits for the loop to take events)."""
        while not self._room.acquire(timeout=0.1):
            if self._stopped.is_set():
                return False
        return not self._stopped.is_set()

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_events(self) -> list[FleetEvent]:
        """The events drawn since the last call (waiting for one); [] once all are drawn."""
        while not self._ready:
            if self._finished:
                return self._end()
            self._waiter = self._loop.create_future()
            await self._waiter
        drawn = [self._ready.popleft() for _ in range(len(self._ready))]
        self._room.release(len(drawn))
        return drawn

    def _end(self) -> list[FleetEvent]:
        """Nothing left once the thread finished: no more events, or what stopped the drawing raised again."""
        if self._error is not None:
            raise self._error
        return []

    def stop(self) -> None:
        self._stopped.set()


async def _publisher(publishers: dict[str, Publisher], settings: PublisherSettings, producer_id: str) -> Publisher:
    """The producer's publisher, started the first time the producer publishes."""
    publisher = publishers.get(producer_id)
    if publisher is None:
        publisher = publishers[producer_id] = Publisher(msgspec.structs.replace(settings, producer_id=producer_id))
        await publisher.start()
    return publisher


async def _publish(publisher: Publisher, payload: GenerationRecord | BatchMarker | dict, summary: LoadSummary) -> None:
    """Send one event as its producer would: a record, a marker, or an invalid record's bytes."""
    if isinstance(payload, GenerationRecord):
        await publisher.publish(payload)
        summary.records += 1
    elif isinstance(payload, BatchMarker):
        await publisher.close_batch(payload.batch_id, payload.speculative_algorithm, payload.expected_producers)
        summary.markers += 1
    else:
        publisher.publish_raw(
            msgspec.msgpack.encode(payload),
            session_id=payload.get("session_id"),
            batch_id=payload.get("batch_id"),
        )
        summary.invalid += 1


async def _pace(summary: LoadSummary, rate: float, started: float) -> None:
    """Wait while the fleet is ahead of ``rate`` records per second."""
    ahead = (summary.records + summary.invalid) / rate - (time.monotonic() - started)
    if ahead > 0.002:
        await asyncio.sleep(ahead)


def write_dump(events: Iterable[FleetEvent], out) -> int:
    """Write events as a JSON-lines dump (what ``aggregate`` and ``replay`` read)."""
    encoder = msgspec.json.Encoder()
    n = 0
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else record_to_builtins(event.payload)
        out.write(encoder.encode(payload) + b"\n")
        n += 1
    return n


def write_expected(events: Iterable[FleetEvent], out) -> int:
    """The BatchMetrics the offline core computes for these events, one JSON line per batch."""
    from ..core.offline import OfflineAggregator

    results = _fed(OfflineAggregator(), events).results()
    for metrics in results:
        out.write(encode_metrics(metrics) + b"\n")
    return len(results)


def _fed(aggregator: OfflineAggregator, events: Iterable[FleetEvent]) -> OfflineAggregator:
    """The aggregator fed every event as the worker reads it (an invalid record as its JSON line)."""
    encoder = msgspec.json.Encoder()
    for event in events:
        payload = event.payload
        if isinstance(payload, dict):
            aggregator.feed_line(encoder.encode(payload), 0)
        else:
            aggregator.feed(payload)
    return aggregator
