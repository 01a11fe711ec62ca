"""One simulated worker: the worker's own stages (or the driver over checkpoint-only ones) on
a virtual loop of its own, built through its seams over the in-memory Kafka, and instrumented
so that each fence, install and release is judged where it happens."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from specmeter.streams.delivery.ledger import Ledger
from specmeter.streams.delivery.output import OrderedProducer
from specmeter.streams.worker.app import StreamShell

from ..fake_kafka import FakeStages, fake_driver
from .changelog_records import _checkpoint_in
from .deployment import SETTINGS
from .kafka import InFlight, SimConsumer, SimProducer, _ignore
from .loop import VirtualLoop
from .outcomes import InjectedFault, Stopped, Violation, _stops_by_design

if TYPE_CHECKING:
    from .scheduler import Simulation


class NotedLedger(Ledger):
    """The worker's ledger, noting each install (its epoch and the rebalance it belongs to)
    and checking it against the released checkpoints."""

    def __init__(self, topics: Any, worker: Worker) -> None:
        super().__init__(topics)
        self.worker = worker

    def install(self, topic: str, p: int, turn: int, state: Any, end: int) -> Any:
        claim = super().install(topic, p, turn, state, end)
        worker = self.worker
        sim = worker.sim
        changelog = sim.changelog_of.get(topic, "")
        owned = worker.driver.writes.ownership(changelog, p)
        if claim is not None and owned is not None:
            where = (changelog, p)
            worker.installed_in[where] = (owned.epoch, worker.confirmed_in.get(where, (-1, -1, 0)))
            sim.check_install(worker, changelog, p, owned.epoch, state.checkpoint)
        return claim


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
        self.stages = FakeStages(self.sim.logs, restore_group=not self.sim.bare)
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

        self.driver.ledger = NotedLedger(self.driver.ledger.topics, worker)
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
        if not self.frozen:  # its code asks the running loop (the loop's own run sets it)
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
        for task in self.loop.pending():
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.run_until_complete(asyncio.gather(*self.loop.pending(), return_exceptions=True))
        self.loop.close()
