"""A deterministic simulation of the worker's delivery layer (issue 43, point 1: a first slice).

The worker's own ``DeliveryDriver`` (its routes, the kept and restore paths, ``OwnedWrites``,
``ChangelogView``) runs for three workers over the in-memory Kafka of ``tests/test_delivery.py``:
one records topic of two partitions and its changelog, a group coordinator with generations
(and group restarts: the group deleted, its generations starting again at 1), members
expired while frozen (their commits refused, their fetches and writes going on), writes in
flight that land one at a time whenever the scheduler says (a frozen worker's too),
compaction of the changelog at any step, and takeover records appended twice.

Each worker runs on an event loop of its own whose clock is virtual (``VirtualLoop``: it
jumps to the next timer when nothing is ready), advanced to the simulation's time only when
the scheduler lets it run: a frozen worker does nothing and wakes with its timers due. Its
wall clock is the simulation's time plus a skew of its own (``DeliveryDriver.wall_ms``, the
seam). One seed is one schedule, and replays exactly.

The invariants, checked where they happen (a violation raised inside a worker's task fails
the output, and the scheduler raises it):

* **no stray fence**: a worker is fenced only by a takeover confirmed in a rebalance not
  older than the one in which it last installed the partition (kept or restored);
* **a restore never goes back**: once the schedule settles, each changelog partition's
  valid checkpoint is not below any checkpoint whose outputs were released;
* **liveness**: once the group is quiet, every partition is restored and read to the end
  of its input within a bound (past the 60 s clock-skew bound of a restarted group).
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from specmeter.streams.core.ownership import (
    CLOCK_SKEW_MS,
    ChangelogView,
    confirmation_of,
    is_confirmation,
    is_takeover,
    split_key,
    takeover_of,
)
from specmeter.streams.delivery.assignor import Member, sticky_assignment
from specmeter.streams.delivery.ledger import Ledger
from specmeter.streams.delivery.output import OrderedProducer

from .fake_kafka import FakeConsumer, FakeLogs, FakeStages, fake_driver

R = "records"
CL = f"{R}-changelog"
PARTITIONS = 2


class Violation(AssertionError):
    """An invariant broken; the message names the seed and the schedule's trace."""


class Stopped(Exception):
    """A worker stopped as designed (writes in flight past a revocation's deadline): it is restarted."""


class _NoSelector(selectors.BaseSelector):
    """A selector without I/O: waiting ``timeout`` moves the loop's virtual clock on."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list:
        if timeout and self.loop is not None:
            self.loop.now += timeout
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual: with nothing ready it jumps to the next timer."""

    def __init__(self) -> None:
        selector = _NoSelector()
        self.now = 0.0
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.now

    def run_to(self, when: float) -> None:
        """Run everything due up to ``when`` (virtual seconds)."""
        self.call_at(max(when, self.now), self.stop)
        self.run_forever()


