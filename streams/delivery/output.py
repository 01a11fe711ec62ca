"""The worker's own producer: every changelog write and output, in the order it was sent.

Faust's producer hands its buffer to Kafka one message per event-loop turn (each
send awaits a ``stampede`` wrapper that sleeps 0): while stage 1 worked through
its input, a partial (and the BatchMetrics behind it) waited behind every
changelog delta queued before it, one loop turn each — seconds under sustained
load. Here ``send`` appends to one ordered queue and a single task hands the
whole queue to aiokafka at once (an append costs ~15 µs and waits only when a
partition's 1 MiB batch is full), so the order per partition is the order of
``send`` and a message waits at most for the request in flight.

``flush`` returns when everything sent before it is acknowledged; the shell
calls it before a partition is given up, at crash points and at shutdown. A message
may name ``on_ack``, called with the offset Kafka gave it (``writes`` checks that an
owner's changelog writes land where it expects them).

**Fail fast.** The first message Kafka refuses after the producer's own retries
(``request_timeout_ms``: an outage longer than that is a refusal too) stops the
producer for good: nothing queued after it, nor sent later, is handed to Kafka, and
``on_failed`` is told once (the worker then exits without flushing). A checkpoint, a
partial or a publication must never become durable after a write it follows was lost:
its successor then resumes from the last state that is whole.

Each message goes into aiokafka's batch for its partition without ``send``, which
built a set of all the topic's partitions for every message (``internals.
message_appender``): the partitions of each topic are looked up once (again after
a metadata refresh), and a keyed message's partition is aiokafka's default
partitioner's choice, remembered per key (murmur2 is pure Python; the keys are
batch ids, few and repeated).

``stalled_s`` says whether the writes go through: how long writes have been waiting
with none of them acknowledged (0 while nothing waits). A broker that leaves while it
leads some partitions stalls the writes to those alone, until its partitions have new
leaders; a cluster that cannot take a write at all (no broker, fewer in-sync replicas
than ``min.insync.replicas``) stalls them all, and it grows. The worker's readiness
reads it (``report.readiness``).

``room`` is the back-pressure: the stages await it after each chunk, and it waits
while more than a limit of bytes is queued and not yet handed over. A worker
catching up a backlog otherwise queued its whole changelog (as much as its input,
uncompressed) in memory, and the producer, one step per turn of a loop busy with
the next chunks, sent it only once the backlog was read: the partials queued
behind it, and so every batch's metrics.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import internals

__all__ = ["OrderedProducer"]

#: keys whose partition is remembered per topic; past it the memory starts afresh
_KEYS_REMEMBERED = 4096


class _Partitions:
    """One topic's partitions as the producer's metadata last said: their
    TopicPartitions, and the partition each key seen so far goes to."""

    __slots__ = ("by_key", "ids", "tps")

    def __init__(self, topic: str, ids: Iterable[int]) -> None:
        from aiokafka.structs import TopicPartition

        self.ids = sorted(ids)
        self.tps = {p: TopicPartition(topic, p) for p in self.ids}
        self.by_key: dict[bytes | None, int] = {}

    def of_key(self, key: bytes | None) -> int:
        """The partition ``AIOKafkaProducer.send`` picks for ``key`` (a random one for None)."""
        partition = self.by_key.get(key)
        if partition is None:
            from aiokafka.partitioner import DefaultPartitioner

            partition = DefaultPartitioner()(key, self.ids, self.ids)
            if key is not None:
                self._remember(key, partition)
        return partition

    def _remember(self, key: bytes, partition: int) -> None:
        """A key's partition, for its next messages (all forgotten past ``_KEYS_REMEMBERED``)."""
        if len(self.by_key) >= _KEYS_REMEMBERED:
            self.by_key.clear()
        self.by_key[key] = partition


log = logging.getLogger("specmeter.output")


async def _started(producer: Any) -> Any:
    """``producer`` started (stopped again when its start fails)."""
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


def _aiokafka_producer(**kafka: Any) -> Any:
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(**kafka)


#: called with the offset Kafka gave a message
OnAck = Callable[[int], None]


