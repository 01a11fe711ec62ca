"""The I/O that carries out the delivery rules of ``ledger``: one route per stage.

A worker holds a fixed set of Kafka clients, whatever its partition count: one
``InputRoute`` per stage, the ordered producer (``output``) and, while partitions are
being taken over, one ``ChangelogReader`` (closed again when the restores are done).

**Each route's consumer is a member of its stage's consumer group** (``<app-id>-stage1``
over the records topic, ``<app-id>-stage2`` over the partials topic), as aiokafka means
a consumer to be: the group assigns it partitions (``assignor``: sticky, so a rebalance
moves only what must move), and it polls for as long as the route makes progress. A
route that stops making progress for ``max_poll_interval`` leaves its group, whose
other members take its partitions over: the liveness ``max.poll.interval`` exists for.

The ``DeliveryDriver`` follows the routes' rebalance callbacks into the ledger: a
revoked partition's state is suspended; a partition assigned again keeps it when its
changelog did not move; any other is taken over (``core.ownership``: the group's generation
checked by a commit, a takeover record, the changelog read up to it) and restored in
steps that yield, so that heartbeats, probes and the other partitions go on. It commits
the checkpoints for the group's lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from ..core.ownership import CLOCK_SKEW_MS, ChangelogView, StateWithoutCheckpoint, Takeover, ValidState
from ..settings import WorkerSettings
from .assignor import StickyAssignor
from .internals import group_generation, set_fetch_wait
from .ledger import Checkpointed, Claim, Ledger, TopicPartition
from .output import OrderedProducer
from .writes import OwnedWrites

__all__ = ["ChangelogReader", "DeliveryDriver", "InputRoute", "StageHooks"]

log = logging.getLogger("specmeter.worker")

#: a stage state restored, and what to do once it is installed
Restored = tuple[Checkpointed, Callable[[], None]]


class Confirmed(NamedTuple):
    """A member's group generation, confirmed by a commit, and when (wall clock, ms, before
    the commit was sent): what its takeover records carry (``core.ownership``)."""

    generation: int
    at_ms: int


class StageHooks(Protocol):
    """What the driver needs of the stages (``worker.app.StreamShell``)."""

    def changelog_of(self, topic: str) -> str:
        """The changelog topic of a stage's input topic."""
        ...

    def restorer(
        self, topic: str, partition: int, state: ValidState, epoch: int | None
    ) -> Generator[None, None, Restored]:
        """A partition's state restored from its changelog's valid state, in steps (it
        yields between them), and what to do once it is installed (its first writes)."""
        ...

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, bytes]]) -> None:
        """Apply admitted input (offset order) to a partition's state and carry out its effects."""
        ...

    async def reached(self, point: str) -> None:
        """A crash point (``worker.faults``): tests kill the worker here."""
        ...


def _consumer(broker: str, kafka: Mapping[str, Any], **options: Any) -> Any:
    """A consumer of the worker's own: a group member (a route) or none (the changelog
    reader); nothing is committed unless it says so."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        bootstrap_servers=broker,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
        **kafka,
    )


def split_chunk(messages: list[tuple[int, bytes]], max_bytes: int) -> tuple[list, list]:
    """The first messages up to ``max_bytes`` of values (at least one), and the rest."""
    size = 0
    for i, (_, value) in enumerate(messages):
        size += len(value)
        if size >= max_bytes:
            return messages[: i + 1], messages[i + 1 :]
    return messages, []


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
            input_ends = await consumer.end_offsets([TP(t, p) for t, p in inputs]) if inputs else {}
            views = await self._read_views(consumer, {TP(t, p): end for (t, p), end in changelogs.items()})
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


def _keyed(by_tp: Mapping[Any, Any]) -> dict[TopicPartition, Any]:
    """A mapping keyed by aiokafka's TopicPartitions, keyed by (topic, partition) tuples."""
    return {(tp.topic, tp.partition): value for tp, value in by_tp.items()}