class SimConsumer(FakeConsumer):
    """A group member as the coordinator sees it: the generation (and group incarnation) it
    joined; a commit from any other is refused, as Kafka's coordinator refuses a stale member."""

    def __init__(self, logs: FakeLogs, sim: Simulation, **options: Any) -> None:
        super().__init__(logs, **options)
        self.sim = sim
        self.joined: tuple[int, int] = (-1, -1)  # (incarnation, generation)
        self.latest: tuple[int, int] = (-1, -1)
        #: the rebalance (sequence number) it last joined: its assignor's assignment number
        self.joined_in = -1
        self.lock: asyncio.Lock | None = None
        #: the fetch waiting for input (ended when a record it follows lands)
        self.waiting: asyncio.Future | None = None

    @property
    def _coordinator(self) -> SimpleNamespace:
        return SimpleNamespace(generation=self.joined[1])

    async def getmany(self, *tps: Any, timeout_ms: int = 0, **kwargs: Any) -> dict[Any, list[Any]]:
        """What is fetchable now, else the first that is within ``timeout_ms`` of virtual
        time: a record landing in a followed partition (or a partition resumed or sought to
        where records are) ends the wait, as a broker's fetch ends on new input. A fetch that
        waits costs no work, so the simulation's cost follows its events, not its clock."""
        await asyncio.sleep(0.001)
        out = self._take(tps)
        if out or timeout_ms <= 0:
            return out
        loop = asyncio.get_running_loop()
        self.waiting = waiter = loop.create_future()
        timer = loop.call_later(timeout_ms / 1000, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiting = None
        return self._take(tps)

    def wake_if_fetchable(self) -> None:
        """End a waiting fetch when something it follows became fetchable."""
        if self.waiting is not None and not self.waiting.done() and self._fetchable():
            self.waiting.set_result(None)

    def _fetchable(self) -> bool:
        return any(
            tp not in self.paused and self.logs.end(tp.topic, tp.partition) > position
            for tp, position in self.positions.items()
        )

    def resume(self, tp: Any) -> None:
        super().resume(tp)
        self.wake_if_fetchable()

    def seek(self, tp: Any, offset: int) -> None:
        super().seek(tp, offset)
        self.wake_if_fetchable()

    async def commit(self, offsets: dict[Any, int]) -> None:
        from aiokafka.errors import CommitFailedError

        if self.group_id and self.joined != (self.sim.incarnation, self.sim.generation):
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
            await self.listener.on_partitions_revoked(list(self.positions))
            self.joined, self.joined_in = joined, self.sim.seq
            self.positions = {TP(self.topics[0], p): 0 for p in partitions}
            self.paused = set()
            await self.listener.on_partitions_assigned(list(self.positions))


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SimLogs(FakeLogs):
    """The in-memory logs, whose appends end the fetches waiting for them."""

    def append(self, topic: str, partition: int, value: bytes | None, key: bytes | None = None) -> int:
        offset = super().append(topic, partition, value, key)
        for consumer in self.consumers:
            if isinstance(consumer, SimConsumer) and consumer.waiting is not None:
                consumer.wake_if_fetchable()
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


class Worker:
    """One worker: its loop, its driver over the shared logs, its clock skew."""

    def __init__(self, sim: Simulation, name: str, skew_ms: int) -> None:
        self.sim, self.name, self.skew_ms = sim, name, skew_ms
        self.loop = VirtualLoop()
        self.loop.now = sim.now
        self.frozen = False
        self.stages = FakeStages(sim.logs)
        self.producer: SimProducer | None = None
        self.output = OrderedProducer(on_failed=_ignore, new_producer=self._new_producer)
        self.member: SimConsumer | None = None
        #: partition -> (the rebalance's sequence number, the group's incarnation, the time) of
        #: its last confirmation that went through
        self.confirmed_in: dict[int, tuple[int, int, int]] = {}
        #: partition -> (its epoch, the confirmation in which it installed the partition)
        self.installed_in: dict[int, tuple[int, tuple[int, int, int]]] = {}
        asyncio.set_event_loop(self.loop)
        self.driver = fake_driver(sim.logs, self.stages)
        self.driver.new_consumer = self._new_consumer
        self.driver.changelogs.new_consumer = self._new_consumer
        self.driver.writes.output = self.output  # type: ignore[assignment]
        self.driver.writes.new_token = lambda: f"{name}-{sim.tokens.getrandbits(64):016x}"
        self.driver.wall_ms = lambda: sim.base_ms + int(sim.now * 1000) + skew_ms
        self.driver.revoke_wait_s = 15.0
        self.driver.settings.commit_interval_s = 1.0
        for route in self.driver.routes:
            route.FETCH_TIMEOUT_MS = 60000

        async def no_watch() -> None:  # the stall watch ticks every 5 ms: no measure here, much work
            pass

        self.driver._watch_loop = no_watch  # type: ignore[method-assign]  # noqa: SLF001
        self._instrument()
        self.loop.run_until_complete(self._start())

    def _new_producer(self, **options: Any) -> SimProducer:
        self.producer = SimProducer(**options)
        return self.producer

    @property
    def in_flight(self) -> deque[InFlight]:
        """What it handed to Kafka and did not land yet."""
        return self.producer.in_flight if self.producer is not None else deque()

    def _new_consumer(self, **options: Any) -> SimConsumer:
        consumer = SimConsumer(self.sim.logs, self.sim, **options)
        if options.get("group_id") == "g-stage1":
            self.member = consumer
        return consumer

    async def _start(self) -> None:
        await self.output.start()
        self.driver.start()
        await asyncio.sleep(0.01)

    def _instrument(self) -> None:
        """Note the rebalance each confirmation belongs to, each install, and check each fence."""
        route, writes = self.driver.routes[0], self.driver.writes
        confirm, fenced = route.confirm_generation, writes.on_fenced
        worker = self

        class Noted(Ledger):
            def install(self, topic: str, p: int, turn: int, state: Any, end: int) -> Any:
                claim = super().install(topic, p, turn, state, end)
                owned = writes.ownership(CL, p)
                if claim is not None and owned is not None:
                    worker.installed_in[p] = (owned.epoch, worker.confirmed_in.get(p, (-1, -1, 0)))
                    worker.sim.check_install(worker, p, owned.epoch, state.checkpoint)
                return claim

        self.driver.ledger = Noted(self.driver.ledger.topics)

        async def confirm_generation(partitions: Any) -> Any:
            partitions = list(partitions)
            seq = self.sim.seq
            confirmed = await confirm(partitions)
            if confirmed is not None:
                noted = (seq, self.sim.incarnation, confirmed.at_ms)
                self.sim.confirmations[(confirmed.generation, confirmed.at_ms)] = noted
                for p in partitions:
                    self.confirmed_in[p] = noted
            return confirmed

        def on_fenced(changelog: str, p: int) -> None:
            self.sim.check_fence(self, p)
            fenced(changelog, p)

        route.confirm_generation = confirm_generation  # type: ignore[method-assign]
        writes.on_fenced = on_fenced

    def run(self) -> None:
        """Run its loop up to the simulation's time (unless frozen); a failure in a task fails."""
        if not self.frozen:
            asyncio.set_event_loop(self.loop)
            self.loop.run_to(self.sim.now)
        failed = self.output.failed
        if isinstance(failed, Violation):
            raise failed
        if _stops_by_design(failed):
            raise Stopped(repr(failed))
        if failed is not None:
            raise self.sim.violation(f"{self.name} failed: {failed!r}")

    def close(self) -> None:
        asyncio.set_event_loop(self.loop)
        if self.producer is not None:
            self.producer.closed = True  # what is in flight lands only as the scheduler's orphans
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(self.loop), return_exceptions=True))
        self.loop.close()