class OrderedProducer:
    """One aiokafka producer fed by one task from one queue (see the module docstring)."""

    def __init__(
        self,
        *,
        on_failed: Callable[[str, BaseException], None],
        new_producer: Callable[..., Any] | None = None,
        **kafka: Any,
    ) -> None:
        self._kafka = kafka
        #: options -> the aiokafka producer (the seam a simulation gives its own through)
        self._new_producer = new_producer or _aiokafka_producer
        self._max_request_size: int = kafka.get("max_request_size", 1_048_576)
        self._on_failed = on_failed
        self._queue: collections.deque[tuple[str, bytes | None, bytes | None, int | None, OnAck | None]] = (
            collections.deque()
        )
        #: the first refusal: nothing is handed to Kafka after it
        self.failed: BaseException | None = None
        #: messages handed to aiokafka and not acknowledged yet: number -> when (monotonic)
        self._unacked: dict[int, float] = {}
        self._handed = 0
        self._producer: Any = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set while the queue is empty and nothing is being appended
        #: bytes (keys and values) queued and not yet handed to aiokafka
        self.queued_bytes = 0
        self._room: asyncio.Event | None = None  # set when ``queued_bytes`` fell to ``_room_at``
        self._room_at = 0
        self._add: Callable[[Any, bytes | None, bytes | None], Any] | None = None
        #: topic -> its partitions, as last looked up (forgotten at each metadata refresh)
        self._partitions: dict[str, _Partitions] = {}
        #: messages sent and neither acknowledged nor failed yet, and when the last of them
        #: was (or, with none waiting, when the first of those now waiting was sent)
        self._unacknowledged = 0
        self._progress_at = time.monotonic()

    async def start(self) -> None:
        self._wake, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        producer = await _started(self._new_producer(**self._kafka))
        self._producer = producer
        self._add = internals.message_appender(producer)
        producer.client.cluster.add_listener(self._forget_partitions)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="specmeter-output")
        if self._queue:  # sent before the start
            self._idle.clear()
            self._wake.set()

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def _draining(self) -> bool:
        """Whether the task that drains the queue runs (started, not ended)."""
        return self._task is not None and not self._task.done()

    @property
    def pending(self) -> int:
        """Messages queued and not yet handed to aiokafka."""
        return len(self._queue)

    def stalled_s(self, now: float) -> float:
        """How long writes have waited with none acknowledged (``time.monotonic`` seconds;
        0 when nothing waits)."""
        return now - self._progress_at if self._unacknowledged else 0.0

    def _answered(self) -> None:
        """A message was acknowledged, or failed: the writes are not stalled."""
        self._unacknowledged -= 1
        self._progress_at = time.monotonic()

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        on_ack: OnAck | None = None,
    ) -> None:
        """Queue one message (never waits); order per partition is the order of calls.
        Dropped once the producer failed (the worker is stopping without a flush)."""
        if self.failed is not None:
            return
        if not self._unacknowledged:
            self._progress_at = time.monotonic()
        self._unacknowledged += 1
        self._queue.append((topic, key, value, partition, on_ack))
        self.queued_bytes += len(key or b"") + len(value or b"")
        if self._wake is not None:
            self._idle.clear()  # type: ignore[union-attr]
            self._wake.set()

    async def room(self, limit_bytes: int) -> None:
        """Wait while more than ``limit_bytes`` are queued, until half of that is left
        (returns at once before the producer started: nothing drains the queue yet)."""
        if self.queued_bytes <= limit_bytes or not self._draining:
            return
        if self._room is None:
            self._room = asyncio.Event()
        self._room.clear()
        self._room_at = limit_bytes // 2
        await self._room.wait()

    async def flush(self) -> None:
        """Wait until every message sent so far is acknowledged (or has failed)."""
        if self._producer is None or self.failed is not None:
            return
        await self._idle.wait()  # type: ignore[union-attr]
        await self._producer.flush()

    async def stop(self) -> None:
        """Flush, then close the connection (after a failure: close it, flushing nothing).
        Idempotent."""
        if self._producer is None:
            return
        if self.failed is not None:
            await self._stop_failed()
            return
        try:
            await self.flush()
        finally:
            self._stop_task()
            self._no_more_room_waits()
            await self._producer.stop()
            self._producer = None

    async def _stop_failed(self) -> None:
        """After a failure: stop the task and close the connection, sending nothing more."""
        self._stop_task()
        await internals.stop_without_sending(self._producer)  # aiokafka's stop would send what it holds
        self._producer = None

    def _stop_task(self) -> None:
        """Either stop's first step: the task that hands the queue over is cancelled, and
        metadata refreshes are no longer listened to."""
        if self._task is not None:
            self._task.cancel()
        self._producer.client.cluster.remove_listener(self._forget_partitions)

    def _no_more_room_waits(self) -> None:
        """Nothing drains the queue any more (stopped, failed): no one waits for room."""
        if self._room is not None:
            self._room.set()

    async def _learn_partitions(self, topic: str) -> _Partitions:
        partitions = self._partitions[topic] = _Partitions(topic, await self._producer.partitions_for(topic))
        return partitions

    def _forget_partitions(self, _cluster: Any) -> None:
        """After a metadata refresh: look each topic's partitions up again."""
        self._partitions = {}

    async def _run(self) -> None:
        from aiokafka.errors import MessageSizeTooLargeError
        from aiokafka.record.default_records import DefaultRecordBatchBuilder

        estimate_size = DefaultRecordBatchBuilder.estimate_size_in_bytes
        no_headers: list[tuple[str, bytes]] = []
        queue, wake, idle, add = self._queue, self._wake, self._idle, self._add
        assert wake is not None and idle is not None and add is not None
        while self.failed is None:
            await wake.wait()
            wake.clear()
            while queue and self.failed is None:
                topic, key, value, partition, on_ack = self._next()
                try:
                    tp = await self._partition_of(topic, key, partition)
                    size = estimate_size(key, value, no_headers)
                    if size > self._max_request_size:
                        raise MessageSizeTooLargeError(
                            f"a message of {size} bytes, over the {self._max_request_size} bytes a request may carry"
                        )
                    future = await add(tp, key, value)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - refused before sending (e.g. too large)
                    self._answered()
                    self.fail(topic, exc)
                    break
                self._handed_over(topic, future, on_ack)
            if not queue:
                idle.set()

    def _next(self) -> tuple[str, bytes | None, bytes | None, int | None, OnAck | None]:
        """The oldest message queued, taken out (waking a writer waiting for room once half
        of its limit is left)."""
        topic, key, value, partition, on_ack = self._queue.popleft()
        self.queued_bytes -= len(key or b"") + len(value or b"")
        if self._room is not None and self.queued_bytes <= self._room_at:
            self._room.set()
        return topic, key, value, partition, on_ack

    async def _partition_of(self, topic: str, key: bytes | None, partition: int | None) -> Any:
        """The topic partition a message goes to: the one given, else its key's (the
        topic's partitions looked up once)."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = await self._learn_partitions(topic)
        if partition is None:
            partition = partitions.of_key(key)
        tp = partitions.tps.get(partition)
        if tp is None:
            raise ValueError(f"{topic} has no partition {partition}")
        return tp

    def _handed_over(self, topic: str, future: Any, on_ack: OnAck | None) -> None:
        """A message aiokafka took: waiting for its acknowledgement (``_done``)."""
        self._handed += 1
        self._unacked[self._handed] = time.monotonic()
        future.add_done_callback(lambda f, topic=topic, on_ack=on_ack, n=self._handed: self._done(topic, f, on_ack, n))

    def unacked_for_s(self) -> float:
        """How long the oldest message handed to Kafka has waited for its acknowledgement (0:
        none waits). The idempotent producer retries through an outage without end: the
        worker stops when this passes its delivery timeout."""
        if not self._unacked:
            return 0.0
        return time.monotonic() - min(self._unacked.values())

    def _done(self, topic: str, future: asyncio.Future, on_ack: OnAck | None, n: int) -> None:
        self._answered()
        self._unacked.pop(n, None)
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None and future.result().offset < 0:
            # aiokafka's duplicate-sequence path completes a write with whatever offset the
            # broker answered, possibly -1: where it landed is unknown, so nothing that
            # rests on its place (a takeover's epoch, a group's check) may go on
            exc = RuntimeError(f"{topic}: a write was acknowledged without its offset ({future.result().offset})")
        if exc is not None:
            self.fail(topic, exc)
        elif on_ack is not None and self.failed is None:
            on_ack(future.result().offset)

    def fail(self, topic: str, exc: BaseException) -> None:
        """The first refusal (or a write past its delivery time): stop handing anything over,
        drop what is queued, say it once (``on_failed``)."""
        if self.failed is not None:
            return
        self.failed = exc
        self._queue.clear()
        self.queued_bytes = 0
        self._no_more_room_waits()
        if self._idle is not None:
            self._idle.set()
        self._on_failed(topic, exc)
