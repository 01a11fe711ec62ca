"""A synchronous facade for rollout code that is not asyncio.

A daemon thread runs an event loop that owns the ``Publisher``. ``publish``
appends to a thread-safe deque (no syscall, no lock) that the loop drains every
few milliseconds; ``close_batch`` and ``stop`` block until done.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from specmeter.schemas import GenerationRecord

from ._errors import PublisherClosedError, QueueFullError
from ._publisher import Publisher
from ._settings import PublisherSettings

__all__ = ["SyncPublisher"]


class SyncPublisher:
    """``Publisher`` for threads: same guarantees, blocking where it must.

    Use as a context manager, or call ``stop()`` when done.
    """

    def __init__(
        self, settings: PublisherSettings | None = None, *, start_timeout_s: float = 60.0, **overrides: Any
    ) -> None:
        self._publisher = Publisher(settings, **overrides)
        self.settings = self._publisher.settings
        self._pending: collections.deque[GenerationRecord] = collections.deque()
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="specmeter-publisher", daemon=True)
        self._thread.start()
        try:
            self._call(self._publisher.start(), start_timeout_s)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self._mover = asyncio.run_coroutine_threadsafe(self._move(), self._loop)

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _move(self) -> None:
        """Move records from the deque into the publisher, respecting its bound."""
        interval = max(self.settings.linger_ms / 4000, 0.001)
        while True:
            await self._move_now()
            await asyncio.sleep(interval)

    async def _move_now(self) -> None:
        pending = self._pending
        while pending:
            await self._publisher.publish(pending[0], timeout_s=3600)
            pending.popleft()

    def publish(self, record: GenerationRecord, *, timeout_s: float | None = None) -> None:
        """Accept one record; blocks only while the queue is full, then raises ``QueueFullError``."""
        if self._closed:
            raise PublisherClosedError("publisher is stopped: create a new one to publish again")
        limit = self.settings.max_queued_records
        if len(self._pending) + self._publisher.queued >= limit:
            timeout_s = self.settings.queue_full_timeout_s if timeout_s is None else timeout_s
            deadline = time.monotonic() + timeout_s
            while len(self._pending) + self._publisher.queued >= limit:
                if time.monotonic() >= deadline:
                    raise QueueFullError(
                        f"{len(self._pending) + self._publisher.queued} records are waiting for Kafka "
                        f"(max_queued_records={limit}); is the broker reachable? The record was not accepted."
                    )
                time.sleep(0.005)
        self._pending.append(record)

    def close_batch(
        self,
        batch_id: str,
        speculative_algorithm: str | None = None,
        expected_producers: int = 1,
        *,
        timeout_s: float | None = None,
    ) -> dict[int, int]:
        """Flush, wait for acknowledgements, send the batch's markers (see ``Publisher.close_batch``)."""

        async def close() -> dict[int, int]:
            await self._move_now()
            return await self._publisher.close_batch(batch_id, speculative_algorithm, expected_producers)

        return self._call(close(), timeout_s)

    def flush(self, timeout_s: float | None = None) -> None:
        async def flush() -> None:
            await self._move_now()
            await self._publisher.flush()

        self._call(flush(), timeout_s)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._publisher.stats)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Deliver what is queued, disconnect and end the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            self._mover.cancel()
            await self._move_now()
            await self._publisher.stop(timeout_s)

        try:
            self._call(stop(), timeout_s + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
