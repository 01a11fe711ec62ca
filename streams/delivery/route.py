"""One stage's input route: a consumer in the stage's group that reads every owned, restored
partition from its checkpoint and hands what the ledger admits to the stage; it confirms
the member's group generation for a takeover (``confirm_generation``) and commits the
checkpoints for the group's lag. Split out of ``routes`` along its seams (issue 43); the
``DeliveryDriver`` there owns the routes and follows their rebalance callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .assignor import StickyAssignor
from .internals import group_generation, group_member, set_fetch_wait
from .ledger import Checkpointed, Claim, Ledger, TopicPartition

if TYPE_CHECKING:
    from ..settings import WorkerSettings
    from .writes import OwnedWrites

__all__ = ["Confirmed", "InputRoute", "split_chunk", "within"]

log = logging.getLogger("specmeter.worker")


class RouteDriver(Protocol):
    """What a route needs of the driver that owns it (``routes.DeliveryDriver``): its group
    callbacks, the ledger, the writes, the clock and the consumers' factory. A protocol, so
    that this module does not import the driver's, which imports it (no import circle, not
    even for the type checker)."""

    RETRY_S: float
    settings: WorkerSettings
    ledger: Ledger
    writes: OwnedWrites
    new_consumer: Callable[..., Any]
    wall_ms: Callable[[], int]

    async def revoked(self, topic: str, partitions: list[int]) -> None: ...

    def assigned(self, topic: str, partitions: list[int]) -> None: ...

    async def apply(self, claim: Claim, messages: list[tuple[int, bytes]]) -> None: ...

    def caught_up(self, claim: Claim, end: int) -> None: ...


class Confirmed(NamedTuple):
    """A member's group generation, confirmed by a commit, when (wall clock, ms, before
    the commit was sent), and its member id: what its takeover records carry
    (``core.ownership``)."""

    generation: int
    at_ms: int
    member: str = ""


def split_chunk(messages: list[tuple[int, bytes]], max_bytes: int) -> tuple[list, list]:
    """The first messages up to ``max_bytes`` of values (at least one), and the rest."""
    size = 0
    for i, (_, value) in enumerate(messages):
        size += len(value)
        if size >= max_bytes:
            return messages[: i + 1], messages[i + 1 :]
    return messages, []


@functools.cache
def _rebalance_listener_class() -> type:
    """aiokafka's ``ConsumerRebalanceListener`` for a route, made once (aiokafka is imported
    when first used; a class made per route would cost an ABC's creation each time)."""
    from aiokafka.abc import ConsumerRebalanceListener

    class Rebalance(ConsumerRebalanceListener):
        def __init__(self, route: InputRoute) -> None:
            self.route = route

        async def on_partitions_revoked(self, revoked: Any) -> None:
            route = self.route
            await route.driver.revoked(route.topic, [tp.partition for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            route = self.route
            if route.group_format_refused():
                return
            route.driver.assigned(route.topic, [tp.partition for tp in assigned])

    return Rebalance


def _rebalance_listener(route: InputRoute) -> Any:
    """aiokafka's ``ConsumerRebalanceListener`` of one route (awaited during a rejoin)."""
    return _rebalance_listener_class()(route)


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


class Wakeup:
    """A flag that ends a route's wait for its fetch when set: what an ``asyncio.Event``
    gives, without a task and a wait of two futures on every fetch (the hot path)."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    async def wait_or(self, fetch: asyncio.Future) -> None:
        """Until the flag is set or ``fetch`` is done (whichever comes first)."""
        if self._set or fetch.done():
            return
        self._waiter = waiter = fetch.get_loop().create_future()

        def done(_: asyncio.Future) -> None:
            if not waiter.done():
                waiter.set_result(None)

        fetch.add_done_callback(done)
        try:
            await waiter
        finally:
            fetch.remove_done_callback(done)
            self._waiter = None


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
        driver: RouteDriver,
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
        self.changed = Wakeup()

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
                await self.changed.wait_or(fetch)
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
        generation, member, confirmed_at_ms = group_generation(consumer), group_member(consumer), self.driver.wall_ms()
        request = asyncio.ensure_future(consumer.commit(offsets))
        request.add_done_callback(lambda done: self._recommit_after(done, offsets))
        try:
            await within(request, self.COMMIT_TIMEOUT_S, self._left_running)
        except (CommitFailedError, IllegalStateError) as exc:  # stale: the next assignment says what is ours
            log.info("route of %s: not taking partitions %s over (%r)", self.topic, sorted(partitions), exc)
            return None
        return Confirmed(generation, confirmed_at_ms, member)

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
