"""The non-blocking publisher: a bounded buffer in front of a background task.

How it works (after aiokafka's producer): ``publish`` encodes the record, picks
its partition (Java-compatible murmur2 of ``session_id``, cached per session),
appends the bytes to that partition's buffer and returns; it never awaits the
network. A background task packs each partition's buffer into one
``RecordBatch`` message when it reaches ``max_message_bytes`` or has waited
``linger_ms``, and delivers it with an idempotent aiokafka producer, re-sending
until Kafka acknowledges it. ``close_batch`` flushes, waits for every
acknowledgement, then sends a ``BatchMarker`` to every partition with the
number of records this producer sent there for the batch.

A publisher publishes one run (``settings.run_id``, None for the default run)
as one producer (``settings.producer_id``): records without their own ids are
counted as its own, in its run (the envelope names both); its markers name both.

Full buffer policy: ``publish`` waits up to ``queue_full_timeout_s`` for room,
then raises ``QueueFullError`` (the record is not accepted); ``publish_nowait``
raises at once. Accepted records are never dropped: a failed delivery is
retried until it succeeds or ``stop`` gives up after its timeout (and says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections import Counter, defaultdict
from typing import Any

import msgspec

from specmeter.schemas import BatchMarker, GenerationRecord, encode_records_message

from ._errors import (
    BrokerUnavailableError,
    PublisherClosedError,
    PublisherError,
    PublisherNotStartedError,
    QueueFullError,
    TopicMissingError,
)
from ._framing import frame_batch, frame_overhead
from ._kafka_logs import connection_reason, quiet_kafka_logs
from ._settings import PublisherSettings, plain_bootstrap, unavailable_message

__all__ = ["Publisher", "partition_for_key"]

log = logging.getLogger("specmeter.producers")


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default partition for a key: Java-compatible murmur2, positive, modulo."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Publisher:
    """Publishes generation records and batch markers to the records topic.

    Use as ``async with Publisher(settings) as pub:`` or call ``start``/``stop``.
    ``publish``/``publish_nowait`` are cheap and safe to call from the rollout
    loop; ``close_batch`` is awaited once per batch when this worker is done.
    """

    def __init__(self, settings: PublisherSettings | None = None, **overrides: Any) -> None:
        import msgspec

        base = settings or PublisherSettings()
        self.settings = msgspec.structs.replace(base, **overrides) if overrides else base
        self._frame_overhead = frame_overhead(self.settings.producer_id, self.settings.run_id)
        self._producer: Any = None
        self._partitions = 0
        self._partition_of: dict[str, int] = {}
        self._buffers: dict[int, list[bytes]] = defaultdict(list)
        #: each buffered record's batch id, beside its bytes (what a stop that gives up names)
        self._buffer_batches: dict[int, list[str | None]] = defaultdict(list)
        self._buffer_bytes: dict[int, int] = defaultdict(int)
        self._buffer_since: dict[int, float] = {}
        self._queued = 0  # accepted, not yet acknowledged
        self._sent: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        #: each delivery task and what it carries: its records' batch ids, or the batch of its marker
        self._inflight: dict[asyncio.Task, _Carried] = {}
        self._wake: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        self._started = False
        self._closed = False
        #: counters for monitoring: messages and records acknowledged, re-sends
        self.stats = {"records_acked": 0, "messages_acked": 0, "resends": 0, "queue_full": 0, "producer_renewals": 0}
        self._renewing = asyncio.Lock()

    # -- lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        """Connect, learn the topic's partitions and start the background task.

        Raises:
            BrokerUnavailableError: no broker answered at ``bootstrap_servers``.
            TopicMissingError: the records topic does not exist (it is never auto-created).
            ValueError: ``bootstrap_servers`` is not ``host:port`` (or ``kafka://host:port``).
        """
        if self._started:
            return
        bootstrap = plain_bootstrap(self.settings.bootstrap_servers)
        self._producer = self._new_producer()
        try:
            self._partitions = await self._connect(bootstrap)
        except BaseException:
            await self._producer.stop()  # nothing left open behind an error
            raise
        self._wake, self._room, self._idle = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._runner = asyncio.create_task(self._run(), name="specmeter-publisher")
        self._started = True

    def _new_producer(self) -> Any:
        from aiokafka import AIOKafkaProducer

        s = self.settings
        return AIOKafkaProducer(
            bootstrap_servers=plain_bootstrap(s.bootstrap_servers),
            client_id=f"specmeter-{s.producer_id}",
            enable_idempotence=True,
            acks="all",
            compression_type=s.compression_type,
            linger_ms=5,
            max_batch_size=max(s.max_message_bytes + 4096, 16384),
            max_request_size=max(s.max_message_bytes * 2, 1048576),
            request_timeout_ms=s.request_timeout_ms,
            retry_backoff_ms=s.retry_backoff_ms,
            **s.security.aiokafka_kwargs(),
            **s.kafka,
        )

    async def _renew_producer(self, failed: Any, exc: BaseException) -> None:
        """Replace the idempotent producer after a failure that leaves its sequence numbers
        out of step with the broker's (a batch that timed out through a broker restart, then
        sent again with the next number): every later send to that partition would be
        refused as out of order, forever. A new producer gets a new producer id; a message
        the old one did deliver after all is a redelivery, which the worker deduplicates."""
        async with self._renewing:
            if self._producer is not failed:
                return  # another delivery renewed it already
            fresh = self._new_producer()
            try:
                await fresh.start()
            except Exception as start_exc:  # noqa: BLE001 - the broker is still away: next failure tries again
                log.debug("publisher: a new producer could not start yet (%r)", start_exc)
                with contextlib.suppress(Exception):
                    await fresh.stop()
                return
            self._producer = fresh
            self.stats["producer_renewals"] += 1
            log.warning(
                "publisher: renewed the Kafka producer after %s (its sequence numbers no longer match the "
                "broker's); unacknowledged messages are sent again through the new one",
                type(exc).__name__,
            )
        with contextlib.suppress(Exception):  # its pending sends fail and are retried through the new one
            await asyncio.wait_for(failed.stop(), 10)

    async def _connect(self, bootstrap: str) -> int:
        """Start the producer and return the records topic's partition count, asked for
        with auto-creation off: aiokafka's own lookup would auto-create a missing topic
        with the broker's default partition count behind the worker's back.

        Raises:
            TopicAuthorizationFailedError (aiokafka's): this principal may not see the topic.
        """
        from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError, for_code
        from aiokafka.protocol.metadata import MetadataRequest

        s = self.settings
        client = self._producer.client
        # aiokafka's lines on why it cannot connect are said in the error, not beside it (issue 47.7)
        with quiet_kafka_logs() as said:
            try:
                await self._producer.start()
                response = await first_answer(client, MetadataRequest([s.topic], allow_auto_topic_creation=False))
            except KafkaError as exc:
                reason = connection_reason(said) if said else type(exc).__name__
                raise BrokerUnavailableError(unavailable_message(bootstrap, reason)) from exc
        (topic,) = response.topics
        error_code, partitions = topic[0], topic[-1]
        if error_code not in (0, UnknownTopicOrPartitionError.errno):
            raise for_code(error_code)(f"topic {s.topic!r} at {bootstrap}")
        if error_code or not partitions:
            raise TopicMissingError(
                f"topic {s.topic!r} does not exist at {bootstrap}: start the worker first "
                f"(`specmeter worker --partitions N` creates it) or create it with N partitions, or set "
                f"PublisherSettings.topic to the worker's records topic; the publisher never creates it"
            )
        return len(partitions)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Deliver everything accepted and wait for its acknowledgements (up to ``timeout_s``),
        then disconnect. Idempotent.

        A stop in a task being cancelled (Ctrl-C, SIGTERM, a job cancelled) delivers too: the
        deliveries are tasks of their own that a cancellation of the caller does not reach
        (issue 47.2: cancelling them left 37 records unsent and stop waiting out its 30 s).
        Only a broker that does not acknowledge within ``timeout_s`` loses records, and the
        error line names them per batch so they can be re-published; the connections then
        close at once."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        flushing = asyncio.get_running_loop().create_task(self.flush(), name="specmeter-publisher-stop")
        try:
            await asyncio.wait({flushing}, timeout=timeout_s)
        except asyncio.CancelledError:  # the stop itself cancelled: what is left is lost
            self._say_lost("publisher stop cancelled")
            raise
        else:
            if not flushing.done():
                self._say_lost(
                    f"publisher stop: the broker at {self.settings.bootstrap_servers} acknowledged nothing "
                    f"more within {timeout_s:g}s"
                )
        finally:
            await self._disconnect(flushing, given_up=not flushing.done())

    def _say_lost(self, why: str) -> None:
        """The error line of a stop that gives up: the records and markers left unacknowledged,
        per batch, so that they can be re-published."""
        if not (self._queued or self._unacknowledged_markers()):
            return
        log.error(
            "%s: %d record(s) are lost unless re-published%s",
            why,
            self._queued,
            _lost_batches(self._unacknowledged_records(), self._unacknowledged_markers()),
        )

    def _unacknowledged_records(self) -> Counter[str | None]:
        """Records accepted and not acknowledged, per batch (None: raw bytes of no batch)."""
        left: Counter[str | None] = Counter()
        for batches in self._buffer_batches.values():
            left.update(batches)
        for carried in self._inflight.values():
            left.update(carried.batches)
        return left

    def _unacknowledged_markers(self) -> list[str]:
        return sorted({c.marker for c in self._inflight.values() if c.marker is not None})

    async def _disconnect(self, flushing: asyncio.Task, *, given_up: bool) -> None:
        """Cancel the flush, the background task and every delivery, then stop the producer:
        ``given_up``, without sending what it still holds.

        Why aiokafka's private ``_sender``: ``AIOKafkaProducer.stop`` first waits until every
        message it holds is delivered, and an idempotent producer retries without end while
        the broker is away: a stop that gave up waited forever (the worker's
        ``internals.stop_without_sending`` does the same; tests/test_faust_pins.py checks the
        member against the pinned aiokafka)."""
        tasks = [flushing, *self._inflight, *((self._runner,) if self._runner is not None else ())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if given_up:
            await self._producer._sender.close()  # noqa: SLF001 - see the docstring
        await self._producer.stop()

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __del__(self) -> None:
        if self._started and not self._closed:
            warnings.warn(
                f"Publisher {self.settings.producer_id!r} was never stopped: queued records may be lost",
                ResourceWarning,
                stacklevel=1,
            )

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def queued(self) -> int:
        """Records accepted but not yet acknowledged by Kafka."""
        return self._queued

    # -- the hot path -------------------------------------------------------------
    def publish_nowait(self, record: GenerationRecord) -> None:
        """Accept one record or raise ``QueueFullError`` at once; never awaits.

        Raises:
            QueueFullError: ``max_queued_records`` are waiting for Kafka.
            PublisherClosedError / PublisherNotStartedError.
        """
        self._check_accepts(record)
        partition = self._partition(record.session_id)
        if not self.settings.pack:  # one keyed message per record, as any Kafka client would
            self._send_alone(record, partition)
        else:
            self._buffer(record, partition)

    def _check_accepts(self, record: GenerationRecord) -> None:
        """Refuse a record while the queue is full or the publisher not running, and one of
        another run."""
        s = self.settings
        if self._queued >= s.max_queued_records or not self._started or self._closed:
            self._refuse()
        if record.run_id is not None and record.run_id != s.run_id:
            raise PublisherError(
                f"record of run {record.run_id!r} given to the publisher of run {s.run_id!r}: one Publisher "
                "publishes one run (PublisherSettings.run_id); the record was not accepted"
            )

    def _partition(self, session_id: str) -> int:
        """The records partition of a session (every record of a session on one)."""
        partition = self._partition_of.get(session_id)
        if partition is None:
            partition = self._partition_of[session_id] = partition_for_key(session_id.encode(), self._partitions)
        return partition

    def _send_alone(self, record: GenerationRecord, partition: int) -> None:
        """One keyed message for the record, which names its own producer and run."""
        s = self.settings
        if record.producer_id is None or record.run_id != s.run_id:
            import msgspec

            record = msgspec.structs.replace(record, producer_id=record.producer_id or s.producer_id, run_id=s.run_id)
        self._queued += 1
        self._sent[record.batch_id][partition] += 1
        self._spawn(
            partition, encode_records_message(record), _Carried([record.batch_id]), key=record.session_id.encode()
        )

    def _buffer(self, record: GenerationRecord, partition: int) -> None:
        """The record into its partition's packed batch (the envelope names producer and run);
        the sender woken once the batch is full."""
        data = encode_records_message(record)
        self._queued += 1
        self._sent[record.batch_id][partition] += 1
        buffer = self._buffers[partition]
        if not buffer:
            self._buffer_since[partition] = time.monotonic()
        buffer.append(data)
        self._buffer_batches[partition].append(record.batch_id)
        size = self._buffer_bytes[partition] + len(data)
        self._buffer_bytes[partition] = size
        if size >= self.settings.max_message_bytes:
            self._wake.set()  # type: ignore[union-attr]

    def publish_raw(self, value: bytes, *, session_id: str | None = None, batch_id: str | None = None) -> None:
        """Send bytes as they are (a replayed invalid record, a foreign client's message).

        Placed by ``session_id`` when given (else partition 0) and counted in
        ``batch_id``'s ``records_sent`` when given, so markers stay honest.
        """
        if self._queued >= self.settings.max_queued_records or not self._started or self._closed:
            self._refuse()
        partition = partition_for_key(session_id.encode(), self._partitions) if session_id else 0
        self._queued += 1
        if batch_id is not None:
            self._sent[batch_id][partition] += 1
        self._spawn(partition, value, _Carried([batch_id]), key=session_id.encode() if session_id else None)

    async def publish(self, record: GenerationRecord, *, timeout_s: float | None = None) -> None:
        """Accept one record; waits only while the queue is full.

        Args:
            timeout_s: how long to wait for room (default ``queue_full_timeout_s``).

        Raises:
            QueueFullError: still full after the timeout; the record was not accepted.
        """
        if self._queued < self.settings.max_queued_records or not self._started or self._closed:
            return self.publish_nowait(record)
        timeout_s = self.settings.queue_full_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while self._queued >= self.settings.max_queued_records and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._room.clear()  # type: ignore[union-attr]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)  # type: ignore[union-attr]
        self.publish_nowait(record)

    def _refuse(self) -> None:
        if not self._started:
            raise PublisherNotStartedError("call `await publisher.start()` (or use `async with`) before publishing")
        if self._closed:
            raise PublisherClosedError("publisher is stopped: create a new one to publish again")
        self.stats["queue_full"] += 1
        raise QueueFullError(
            f"{self._queued} records are waiting for Kafka (max_queued_records="
            f"{self.settings.max_queued_records}); is the broker at {self.settings.bootstrap_servers} reachable? "
            "The record was not accepted: publish it again later."
        )

    # -- batches ----------------------------------------------------------------
    async def flush(self) -> None:
        """Send everything buffered now and wait until Kafka acknowledged it all.

        Cancelling a flush stops the wait, not the deliveries: they go on in their own tasks
        (``stop`` waits for them)."""
        if not self._started:
            return
        self._drain(force=True)
        while self._inflight or self._queued:
            if self._inflight:
                await asyncio.wait(list(self._inflight))
            self._drain(force=True)
            if not self._inflight and self._queued:
                await asyncio.sleep(0.01)

    async def close_batch(
        self, batch_id: str, speculative_algorithm: str | None = None, expected_producers: int = 1
    ) -> dict[int, int]:
        """Mark this producer done with ``batch_id``.

        Flushes and waits for the acknowledgement of every record, then sends a
        ``BatchMarker`` to every partition (``records_sent`` = what this producer
        sent there for the batch) and waits for those too.

        Returns:
            records sent per partition for the batch.
        """
        if not self._started or self._closed:
            self._refuse()
        await self.flush()
        sent = dict(self._sent.pop(batch_id, {}))
        deliveries = set()
        for partition in range(self._partitions):
            marker = BatchMarker(
                batch_id=batch_id,
                producer_id=self.settings.producer_id,
                records_sent=sent.get(partition, 0),
                speculative_algorithm=speculative_algorithm or None,
                expected_producers=expected_producers,
                run_id=self.settings.run_id,
            )
            deliveries.add(
                self._spawn(partition, encode_records_message(marker), _Carried([], batch_id), key=batch_id.encode())
            )
        await asyncio.wait(deliveries)  # a cancelled close_batch leaves its markers to ``stop``
        return sent

    def open_batches(self) -> list[str]:
        """Batches with records published and no ``close_batch`` yet."""
        return list(self._sent)

    # -- background -------------------------------------------------------------
    async def _run(self) -> None:
        linger = self.settings.linger_ms / 1000
        wake = self._wake
        assert wake is not None
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), linger)
            wake.clear()
            self._drain(force=False)

    def _drain(self, *, force: bool) -> None:
        """Hand ready buffers to delivery tasks (all of them when ``force``)."""
        now = time.monotonic()
        s = self.settings
        linger = s.linger_ms / 1000
        for partition in [p for p, b in self._buffers.items() if b]:
            if (
                not force
                and self._buffer_bytes[partition] < s.max_message_bytes
                and now - self._buffer_since.get(partition, now) < linger
            ):
                continue
            records = self._buffers.pop(partition)
            batches = self._buffer_batches.pop(partition)
            self._buffer_bytes.pop(partition, None)
            self._buffer_since.pop(partition, None)
            self._pack(partition, records, batches)

    def _pack(self, partition: int, records: list[bytes], batches: list[str | None]) -> None:
        """Deliver a partition's records as messages of at most ``max_message_bytes``."""
        limit, overhead = self.settings.max_message_bytes, self._frame_overhead
        first, size = 0, overhead
        for i, data in enumerate(records):
            if i > first and size + len(data) > limit:
                self._spawn_frame(partition, records[first:i], batches[first:i])
                first, size = i, overhead
            size += len(data)
        if first < len(records):
            self._spawn_frame(partition, records[first:], batches[first:])

    def _spawn_frame(self, partition: int, records: list[bytes], batches: list[str | None]) -> None:
        s = self.settings
        self._spawn(partition, frame_batch(records, s.producer_id, s.run_id), _Carried(batches))

    def _spawn(self, partition: int, value: bytes, carried: _Carried, key: bytes | None = None) -> asyncio.Task:
        """A delivery task of its own: cancelling whoever waits for it does not cancel it."""
        task = asyncio.get_running_loop().create_task(self._deliver(partition, value, len(carried.batches), key=key))
        self._inflight[task] = carried
        task.add_done_callback(self._delivered)
        return task

    def _delivered(self, task: asyncio.Task) -> None:
        self._inflight.pop(task, None)

    async def _deliver(self, partition: int, value: bytes, count: int, *, key: bytes | None = None) -> None:
        """Send one message until Kafka acknowledges it; retries never give up while running."""
        backoff = self.settings.retry_backoff_ms / 1000
        while True:
            producer = self._producer
            try:
                future = await producer.send(self.settings.topic, value, key=key, partition=partition)
                await future
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every send error is retried
                self.stats["resends"] += 1
                log.warning(
                    "publisher: delivery to partition %d failed (%s: %s); retrying in %.2fs",
                    partition,
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                if _breaks_sequence(exc):
                    await self._renew_producer(producer, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self.stats["messages_acked"] += 1
        if count:
            self.stats["records_acked"] += count
            self._queued -= count
            if self._room is not None:
                self._room.set()


def _breaks_sequence(exc: BaseException) -> bool:
    """Whether a failed send may leave the idempotent producer's sequence numbers out of step
    with the broker's: the broker refused them, or aiokafka gave up on a batch (a timeout)
    whose numbers the resend does not reuse."""
    from aiokafka import errors

    return isinstance(
        exc,
        (
            errors.OutOfOrderSequenceNumber,
            errors.UnknownProducerId,
            errors.InvalidProducerEpoch,
            errors.ProducerFenced,
            errors.KafkaTimeoutError,
            errors.RequestTimedOutError,
        ),
    )


class _Carried(msgspec.Struct):
    """What one delivery carries: its records' batch ids (None: raw bytes of no batch), or
    none and the batch whose marker it is."""

    batches: list[str | None]
    marker: str | None = None


def _lost_batches(records: Counter[str | None], markers: list[str], shown: int = 20) -> str:
    """``: batch b-12 (20), batch b-13 (17); the markers of b-11``: record counts per batch,
    the first ``shown`` batches of each."""
    named = [f"{'no batch' if b is None else 'batch ' + b} ({n})" for b, n in records.most_common()]
    parts = [_first(named, shown, "batches")] if named else []
    if markers:
        parts.append(f"the markers of {_first(markers, shown, 'batches')}")
    return ": " + "; ".join(parts) if parts else ""


def _first(items: list[str], shown: int, what: str) -> str:
    """The first ``shown`` items, and how many more."""
    more = f" and {len(items) - shown} more {what}" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


async def first_answer(client: Any, request: Any) -> Any:
    """``request``'s answer from the first broker that answers, the cluster's known brokers
    in random order: a broker that is away (killed, restarting) stays in the metadata for a
    while, and asking only one picked at random failed a publisher's start while the other
    two of three answered (found by the group chaos on a three-broker cluster).

    Raises:
        KafkaError (aiokafka's): the last broker's error, when none answers.
    """
    import random

    from aiokafka.errors import KafkaError, NoBrokersAvailable

    nodes = [broker.nodeId for broker in client.cluster.brokers()]
    random.shuffle(nodes)
    failed: KafkaError = NoBrokersAvailable()
    for node in nodes:
        try:
            return await client.send(node, request)
        except KafkaError as exc:
            failed = exc
    raise failed
