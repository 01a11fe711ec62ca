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
calls it where it relied on Faust's flush: before a partition is given up, at
crash points and at shutdown. A message Kafka refuses after the producer's own
retries goes to ``on_failed`` (the worker stops: an output is never skipped).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["OrderedProducer"]

log = logging.getLogger("specmeter.output")


class OrderedProducer:
    """One aiokafka producer fed by one task from one queue (see the module docstring)."""

    def __init__(self, *, on_failed: Callable[[str, BaseException], None], **kafka: Any) -> None:
        self._kafka = kafka
        self._on_failed = on_failed
        self._queue: collections.deque[tuple[str, bytes | None, bytes | None, int | None]] = collections.deque()
        self._producer: Any = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set while the queue is empty and nothing is being appended

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        self._wake, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        producer = AIOKafkaProducer(**self._kafka)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer
        self._task = asyncio.get_running_loop().create_task(self._run(), name="specmeter-output")
        if self._queue:  # sent before the start
            self._idle.clear()
            self._wake.set()

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def pending(self) -> int:
        """Messages queued and not yet handed to aiokafka."""
        return len(self._queue)

    def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None) -> None:
        """Queue one message (never waits); order per partition is the order of calls."""
        self._queue.append((topic, key, value, partition))
        if self._wake is not None:
            self._idle.clear()  # type: ignore[union-attr]
            self._wake.set()

    async def flush(self) -> None:
        """Wait until every message sent so far is acknowledged (or has failed)."""
        if self._producer is None:
            return
        await self._idle.wait()  # type: ignore[union-attr]
        await self._producer.flush()

    async def stop(self) -> None:
        """Flush, then close the connection. Idempotent."""
        if self._producer is None:
            return
        try:
            await self.flush()
        finally:
            if self._task is not None:
                self._task.cancel()
            await self._producer.stop()
            self._producer = None

    async def _run(self) -> None:
        queue, wake, idle = self._queue, self._wake, self._idle
        assert wake is not None and idle is not None
        while True:
            await wake.wait()
            wake.clear()
            while queue:
                topic, key, value, partition = queue.popleft()
                try:
                    future = await self._producer.send(topic, value, key=key, partition=partition)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - refused before sending (e.g. too large)
                    self._on_failed(topic, exc)
                    continue
                future.add_done_callback(lambda f, topic=topic: self._done(topic, f))
            if not queue:
                idle.set()

    def _done(self, topic: str, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self._on_failed(topic, exc)
