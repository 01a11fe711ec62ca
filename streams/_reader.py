"""The I/O for the delivery decisions of ``_delivery``: direct reads, restores, the tails, commits.

Faust runs the consumer group and delivers the input to the agents; the
``Ledger`` decides what of it (and of the tails' fetches) is applied; this
driver reads what Faust's membership says into a ``Membership``, carries the
decisions out and applies through the stages' ``run`` hooks. Direct reads
(a partition's changelog, gap fills, catch-ups) go through one long-lived
standalone consumer per input partition (``DirectReader``), log ends through one
more; each tail keeps its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

from ._delivery import Apply, Claim, Fetched, Ledger, Membership, ReadGap, Restore, Seek

__all__ = ["DeliveryDriver", "DirectReader", "split_chunk"]

log = logging.getLogger("specmeter.worker")


class _Turns:
    """One read at a time, the waiting served by priority, then in order of arrival."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._arrivals = 0

    @contextlib.asynccontextmanager
    async def turn(self, priority: int) -> AsyncIterator[None]:
        if self._busy or self._waiting:
            self._arrivals += 1
            waiter = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (priority, self._arrivals, waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._hand_over()  # handed the turn, but cancelled before taking it
                raise
        self._busy = True
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        while self._waiting:
            _, _, waiter = heapq.heappop(self._waiting)
            if not waiter.done():
                waiter.set_result(None)  # stays busy: the turn passes on
                return
        self._busy = False


#: a restore's changelog read goes before input reads: a partition is followed (and the
#: worker ready) only once restored, and a catch-up, a chunk at a time, must not delay it
CHANGELOG, INPUT = 0, 1


class DirectReader:
    """One standalone consumer (no group, nothing committed) for every direct read.

    Started on first use and kept (a read used to start and stop a consumer of its own,
    per chunk); one read at a time, so a restore's changelog read and a catch-up of the
    same partition take turns a chunk each, changelog reads first. After an error it is
    stopped and a fresh one is started by the next read."""

    def __init__(self, broker: str, kafka: dict[str, Any] | None = None) -> None:
        self.broker = broker
        self.kafka = kafka or {}
        self._consumer: Any = None
        self._turns = _Turns()
        #: (partition, offset) where the consumer stands after the last read, when known exactly:
        #: a read that starts there continues without a seek (which drops what was prefetched)
        self._stands_at: tuple[Any, int] | None = None

    async def _started(self) -> Any:
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.broker,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=16 * 1024 * 1024,
                # a read stops at the end it was given: a fetch there waits for
                # nothing, and the next read never waits long for one in flight
                fetch_max_wait_ms=20,
                **self.kafka,
            )
            try:
                await consumer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def _reset(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._stands_at = None
        if consumer is not None:
            try:
                await consumer.stop()
            except Exception as exc:  # noqa: BLE001 - a fresh one starts on the next read
                log.debug("stopping the direct reader failed: %r", exc)

    async def close(self) -> None:
        """Stop the consumer now, without waiting for a read in progress (it fails)."""
        await self._reset()

    async def end_offsets(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The log end of each (topic, partition) now."""
        from aiokafka.structs import TopicPartition

        async with self._turns.turn(INPUT):
            try:
                consumer = await self._started()
                ends = await consumer.end_offsets([TopicPartition(t, p) for t, p in partitions])
            except Exception:
                await self._reset()
                raise
        return {(tp.topic, tp.partition): end for tp, end in ends.items()}

    async def scan(
        self,
        topic: str,
        partition: int,
        start: int | None,
        end: int | None,
        visit: Callable[[Any], None],
        *,
        max_messages: int | None = None,
        timeout_s: float = 120.0,
        priority: int = INPUT,
    ) -> int:
        """Feed the messages of one partition from ``start`` (None: its beginning) up to
        ``end`` (None: its end now) to ``visit``, at most ``max_messages`` of them; returns
        the offset reached (exclusive).

        A read that starts where the previous one of the same partition stopped continues
        from what the consumer prefetched meanwhile (a catch-up reads chunk after chunk);
        a read that reached its end pauses the partition: an idle fetch would long-poll at
        the log end, and the next read would wait for it to return."""
        from aiokafka.structs import TopicPartition

        tp = TopicPartition(topic, partition)
        async with self._turns.turn(priority):
            stands_at, self._stands_at = self._stands_at, None
            stopped_early = False
            try:
                consumer = await self._started()
                if consumer.assignment() != {tp}:
                    consumer.assign([tp])
                    stands_at = None
                else:
                    consumer.resume(tp)  # paused if the previous read reached its end
                if end is None:
                    end = (await consumer.end_offsets([tp]))[tp]
                if start is None:
                    await consumer.seek_to_beginning(tp)
                elif start >= end:
                    self._stands_at = stands_at
                    return end
                elif stands_at != (tp, start):
                    consumer.seek(tp, max(start, 0))
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout_s
                left = max_messages
                while (position := await consumer.position(tp)) < end:
                    if loop.time() > deadline:
                        raise TimeoutError(f"reading {topic}[{partition}] from {start} to {end} took over {timeout_s}s")
                    # never more than are left to take: the consumer then stands right after
                    # the last one taken, and the next read can continue from there
                    fetched = (await consumer.getmany(tp, timeout_ms=500, max_records=left)).get(tp, [])
                    for message in fetched:
                        if message.offset >= end:  # written after the end was read: the next read's
                            return end
                        if start is not None and message.offset < start:
                            continue
                        visit(message)
                        if left is not None:
                            left -= 1
                            if left == 0:
                                stopped_early = message is fetched[-1]
                                if stopped_early:
                                    self._stands_at = (tp, message.offset + 1)
                                return message.offset + 1
                self._stands_at = (tp, position)
                return position
            except Exception:
                await self._reset()
                raise
            finally:
                if not stopped_early and self._consumer is not None and tp in self._consumer.assignment():
                    self._consumer.pause(tp)

    async def read_range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        max_messages: int | None = None,
        timeout_s: float = 120.0,
    ) -> tuple[list[tuple[int, Any]], int]:
        """The (offset, value) messages of [start, end) (end None: the log end now), at most
        ``max_messages``, and the offset read up to (exclusive): ``end``, or less when
        ``max_messages`` stopped the read early."""
        out: list[tuple[int, Any]] = []

        def collect(message: Any) -> None:
            out.append((message.offset, message.value))

        upto = await self.scan(topic, partition, start, end, collect, max_messages=max_messages, timeout_s=timeout_s)
        return out, upto

    async def read_changelog(
        self, topic: str, partition: int, *, timeout_s: float = 120.0
    ) -> list[tuple[bytes, bytes]]:
        """Every live (key, value) of one compacted changelog partition, read to its end
        (latest value per key; tombstones remove keys)."""
        live: dict[bytes, bytes] = {}

        def keep(message: Any) -> None:
            if message.value is None:
                live.pop(message.key, None)
            else:
                live[message.key] = message.value

        await self.scan(topic, partition, None, None, keep, timeout_s=timeout_s, priority=CHANGELOG)
        return list(live.items())


def split_chunk(messages: list[tuple[int, bytes]], max_bytes: int) -> tuple[list, list]:
    """The first messages up to ``max_bytes`` of values (at least one), and the rest."""
    size = 0
    for i, (_, value) in enumerate(messages):
        size += len(value)
        if size >= max_bytes:
            return messages[: i + 1], messages[i + 1 :]
    return messages, []


#: (topic, state, partition, messages) -> applied: a stage's processing of admitted input
Run = Callable[[str, Any, int, list[tuple[int, Any]]], Awaitable[None]]
#: (topic, partition, changelog entries, now) -> (the restored state, what to do once it is installed)
Build = Callable[[str, int, list[tuple[bytes, bytes]]], tuple[Any, Callable[[], None]]]


class DeliveryDriver:
    """Carries out the ledger's decisions for both stages' inputs of one worker."""

    #: seconds between tries of a failed catch-up
    RETRY_S = 1.0

    def __init__(
        self, app: Any, settings: Any, *, run: Run, build: Build, changelog_of: Callable[[str], str], crash_points: Any
    ) -> None:
        self.app = app
        self.settings = settings
        t = settings.topics
        self.records, self.partials = t.records, t.partials
        self.ledger = Ledger((self.records, self.partials))
        #: for log ends (idle catch-up)
        self.reader = DirectReader(settings.broker, settings.security.aiokafka_kwargs())
        #: (topic, partition) -> the reader of that input partition and its changelog: partitions
        #: are read in parallel (one reader for all let a restarted worker catch up its
        #: partitions one after another, and one killed every few seconds starved the last)
        self._readers: dict[tuple[str, int], DirectReader] = {}
        self._run = run
        self._build = build
        self._changelog_of = changelog_of
        self.crash_points = crash_points
        #: (topic, partition) -> its restore task (restore, then catch-up)
        self._restoring: dict[tuple[str, int], asyncio.Task] = {}
        #: name -> (the task of a tail (or other long-running helper), when it started)
        self._tasks: dict[str, tuple[asyncio.Task, float]] = {}
        #: records partition -> when stage 1 last got input (wall clock, for /metrics)
        self.last_event_at: dict[int, float] = {}
        self.gap_fills = 0
        self.idle_catch_ups = 0

    # -- membership -------------------------------------------------------------------------------
    def membership(self) -> Membership:
        """What Faust's group membership says now."""
        app = self.app
        consumer = app.consumer
        generation = getattr(app, "consumer_generation_id", None)
        if consumer is None:
            return Membership({}, generation, settled=False)
        assigned: dict[str, set[int]] = {self.records: set(), self.partials: set()}
        for tp in consumer.assignment():
            assigned.setdefault(tp.topic, set()).add(tp.partition)
        return Membership({t: frozenset(ps) for t, ps in assigned.items()}, generation, settled=not app.rebalancing)

    def _reader_for(self, topic: str, partition: int) -> DirectReader:
        reader = self._readers.get((topic, partition))
        if reader is None:
            reader = DirectReader(self.settings.broker, self.settings.security.aiokafka_kwargs())
            self._readers[(topic, partition)] = reader
        return reader

    def _progress(self, claim: Claim) -> None:
        self.ledger.progressed(claim.topic, claim.partition, time.monotonic())

    async def _apply(self, action: Apply) -> None:
        claim = action.claim
        if claim.topic == self.records:
            self.last_event_at[claim.partition] = time.time()
        self._progress(claim)
        await self._run(claim.topic, claim.state, claim.partition, action.messages)

    # -- restore and catch-up -----------------------------------------------------------------------
    def restore_assigned(self, membership: Membership) -> None:
        """Start restoring every partition of either input assigned without a state."""
        for topic in (self.records, self.partials):
            for partition in self.ledger.to_restore(topic, membership):
                self.ensure_restore(topic, partition)

    def ensure_restore(self, topic: str, partition: int) -> None:
        """Start restoring a partition's state in the background, unless the ledger says it
        is restored or being restored (see ``Ledger.begin_restore``)."""
        epoch = self.ledger.begin_restore(topic, partition)
        if epoch is None:
            return
        previous = self._restoring.get((topic, partition))
        if previous is not None:
            previous.cancel()  # of an older epoch: it can no longer install anything
        self._restoring[(topic, partition)] = asyncio.get_running_loop().create_task(
            self._restore(topic, partition, epoch), name=f"restore-{topic}-{partition}"
        )

    async def _restore(self, topic: str, partition: int, epoch: int) -> None:
        try:
            await self._restore_and_catch_up(topic, partition, epoch)
        finally:
            self.ledger.end_restore(topic, partition, epoch)

    async def _restore_and_catch_up(self, topic: str, partition: int, epoch: int) -> None:
        """Read the partition's changelog, install its state, then catch up from its
        checkpoint to the log end: whatever was delivered meanwhile was not applied
        (``Restore``) and is read here; Faust's consumer may have resumed anywhere (it
        commits past offsets it considers gaps)."""
        ledger = self.ledger
        try:
            entries = await self._reader_for(topic, partition).read_changelog(self._changelog_of(topic), partition)
        except Exception as exc:  # noqa: BLE001 - retried by the next tick
            log.warning("restoring topic=%s partition=%d failed (%r): retrying", topic, partition, exc)
            return
        if epoch != ledger.epoch or not self.membership().owns(topic, partition):
            return
        await self.crash_points.reached("restore")
        state, installed = self._build(topic, partition, entries)
        claim = ledger.install(topic, partition, epoch, state, self.membership())
        if claim is None:
            return
        installed()
        while True:  # retried until caught up: the partition's batch timers wait for it
            try:
                caught = await self.read_and_apply(claim, None)
                break
            except Exception as exc:  # noqa: BLE001 - a broker away for a while
                log.warning(
                    "catching up topic=%s partition=%d failed (%r): retrying in %.0f s",
                    topic,
                    partition,
                    exc,
                    self.RETRY_S,
                )
            await asyncio.sleep(self.RETRY_S)
            if not ledger.holds(claim, self.membership()):
                return
        if caught:
            log.info("topic=%s partition=%d caught up %d message(s) after the checkpoint", topic, partition, caught)

    async def read_and_apply(self, claim: Claim, end: int | None) -> int:
        """Read [checkpoint+1, end) of a claimed partition directly and apply it, a chunk
        (``chunk_messages``) at a time, yielding between chunks (the producer sends a chunk's
        changelog while the next is read); stops when the claim no longer holds. The reader
        prefetches the next chunk meanwhile. Returns how many messages were applied."""
        ledger = self.ledger
        catch_up = ledger.catch_up(claim, end, max(1, self.settings.chunk_messages))
        done = 0
        while (span := catch_up.next_range()) is not None:
            reader = self._reader_for(claim.topic, claim.partition)
            messages, upto = await reader.read_range(
                claim.topic, claim.partition, span.start, span.end, max_messages=span.max_messages
            )
            if not ledger.holds(claim, self.membership()):
                return done
            if messages:
                await self._run(claim.topic, claim.state, claim.partition, messages)
                done += len(messages)
            self._progress(claim)
            catch_up.read(len(messages), upto)
            await asyncio.sleep(0)
            if not ledger.holds(claim, self.membership()):
                return done
        return done

    def forget(self, topic_partitions: Any) -> None:
        """Drop the state of revoked partitions (and stop their restores); the next owner rebuilds it."""
        revoked = [(tp.topic, tp.partition) for tp in topic_partitions]
        for key in revoked:
            task = self._restoring.pop(key, None)
            if task is not None:
                task.cancel()
        self.ledger.revoke(revoked)

    # -- Faust's delivery ---------------------------------------------------------------------------
    async def on_delivered(self, topic: str, events: list) -> None:
        """Apply what the ledger admits of one hand-over of Faust's delivery."""
        membership = self.membership()
        fetched = [
            Fetched(e.message.partition, e.message.offset, e.value, getattr(e.message, "generation_id", None))
            for e in events
        ]
        delivered = self.ledger.delivered(topic, fetched, membership)
        if delivered.stale:
            log.info("dropped %d message(s) fetched before a rebalance (topic=%s)", delivered.stale, topic)
        for action in delivered.actions:
            if isinstance(action, Restore):  # not restored yet: the restore's catch-up reads these
                self.ensure_restore(action.topic, action.partition)
            elif not self.ledger.holds(action.claim, self.membership()):
                continue  # an earlier partition's await saw a revocation
            elif isinstance(action, Apply):
                await self._apply(action)
            elif isinstance(action, ReadGap):
                self.gap_fills += 1
                claim = action.claim
                read = await self.read_and_apply(claim, action.end)
                log.warning(
                    "partition=%d of %s skipped offsets after %d: read %d message(s) directly",
                    claim.partition,
                    topic,
                    action.start - 1,
                    read,
                )

    async def catch_up_idle(self, idle_s: float = 1.0) -> None:
        """Progress that does not depend on Faust's delivery: every owned partition whose log
        end is past its checkpoint while nothing arrived for ``idle_s`` is read directly."""
        ledger = self.ledger
        idle = ledger.idle(self.membership(), time.monotonic(), idle_s)
        if not idle:
            return
        ends = await self.reader.end_offsets([(c.topic, c.partition) for c in idle])
        for claim in idle:
            end = ledger.idle_read(claim, ends.get((claim.topic, claim.partition), 0), time.monotonic())
            if end is None:
                continue
            read = await self.read_and_apply(claim, end)
            if not ledger.holds(claim, self.membership()):
                return
            self.idle_catch_ups += 1
            log.info(
                "topic=%s partition=%d: nothing delivered for %.0fs, read %d message(s) directly",
                claim.topic,
                claim.partition,
                idle_s,
                read,
            )

    # -- the tails -------------------------------------------------------------------------------------
    def _tail_consumer(self, **options: Any) -> Any:
        """A tail's consumer: no group (the positions are the checkpoints), a short fetch wait."""
        from aiokafka import AIOKafkaConsumer

        s = self.settings
        return AIOKafkaConsumer(
            bootstrap_servers=s.broker,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=s.fetch_wait_ms,
            **options,
            **s.security.aiokafka_kwargs(),
        )

    async def tail_partials(self) -> None:
        """Feed stage 2 from a consumer of its own, beside Faust's.

        Faust's one consumer serves both topics, and aiokafka sends no new fetch to a
        broker while fetched records younger than ``prefetch_backoff`` (100 ms) wait
        there: under load every partial queued behind the records topic, for up to
        100 ms per fetch. This consumer follows only the owned partials partitions,
        from each merger's checkpoint; whichever path delivers first applies, the
        other finds the offsets at or below the checkpoint and skips them.
        """

        topic, ledger = self.partials, self.ledger
        consumer = self._tail_consumer()
        following: dict[int, Any] = {}  # partition -> the merger its position was set for
        try:
            await consumer.start()
            while True:
                following = self._refollow(consumer, topic, following, during_catch_up=True)
                if not following:
                    await asyncio.sleep(0.1)
                    continue
                epoch = ledger.epoch
                fetched = await consumer.getmany(timeout_ms=200, max_records=500)
                for tp, messages in fetched.items():
                    state = following.get(tp.partition)
                    claim = Claim(topic, tp.partition, epoch, state)
                    if state is None or not ledger.holds(claim, self.membership()):
                        continue
                    action = ledger.follow(claim, [(m.offset, m.value) for m in messages])
                    if isinstance(action, Seek):  # a gap: read from the checkpoint again
                        consumer.seek(tp, action.offset)
                    elif action is not None:
                        await self._apply(action)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Faust's own delivery still feeds stage 2
            log.warning("partials tail stopped (%r); stage 2 is fed by Faust's consumer alone until restart", exc)
        finally:
            await consumer.stop()

    async def tail_records(self) -> None:
        """Feed stage 1 from a consumer of its own, beside Faust's: the main path under load.

        Faust's consumer fetches with ``fetch_max_wait_ms`` fixed at 1500 ms, and aiokafka
        sends a new fetch only for the partitions holding no untaken records while the
        others wait for that fetch to return: under sustained load a partition's next
        messages (a batch's marker among them) waited up to 1.5 s behind a fetch for
        quiet partitions, and Faust then handed them over a few messages at a time,
        each hand-over costing a changelog delta and a checkpoint. This consumer follows
        every owned, restored records partition from its checkpoint with a short fetch
        wait (``fetch_wait_ms``), takes everything fetched at once, and applies it in
        chunks of at most ``chunk_bytes`` per partition, round robin between partitions:
        a fetched marker waits behind at most one chunk of each partition, never behind
        a fetch. Whichever path delivers first applies; the other finds the offsets at
        or below the checkpoint and skips them (Faust's still acks and commits).
        """
        from aiokafka.structs import TopicPartition

        topic, ledger = self.records, self.ledger
        consumer = self._tail_consumer(max_partition_fetch_bytes=max(self.settings.chunk_bytes, 1_048_576))
        following: dict[int, Any] = {}  # partition -> the processor its position was set for
        try:
            await consumer.start()
            while True:
                following = self._refollow(consumer, topic, following)
                if not following:
                    await asyncio.sleep(0.1)
                    continue
                epoch = ledger.epoch
                fetched = await consumer.getmany(timeout_ms=200)
                pending = {
                    tp.partition: [(m.offset, m.value) for m in messages]
                    for tp, messages in fetched.items()
                    if messages
                }
                while pending:
                    membership = self.membership()
                    for partition in list(pending):
                        claim = Claim(topic, partition, epoch, following.get(partition))
                        if claim.state is None or not membership.settled or not ledger.holds(claim, membership):
                            del pending[partition]  # read again from the checkpoint once ours
                            continue
                        action = ledger.follow(claim, pending.pop(partition))
                        if isinstance(action, Seek):  # a gap: read from the checkpoint again
                            consumer.seek(TopicPartition(topic, partition), action.offset)
                        elif action is not None:
                            chunk, rest = split_chunk(action.messages, self.settings.chunk_bytes)
                            if rest:
                                pending[partition] = rest
                            await self._apply(Apply(claim, chunk))
                    await asyncio.sleep(0)  # stage 2 and the producer between rounds
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Faust's own delivery still feeds stage 1
            log.warning("records tail stopped (%r); stage 1 is fed by Faust's consumer alone until restart", exc)
        finally:
            await consumer.stop()

    def _refollow(
        self, consumer: Any, topic: str, following: dict[int, Any], *, during_catch_up: bool = False
    ) -> dict[int, Any]:
        """Point a tail's consumer at the partitions it should follow now, each at its
        checkpoint + 1, when they (or their states) changed; returns what it follows."""
        from aiokafka.structs import TopicPartition

        owned = self.ledger.followed(topic, self.membership(), during_catch_up=during_catch_up)
        if owned.keys() != following.keys() or any(following[p] is not q for p, q in owned.items()):
            consumer.assign([TopicPartition(topic, p) for p in owned])
            for p, state in owned.items():
                consumer.seek(TopicPartition(topic, p), state.checkpoint + 1)
            return dict(owned)
        return following

    def start_tails(self, also: Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = ()) -> None:
        """Start the records and partials tails (and ``also``), or restart one at most every
        5 s after it stopped on an error."""
        for name, run in (*also, ("records-tail", self.tail_records), ("partials-tail", self.tail_partials)):
            task, started = self._tasks.get(name, (None, 0.0))
            if task is not None and (not task.done() or time.monotonic() - started < 5.0):
                continue
            self._tasks[name] = (asyncio.get_running_loop().create_task(run(), name=name), time.monotonic())

    def steer_records_delivery(self, *, resumed: bool = False) -> None:
        """Pause Faust's delivery of the records partitions while the records tail runs
        (one reader: on 2 cores a second fetch, decompression and Faust's per-message
        hand-over of the same input cost a fifth of the worker's CPU), and resume it
        when the tail has stopped. Faust resumes its partitions after every rebalance;
        this runs every tick, and with ``resumed`` right after Faust resumed them (the
        rebalance is not marked ended yet, but nothing of it resumes partitions any more)."""
        consumer = self.app.consumer
        if consumer is None or (self.app.rebalancing and not resumed):
            return
        tps = {tp for tp in consumer.assignment() if tp.topic == self.records}
        paused: set[Any] = getattr(consumer, "_paused_partitions", set())
        task, _ = self._tasks.get("records-tail", (None, 0.0))
        if task is not None and not task.done():
            if tps - paused:
                consumer.pause_partitions(tps - paused)
        elif tps & paused:
            consumer.resume_partitions(tps & paused)

    async def commit_records(self) -> None:
        """Commit the records offsets stage 1 has applied (checkpoint + 1) for the consumer
        group: Faust commits only what it delivered, and while the records tail reads the
        input the group's lag (what operators watch) would otherwise never move. Recovery
        never reads these offsets."""
        app = self.app
        consumer = app.consumer
        commit = getattr(consumer, "_commit", None)  # Faust's consumer's own commit
        if consumer is None or commit is None or app.rebalancing:
            return
        from faust.types import TP

        offsets = self.ledger.commit_offsets(self.records, self.membership())
        if offsets:
            await commit({TP(self.records, p): offset for p, offset in offsets.items()})

    async def close(self) -> None:
        """Stop the tails, the restores and the direct readers."""
        for task, _ in self._tasks.values():
            task.cancel()
        for task in self._restoring.values():
            task.cancel()
        for reader in (self.reader, *self._readers.values()):
            await reader.close()
