"""The in-memory Kafka's clients as the worker sees them: a group member whose fetches wait
for input and whose stale commits are refused, logs whose appends end those waits, and a
producer whose writes stay in flight until the scheduler lands them. The scheduler decides
when things happen; these say what each means to a client."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..fake_kafka import FakeConsumer, FakeLogs
from .deployment import PARTITIONS, SETTINGS

if TYPE_CHECKING:
    from .scheduler import Simulation
    from .worker import Worker


class SimConsumer(FakeConsumer):
    """A group member as the coordinator sees it: the generation (and group incarnation) it
    joined; a commit from any other is refused, as Kafka's coordinator refuses a stale member."""

    def __init__(self, logs: SimLogs, sim: Simulation, **options: Any) -> None:
        super().__init__(logs, **options)
        self.sim = sim
        self.joined: tuple[int, int] = (-1, -1)  # (incarnation, generation)
        self.latest: tuple[int, int] = (-1, -1)
        #: the rebalance (sequence number) it last joined: its assignor's assignment number
        self.joined_in = -1
        self.lock: asyncio.Lock | None = None
        #: the worker it belongs to
        self.worker: Worker | None = None
        #: its member id: Kafka's coordinator gives a new one to a member that joins anew
        #: (a group started again, a member expelled while away); kept while it stays in
        self.member_id = ""
        #: the fetch waiting for input (ended when a record it follows lands)
        self.waiting: asyncio.Future | None = None

    @property
    def _coordinator(self) -> SimpleNamespace:
        return SimpleNamespace(generation=self.joined[1], member_id=self.member_id)

    async def getmany(self, *tps: Any, timeout_ms: int = 0, **kwargs: Any) -> dict[Any, list[Any]]:
        """What is fetchable now, else the first that is within ``timeout_ms`` of virtual
        time: a record landing in a followed partition (or a partition resumed or sought to
        where records are) ends the wait, as a broker's fetch ends on new input. A fetch that
        waits costs no work, so the simulation's cost follows its events, not its clock."""
        await asyncio.sleep(0)  # a fetch answers on the loop's next turn: other tasks run first
        out = self._take(tps)
        if out or timeout_ms <= 0:
            return out
        loop = asyncio.get_running_loop()
        self.waiting = waiter = loop.create_future()
        timer = loop.call_later(timeout_ms / 1000, _wake, waiter)
        self.logs.fetching[self] = None
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiting = None
            self.logs.fetching.pop(self, None)
        return self._take(tps)

    def wake_if_fetchable(self, topic: str | None = None, partition: int | None = None) -> None:
        """End a waiting fetch when something it follows became fetchable (in ``topic``'s
        ``partition`` when given: where a record just landed)."""
        if self.waiting is not None and not self.waiting.done() and self._fetchable(topic, partition):
            self.waiting.set_result(None)

    def _fetchable(self, topic: str | None, partition: int | None) -> bool:
        if topic is not None:  # a record landed there (a partition is a (topic, partition) tuple)
            position = self.positions.get((topic, partition))
            return (
                position is not None
                and (topic, partition) not in self.paused
                and self.logs.end(topic, partition) > position
            )
        return any(
            tp not in self.paused and self.logs.end(tp.topic, tp.partition) > position
            for tp, position in self.positions.items()
        )

    def resume(self, *tps: Any) -> None:
        super().resume(*tps)
        self.wake_if_fetchable()

    def seek(self, tp: Any, offset: int) -> None:
        super().seek(tp, offset)
        self.wake_if_fetchable()

    async def commit(self, offsets: dict[Any, int]) -> None:
        from aiokafka.errors import CommitFailedError

        group = self.sim.group_of.get(self.group_id or "")
        if group is not None and self.joined != group.joined:
            raise CommitFailedError("the group rebalanced (a stale generation)")
        await super().commit(offsets)

    async def join(self, joined: tuple[int, int], partitions: list[int]) -> None:
        """A rebalance as aiokafka runs it: revoked, joined at the new generation, assigned;
        one at a time, and only the latest of those waiting (a member rejoins once)."""
        from aiokafka.structs import TopicPartition as TP

        self.latest = joined
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            if self.latest != joined:
                return  # a newer rebalance came meanwhile: it is the one this member joins
            await self._revoke()
            if self.joined != (joined[0], joined[1] - 1):  # not in the generation before: a new member
                self.member_id = f"{self.worker.name if self.worker else '?'}-{next(self.sim.members)}"
            self.joined, self.joined_in = joined, self.sim.group_of[self.group_id].seq
            self.positions = {TP(self.topics[0], p): 0 for p in partitions}
            self.paused = set()
            await self.listener.on_partitions_assigned(list(self.positions))

    async def _revoke(self) -> None:
        """The revocation callback, which must end within the group's rebalance timeout:
        Kafka's coordinator expels a member whose rejoin takes longer (unless the worker was
        frozen meanwhile: its session expired, the coordinator expelled it anyway)."""
        loop, worker = asyncio.get_running_loop(), self.worker
        began, freezes = loop.time(), worker.freezes if worker is not None else 0
        await self.listener.on_partitions_revoked(list(self.positions))
        took = loop.time() - began
        if took > SETTINGS.session_timeout_s and worker is not None and worker.freezes == freezes:
            self.sim.failures.append(
                self.sim.violation(
                    f"{worker.name}'s revocation took {took:.1f} s, past the group's rebalance timeout "
                    f"({SETTINGS.session_timeout_s:.0f} s): Kafka's coordinator expels such a member"
                )
            )


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SimLogs(FakeLogs):
    """The in-memory logs, whose appends end the fetches waiting for them."""

    def __init__(self) -> None:
        super().__init__()
        #: the consumers whose fetch waits for input, in the order they began (a dict: a
        #: set's order would follow memory addresses, and a replay must wake them alike)
        self.fetching: dict[SimConsumer, None] = {}

    def append(self, topic: str, partition: int, value: bytes | None, key: bytes | None = None) -> int:
        offset = super().append(topic, partition, value, key)
        for consumer in list(self.fetching):
            consumer.wake_if_fetchable(topic, partition)
        return offset


#: a write handed to Kafka and not landed yet: (topic, partition, key, value, its delivery future)
InFlight = tuple[str, int, bytes | None, bytes | None, asyncio.Future]


class SimProducer:
    """aiokafka's producer as the worker's ``OrderedProducer`` uses it (the surface
    ``delivery.internals`` pins): what the ordered producer hands over waits in flight until
    the scheduler lands it, and its delivery future is answered then (on the worker's loop)."""

    def __init__(self, **options: Any) -> None:
        self._request_timeout_ms = options.get("request_timeout_ms", 30_000)
        self._message_accumulator = self
        self._sender = SimpleNamespace(close=_nothing)
        self.client = SimpleNamespace(cluster=SimpleNamespace(add_listener=_ignore, remove_listener=_ignore))
        self.in_flight: deque[InFlight] = deque()
        #: a stopped worker's producer: nothing it held lands unless the scheduler says so
        self.closed = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.closed = True

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    async def add_message(self, tp: Any, key: bytes | None, value: bytes | None, timeout_s: float) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.in_flight.append((tp.topic, tp.partition, key, value, future))
        return future

    async def flush(self) -> None:
        while self.in_flight:
            await asyncio.sleep(0.05)


async def _nothing() -> None:
    pass


def _ignore(*_: Any) -> None:
    pass


def _answer(future: asyncio.Future, offset: int | None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(SimpleNamespace(offset=offset))
