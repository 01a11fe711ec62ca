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

The layout follows the seams: ``route`` is a stage's input route (reading, commits, the
generation check), ``changelog`` the changelog reader, and this module the driver (the
rebalance callbacks, the kept and restore paths, the revocation deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from typing import Any, Protocol

from ..core.ownership import CLOCK_SKEW_MS, StateWithoutCheckpoint, Takeover, ValidState
from ..settings import WorkerSettings
from .changelog import ChangelogReader
from .ledger import Checkpointed, Claim, Ledger, TopicPartition
from .output import OrderedProducer
from .route import Confirmed, InputRoute, split_chunk, within
from .writes import OwnedWrites

__all__ = ["ChangelogReader", "DeliveryDriver", "InputRoute", "StageHooks", "split_chunk", "within"]

log = logging.getLogger("specmeter.worker")

#: a stage state restored, and what to do once it is installed
Restored = tuple[Checkpointed, Callable[[], None]]


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
        #: the ready line waits while set: the worker's web pages are not served yet, and a
        #: reader of the log takes "ready" to mean that they are (``release_ready``)
        self.ready_held = False
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

    @property
    def backlog_read(self) -> bool:
        """Both groups joined, every partition assigned here restored and read to the log end
        it had at its install: the input that waited for the worker is read."""
        return not self.rebalancing and self.ledger.ready() and not self.ledger.any_catching_up

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
        started again within ``CLOCK_SKEW_MS`` of it (as does one of the same generation by
        another member): the next try waits until that bound has passed, and counts
        (``core.ownership.counts_after``)."""
        delay_s = self.RETRY_S
        if counting is not None and _another_incarnation(counting, confirmed):
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

    def release_ready(self) -> None:
        """The ready line no longer held: said now if every assigned partition is restored, else when they are."""
        self.ready_held = False
        self._say_ready()

    def _say_ready(self) -> None:
        """Once per assignment, when every assigned partition is restored (and the line is not held): one line."""
        if self._assigned_at is None or self.ready_held or not self.ledger.ready():
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


def _another_incarnation(counting: Takeover, confirmed: Confirmed) -> bool:
    """Whether the counting takeover is of a group incarnation other than the member's
    (its group started again within the clock-skew bound of it): a newer generation than
    the member's own, or the same generation by another member."""
    if confirmed.generation < 0:
        return False
    if counting.generation == confirmed.generation:
        return bool(counting.member and confirmed.member and counting.member != confirmed.member)
    return counting.generation > confirmed.generation
