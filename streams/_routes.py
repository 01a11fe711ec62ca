"""The I/O that carries out the delivery rules of ``_delivery``: one route per stage.

A worker holds a fixed set of Kafka clients, whatever its partition count: Faust's
group consumer (membership only, ``_internals``), the ordered producer (``_output``),
one ``InputRoute`` per stage (a consumer without a group that reads every owned
partition of that stage's input from its checkpoint) and, while partitions are being
restored, one ``ChangelogReader`` (closed again when the restores are done).

The ``DeliveryDriver`` follows Faust's public assignment signals into the ledger,
restores newly assigned partitions (all of a rebalance's together, through one
reader), installs their states and lets the routes read them; it commits the
checkpoints for the group's lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol

from ._delivery import Checkpointed, Claim, Ledger, TopicPartition
from ._internals import set_fetch_wait
from .settings import WorkerSettings

__all__ = ["ChangelogReader", "DeliveryDriver", "InputRoute", "StageHooks"]

log = logging.getLogger("specmeter.worker")


class StageHooks(Protocol):
    """What the driver needs of the stages (``app.StreamShell``)."""

    def changelog_of(self, topic: str) -> str:
        """The changelog topic of a stage's input topic."""
        ...

    def build(
        self, topic: str, partition: int, entries: list[tuple[bytes, bytes]]
    ) -> tuple[Checkpointed, Callable[[], None]]:
        """A partition's state restored from its changelog entries, and what to do once installed."""
        ...

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, bytes]]) -> None:
        """Apply admitted input (offset order) to a partition's state and carry out its effects."""
        ...

    async def reached(self, point: str) -> None:
        """A crash point (``_faults``): tests kill the worker here."""
        ...


def _consumer(broker: str, kafka: Mapping[str, Any], **options: Any) -> Any:
    """A consumer of the worker's own: no group (positions are the checkpoints), nothing
    committed; it reads assigned partitions of topics the worker created."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        bootstrap_servers=broker,
        group_id=None,
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
    """Reads whole changelog partitions for restores: all of a round's partitions through
    one consumer at once, each yielded as soon as it is read to the end it had when the
    round began (latest value per key; tombstones remove keys)."""

    def __init__(self, new_consumer: Callable[..., Any]) -> None:
        self.new_consumer = new_consumer

    async def read(
        self, changelogs: list[TopicPartition], inputs: list[TopicPartition], *, timeout_s: float = 300.0
    ) -> tuple[dict[TopicPartition, int], list[tuple[TopicPartition, list[tuple[bytes, bytes]]]]]:
        """The log ends of ``inputs`` now, and every changelog partition's live entries."""
        from aiokafka.structs import TopicPartition as TP

        consumer = self.new_consumer(max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_wait_ms=20)
        await consumer.start()
        try:
            input_ends = await consumer.end_offsets([TP(t, p) for t, p in inputs]) if inputs else {}
            tps = [TP(t, p) for t, p in changelogs]
            ends = await consumer.end_offsets(tps)
            starts = await consumer.beginning_offsets(tps)
            live: dict[TP, dict[bytes, bytes]] = {tp: {} for tp in tps}
            reading = {tp for tp in tps if ends[tp] > starts[tp]}
            out: list[tuple[TopicPartition, list[tuple[bytes, bytes]]]] = [
                ((tp.topic, tp.partition), []) for tp in tps if tp not in reading
            ]
            if reading:
                consumer.assign(sorted(reading))
                await consumer.seek_to_beginning(*reading)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while reading:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"reading changelogs took over {timeout_s:.0f} s (still {sorted(reading)})")
                fetched = await consumer.getmany(*reading, timeout_ms=500)
                for tp, messages in fetched.items():
                    entries = live[tp]
                    for m in messages:
                        if m.offset >= ends[tp]:
                            break
                        if m.value is None:
                            entries.pop(m.key, None)
                        else:
                            entries[m.key] = m.value
                for tp in list(reading):
                    if await consumer.position(tp) >= ends[tp]:
                        reading.discard(tp)
                        consumer.pause(tp)
                        out.append(((tp.topic, tp.partition), list(live.pop(tp).items())))
            return {(tp.topic, tp.partition): end for tp, end in input_ends.items()}, out
        finally:
            await consumer.stop()