def _rebalance_listener(route: InputRoute) -> Any:
    """aiokafka's ``ConsumerRebalanceListener`` of one route (awaited during a rejoin)."""
    from aiokafka.abc import ConsumerRebalanceListener

    class Rebalance(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            await route.driver.revoked(route.topic, [tp.partition for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            if route.group_format_refused():
                return
            route.driver.assigned(route.topic, [tp.partition for tp in assigned])

    return Rebalance()


async def within(awaitable: Awaitable[Any], timeout_s: float, left: set[asyncio.Future] | None = None) -> Any:
    """``awaitable``'s result, or TimeoutError after ``timeout_s`` without cancelling it.

    For aiokafka's commits: ``commit_offsets`` shields its request, and a cancelled shield
    drops the request's outcome (asyncio's ``shield`` removes its callback), so every
    commit ``wait_for`` gave up on while the coordinator was away ended in "Task exception
    was never retrieved" and a traceback. The request ends on its own (aiokafka retries
    until the coordinator answers or the member is stale); its outcome is read and dropped.
    One given up on (or whose caller was cancelled) is put in ``left``: its owner cancels
    it once the consumer stopped, when no request of it is in flight any more.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        _leave_running(task, left)
        raise
    if not done:
        _leave_running(task, left)
        raise TimeoutError(f"no answer in {timeout_s:g} s")
    return task.result()


def _leave_running(task: asyncio.Future, left: set[asyncio.Future] | None) -> None:
    task.add_done_callback(_drop_outcome)
    if left is not None:
        left.add(task)
        task.add_done_callback(left.discard)


def _drop_outcome(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class InputRoute:
    """One stage's input: a consumer in the stage's group that reads every owned, restored
    partition of the topic from its checkpoint, and hands what the ledger admits to the stage.

    Everything fetched is applied in chunks of at most ``chunk_bytes`` per partition,
    round robin between partitions: a fetched marker waits behind at most one chunk
    of each partition, never behind a whole backlog. A catch-up after a restore is this
    same reading, from the restored checkpoint: the ledger holds the partition's timers
    until the route reaches the log end it had at install.

    After ``IDLE_AFTER_S`` without input the broker may hold its fetches for
    ``IDLE_FETCH_WAIT_MS`` instead of the short busy wait (``fetch_wait_ms``): an idle
    worker's CPU then does not grow with its partitions, and new input still ends a
    held fetch at once. Not while an assigned partition waits for its state, though: a
    consumer has one fetch in flight per broker, and a partition resumed behind a held
    one would wait out the hold before its catch-up begins.
    """

    IDLE_AFTER_S = 5.0
    IDLE_FETCH_WAIT_MS = 5000
    #: the longest a fetch waits for input (what to follow is followed meanwhile)
    FETCH_TIMEOUT_MS = 200
    #: the longest an offset commit may take (a coordinator failing over): it runs beside
    #: the reading, never in its way
    COMMIT_TIMEOUT_S = 10.0

    def __init__(
        self,
        driver: DeliveryDriver,
        topic: str,
        group_id: str,
        *,
        chunk_bytes: int,
        fetch_options: Mapping[str, Any],
        group_options: Mapping[str, Any],
    ):
        self.driver = driver
        self.topic = topic
        self.group_id = group_id
        self.chunk_bytes = chunk_bytes
        self.fetch_options = fetch_options
        self.group_options = group_options
        self.busy_fetch_wait_ms: int = fetch_options.get("fetch_max_wait_ms", 500)
        #: the fetch wait in force (the busy one, or ``IDLE_FETCH_WAIT_MS`` while idle)
        self.fetch_wait_ms = self.busy_fetch_wait_ms
        #: partition -> the state its consumer position was set for
        self._following: dict[int, Checkpointed] = {}
        self.consumer: Any = None
        #: the group's assignor (this member's): the group's format comes with each assignment
        self.assignor = StickyAssignor()
        self._group_format = self.assignor.group_format
        self._committed: dict[TopicPartition, int] = {}
        self._committed_at = 0.0
        self._commit_failures = 0
        #: the commit under way, beside the reading (one at a time)
        self._committing: asyncio.Task | None = None
        #: commit requests given up on, still retrying: cancelled once the consumer stopped
        self._left_running: set[asyncio.Future] = set()
        #: reads failed in a row (the first is said, the rest logged at debug)
        self._fetch_failures = 0
        #: the route stops applying input (the worker is stopping)
        self.stopping = False
        #: set when the partitions to follow or their states changed (an assignment, a state
        #: installed, a fence): the route follows them at once, even while a fetch waits
        self.changed = asyncio.Event()

    async def run(self) -> None:
        """Join the group and read until cancelled; errors are said once and retried."""
        driver = self.driver
        consumer = self._new_consumer()
        try:
            consumer.subscribe([self.topic], listener=_rebalance_listener(self))
            await _retrying(f"route of {self.topic}: joining its group", consumer.start, driver.RETRY_S)
            self.consumer = consumer
            await self._read(consumer)
        finally:
            self.consumer = None
            with contextlib.suppress(Exception):
                await consumer.stop()  # leaves the group: its partitions move at once
            # commits still retrying (a coordinator away) end only now: cancelled while one was
            # in flight, aiokafka's shield would drop its outcome (``within``)
            if self._committing is not None:
                self._committing.cancel()
                with contextlib.suppress(asyncio.CancelledError):  # it catches every other error itself
                    await self._committing
            for request in list(self._left_running):
                request.cancel()

    def _new_consumer(self) -> Any:
        """The route's consumer: a member of the stage's group, with the sticky assignor."""
        return self.driver.new_consumer(
            group_id=self.group_id,
            partition_assignment_strategy=(self.assignor,),
            **self.group_options,
            **self.fetch_options,
        )

    def group_format_refused(self) -> bool:
        """After an assignment: say the group's format when it changed (a rolling upgrade's
        progress), and whether it is one this release cannot write (``core.formats``): then
        the output fails, so nothing is written, and the worker stops with the reason."""
        assignor = self.assignor
        if assignor.group_format != self._group_format:
            self._group_format = assignor.group_format
            log.info(
                "%s: the group writes format %d (this release writes %d to %d)",
                self.topic,
                assignor.group_format,
                assignor.oldest_format,
                assignor.format,
            )
        if assignor.refused is None:
            return False
        log.critical("%s: %s", self.topic, assignor.refused)
        self.driver.writes.output.fail(self.topic, assignor.refused)
        return True

    async def _read(self, consumer: Any) -> None:
        last_input = time.monotonic()
        while True:
            self._refollow(consumer)
            fetched = await self._fetch(consumer)
            if fetched is None:
                continue
            pending = _by_partition(fetched)
            if pending:
                last_input = time.monotonic()
            self._pace(
                consumer, idle=time.monotonic() - last_input >= self.IDLE_AFTER_S and self._all_followed(consumer)
            )
            await self._apply(pending)
            await self._check_caught_up(consumer)
            await self._commit(consumer)

    async def _fetch(self, consumer: Any) -> Any:
        """What the consumer fetched (``_fetch_following``); None after a failure, said once
        and retried ``RETRY_S`` later: the route must not die."""
        try:
            fetched = await self._fetch_following(consumer)
        except Exception as exc:  # noqa: BLE001 - said once, retried
            self._fetch_failures += 1
            (log.warning if self._fetch_failures == 1 else log.debug)(
                "route of %s: reading failed (%r); trying again every %.0f s", self.topic, exc, self.driver.RETRY_S
            )
            await asyncio.sleep(self.driver.RETRY_S)
            return None
        self._fetch_failures = 0
        return fetched

    async def _fetch_following(self, consumer: Any) -> Any:
        """What the consumer fetched within ``FETCH_TIMEOUT_MS``. When what to follow
        changes meanwhile (an install, an assignment, a fence) the route follows it at once,
        while the fetch waits: a partition restored meanwhile is resumed (sought) and its
        records end the wait, as aiokafka's fetcher allows. The fetch is never cut short:
        aiokafka counts a consumer as polling from ``getmany``'s start to its end (its
        ``max_poll_interval_ms`` liveness), which a cancelled ``getmany`` never ends."""
        fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=self.FETCH_TIMEOUT_MS))
        try:
            while not fetch.done():
                changed = asyncio.ensure_future(self.changed.wait())
                try:
                    await asyncio.wait((fetch, changed), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if self.changed.is_set():
                    self._refollow(consumer)
        except asyncio.CancelledError:  # the route stops: its consumer is stopped next
            fetch.cancel()
            raise
        return fetch.result()

    def look_again(self) -> None:
        """The partitions to follow or their states changed: follow them at once, and fetch
        with the short wait from the next request on (called from the rebalance listener
        before aiokafka's fetcher sends one for a new assignment)."""
        self.changed.set()
        if self.consumer is not None:
            self._pace(self.consumer, idle=False)

    def _all_followed(self, consumer: Any) -> bool:
        """Whether every partition assigned to the route is followed (none waits for its state)."""
        return all(tp.partition in self._following for tp in consumer.assignment())

    async def _check_caught_up(self, consumer: Any) -> None:
        """Tell the driver of each partition whose route reached the log end it had at install."""
        ledger = self.driver.ledger
        for partition, end in ledger.catching_up(self.topic).items() if ledger.any_catching_up else ():
            held = ledger.claim(self.topic, partition)
            if held is not None and self._following.get(partition) is held.state:
                await self._check_reached(consumer, held, end)

    async def _check_reached(self, consumer: Any, held: Claim, end: int) -> None:
        """Tell the driver when the position of a partition followed for its state reached ``end``."""
        from aiokafka.structs import TopicPartition as TP

        position = await consumer.position(TP(self.topic, held.partition))
        if self.driver.ledger.reached(held, position):
            self.driver.caught_up(held, end)

    async def _apply(self, pending: dict[int, list[tuple[int, bytes]]]) -> None:
        """Apply what was fetched, a chunk per partition in turn."""
        while pending and not self.stopping:
            for partition in list(pending):
                await self._apply_chunk(partition, pending)
            await asyncio.sleep(0)  # the other stage and the producer between rounds

    async def _apply_chunk(self, partition: int, pending: dict[int, list[tuple[int, bytes]]]) -> None:
        """Apply a partition's next chunk of what is pending. Input
        of a partition no longer followed is dropped (read again from the checkpoint once
        ours)."""
        claim = self._claim(partition)
        if claim is None:
            del pending[partition]
            return
        admitted = self.driver.ledger.admit(claim, pending.pop(partition))
        if admitted.gap is not None:
            self._say_gap(partition, admitted.gap)
        if not admitted.messages:
            return
        chunk, rest = split_chunk(admitted.messages, self.chunk_bytes)
        if rest:
            pending[partition] = rest
        await self.driver.apply(claim, chunk)

    def _say_gap(self, partition: int, gap: tuple[int, int]) -> None:
        """Offsets the ledger expected and the log no longer holds: read on past them."""
        log.warning(
            "topic=%s partition=%d: offsets %d to %d are no longer in the log (retention or "
            "compaction); read on from %d",
            self.topic,
            partition,
            gap[0],
            gap[1] - 1,
            gap[1],
        )

    def _claim(self, partition: int) -> Claim | None:
        """The ledger's claim on a partition this route follows for the state it holds now."""
        state = self._following.get(partition)
        claim = self.driver.ledger.claim(self.topic, partition)
        if state is None or claim is None or claim.state is not state:
            return None
        return claim

    async def _commit(self, consumer: Any) -> None:
        """Commit the checkpoints that moved, every ``commit_interval``: the group's lag
        for operators (recovery reads the changelog, never these). The commit runs beside
        the reading, one at a time: a coordinator failing over must not stall input whose
        partition leaders are up. A failure is said once a minute and retried at the next
        interval; a commit still waiting after ``COMMIT_TIMEOUT_S`` counts as one."""
        if self._committing is not None and not self._committing.done():
            return
        offsets = self._moved_offsets()
        if offsets:
            self._committing = asyncio.get_running_loop().create_task(
                self._commit_offsets(consumer, offsets), name=f"commit-{self.topic}"
            )

    def _moved_offsets(self) -> dict[TopicPartition, int]:
        """The checkpoints that moved since the last commit, once ``commit_interval`` passed
        (none before)."""
        now = asyncio.get_running_loop().time()  # the loop's clock: monotonic (virtual in the simulation)
        if now - self._committed_at < self.driver.settings.commit_interval_s:
            return {}
        self._committed_at = now
        return {
            tp: offset
            for tp, offset in self.driver.ledger.commit_offsets(self.topic).items()
            if self._committed.get(tp) != offset
        }

    async def _commit_offsets(self, consumer: Any, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets``; a failure is said once a minute (the next interval retries)."""
        from aiokafka.structs import TopicPartition as TP

        request = asyncio.ensure_future(consumer.commit({TP(t, p): offset for (t, p), offset in offsets.items()}))
        try:
            await within(request, self.COMMIT_TIMEOUT_S, self._left_running)
        except TimeoutError as exc:  # still waiting for a coordinator: said, and no other commit until it ends
            self._commit_failures += 1
            (log.warning if self._commit_failures % 60 == 1 else log.debug)(
                "committing the offsets of %s has waited %.0f s (%r); retried when it ends",
                self.topic,
                self.COMMIT_TIMEOUT_S,
                exc,
            )
            try:
                await request  # ends on its own: aiokafka retries until the coordinator answers
            except Exception:  # noqa: BLE001 - the next interval commits
                return
        except Exception as exc:  # noqa: BLE001 - a rebalance, a broker away: the next interval commits
            from aiokafka.errors import CommitFailedError

            if isinstance(exc, CommitFailedError):  # aiokafka's reason is ten lines about poll()
                log.info(
                    "committing the offsets of %s was refused: the group rebalanced since (it takes the "
                    "partitions' offsets from the last commit that went through)",
                    self.topic,
                )
                return
            self._commit_failures += 1
            (log.warning if self._commit_failures % 60 == 1 else log.debug)(
                "committing the offsets of %s failed (%r); retried", self.topic, exc
            )
            return
        self._committed.update(offsets)
        self._commit_failures = 0  # the next outage is said again at once

    async def confirm_generation(self, partitions: Iterable[int]) -> Confirmed | None:
        """This member's group generation and when it was confirmed (wall clock, ms, taken
        before the commit was sent) when it is still in the group's current generation and
        holds ``partitions``: a commit of their committed offsets succeeds only then (the
        group coordinator refuses a stale generation; aiokafka retries what is retriable).
        None when it is stale: a worker frozen while its partitions moved learns it here,
        before it writes a takeover; one that freezes after it writes a takeover record
        that does not count (``core.ownership``). Any other failure (a right missing) is
        raised: the takeover is tried again."""
        from aiokafka.errors import CommitFailedError, IllegalStateError
        from aiokafka.structs import TopicPartition as TP

        consumer = self.consumer
        if consumer is None:
            return None
        tps = [TP(self.topic, p) for p in partitions]
        offsets = await _committed_offsets(consumer, tps)
        generation, confirmed_at_ms = group_generation(consumer), self.driver.wall_ms()
        request = asyncio.ensure_future(consumer.commit(offsets))
        request.add_done_callback(lambda done: self._recommit_after(done, offsets))
        try:
            await within(request, self.COMMIT_TIMEOUT_S, self._left_running)
        except (CommitFailedError, IllegalStateError) as exc:  # stale: the next assignment says what is ours
            log.info("route of %s: not taking partitions %s over (%r)", self.topic, sorted(partitions), exc)
            return None
        return Confirmed(generation, confirmed_at_ms)

    def _recommit_after(self, request: asyncio.Future, offsets: Mapping[Any, int]) -> None:
        """A generation check went through: its partitions' committed offsets are the ones
        it read before it was sent, which may be older than a commit of this route's that
        went through meanwhile (a check given up on lands whenever the coordinator
        answers). The next interval commits their checkpoints again, so the group's lag
        never stays behind for a partition without new input."""
        if not request.cancelled() and request.exception() is None:
            for tp in offsets:
                self._committed.pop((tp.topic, tp.partition), None)

    def forget(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._following.pop(p, None)

    def _pace(self, consumer: Any, *, idle: bool) -> None:
        wait_ms = self.IDLE_FETCH_WAIT_MS if idle else self.busy_fetch_wait_ms
        if wait_ms != self.fetch_wait_ms:
            set_fetch_wait(consumer, wait_ms)
            self.fetch_wait_ms = wait_ms

    def _refollow(self, consumer: Any) -> None:
        """Read the partitions the ledger says to read now, each from its checkpoint + 1
        (sought when its state changed); pause the assigned ones not restored yet."""

        self.changed.clear()
        owned = self.driver.ledger.following(self.topic)
        assigned = {tp.partition: tp for tp in consumer.assignment()}
        for p, tp in assigned.items():
            self._follow(consumer, p, tp, owned.get(p))
        for p in list(self._following):
            if p not in assigned:
                del self._following[p]

    def _follow(self, consumer: Any, p: int, tp: Any, state: Checkpointed | None) -> None:
        """Pause an assigned partition not restored; read one from its checkpoint + 1 when
        its state changed."""
        if state is None:
            self._following.pop(p, None)
            consumer.pause(tp)
        elif self._following.get(p) is not state:
            consumer.seek(tp, state.checkpoint + 1)
            consumer.resume(tp)
            self._following[p] = state


async def _committed_offsets(consumer: Any, tps: list[Any]) -> dict[Any, int]:
    """Each partition's committed offset (its log start where none is)."""
    offsets = {}
    for tp in tps:
        committed = await consumer.committed(tp)
        offsets[tp] = committed if committed is not None else (await consumer.beginning_offsets([tp]))[tp]
    return offsets


async def _retrying(what: str, start: Callable[[], Coroutine[Any, Any, Any]], every_s: float) -> None:
    failures = 0
    while True:
        try:
            await start()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broker away: said once, retried
            failures += 1
            (log.warning if failures == 1 else log.debug)("%s failed (%r); trying again", what, exc)
            await asyncio.sleep(every_s)


def _by_partition(fetched: dict[Any, list[Any]]) -> dict[int, list[tuple[int, bytes]]]:
    """A fetch's (offset, value) pairs by partition, of the partitions it brought any."""
    return {tp.partition: [(m.offset, m.value) for m in messages] for tp, messages in fetched.items() if messages}


class DeliveryDriver:
    """Carries out the ledger's decisions for both stages' inputs of one worker."""

    #: seconds between tries of a failed takeover or read
    RETRY_S = 1.0
    #: seconds before a route that stopped on an error is started again
    RESTART_S = 5.0
    #: a restore yields to the event loop after this much work (seconds)
    RESTORE_SLICE_S = 0.01

    def __init__(
        self,
        settings: WorkerSettings,
        stages: StageHooks,
        *,
        output: OrderedProducer,
        new_consumer: Callable[..., Any] | None = None,
    ) -> None:
        t = settings.topics
        self.settings = settings
        #: how long a revocation waits for a partition's writes in flight before it drops its
        #: state rather than keep it (a rejoin must not outlast the group's rebalance timeout)
        self.revoke_wait_s = settings.session_timeout_s / 2
        kafka = settings.security.aiokafka_kwargs()
        #: options -> a consumer of the worker's own (a fake one in tests without a broker)
        self.new_consumer = new_consumer or (lambda **options: _consumer(settings.broker, kafka, **options))
        self.stages = stages
        #: the wall clock (ms) a takeover's confirmation is timed by: the seam a simulation
        #: gives each worker a clock of its own (skewed) through
        self.wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        self.records, self.partials = t.records, t.partials
        self.ledger = Ledger((self.records, self.partials))
        self.changelogs = ChangelogReader(self.new_consumer)
        self.writes = OwnedWrites(output, self.changelogs.read_range, self._fenced)
        self.routes = self._new_routes(settings)
        self._route_of = {route.topic: route for route in self.routes}
        #: per topic: set when partitions wait to be taken over
        self._wanted = {topic: asyncio.Event() for topic in self._route_of}
        #: name -> (a long-running task: the routes, the takeovers; when it started)
        self._tasks: dict[str, tuple[asyncio.Task, float]] = {}
        #: per topic: the takeover round under way (cancelled by a revocation)
        self._rounds: dict[str, asyncio.Task] = {}
        #: when the assignment last changed (monotonic), until the worker said it is ready for it
        self._assigned_at: float | None = None
        #: topics whose group revoked this worker's partitions and has not assigned any yet
        self._rebalancing: set[str] = set()
        #: topics whose group has assigned this worker partitions (none, maybe) at least once
        self._joined: set[str] = set()
        #: records partition -> when stage 1 last got input (wall clock, for /metrics)
        self.last_event_at: dict[int, float] = {}
        #: partitions restored from their changelog, and kept through a rebalance, over the worker's life
        self.restored = 0
        self.kept = 0
        #: the longest a restore step held the event loop (seconds), over the worker's life
        self.longest_restore_step_s = 0.0
        #: the longest the event loop did not answer while a takeover was under way (seconds):
        #: every restore's steps, the changelog reading, the other partitions' work
        self.longest_stall_restoring_s = 0.0
        self._watch: asyncio.Task | None = None
        #: takeovers that did not count, to be tried again (``_ask_again``)
        self._asked_again: set[asyncio.TimerHandle] = set()

    def _new_routes(self, settings: WorkerSettings) -> tuple[InputRoute, InputRoute]:
        """The two stages' routes, with the consumer options of the worker's settings."""
        fetch = {"fetch_max_wait_ms": settings.fetch_wait_ms}
        group = {
            "session_timeout_ms": int(settings.session_timeout_s * 1000),
            # said, not left to aiokafka's default: a revocation waits half of it for writes
            "rebalance_timeout_ms": int(settings.session_timeout_s * 1000),
            "heartbeat_interval_ms": int(min(3.0, settings.session_timeout_s / 4) * 1000),
            "max_poll_interval_ms": int(settings.max_poll_interval_s * 1000),
        }
        stage1, stage2 = settings.consumer_groups
        return (
            InputRoute(
                self,
                self.records,
                stage1,
                chunk_bytes=settings.chunk_bytes,
                fetch_options={**fetch, "max_partition_fetch_bytes": max(settings.chunk_bytes, 1_048_576)},
                group_options=group,
            ),
            InputRoute(
                self, self.partials, stage2, chunk_bytes=settings.chunk_bytes, fetch_options=fetch, group_options=group
            ),
        )

    def changelog(self, topic: str) -> str:
        return self.stages.changelog_of(topic)

    # -- the groups' rebalance callbacks -------------------------------------------------------
    async def revoked(self, topic: str, partitions: list[int]) -> None:
        """Revoked partitions: work stops, a takeover under way is cancelled, and once the
        writes in flight are out (the next owner must find them) the states are kept,
        suspended, in case the next assignment gives them back."""
        self._rebalancing.add(topic)
        round_ = self._rounds.get(topic)
        if round_ is not None:
            round_.cancel()
        suspended = self.ledger.revoke((topic, p) for p in partitions)
        self._route_of[topic].forget(partitions)
        self._route_of[topic].look_again()
        changelog = self.changelog(topic)
        await self._let_writes_out(topic, changelog, [p for _, p in suspended])
        self._forget_unsuspended(topic, changelog, partitions, suspended)

    def _forget_unsuspended(
        self, topic: str, changelog: str, partitions: list[int], suspended: list[TopicPartition]
    ) -> None:
        """The writes of the revoked partitions that kept no state: forgotten."""
        for p in partitions:
            if (topic, p) not in suspended:
                self.writes.forget(changelog, p)

    async def _let_writes_out(self, topic: str, changelog: str, partitions: list[int]) -> None:
        """Wait for the suspended partitions' writes in flight, all under one deadline
        (``revoke_wait_s``, half the group's rebalance timeout: the member must rejoin in
        time). Writes still in flight then would land later, from a live worker that no
        longer owns the partitions: the worker fails fast instead (its output stops, it
        exits, and its successors restore what counts)."""
        if not await self.writes.idle([(changelog, p) for p in partitions], self.revoke_wait_s):
            log.error(
                "%s: writes of partitions %s still in flight %.0f s into a rebalance: stopping the worker rather "
                "than leave them to land once others own the partitions (restart it: it resumes from the changelog)",
                topic,
                sorted(partitions),
                self.revoke_wait_s,
            )
            self.writes.output.fail(
                changelog, TimeoutError(f"writes in flight past the rebalance's {self.revoke_wait_s:.0f} s")
            )

    def assigned(self, topic: str, partitions: list[int]) -> None:
        """The group's whole assignment of ``topic``: what is new is taken over (or kept)."""
        self._rebalancing.discard(topic)
        self._joined.add(topic)
        self.ledger.assign(topic, partitions)
        self._drop_suspended_elsewhere(topic, partitions)
        self._assigned_at = time.monotonic()
        self._route_of[topic].look_again()
        self._wanted[topic].set()

    def _drop_suspended_elsewhere(self, topic: str, partitions: list[int]) -> None:
        """The suspended states of partitions the assignment did not give back: dropped."""
        for p in self.ledger.suspended(topic):
            if p not in partitions:
                self.ledger.take_suspended(topic, p)
                self.writes.forget(self.changelog(topic), p)

    @property
    def rebalancing(self) -> bool:
        """A group has not assigned this worker partitions yet (it is joining), or revoked
        them and has not assigned any since."""
        return bool(self._rebalancing) or len(self._joined) < len(self.routes)

    def _fenced(self, changelog: str, partition: int) -> None:
        """Another worker's takeover was found in a changelog partition this worker wrote."""
        topic = next(t for t in self._route_of if self.changelog(t) == changelog)
        if self.ledger.fence(topic, partition):
            self._wanted[topic].set()  # still assigned here: taken over again if the group says so
        self._route_of[topic].look_again()

    # -- applying ----------------------------------------------------------------------------------
    async def apply(self, claim: Claim, messages: list[tuple[int, bytes]]) -> None:
        if claim.topic == self.records:
            self.last_event_at[claim.partition] = time.time()
        await self.stages.run(claim.topic, claim.state, claim.partition, messages)

    def caught_up(self, claim: Claim, end: int) -> None:
        log.info(
            "topic=%s partition=%d caught up to offset %d: its batch timers run", claim.topic, claim.partition, end
        )

    # -- takeovers ---------------------------------------------------------------------------------
    async def taking_over(self, topic: str) -> None:
        """Take over what the ledger says, a round at a time; a round that failed is tried
        again ``RETRY_S`` later (said once, and once it worked)."""
        failures = 0
        wanted = self._wanted[topic]
        while True:
            await wanted.wait()
            wanted.clear()
            begun = self._begin_restores(topic)
            if begun:
                failures = await self._round(topic, begun, failures)
            self._say_ready()

    def _begin_restores(self, topic: str) -> list[tuple[int, int]]:
        """(partition, the ledger's turn) of each restore the ledger lets begin now."""
        return [
            (p, turn)
            for _, p in self.ledger.to_restore(topic)
            if (turn := self.ledger.begin_restore(topic, p)) is not None
        ]

    async def _round(self, topic: str, begun: list[tuple[int, int]], failures: int) -> int:
        """One takeover round, as a task a revocation can cancel; returns the failed rounds
        in a row (a failure makes the round wanted again ``RETRY_S`` later)."""
        round_ = self._start_round(topic, begun)
        try:
            await round_
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the driver itself is being stopped
        except Exception as exc:  # noqa: BLE001 - a broker away for a while
            failures += 1
            await self._retry_round(topic, len(begun), failures, exc)
        else:
            if failures:
                log.info("taking partitions of %s over succeeded after %d failed tries", topic, failures)
            failures = 0
        finally:
            self._end_round(topic, begun)
        return failures

    def _start_round(self, topic: str, begun: list[tuple[int, int]]) -> asyncio.Task:
        """The round's task (a revocation cancels it), and the watch of the event loop's
        stalls unless one runs."""
        round_ = self._rounds[topic] = asyncio.get_running_loop().create_task(
            self._take_over(topic, begun), name=f"take-over-{topic}"
        )
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop(), name="watch-restores")
        return round_

    async def _retry_round(self, topic: str, partitions: int, failures: int, exc: Exception) -> None:
        """A failed round: said once (then at debug), wanted again ``RETRY_S`` later."""
        (log.warning if failures == 1 else log.debug)(
            "taking %d partition(s) of %s over failed (%r): retrying every %.0f s",
            partitions,
            topic,
            exc,
            self.RETRY_S,
        )
        await asyncio.sleep(self.RETRY_S)
        self._wanted[topic].set()

    def _end_round(self, topic: str, begun: list[tuple[int, int]]) -> None:
        """The round is over: the restores it began and did not install may begin again."""
        self._rounds.pop(topic, None)
        for p, turn in begun:
            self.ledger.end_restore(topic, p, turn)

    async def _take_over(self, topic: str, begun: list[tuple[int, int]]) -> None:
        started = time.monotonic()
        changelog = self.changelog(topic)
        turns = dict(begun)
        confirmed = await self._route_of[topic].confirm_generation(turns)
        if confirmed is None:
            return  # a stale member: the next assignment says what is ours
        await self._keep_unchanged(topic, changelog, turns, confirmed)
        if not turns:
            return
        await self._restore_from_changelogs(topic, changelog, turns, confirmed)
        log.debug("took %d partition(s) of %s over in %.2f s", len(turns), topic, time.monotonic() - started)

    async def _keep_unchanged(self, topic: str, changelog: str, turns: dict[int, int], confirmed: Confirmed) -> None:
        """Reinstate, without a restore, the partitions kept through the rebalance whose
        changelog nobody wrote since this worker's last write (taken out of ``turns``): a
        confirmation of the generation confirmed now lands where its next write was due
        (``OwnedWrites.confirm``), so that a takeover of an older rebalance landing later
        counts for nothing. The others' writes are forgotten: they are restored."""
        kept = self._take_kept(topic, turns)
        if not kept:
            return
        ends = await self._log_ends([(log, p) for p in kept for log in (changelog, topic)])
        await asyncio.gather(
            *(self._keep_if_unchanged(topic, changelog, p, state, turns, ends, confirmed) for p, state in kept.items())
        )

    def _take_kept(self, topic: str, turns: dict[int, int]) -> dict[int, Checkpointed]:
        """The suspended states of the partitions to take over, taken out of the ledger."""
        return {p: s for p in turns if (s := self.ledger.take_suspended(topic, p)) is not None}

    async def _keep_if_unchanged(
        self,
        topic: str,
        changelog: str,
        p: int,
        state: Checkpointed,
        turns: dict[int, int],
        ends: dict[TopicPartition, int],
        confirmed: Confirmed,
    ) -> None:
        """Reinstate a kept state when its changelog ends where this worker's last write
        did and its confirmation landed there (its turn taken out of ``turns``); else
        forget its writes."""
        owned = self.writes.ownership(changelog, p)
        unchanged = owned is not None and ends[(changelog, p)] == owned.next_offset
        if not unchanged or not await self.writes.confirm(changelog, p, *confirmed):
            self.writes.forget(changelog, p)
            return
        if self.ledger.install(topic, p, turns.pop(p), state, ends[(topic, p)]) is not None:
            self.kept += 1
            self._route_of[topic].look_again()  # read at once, while the others restore

    async def _restore_from_changelogs(
        self, topic: str, changelog: str, turns: dict[int, int], confirmed: Confirmed
    ) -> None:
        """Write a takeover record in each partition's changelog, read them up to it, and
        restore and install each state whose takeover counts (unless the ledger moved on
        meanwhile)."""
        owner_epochs = await self._write_takeovers(changelog, turns, confirmed)
        ends, views = await self.changelogs.read(
            {(changelog, p): self._read_end(changelog, p, epoch) for p, epoch in owner_epochs.items()},
            [(topic, p) for p in turns],
        )
        for p, epoch in owner_epochs.items():
            await self.stages.reached("restore")
            valid = views[(changelog, p)].result()
            if valid.epoch != epoch:
                self._not_counted(topic, changelog, p, epoch, valid.epoch)
                self._ask_again(topic, confirmed, valid.counting)
                continue
            try:
                state, installed = await self._restore(topic, p, valid, epoch)
            except StateWithoutCheckpoint:
                if await self._route_of[topic].confirm_generation([p]) is not None:
                    raise  # a current owner: the changelog lost a checkpoint it needs, said loudly
                self._not_counted(topic, changelog, p, epoch, None)  # stale: it read a newer owner's deletions
                continue
            self._install_restored(topic, changelog, p, turns[p], state, ends[(topic, p)], installed)

    def _not_counted(self, topic: str, changelog: str, p: int, epoch: int, counting: int | None) -> None:
        """This worker's takeover does not count, or no longer: a newer generation took the
        partition before it landed, or since (this worker is stale). Nothing is restored or
        written."""
        log.info(
            "%s[%d]: the takeover at %d does not count (a newer generation's%s came first): not restoring",
            topic,
            p,
            epoch,
            "" if counting is None else f" at {counting}",
        )
        self.writes.forget(changelog, p)

    def _ask_again(self, topic: str, confirmed: Confirmed, counting: Takeover | None) -> None:
        """A takeover that did not count is tried again: the next round confirms the
        generation first (a stale member stops there). A counting takeover of a newer
        generation than the one confirmed, when the member is current, means the group
        started again within ``CLOCK_SKEW_MS`` of it: the next try waits until that bound
        has passed, and counts (``core.ownership.counts_after``)."""
        delay_s = self.RETRY_S
        if counting is not None and counting.generation > confirmed.generation >= 0:
            delay_s += max(0.0, (counting.at_ms + CLOCK_SKEW_MS - confirmed.at_ms) / 1000)
        loop = asyncio.get_running_loop()
        self._asked_again = {h for h in self._asked_again if h.when() > loop.time()}
        self._asked_again.add(loop.call_later(min(delay_s, 2 * CLOCK_SKEW_MS / 1000), self._wanted[topic].set))

    def _read_end(self, changelog: str, p: int, epoch: int) -> int:
        """Where a takeover reads its changelog up to: past its confirmation (a takeover
        landing between the two must be seen)."""
        owned = self.writes.ownership(changelog, p)
        return owned.next_offset if owned is not None and owned.epoch == epoch else epoch + 1

    async def _write_takeovers(self, changelog: str, turns: dict[int, int], confirmed: Confirmed) -> dict[int, int]:
        """A takeover record in each partition's changelog, all at once: partition -> its epoch."""
        appends = (self.writes.take_over(changelog, p, *confirmed) for p in turns)
        return dict(zip(turns, await asyncio.gather(*appends), strict=True))

    def _install_restored(
        self,
        topic: str,
        changelog: str,
        p: int,
        turn: int,
        state: Checkpointed,
        end: int,
        installed: Callable[[], None],
    ) -> None:
        """Install a restored state (unless the ledger moved on meanwhile: then its writes
        are forgotten)."""
        if self.ledger.install(topic, p, turn, state, end) is not None:
            self.restored += 1
            installed()
            self._route_of[topic].look_again()  # read at once, while the others restore
        else:
            self.writes.forget(changelog, p)

    async def _restore(self, topic: str, partition: int, valid: ValidState, epoch: int) -> Restored:
        """Run a stage's restore in steps, yielding whenever a slice of work is done."""
        steps = self.stages.restorer(topic, partition, valid, epoch)
        slice_started = time.perf_counter()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                self._note_step(time.perf_counter() - slice_started)
                return done.value
            elapsed = time.perf_counter() - slice_started
            if elapsed >= self.RESTORE_SLICE_S:
                self._note_step(elapsed)
                await asyncio.sleep(0)
                slice_started = time.perf_counter()

    async def _watch_loop(self, period_s: float = 0.005) -> None:
        """While takeovers are under way: how late the event loop wakes a sleeper (its stall)."""
        loop = asyncio.get_running_loop()
        while self._rounds:
            asked = loop.time()
            await asyncio.sleep(period_s)
            self.longest_stall_restoring_s = max(self.longest_stall_restoring_s, loop.time() - asked - period_s)

    def _note_step(self, seconds: float) -> None:
        self.longest_restore_step_s = max(self.longest_restore_step_s, seconds)

    async def _log_ends(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        from aiokafka.structs import TopicPartition as TP

        consumer = self.new_consumer(group_id=None)
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TP(t, p) for t, p in partitions])
        finally:
            await consumer.stop()
        return {(tp.topic, tp.partition): end for tp, end in ends.items()}

    def _say_ready(self) -> None:
        """Once per assignment, when every assigned partition is restored: one line."""
        if self._assigned_at is None or not self.ledger.ready():
            return
        log.info(
            "Worker ready: %d records and %d partials partition(s) (%d restored, %d kept through rebalances "
            "so far) in %.2f s",
            len(self.ledger.assigned(self.records)),
            len(self.ledger.assigned(self.partials)),
            self.restored,
            self.kept,
            time.monotonic() - self._assigned_at,
        )
        self._assigned_at = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, also: Iterable[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = ()) -> None:
        """Start the routes and the takeovers (and ``also``), or start one again at most every
        ``RESTART_S`` after it stopped on an error."""
        for name, run in (*also, *self._runs()):
            if self._to_start(name):
                self._tasks[name] = (asyncio.get_running_loop().create_task(run(), name=name), time.monotonic())

    def _runs(self) -> tuple[tuple[str, Callable[[], Coroutine[Any, Any, None]]], ...]:
        """The driver's own long-running tasks, by name: each topic's takeovers, then each route."""
        return (
            *((f"take-over-{route.topic}", lambda t=route.topic: self.taking_over(t)) for route in self.routes),
            *((f"route-{route.topic}", route.run) for route in self.routes),
        )

    def _to_start(self, name: str) -> bool:
        """Whether a task is to be started: never started, or stopped at least ``RESTART_S``
        after it started (said when it stopped on an error)."""
        task, started = self._tasks.get(name, (None, 0.0))
        if task is None:
            return True
        if not task.done() or time.monotonic() - started < self.RESTART_S:
            return False
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s stopped (%r): starting it again", name, task.exception())
        return True

    async def close(self) -> None:
        """Stop applying input, let the writes in flight out (unless writing failed: then
        nothing more goes out), then leave the groups."""
        for route in self.routes:
            route.stopping = True
        if self.writes.output.failed is None:
            await self._writes_out()
        await self._stop_tasks()
        await self.writes.close()

    async def _writes_out(self) -> None:
        """Wait for every assigned partition's writes in flight, all under one ``revoke_wait_s``."""
        assigned = [(self.changelog(topic), p) for topic in self._route_of for p in self.ledger.assigned(topic)]
        await self.writes.idle(assigned, self.revoke_wait_s)

    async def _stop_tasks(self) -> None:
        """Cancel the routes, the takeovers and the watch, and wait until they stopped."""
        for handle in self._asked_again:
            handle.cancel()
        tasks = [task for task, _ in self._tasks.values()] + ([self._watch] if self._watch is not None else [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