class Simulation:
    """The scheduler: the logs, the coordinator, the workers and the trace."""

    def __init__(self, seed: int, *, workers: int = 3) -> None:
        self.rng = random.Random(seed)
        self.tokens = random.Random(~seed)  # takeover tokens: of the seed, apart from the schedule's draws
        self.seed = seed
        self.logs = SimLogs()
        self.now = 0.0
        self.base_ms = 1_700_000_000_000
        self.incarnation, self.generation, self.seq = 0, 0, 0
        #: (generation, at_ms) of each confirmation that went through -> its rebalance's sequence number
        self.confirmations: dict[tuple[int, int], int] = {}
        self.trace: list[str] = []
        #: writes of stopped workers that may still land
        self.orphans: deque = deque()
        #: violations found inside a worker's task that would not fail it (raised by ``run``)
        self.failures: list[Violation] = []
        self.workers = [Worker(self, f"w{i}", self.rng.randint(-20_000, 20_000)) for i in range(workers)]
        for p in range(PARTITIONS):
            self.logs.logs.setdefault(R, {}).setdefault(p, [])
            self.logs.logs.setdefault(CL, {}).setdefault(p, [])

    def say(self, line: str) -> None:
        self.trace.append(f"{self.now:9.3f} {line}")

    def violation(self, what: str) -> Violation:
        return Violation(f"seed {self.seed}: {what}\n  " + "\n  ".join(self.trace[-40:]))

    # -- the checks ------------------------------------------------------------------------
    def check_fence(self, worker: Worker, p: int) -> None:
        """A fence is legit only by a takeover confirmed in a rebalance not older than the
        one in which the fenced worker installed the partition; or by one of an older group
        incarnation confirmed within the clock-skew bound of it (the bound the protocol
        states: ``docs/ownership.md``, rule 2)."""
        epoch, installed = worker.installed_in.get(p, (-1, (-1, -1, 0)))
        for offset, key, value in self.logs.logs[CL][p]:
            found = _takeover_at(offset, key, value, epoch)
            noted = self.confirmations.get((found.generation, found.at_ms)) if found is not None else None
            if noted is not None and _may_fence(noted, installed):
                return
        raise self.violation(f"a stray takeover fenced {worker.name} on partition {p} (installed in {installed})")

    def check_install(self, worker: Worker, p: int, epoch: int, checkpoint: int) -> None:
        """A current owner's install never goes back: its checkpoint is not below any
        released one (a stale reader, whose takeover a newer one followed, may). Noted here
        and raised by the scheduler: the round it runs in retries what fails."""
        if self._valid(p).epoch != epoch:
            return
        released = self._released(p)
        if checkpoint < released:
            self.failures.append(
                self.violation(f"{worker.name} installed partition {p} at checkpoint {checkpoint}, below {released}")
            )

    def _released(self, p: int) -> int:
        return max((c for w in self.workers for _, q, c in w.stages.released if q == p), default=-1)

    def _valid(self, p: int) -> Any:
        view = ChangelogView()
        for offset, key, value in self.logs.logs[CL][p]:
            view.add(offset, key, value)
        return view.result()

    def check_settled(self) -> None:
        """Every partition read to its end, and its changelog's valid checkpoint not below
        any released one."""
        for p in range(PARTITIONS):
            released, valid = self._released(p), self._valid(p)
            checkpoint = max((int(v) for k, v in valid.entries if split_key(k)[0].endswith(b"\x1fc")), default=-1)
            if checkpoint < released:
                raise self.violation(f"partition {p}: the valid checkpoint {checkpoint} is below {released}, released")

    # -- the steps -------------------------------------------------------------------------
    def run(self, worker: Worker) -> None:
        """Let a worker run; one that stopped (fail fast) is restarted and the group rebalances."""
        try:
            worker.run()
            if self.failures:
                raise self.failures[0]
        except Stopped as stopped:
            self.restart(worker, f"stops ({stopped})")
            self.rebalance()

    def restart(self, worker: Worker, why: str) -> Worker:
        """A worker gone at whatever await its tasks were parked at: a prefix of what it
        handed to Kafka lands later (each write's order kept), the rest is lost with it; a
        new process of the same name starts and joins at the next rebalance."""
        in_flight = list(worker.in_flight)
        self.orphans.extend(in_flight[: self.rng.randint(0, len(in_flight))])
        self.say(f"{worker.name} {why} and restarts")
        worker.close()
        new = self.workers[self.workers.index(worker)] = Worker(self, worker.name, worker.skew_ms)
        return new

    def crash(self, worker: Worker) -> None:
        """A worker killed between two of its awaits (a crash, an OOM kill, a node lost);
        its group notices now or at a later rebalance."""
        self.restart(worker, "is killed")
        if self.rng.random() < 0.5:
            self.rebalance()

    def land_orphan(self) -> None:
        if self.orphans:
            topic, partition, key, value, _ = self.orphans.popleft()
            offset = self.logs.append(topic, partition, value, key)
            self.say(f"  a stopped worker's write lands at {topic}[{partition}]@{offset}")

    def rebalance(self, *, restart: bool = False) -> None:
        """A new generation (of a new group incarnation after a restart) among the live workers."""
        if restart:
            self.incarnation, self.generation = self.incarnation + 1, 0
        self.generation += 1
        self.seq += 1
        live = [w for w in self.workers if not w.frozen]
        if not live:
            return
        given = self._assign(live) if self.rng.random() < 0.7 else self._scatter(live)
        self.say(f"rebalance {self.incarnation}.{self.generation}: {given}")
        for w in live:
            if w.member is not None:
                w.loop.create_task(w.member.join((self.incarnation, self.generation), given[w.name]))

    def _assign(self, live: list[Worker]) -> dict[str, list[int]]:
        """The project's own sticky assignment among the live members: each reports what it
        holds and the rebalance that gave it (a member woken from a freeze still holds what
        moved meanwhile; the newer rebalance wins)."""
        members = {
            w.name: Member(frozenset({R}), tuple((R, tp.partition) for tp in w.member.positions), w.member.joined_in)
            for w in live
            if w.member is not None
        }
        out = sticky_assignment([(R, p) for p in range(PARTITIONS)], members)
        return {name: [p for _, p in tps] for name, tps in out.items()}

    def _scatter(self, live: list[Worker]) -> dict[str, list[int]]:
        """An assignment of another mind (a leader of another release): each partition anywhere."""
        given: dict[str, list[int]] = {w.name: [] for w in live}
        for p in range(PARTITIONS):
            given[self.rng.choice(live).name].append(p)
        return given

    def land(self, worker: Worker, *, faults: bool = True) -> None:
        """One of a worker's writes in flight reaches its partition (in order per partition,
        the partitions in any order), and its answer goes back: mostly its offset; or, as
        Kafka can, it lands twice (a retry of a request whose answer was lost) and the answer
        names the second copy, or it is answered without an offset (aiokafka's duplicate
        sequence path), or its delivery times out, landed or not."""
        in_flight = worker.in_flight
        if not in_flight:
            return
        topic, partition, key, value, future = _next_of_a_partition(in_flight, self.rng)
        roll = self.rng.random() if faults else 1.0
        if roll < 0.005:
            landed = self.rng.random() < 0.5
            if landed:
                self.logs.append(topic, partition, value, key)
            self.say(f"  {worker.name}'s write to {topic}[{partition}] times out ({'landed' if landed else 'lost'})")
            worker.loop.call_soon(_answer, future, None, KafkaTimeoutError())
            return
        offset = self.logs.append(topic, partition, value, key)
        if roll < 0.02:
            offset = self.logs.append(topic, partition, value, key)
            self.say(f"  {worker.name}'s write lands twice at {topic}[{partition}]@{offset - 1},{offset}: {key!r}")
        elif roll < 0.025:
            self.say(f"  {worker.name}'s write lands at {topic}[{partition}]@{offset}, answered without its offset")
            offset = -1
        else:
            self.say(f"  {worker.name}'s write lands at {topic}[{partition}]@{offset}: {key!r}")
        worker.loop.call_soon(_answer, future, offset)

    def freeze_mid_takeover(self) -> None:
        """A worker whose takeover record is in flight freezes (it lands while the worker is away)."""
        taking = [w for w in self.workers if not w.frozen and any(k and is_takeover(k) for _, _, k, *_ in w.in_flight)]
        if taking:
            worker = self.rng.choice(taking)
            worker.frozen = True
            self.say(f"{worker.name} freezes, a takeover in flight")

    def compact(self) -> None:
        """What compaction keeps of the changelog: the latest record per key (offsets kept)."""
        for log in self.logs.logs[CL].values():
            latest = {k: o for o, k, _ in log if k is not None}
            log[:] = [(o, k, v) if k is None or latest[k] == o else (o, None, None) for o, k, v in log]
        self.say("compaction")

    def duplicate(self) -> None:
        """A takeover record lands a second time (a retried send)."""
        p = self.rng.randrange(PARTITIONS)
        copies = [(k, v) for _, k, v in self.logs.logs[CL][p] if k is not None and v is not None and is_takeover(k)]
        if copies:
            key, value = copies[-1] if self.rng.random() < 0.7 else self.rng.choice(copies)  # mostly the owner's
            self.say(f"a second copy of {key!r} lands at {self.logs.append(CL, p, value, key)}")

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        worker = rng.choice(self.workers)
        if roll < 0.05:
            self.rebalance(restart=rng.random() < 0.25)
        elif roll < 0.09:
            worker.frozen = not worker.frozen
            self.say(f"{worker.name} {'freezes' if worker.frozen else 'wakes'}")
            if not worker.frozen and rng.random() < 0.5:
                self.rebalance()  # it rejoins the group its session expired from
        elif roll < 0.10:
            self.freeze_mid_takeover()
        elif roll < 0.11:
            self.compact()
        elif roll < 0.13:
            self.duplicate()
        elif roll < 0.25:
            p = rng.randrange(PARTITIONS)
            self.logs.append(R, p, b"r")
        elif roll < 0.27:
            self.land_orphan()
        elif roll < 0.275:
            self.crash(worker)
        elif roll < 0.6:
            self.land(worker)
        else:
            self.now += (
                rng.choice((0.005, 0.02, 0.02, 0.1, 0.1, 0.5, 2.0)) if rng.random() < 0.95 else rng.choice((40.0, 90.0))
            )
            self.run(worker)

    def settle(self, bound_s: float = 300.0) -> None:
        """Everyone wakes and joins a last rebalance; within ``bound_s`` every partition is
        read to its end by its owner and nothing is left in flight."""
        for w in self.workers:
            w.frozen = False
        self.rebalance()
        deadline = self.now + bound_s
        while self.now < deadline:
            while self.orphans:
                self.land_orphan()
            for w in list(self.workers):
                while w.in_flight:
                    self.land(w, faults=False)
                self.run(w)
            if self._done():
                return
            self.now += 0.5
        raise self.violation("liveness: a partition was not read to its end within the bound after the group was quiet")

    def _done(self) -> bool:
        for p in range(PARTITIONS):
            end = self.logs.end(R, p)
            owners = [w for w in self.workers if w.driver.ledger.timers_run(R, p)]
            states = [w.driver.ledger.following(R).get(p) for w in owners]
            if len(owners) != 1 or states[0] is None or states[0].checkpoint != end - 1:
                return False
        return not any(w.in_flight or w.output.pending for w in self.workers)