class InputRoute:
    """One stage's input: a consumer that reads every owned, restored partition of the
    topic from its checkpoint, and hands what the ledger admits to the stage.

    Everything fetched is applied in chunks of at most ``chunk_bytes`` per partition,
    round robin between partitions: a fetched marker waits behind at most one chunk
    of each partition, never behind a whole backlog. A catch-up after a restore is
    this same reading, from the restored checkpoint: the ledger holds the partition's
    timers until the route reaches the log end it had at install.

    After ``IDLE_AFTER_S`` without input the broker may hold its fetches for
    ``IDLE_FETCH_WAIT_MS`` instead of the short busy wait (``fetch_wait_ms``): an idle
    worker's CPU then does not grow with its partitions, and new input still ends a
    held fetch at once.
    """

    IDLE_AFTER_S = 5.0
    IDLE_FETCH_WAIT_MS = 5000

    def __init__(self, driver: DeliveryDriver, topic: str, *, chunk_bytes: int, fetch_options: Mapping[str, Any]):
        self.driver = driver
        self.topic = topic
        self.chunk_bytes = chunk_bytes
        self.fetch_options = fetch_options
        self.busy_fetch_wait_ms: int = fetch_options.get("fetch_max_wait_ms", 500)
        #: the fetch wait in force (the busy one, or ``IDLE_FETCH_WAIT_MS`` while idle)
        self.fetch_wait_ms = self.busy_fetch_wait_ms
        #: partition -> the state its consumer position was set for
        self._following: dict[int, Checkpointed] = {}

    async def run(self) -> None:
        """Read until cancelled; after an error (a broker away for a while), again from the
        checkpoints with a fresh consumer, ``RETRY_S`` later (said once per outage)."""
        failures, last_failure = 0, 0.0
        while True:
            self._following = {}
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - logged, retried: the route must not die
                if time.monotonic() - last_failure > 60:
                    failures = 0  # a new outage, not the same one going on
                failures, last_failure = failures + 1, time.monotonic()
                (log.warning if failures == 1 else log.debug)(
                    "route of %s: reading failed (%r); trying again every %.0f s", self.topic, exc, self.driver.RETRY_S
                )
                await asyncio.sleep(self.driver.RETRY_S)

    async def _read(self) -> None:
        from aiokafka.structs import TopicPartition as TP

        driver, ledger, topic = self.driver, self.driver.ledger, self.topic
        consumer = driver.new_consumer(**self.fetch_options)
        try:
            await consumer.start()
            self.fetch_wait_ms = self.busy_fetch_wait_ms
            last_input = time.monotonic()
            while True:
                self._refollow(consumer)
                if not self._following:
                    await driver.assignment_changed.wait()
                    continue
                epoch = ledger.epoch
                # a short wait here whatever the broker holds a fetch for: a partition newly
                # restored (or revoked) is followed at the next turn
                fetched = await consumer.getmany(timeout_ms=200)
                pending: dict[int, list[tuple[int, bytes]]] = {}
                for tp, messages in fetched.items():
                    if messages:
                        pending[tp.partition] = [(m.offset, m.value) for m in messages]
                if pending:
                    last_input = time.monotonic()
                self._pace(consumer, idle=time.monotonic() - last_input >= self.IDLE_AFTER_S)
                while pending:
                    for partition in list(pending):
                        claim = Claim(topic, partition, epoch, self._following.get(partition))
                        if claim.state is None or not ledger.holds(claim):
                            del pending[partition]  # read again from the checkpoint once ours
                            continue
                        admitted = ledger.admit(claim, pending.pop(partition))
                        if admitted.gap is not None:
                            log.warning(
                                "topic=%s partition=%d: offsets %d to %d are no longer in the log (retention or "
                                "compaction); read on from %d",
                                topic,
                                partition,
                                admitted.gap[0],
                                admitted.gap[1] - 1,
                                admitted.gap[1],
                            )
                        if not admitted.messages:
                            continue
                        chunk, rest = split_chunk(admitted.messages, self.chunk_bytes)
                        if rest:
                            pending[partition] = rest
                        await driver.apply(claim, chunk)
                    await asyncio.sleep(0)  # the other stage and the producer between rounds
                for partition, end in ledger.catching_up(topic).items() if ledger.any_catching_up else ():
                    held = ledger.claim(topic, partition)
                    if held is not None and self._following.get(partition) is held.state:
                        position = await consumer.position(TP(topic, partition))
                        if ledger.reached(held, position):
                            driver.caught_up(held, end)
        finally:
            await consumer.stop()

    def _pace(self, consumer: Any, *, idle: bool) -> None:
        wait_ms = self.IDLE_FETCH_WAIT_MS if idle else self.busy_fetch_wait_ms
        if wait_ms != self.fetch_wait_ms:
            set_fetch_wait(consumer, wait_ms)
            self.fetch_wait_ms = wait_ms

    def _refollow(self, consumer: Any) -> None:
        """Point the consumer at the partitions the ledger says to read now, each at its
        checkpoint + 1, when they (or their states) changed."""
        from aiokafka.structs import TopicPartition as TP

        driver = self.driver
        driver.assignment_changed.clear()
        owned = driver.ledger.following(self.topic)
        if owned.keys() == self._following.keys() and all(self._following[p] is s for p, s in owned.items()):
            return
        consumer.assign([TP(self.topic, p) for p in sorted(owned)])
        for p, state in owned.items():
            consumer.seek(TP(self.topic, p), state.checkpoint + 1)
        self._following = dict(owned)


