"""A deterministic simulation of the worker (issue 43): its own delivery layer, stages and
ordered producer, for three workers over an in-memory Kafka that behaves like Kafka where
the ownership protocol cares.

Two kinds of schedule share the scheduler:

* **the worker's own stages** (``real=True``): each worker is the worker's ``StreamShell``
  (``worker/app.py``: both stage cores, stage 2 merging the partials stage 1 publishes, the
  ordered producer, the delivery driver), built through its seams (the Kafka clients'
  factories, its wall clock, its stop). A seeded fleet's records and markers go to the
  records topic as the producers' library would place them; both stages' groups rebalance.
* **checkpoint-only stages** (``tests/support/fake_kafka.FakeStages``): the driver alone,
  cheaper, so that more schedules reach the ownership protocol's corners.

The in-memory Kafka: partition logs with offsets; compaction at any step (the latest
record per key, tombstones kept); a coordinator per consumer group with the classic
protocol's generations, the project's own sticky assignor (or another leader's mind), members
expired while frozen (their commits refused, their fetches and writes going on), groups
deleted and started again (generations from 1); fetches that end on input; writes in flight
that land whenever the scheduler says, in order per partition, from frozen and dead workers
too, sometimes twice, answered without an offset, or timed out (landed or not); takeover
records appended twice. Workers freeze, wake, stop as designed (fail fast) and are killed
between any two awaits, and restart.

Each worker runs on an event loop of its own whose clock is virtual (``VirtualLoop``: it
jumps to the next timer when nothing is ready), advanced to the simulation's time only when
the scheduler lets it run. Its wall clock is the simulation's time plus a skew of its own
(up to ±20 s; a restarted group's takeovers are judged past the 60 s bound). One seed is one
schedule, and replays exactly.

The invariants, checked where they happen (a violation inside a worker's task fails its
output, and the scheduler raises it):

* **no stray fence**: a worker is fenced only by a takeover confirmed in a rebalance not
  older than the one in which it last installed the partition (kept or restored), or by one
  of an older group incarnation within the clock-skew bound;
* **a restore never goes back**: a current owner installs no checkpoint below one whose
  outputs were released; once settled, each changelog's valid checkpoint is not below them;
* **one content per (batch, revision)** on the metrics topic, checked as each lands;
* **exact and nothing lost**: once settled, every batch's latest metrics equal what the
  offline core computes from the same records (a worker that never stopped), and every
  record is counted once;
* **liveness**: once the group is quiet, every partition of both stages is restored and read
  to the end of its input, and every batch published, within a bound.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import selectors
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import msgspec
from aiokafka.errors import KafkaTimeoutError

from specmeter.schemas import BatchMarker, GenerationRecord, decode_dead_letter, decode_metrics, encode_records_message
from specmeter.streams.core.layout import changelog_topics, decode_checkpoint, decode_stage2_checkpoint
from specmeter.streams.core.ownership import (
    CLOCK_SKEW_MS,
    ChangelogView,
    confirmation_of,
    is_confirmation,
    is_takeover,
    takeover_of,
)
from specmeter.streams.delivery.assignor import Member, sticky_assignment
from specmeter.streams.delivery.ledger import Ledger
from specmeter.streams.delivery.output import OrderedProducer
from specmeter.streams.settings import WorkerSettings
from specmeter.streams.worker.app import StreamShell

from .fake_kafka import FakeConsumer, FakeLogs, FakeStages, fake_driver

R = "records"
CL = f"{R}-changelog"
PARTITIONS = 2
#: the deployment the worker's own stages run as
SETTINGS = WorkerSettings(
    broker="simulated:9092",
    app_id="sim",
    partitions=PARTITIONS,
    tick_s=30.0,  # timers tick rarely: batches close on their markers, the grace never ends
    batch_timeout_s=1e6,
    grace_s=1e6,
    session_timeout_s=30.0,
    commit_interval_s=1.0,
    web_enabled=False,
)


@dataclass
class Group:
    """A consumer group as its coordinator keeps it: its input topic, its incarnation (a
    group deleted when empty starts its generations again at 1), its generation, and how
    many rebalances of it the schedule had (the assignor's assignment number)."""

    topic: str
    group_id: str
    incarnation: int = 0
    generation: int = 0
    seq: int = 0

    @property
    def joined(self) -> tuple[int, int]:
        return self.incarnation, self.generation


class Violation(AssertionError):
    """An invariant broken; the message names the seed and the schedule's trace."""


class InjectedFault(RuntimeError):
    """A failure the scheduler injects where the worker must stop on it (rule 11)."""


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
        #: its tasks not done (``asyncio.all_tasks`` walks every loop's: many in a long run)
        self.tasks: set[asyncio.Task] = set()
        self.set_task_factory(self._task)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def time(self) -> float:
        return self.now

    def run_to(self, when: float) -> None:
        """Run everything due up to ``when`` (virtual seconds)."""
        self.call_at(max(when, self.now), self.stop)
        self.run_forever()


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
        return any(
            tp not in self.paused and self.logs.end(tp.topic, tp.partition) > position
            for tp, position in self.positions.items()
            if topic is None or (tp.topic == topic and tp.partition == partition)
        )

    def resume(self, tp: Any) -> None:
        super().resume(tp)
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


class Worker:
    """One worker: its loop, its stages and driver over the shared logs, its clock skew."""

    def __init__(self, sim: Simulation, name: str, skew_ms: int) -> None:
        self.sim, self.name, self.skew_ms = sim, name, skew_ms
        self.loop = VirtualLoop()
        self.loop.now = sim.now
        self.frozen = False
        #: how many times it froze (a revocation across a freeze is not its own doing)
        self.freezes = 0
        self.producer: SimProducer | None = None
        #: input topic -> its group member
        self.members: dict[str, SimConsumer] = {}
        #: (changelog, partition) -> (the rebalance's number, the group's incarnation, the
        #: time) of its last confirmation that went through
        self.confirmed_in: dict[tuple[str, int], tuple[int, int, int]] = {}
        #: (changelog, partition) -> (its epoch, the confirmation in which it installed it)
        self.installed_in: dict[tuple[str, int], tuple[int, tuple[int, int, int]]] = {}
        asyncio.set_event_loop(self.loop)
        self.shell: StreamShell | None = None
        self.driver = self._shell() if sim.real else self._fake_stages()
        self.driver.writes.new_token = lambda: f"{name}-{sim.tokens.getrandbits(64):016x}"
        self.driver.wall_ms = self.wall_ms
        self.driver.revoke_wait_s = 15.0
        for route in self.driver.routes:
            route.FETCH_TIMEOUT_MS = 60000

        async def no_watch() -> None:  # the stall watch ticks every 5 ms: no measure here, much work
            pass

        self.driver._watch_loop = no_watch  # type: ignore[method-assign]  # noqa: SLF001
        self._instrument()
        self.loop.run_until_complete(self._start())

    def wall_ms(self) -> int:
        """Its wall clock: the simulation's time, skewed."""
        return self.sim.base_ms + int(self.sim.now * 1000) + self.skew_ms

    def _shell(self) -> Any:
        """The worker's own ``StreamShell`` through its seams."""
        shell = self.shell = StreamShell(SETTINGS, new_consumer=self._new_consumer, new_producer=self._new_producer)
        shell.now_ms = self.wall_ms
        shell.stop_process = _ignore  # its output failed: the scheduler restarts it
        self.output = shell.output
        return shell.delivery

    def _fake_stages(self) -> Any:
        """The driver over checkpoint-only stages, with the worker's ordered producer."""
        self.stages = FakeStages(self.sim.logs)
        self.output = OrderedProducer(on_failed=_ignore, new_producer=self._new_producer)
        driver = fake_driver(self.sim.logs, self.stages)
        driver.new_consumer = driver.changelogs.new_consumer = self._new_consumer
        driver.writes.output = self.output  # type: ignore[assignment]
        driver.settings.commit_interval_s = 1.0
        return driver

    def _new_producer(self, **options: Any) -> SimProducer:
        self.producer = SimProducer(**options)
        return self.producer

    @property
    def in_flight(self) -> deque[InFlight]:
        """What it handed to Kafka and did not land yet."""
        return self.producer.in_flight if self.producer is not None else deque()

    def _new_consumer(self, **options: Any) -> SimConsumer:
        consumer = SimConsumer(self.sim.logs, self.sim, **options)
        consumer.worker = self
        group = self.sim.group_of.get(options.get("group_id") or "")
        if group is not None:
            self.members[group.topic] = consumer
        return consumer

    async def _start(self) -> None:
        if self.shell is None:
            await self.output.start()
            self.driver.start()
        else:
            self.shell.start()
            asyncio.get_running_loop().create_task(self._ticks(self.shell))
        await asyncio.sleep(0.01)

    @staticmethod
    async def _ticks(shell: StreamShell) -> None:
        """The stages' timers, as Faust's timer runs them."""
        while True:
            await asyncio.sleep(SETTINGS.tick_s)
            shell.on_tick()

    def _instrument(self) -> None:
        """Note the rebalance each confirmation belongs to, each install and each release,
        and check each fence and install."""
        writes, sim, worker = self.driver.writes, self.sim, self
        fenced, submit = writes.on_fenced, writes.submit

        class Noted(Ledger):
            def install(self, topic: str, p: int, turn: int, state: Any, end: int) -> Any:
                claim = super().install(topic, p, turn, state, end)
                changelog = sim.changelog_of.get(topic, "")
                owned = writes.ownership(changelog, p)
                if claim is not None and owned is not None:
                    where = (changelog, p)
                    worker.installed_in[where] = (owned.epoch, worker.confirmed_in.get(where, (-1, -1, 0)))
                    sim.check_install(worker, changelog, p, owned.epoch, state.checkpoint)
                return claim

        self.driver.ledger = Noted(self.driver.ledger.topics)
        for route in self.driver.routes:
            if route.topic in sim.changelog_of:
                route.confirm_generation = self._noting_confirmations(route)  # type: ignore[method-assign]

        unread = [0]

        def on_fenced(changelog: str, p: int) -> None:
            if writes.unreadable_gaps == unread[0]:  # a gap compaction left unreadable gives up, as it must
                sim.check_fence(self, changelog, p)
            unread[0] = writes.unreadable_gaps
            fenced(changelog, p)

        def noted_submit(topic: str, partition: int, writes_: Any, release: Any, *args: Any, **kwargs: Any) -> None:
            checkpoint = max((c for k, v in writes_ if (c := _checkpoint_in(k, v)) is not None), default=None)

            async def noted_release() -> None:
                if sim.rng.random() < 0.002:
                    raise InjectedFault("a release that failed (a bug in a stage's outputs, injected)")
                await release()
                if checkpoint is not None:
                    sim.released[(topic, partition)] = max(sim.released.get((topic, partition), -1), checkpoint)

            submit(topic, partition, writes_, noted_release, *args, **kwargs)

        writes.on_fenced = on_fenced
        writes.submit = noted_submit  # type: ignore[method-assign]

    def _noting_confirmations(self, route: Any) -> Any:
        confirm, group = route.confirm_generation, self.sim.groups[route.topic]
        changelog = self.sim.changelog_of[route.topic]

        async def confirm_generation(partitions: Any) -> Any:
            partitions = list(partitions)
            seq = group.seq
            confirmed = await confirm(partitions)
            if confirmed is not None:
                noted = (seq, group.incarnation, confirmed.at_ms)
                self.sim.confirmations[(changelog, confirmed.generation, confirmed.at_ms)] = noted
                for p in partitions:
                    self.confirmed_in[(changelog, p)] = noted
            return confirmed

        return confirm_generation

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
        for task in list(self.loop.tasks):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.run_until_complete(asyncio.gather(*self.loop.tasks, return_exceptions=True))
        self.loop.close()


class Simulation:
    """The scheduler: the logs, the groups' coordinator, the workers, the input and the trace."""

    def __init__(self, seed: int, *, workers: int = 3, real: bool = False) -> None:
        self.rng = random.Random(seed)
        self.tokens = random.Random(~seed)  # takeover tokens: of the seed, apart from the schedule's draws
        self.seed, self.real = seed, real
        self.logs = SimLogs()
        self.now = 0.0
        self.base_ms = 1_700_000_000_000
        topics = SETTINGS.topics
        #: input topic -> its changelog, and back; the groups by input topic and by id
        self.changelog_of = dict(zip((topics.records, topics.partials), changelog_topics(SETTINGS.app_id), strict=True))
        if not real:
            self.changelog_of = {R: CL}
        self.input_of = {changelog: topic for topic, changelog in self.changelog_of.items()}
        ids = SETTINGS.consumer_groups if real else ("g-stage1",)
        self.groups = {topic: Group(topic, group_id) for topic, group_id in zip(self.changelog_of, ids, strict=True)}
        self.group_of = {group.group_id: group for group in self.groups.values()}
        #: (changelog, generation, at_ms) of each confirmation that went through -> (its
        #: rebalance's number, its group's incarnation, its time)
        self.confirmations: dict[tuple[str, int, int], tuple[int, int, int]] = {}
        #: (changelog, partition) -> the highest checkpoint whose outputs were released
        self.released: dict[tuple[str, int], int] = {}
        self.trace: list[str] = []
        #: numbers of the members' ids
        self.members = itertools.count()
        #: writes of stopped workers that may still land
        self.orphans: deque[InFlight] = deque()
        #: violations found inside a worker's task that would not fail it (raised by ``run``)
        self.failures: list[Violation] = []
        #: (batch, revision) -> the metrics published for it (one content each)
        self.published: dict[tuple[str, int], Any] = {}
        self.input = SimInput(seed) if real else None
        for topic in (*self.changelog_of, *self.input_of, topics.metrics, topics.deadletter):
            for p in range(PARTITIONS):
                self.logs.logs.setdefault(topic, {}).setdefault(p, [])
        self.workers = [Worker(self, f"w{i}", self.rng.randint(-20_000, 20_000)) for i in range(workers)]

    def say(self, line: str) -> None:
        self.trace.append(f"{self.now:9.3f} {line}")

    def violation(self, what: str) -> Violation:
        return Violation(
            f"seed {self.seed}{' (real stages)' if self.real else ''}: {what}\n  " + "\n  ".join(self.trace[-40:])
        )

    # -- the checks ------------------------------------------------------------------------
    def check_fence(self, worker: Worker, changelog: str, p: int) -> None:
        """A fence is legit only by a takeover confirmed in a rebalance not older than the
        one in which the fenced worker installed the partition; or by one of an older group
        incarnation confirmed within the clock-skew bound of it (the bound the protocol
        states: ``docs/ownership.md``, rule 2)."""
        epoch, installed = worker.installed_in.get((changelog, p), (-1, (-1, -1, 0)))
        for offset, key, value in self.logs.logs[changelog][p]:
            found = _takeover_at(offset, key, value, epoch)
            noted = self.confirmations.get((changelog, found.generation, found.at_ms)) if found is not None else None
            if noted is not None and _may_fence(noted, installed):
                return
        raise self.violation(f"a stray takeover fenced {worker.name} on {changelog}[{p}] (installed in {installed})")

    def check_install(self, worker: Worker, changelog: str, p: int, epoch: int, checkpoint: int) -> None:
        """A current owner's install never goes back: its checkpoint is not below any
        released one (a stale reader, whose takeover a newer one followed, may). Noted here
        and raised by the scheduler: the round it runs in retries what fails."""
        if self._valid(changelog, p).epoch != epoch:
            return
        released = self.released.get((changelog, p), -1)
        if checkpoint < released:
            self.failures.append(
                self.violation(f"{worker.name} installed {changelog}[{p}] at checkpoint {checkpoint}, below {released}")
            )

    def check_metrics(self, value: bytes | None) -> None:
        """One content per (batch, revision): a publication repeated (after a takeover) is
        the same message."""
        metrics = decode_metrics(value or b"")
        key = (metrics.batch_id, metrics.revision)
        first = self.published.setdefault(key, metrics)
        if first != metrics:
            self.failures.append(self.violation(f"two contents for batch {key[0]} revision {key[1]}"))

    def _valid(self, changelog: str, p: int) -> Any:
        view = ChangelogView()
        for offset, key, value in self.logs.logs[changelog][p]:
            view.add(offset, key, value)
        return view.result()

    def check_settled(self) -> None:
        """Each changelog's valid checkpoint not below any released one; with the worker's
        own stages, every batch exact and every record counted once."""
        for changelog in self.input_of:
            for p in range(PARTITIONS):
                released, valid = self.released.get((changelog, p), -1), self._valid(changelog, p)
                checkpoint = max((c for k, v in valid.entries if (c := _checkpoint_in(k, v)) is not None), default=-1)
                if checkpoint < released:
                    raise self.violation(
                        f"{changelog}[{p}]: the valid checkpoint {checkpoint} is below {released}, released"
                    )
        if self.input is not None:
            try:
                self.input.check(self.published.values(), self._dead_letters())
            except AssertionError as exc:
                raise self.violation(f"not exact: {exc}") from None

    def _dead_letters(self) -> list[Any]:
        letters = self.logs.logs[SETTINGS.topics.deadletter]
        return [decode_dead_letter(v) for log in letters.values() for _, _, v in log if v is not None]

    # -- the steps -------------------------------------------------------------------------
    def run(self, worker: Worker) -> None:
        """Let a worker run; one that stopped (fail fast) is restarted and the groups rebalance."""
        try:
            worker.run()
            if self.failures:
                raise self.failures[0]
        except Stopped as stopped:
            self.restart(worker, f"stops ({stopped})")
            self.rebalance_all()

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
        its groups notice now or at a later rebalance."""
        self.restart(worker, "is killed")
        if self.rng.random() < 0.5:
            self.rebalance_all()

    def land_orphan(self) -> None:
        if self.orphans:
            topic, partition, key, value, _ = self.orphans.popleft()
            offset = self._append(topic, partition, key, value)
            self.say(f"  a stopped worker's write lands at {topic}[{partition}]@{offset}")

    def _append(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> int:
        """A write lands (a publication is checked as it does)."""
        if topic == SETTINGS.topics.metrics and self.real:
            self.check_metrics(value)
        return self.logs.append(topic, partition, value, key)

    def rebalance_all(self) -> None:
        for topic in self.groups:
            self.rebalance(topic)

    def rebalance(self, topic: str, *, restart: bool = False) -> None:
        """A new generation of ``topic``'s group (of a new group incarnation after a
        restart) among the live workers."""
        group = self.groups[topic]
        if restart:
            group.incarnation, group.generation = group.incarnation + 1, 0
        group.generation += 1
        group.seq += 1
        live = [w for w in self.workers if not w.frozen and topic in w.members]
        if not live:
            return
        given = self._assign(topic, live) if self.rng.random() < 0.7 else self._scatter(live)
        self.say(f"rebalance of {topic} {group.incarnation}.{group.generation}: {given}")
        for w in live:
            w.loop.create_task(w.members[topic].join(group.joined, given[w.name]))

    def _assign(self, topic: str, live: list[Worker]) -> dict[str, list[int]]:
        """The project's own sticky assignment among the live members: each reports what it
        holds and the rebalance that gave it (a member woken from a freeze still holds what
        moved meanwhile; the newer rebalance wins)."""
        members = {
            w.name: Member(
                frozenset({topic}),
                tuple((topic, tp.partition) for tp in w.members[topic].positions),
                w.members[topic].joined_in,
            )
            for w in live
        }
        out = sticky_assignment([(topic, p) for p in range(PARTITIONS)], members)
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
                self._append(topic, partition, key, value)
            else:
                _lose_after(worker, in_flight, topic, partition)
            self.say(f"  {worker.name}'s write to {topic}[{partition}] times out ({'landed' if landed else 'lost'})")
            worker.loop.call_soon(_answer, future, None, KafkaTimeoutError())
            return
        offset = self._append(topic, partition, key, value)
        if roll < 0.02:
            offset = self._append(topic, partition, key, value)
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
            worker.freezes += 1
            self.say(f"{worker.name} freezes, a takeover in flight")

    def compact(self) -> None:
        """What compaction keeps of the changelogs: the latest record per key (offsets kept),
        and, once ``delete.retention.ms`` passed, no tombstone at all."""
        drop_tombstones = self.rng.random() < 0.5
        for changelog in self.input_of:
            for log in self.logs.logs[changelog].values():
                latest = {k: o for o, k, _ in log if k is not None}
                log[:] = [
                    (o, k, v)
                    if k is None or (latest[k] == o and (v is not None or not drop_tombstones))
                    else (o, None, None)
                    for o, k, v in log
                ]
        self.say(f"compaction{', tombstones dropped' if drop_tombstones else ''}")

    def duplicate(self) -> None:
        """A takeover record lands a second time (a retried send)."""
        changelog, p = self.rng.choice(list(self.input_of)), self.rng.randrange(PARTITIONS)
        log = self.logs.logs[changelog][p]
        copies = [(k, v) for _, k, v in log if k is not None and v is not None and is_takeover(k)]
        if copies:
            key, value = copies[-1] if self.rng.random() < 0.7 else self.rng.choice(copies)  # mostly the owner's
            self.say(f"a second copy of {key!r} lands at {changelog}[{p}]@{self.logs.append(changelog, p, value, key)}")

    def publish(self) -> None:
        """The next input message lands (the records topic)."""
        if self.input is None:
            self.logs.append(R, self.rng.randrange(PARTITIONS), b"r")
        elif self.input.messages:
            partition, key, value = self.input.messages.popleft()
            self.logs.append(SETTINGS.topics.records, partition, value, key)

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        worker = rng.choice(self.workers)
        if roll < 0.05:
            self.rebalance(rng.choice(list(self.groups)), restart=rng.random() < 0.25)
        elif roll < 0.09:
            worker.frozen = not worker.frozen
            worker.freezes += worker.frozen
            self.say(f"{worker.name} {'freezes' if worker.frozen else 'wakes'}")
            if not worker.frozen and rng.random() < 0.5:
                self.rebalance_all()  # it rejoins the groups its session expired from
        elif roll < 0.10:
            self.freeze_mid_takeover()
        elif roll < 0.11:
            self.compact()
        elif roll < 0.13:
            self.duplicate()
        elif roll < 0.25:
            self.publish()
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
        """The rest of the input lands, everyone wakes and joins a last rebalance; within
        ``bound_s`` every partition is read to its end by its owner, every batch published
        and nothing is left in flight."""
        while self.input is not None and self.input.messages:
            self.publish()
        for w in self.workers:
            w.frozen = False
        self.rebalance_all()
        deadline, step_s = self.now + bound_s, 0.5
        while self.now < deadline:
            landed = bool(self.orphans) or any(w.in_flight for w in self.workers)
            while self.orphans:
                self.land_orphan()
            for w in list(self.workers):
                while w.in_flight:
                    self.land(w, faults=False)
                self.run(w)
            if self._done():
                return
            step_s = 0.5 if landed else min(2 * step_s, 8.0)  # quiet: the clock runs on faster
            self.now += step_s
        raise self.violation("liveness: once the group was quiet, some input was not read to its end within the bound")

    def _done(self) -> bool:
        for topic in self.groups:
            if not all(self._read_to_end(topic, p) for p in range(PARTITIONS)):
                return False
        if any(w.in_flight or w.output.pending for w in self.workers):
            return False
        return self.input is None or self.input.all_published(self.published)

    def _read_to_end(self, topic: str, p: int) -> bool:
        """One worker runs the partition's timers, and its state is at the log's end."""
        owners = [w for w in self.workers if w.driver.ledger.timers_run(topic, p)]
        if len(owners) != 1:
            return False
        state = owners[0].driver.ledger.following(topic).get(p)
        return state is not None and state.checkpoint == self.logs.end(topic, p) - 1


class SimInput:
    """A seeded fleet's records and markers as the producers' library puts them on the
    records topic: a record keyed by its session (Kafka's default partitioner), a producer's
    batch closed by one marker per partition naming what it sent there. One of ``FLEETS``
    fleets, by the seed (drawing one costs more than a schedule)."""

    FLEETS = 64

    def __init__(self, seed: int) -> None:
        self.events, messages = _fleet(seed % self.FLEETS)
        self.messages = deque(messages)

    def all_published(self, published: dict[tuple[str, int], Any]) -> bool:
        """Every batch of the fleet published, complete."""
        done = {batch for (batch, _), m in published.items() if m.complete}
        return {e.batch_id for e in self.events if e.kind == "marker"} <= done

    def check(self, published: Any, letters: list[Any]) -> None:
        """Exact (the offline core's metrics for the same records) and every record counted once."""
        from .worker_harness import assert_conserved, assert_each_batch_matches, latest_by_batch, produced_records

        published = list(published)
        assert_each_batch_matches(latest_by_batch(published), self.events, partitions=PARTITIONS)
        assert_conserved(produced_records(self.events), published, letters)


@functools.lru_cache(maxsize=SimInput.FLEETS)
def _fleet(n: int) -> tuple[list[Any], list[tuple[int, bytes | None, bytes]]]:
    """Fleet ``n``: its events (every kind of trouble, small) and its messages in order."""
    from .worker_harness import fleet_events

    events = fleet_events(n, batches=2, sessions=4, template_pool=16)
    sent: dict[tuple[str, str, int], int] = {}
    return events, [message for event in events for message in _messages(event, sent)]


def _messages(event: Any, sent: dict[tuple[str, str, int], int]) -> list[tuple[int, bytes | None, bytes]]:
    """An event's messages as the producers' library sends them (``sent``: what each
    producer sent per batch and partition, which its markers name)."""
    from specmeter.producers._publisher import partition_for_key

    payload = event.payload
    if isinstance(payload, BatchMarker):
        return [
            (p, payload.batch_id.encode(), _marker(payload, sent.pop((event.producer_id, payload.batch_id, p), 0)))
            for p in range(PARTITIONS)
        ]
    record = isinstance(payload, GenerationRecord)
    session = payload.session_id if record else payload.get("session_id")
    key = session.encode() if session else None
    partition = partition_for_key(key, PARTITIONS) if key else 0
    batch = payload.batch_id if record else payload.get("batch_id")
    if batch is not None:
        where = (event.producer_id, batch, partition)
        sent[where] = sent.get(where, 0) + 1
    value = encode_records_message(payload) if record else msgspec.msgpack.encode(payload)
    return [(partition, key, value)]


def _marker(marker: BatchMarker, records_sent: int) -> bytes:
    return encode_records_message(msgspec.structs.replace(marker, records_sent=records_sent))


def _checkpoint_in(key: bytes, value: bytes | None) -> int | None:
    """The input offset a changelog write checkpoints (None: it is no checkpoint): stage 1's
    ``c``, stage 2's ``k``, a checkpoint-only stage's plain number."""
    kind = key.partition(b"\x1f")[2]
    if value is None or kind not in (b"c", b"k"):
        return None
    if value.isdigit():
        return int(value)
    return decode_checkpoint(value).offset if kind == b"c" else decode_stage2_checkpoint(value).offset


def _lose_after(worker: Worker, in_flight: deque[InFlight], topic: str, partition: int) -> None:
    """A write lost: the idempotent producer's later writes to its partition are refused
    (their sequence numbers no longer follow): none of them lands, each fails."""
    for write in [w for w in in_flight if w[0] == topic and w[1] == partition]:
        in_flight.remove(write)
        worker.loop.call_soon(_answer, write[4], None, KafkaTimeoutError())


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
    return isinstance(failed, (TimeoutError, KafkaTimeoutError, InjectedFault)) or (
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


#: one schedule in this many runs the worker's own stages (the others, checkpoint-only ones)
REAL_EVERY = 10


def runs_real_stages(seed: int) -> bool:
    """Whether schedule ``seed`` runs the worker's own stages."""
    return seed % REAL_EVERY == REAL_EVERY - 1


#: how many workers a schedule runs, by its seed (two to four)
WORKERS = (2, 3, 2, 4, 3)
#: the steps of a schedule before its group is left quiet
STEPS = 100


def run_simulation(seed: int, *, steps: int = STEPS, real: bool | None = None) -> Simulation:
    """One schedule (with the worker's own stages when ``real``; None: as the seed says);
    raises ``Violation`` when an invariant breaks."""
    real = runs_real_stages(seed) if real is None else real
    sim = Simulation(seed, workers=WORKERS[seed // REAL_EVERY % len(WORKERS)], real=real)
    try:
        sim.rebalance_all()
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


def shortest_failure(seed: int, steps: int = STEPS) -> Violation | None:
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
    schedules: int, *, start: int = 0, jobs: int = 0, progress: Callable[[int, list[str]], None] | None = None
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
                progress(done, found)
    return found


def _violation_of(seed: int, real: bool | None = None) -> str | None:
    try:
        run_simulation(seed, real=real)
    except Violation as violation:
        return str(violation)
    return None


def first_failure(limit: int, *, jobs: int = 0, real: bool | None = None) -> tuple[int, str] | None:
    """The first seed below ``limit`` whose schedule breaks an invariant, and its violation
    (None: none does); every schedule with the worker's own stages when ``real``. Over a
    process per core, forked: a function replaced in this process (a fix reverted) is
    replaced in theirs."""
    import multiprocessing

    check = functools.partial(_violation_of, real=real)
    with multiprocessing.get_context("fork").Pool(jobs or multiprocessing.cpu_count()) as pool:
        for seed, violation in enumerate(pool.imap(check, range(limit), chunksize=4)):
            if violation is not None:
                pool.terminate()
                return seed, violation
    return None


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

    said = 0

    def progress(done: int, found: list[str]) -> None:
        nonlocal last, said
        for violation in found[said:]:  # each as soon as it is found
            print(violation, file=sys.stderr, flush=True)
        said = len(found)
        now = time.monotonic()
        if now - last >= args.every or done == args.schedules:
            last = now
            rate = done / (now - began)
            print(
                f"{done:,}/{args.schedules:,} schedules, {said} violations, {rate:,.0f}/s", file=sys.stderr, flush=True
            )

    found = run_many(args.schedules, start=args.start, jobs=args.jobs, progress=progress)
    elapsed = time.monotonic() - began
    summary = {"schedules": args.schedules, "start": args.start, "violations": len(found), "seconds": round(elapsed, 1)}
    print(json.dumps(summary))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