def _next_of_a_partition(in_flight: deque[InFlight], rng: random.Random) -> InFlight:
    """The oldest write in flight to a partition picked at random among those waiting."""
    topic, partition = rng.choice(in_flight)[:2]
    for i, write in enumerate(in_flight):
        if write[0] == topic and write[1] == partition:
            del in_flight[i]
            return write
    raise AssertionError("unreachable")


def _stops_by_design(failed: BaseException | None) -> bool:
    """A worker's output failed as the protocol says it stops: writes in flight past a
    revocation's deadline, a write whose delivery timed out, or one answered without its
    offset (``docs/ownership.md``, rules 9 and 10)."""
    return isinstance(failed, (TimeoutError, KafkaTimeoutError)) or (
        isinstance(failed, RuntimeError) and "without its offset" in str(failed)
    )


def _takeover_at(offset: int, key: bytes | None, value: bytes | None, epoch: int) -> Any:
    """The takeover a changelog record after ``epoch`` is or stands for (None: none)."""
    if offset <= epoch or key is None or value is None:
        return None
    if is_takeover(key):
        return takeover_of(value)
    confirmation = confirmation_of(value) if is_confirmation(key) else None
    return confirmation.as_takeover() if confirmation is not None and confirmation.epoch > epoch else None


def _may_fence(found: tuple[int, int, int], installed: tuple[int, int, int]) -> bool:
    """Whether a takeover confirmed at ``found`` (rebalance, incarnation, time) may fence an
    owner that installed at ``installed``."""
    if found[0] >= installed[0]:
        return True
    return found[1] < installed[1] and found[2] + CLOCK_SKEW_MS >= installed[2]