class DeliveryDriver:
    """Carries out the ledger's decisions for both stages' inputs of one worker."""

    #: seconds between tries of a failed restore
    RETRY_S = 1.0
    #: seconds before a route that stopped on an error is started again
    RESTART_S = 5.0

    def __init__(
        self, settings: WorkerSettings, stages: StageHooks, *, new_consumer: Callable[..., Any] | None = None
    ) -> None:
        t = settings.topics
        self.settings = settings
        kafka = settings.security.aiokafka_kwargs()
        #: options -> a consumer of the worker's own (a fake one in tests without a broker)
        self.new_consumer = new_consumer or (lambda **options: _consumer(settings.broker, kafka, **options))
        self.stages = stages
        self.records, self.partials = t.records, t.partials
        self.ledger = Ledger((self.records, self.partials))
        fetch = {"fetch_max_wait_ms": settings.fetch_wait_ms}
        self.routes = (
            InputRoute(
                self,
                self.records,
                chunk_bytes=settings.chunk_bytes,
                fetch_options={**fetch, "max_partition_fetch_bytes": max(settings.chunk_bytes, 1_048_576)},
            ),
            InputRoute(self, self.partials, chunk_bytes=settings.chunk_bytes, fetch_options=fetch),
        )
        self.changelogs = ChangelogReader(self.new_consumer)
        #: set when the assignment or an installed state changed: an idle route looks again
        self.assignment_changed = asyncio.Event()
        self._restore_wanted = asyncio.Event()
        #: name -> (a long-running task: the routes, the restorer; when it started)
        self._tasks: dict[str, tuple[asyncio.Task, float]] = {}
        self._restoring: asyncio.Task | None = None
        #: when the assignment last changed (monotonic), until the worker said it is ready for it
        self._assigned_at: float | None = None
        #: records partition -> when stage 1 last got input (wall clock, for /metrics)
        self.last_event_at: dict[int, float] = {}

    # -- Faust's assignment signals ------------------------------------------------------------
    def assign(self, assigned: Iterable[TopicPartition]) -> None:
        """The group's whole assignment now: restore what is new."""
        self.ledger.assign(assigned)
        self._assigned_at = time.monotonic()
        self.assignment_changed.set()
        self._restore_wanted.set()

    def revoke(self, revoked: Iterable[TopicPartition]) -> None:
        """Forget revoked partitions (and stop a restore under way: its epoch is gone)."""
        self.ledger.revoke(revoked)
        if self._restoring is not None:
            self._restoring.cancel()
        self.assignment_changed.set()
        self._restore_wanted.set()  # partitions still assigned are restored again

    # -- applying ----------------------------------------------------------------------------------
    async def apply(self, claim: Claim, messages: list[tuple[int, bytes]]) -> None:
        if claim.topic == self.records:
            self.last_event_at[claim.partition] = time.time()
        await self.stages.run(claim.topic, claim.state, claim.partition, messages)

    def caught_up(self, claim: Claim, end: int) -> None:
        log.info(
            "topic=%s partition=%d caught up to offset %d: its batch timers run", claim.topic, claim.partition, end
        )

    # -- restores ---------------------------------------------------------------------------------
    async def restorer(self) -> None:
        """Restore what the ledger says, all of a round's partitions through one reader;
        a round that failed is tried again ``RETRY_S`` later (said once, and once it worked)."""
        failures = 0
        while True:
            await self._restore_wanted.wait()
            self._restore_wanted.clear()
            begun = [
                (topic, partition, epoch)
                for topic, partition in self.ledger.to_restore()
                if (epoch := self.ledger.begin_restore(topic, partition)) is not None
            ]
            if not begun:
                self._say_ready()
                continue
            self._restoring = asyncio.get_running_loop().create_task(self._restore(begun), name="restore")
            try:
                await self._restoring
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the restorer itself is being stopped
            except Exception as exc:  # noqa: BLE001 - a broker away for a while
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "restoring %d partition(s) failed (%r): retrying every %.0f s", len(begun), exc, self.RETRY_S
                )
                await asyncio.sleep(self.RETRY_S)
                self._restore_wanted.set()
            else:
                if failures:
                    log.info("restoring succeeded after %d failed tries", failures)
                failures = 0
            finally:
                self._restoring = None
                for topic, partition, epoch in begun:
                    self.ledger.end_restore(topic, partition, epoch)
            self._say_ready()

    def _say_ready(self) -> None:
        """Once per assignment, when every assigned partition is restored: one line."""
        if self._assigned_at is None or not self.ledger.ready():
            return
        log.info(
            "Worker ready: %d records and %d partials partition(s) restored in %.2f s",
            len(self.ledger.assigned(self.records)),
            len(self.ledger.assigned(self.partials)),
            time.monotonic() - self._assigned_at,
        )
        self._assigned_at = None

    async def _restore(self, begun: list[tuple[str, int, int]]) -> None:
        started = time.monotonic()
        stages = self.stages
        epochs = {(t, p): e for t, p, e in begun}
        inputs = sorted(epochs)
        ends, read = await self.changelogs.read([(stages.changelog_of(t), p) for t, p in inputs], inputs)
        log_of = {stages.changelog_of(t): t for t, _ in inputs}
        for (log_topic, partition), entries in read:
            topic = log_of[log_topic]
            await stages.reached("restore")
            state, installed = stages.build(topic, partition, entries)
            claim = self.ledger.install(topic, partition, epochs[(topic, partition)], state, ends[(topic, partition)])
            if claim is not None:
                installed()
        self.assignment_changed.set()
        log.debug("restored %d partition(s) in %.2f s", len(begun), time.monotonic() - started)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, also: Iterable[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = ()) -> None:
        """Start the routes and the restorer (and ``also``), or start one again at most every
        ``RESTART_S`` after it stopped on an error."""
        runs = (
            *also,
            ("restorer", self.restorer),
            *((f"route-{route.topic}", route.run) for route in self.routes),
        )
        for name, run in runs:
            task, started = self._tasks.get(name, (None, 0.0))
            if task is not None and (not task.done() or time.monotonic() - started < self.RESTART_S):
                continue
            if task is not None and not task.cancelled() and task.exception() is not None:
                log.warning("%s stopped (%r): starting it again", name, task.exception())
            self._tasks[name] = (asyncio.get_running_loop().create_task(run(), name=name), time.monotonic())

    async def close(self) -> None:
        """Stop the routes and the restorer."""
        tasks = [task for task, _ in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
