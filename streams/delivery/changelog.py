"""Reading changelog partitions: whole, for a round of takeovers (all its partitions through
one consumer at once), and ranges, for a writer's check of the offsets its writes skipped
(``writes``). Split out of ``routes`` along its seams (issue 43): the driver reads through
it, and a simulation gives it consumers of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..core.ownership import ChangelogView
from .ledger import TopicPartition

__all__ = ["ChangelogReader"]


class ChangelogReader:
    """Reads changelog partitions: whole, for takeovers (all of a round's partitions
    through one consumer at once), and ranges, for a writer's check of skipped offsets."""

    #: a read that gets nothing new for this long fails (and is tried again): the limit
    #: grows with the state to read, never cuts a large restore that makes progress
    STALL_S = 60.0
    #: yield to the event loop after this many records of one fetch
    YIELD_EVERY = 5_000

    def __init__(self, new_consumer: Callable[..., Any]) -> None:
        self.new_consumer = new_consumer

    async def read(
        self, changelogs: Mapping[TopicPartition, int], inputs: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, ChangelogView]]:
        """The log ends of ``inputs`` now, and each changelog partition read from its start
        up to (not including) the end offset given for it."""
        from aiokafka.structs import TopicPartition as TP

        consumer = self.new_consumer(group_id=None, max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_wait_ms=20)
        await consumer.start()
        try:
            input_tps, ends = [TP(t, p) for t, p in inputs], {TP(t, p): end for (t, p), end in changelogs.items()}
            if input_tps or ends:  # an empty assignment would ask for every topic's metadata
                _learn_leaders(consumer, [*input_tps, *ends])
            input_ends = await consumer.end_offsets(input_tps) if input_tps else {}
            views = await self._read_views(consumer, ends)
            return _keyed(input_ends), _keyed(views)
        finally:
            await consumer.stop()

    async def _read_views(self, consumer: Any, tps: dict[Any, int]) -> dict[Any, ChangelogView]:
        """Each changelog partition read from its start up to its end offset, through one
        consumer; fails when a whole ``STALL_S`` brings nothing new."""
        views = {tp: ChangelogView() for tp in tps}
        reading = await self._start_reading(consumer, tps)
        progress_at = time.monotonic()
        while reading:
            if time.monotonic() - progress_at > self.STALL_S:
                raise TimeoutError(f"reading changelogs got nothing new for {self.STALL_S:.0f} s: {sorted(reading)}")
            progress_at = await self._fetch_into(consumer, reading, views, tps, progress_at)
            await self._pause_read(consumer, reading, tps)
        return views

    async def _start_reading(self, consumer: Any, tps: dict[Any, int]) -> set[Any]:
        """The partitions with records before their end offset, assigned and sought to their start."""
        starts = await consumer.beginning_offsets(list(tps))
        reading = {tp for tp, end in tps.items() if end > starts[tp]}
        if reading:
            consumer.assign(sorted(reading))
            await consumer.seek_to_beginning(*reading)
        return reading

    async def _fetch_into(
        self,
        consumer: Any,
        reading: set[Any],
        views: dict[Any, ChangelogView],
        tps: dict[Any, int],
        progress_at: float,
    ) -> float:
        """One fetch of the partitions still read, into their views; returns when the
        reading last got something new."""
        fetched = await consumer.getmany(*reading, timeout_ms=500)
        for tp, messages in fetched.items():
            if messages:
                progress_at = time.monotonic()
            await self._add(views[tp], messages, tps[tp])
        return progress_at

    async def _pause_read(self, consumer: Any, reading: set[Any], tps: dict[Any, int]) -> None:
        """Stop reading (and pause) each partition whose position reached its end offset."""
        for tp in list(reading):
            if await consumer.position(tp) >= tps[tp]:
                reading.discard(tp)
                consumer.pause(tp)

    async def _add(self, view: ChangelogView, messages: list[Any], end: int) -> None:
        """A fetch's records before ``end``, into the view, yielding every ``YIELD_EVERY``."""
        for i, m in enumerate(messages):
            if m.offset >= end:
                break
            view.add(m.offset, m.key, m.value)
            if i % self.YIELD_EVERY == self.YIELD_EVERY - 1:
                await asyncio.sleep(0)

    async def read_range(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """The records of a changelog partition in [start, end) that the log still holds."""
        from aiokafka.structs import TopicPartition as TP

        tp = TP(topic, partition)
        consumer = self.new_consumer(group_id=None, fetch_max_wait_ms=20)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, start)
            return await self._read_to(consumer, tp, start, end)
        finally:
            await consumer.stop()

    async def _read_to(
        self, consumer: Any, tp: Any, start: int, end: int
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """The records from the consumer's position up to ``end``; fails when a whole
        ``STALL_S`` brings nothing."""
        out: list[tuple[int, bytes | None, bytes | None]] = []
        progress_at = time.monotonic()
        while await consumer.position(tp) < end:
            if time.monotonic() - progress_at > self.STALL_S:
                raise TimeoutError(f"reading {tp.topic}[{tp.partition}] offsets {start}-{end - 1} got nowhere")
            fetched = await consumer.getmany(tp, timeout_ms=500)
            for m in fetched.get(tp, ()):
                progress_at = time.monotonic()
                if m.offset < end:
                    out.append((m.offset, m.key, m.value))
        return out


def _learn_leaders(consumer: Any, tps: list[Any]) -> None:
    """Have a new consumer look up the leaders of ``tps`` at once. Asked for the offsets of
    a partition whose leader it does not know yet, aiokafka waits its ``retry_backoff_ms``
    (100 ms) before it asks for the metadata; a takeover asked twice, and these two waits
    were most of a worker's takeover at start-up and of each rebalance's. Assigned, the
    partitions' metadata is asked for now (and the offsets asked next wait for it);
    paused, nothing of them is fetched. Reading assigns what it reads afterwards."""
    consumer.assign(tps)
    consumer.pause(*tps)


def _keyed(by_tp: Mapping[Any, Any]) -> dict[TopicPartition, Any]:
    """A mapping keyed by aiokafka's TopicPartitions, keyed by (topic, partition) tuples."""
    return {(tp.topic, tp.partition): value for tp, value in by_tp.items()}