def run_simulation(seed: int, *, steps: int = 150) -> Simulation:
    """One schedule; raises ``Violation`` when an invariant breaks."""
    sim = Simulation(seed)
    try:
        sim.rebalance()
        for _ in range(steps):
            sim.step()
        sim.settle()
        sim.check_settled()
    finally:
        for w in sim.workers:
            if not w.loop.is_closed():
                w.close()
        asyncio.set_event_loop(None)
    return sim


def shortest_failure(seed: int, steps: int = 150) -> Violation | None:
    """The violation of the shortest prefix of schedule ``seed`` that still breaks an
    invariant (its steps, then the quiet group's settling): the trace to read first."""
    for length in range(1, steps + 1):
        try:
            run_simulation(seed, steps=length)
        except Violation as violation:
            return violation
    return None


def failures_among(seeds: range) -> list[str]:
    """The violations of the schedules ``seeds``, each with its seed and its shortest trace."""
    found = []
    for seed in seeds:
        try:
            run_simulation(seed)
        except Violation as violation:
            shortest = shortest_failure(seed)
            found.append(str(shortest or violation))
    return found


def run_many(
    schedules: int, *, start: int = 0, jobs: int = 0, progress: Callable[[int, int], None] | None = None
) -> list[str]:
    """Schedules ``start`` to ``start + schedules - 1`` over ``jobs`` processes (0: one per
    core); the violations found, each with its seed and shortest trace."""
    import multiprocessing

    jobs = jobs or multiprocessing.cpu_count()
    size = max(1, min(500, schedules // (jobs * 8) or 1))
    chunks = [range(s, min(s + size, start + schedules)) for s in range(start, start + schedules, size)]
    found: list[str] = []
    done = 0
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for violations, chunk in zip(pool.imap(failures_among, chunks), chunks, strict=True):
            found += violations
            done += len(chunk)
            if progress is not None:
                progress(done, len(found))
    return found


def main(argv: list[str] | None = None) -> int:
    """The long mode: ``python -m tests.support.delivery_sim --schedules 1000000``."""
    import argparse
    import json
    import logging
    import sys
    import time

    parser = argparse.ArgumentParser(
        prog="python -m tests.support.delivery_sim",
        description="Run the delivery simulation's schedules (one seed, one schedule) and report violations.",
    )
    parser.add_argument("--schedules", type=int, default=10_000, help="how many schedules (default 10,000)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--jobs", type=int, default=0, help="processes (default: one per core)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines (default 30)")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the workers say what they do; the violations say what matters
    began = last = time.monotonic()

    def progress(done: int, violations: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= args.every or done == args.schedules:
            last = now
            rate = done / (now - began)
            print(f"{done:,}/{args.schedules:,} schedules, {violations} violations, {rate:,.0f}/s", file=sys.stderr)

    found = run_many(args.schedules, start=args.start, jobs=args.jobs, progress=progress)
    elapsed = time.monotonic() - began
    for violation in found:
        print(violation, file=sys.stderr)
    summary = {"schedules": args.schedules, "start": args.start, "violations": len(found), "seconds": round(elapsed, 1)}
    print(json.dumps(summary))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
