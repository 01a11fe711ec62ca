"""An in-memory Kafka for the delivery layer's tests and its simulation: logs with offsets,
group consumers that serve them, the ordered producer as the writes see it, and stages that
restore a checkpoint and apply input exactly once (anything else fails).

``tests/test_delivery.py`` drives the real ``DeliveryDriver`` over these; the simulation
(``tests/support/delivery_sim.py``) builds its own members and producer on top of them."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from specmeter.streams.core.ownership import owner_key_part, split_key
from specmeter.streams.delivery.routes import DeliveryDriver

R, P = "records", "partials"


@dataclass
class Stage:
    """A stage state as the ledger sees it: a checkpoint that moves as messages are applied
    (exactly once each, in order: anything else fails the test)."""

    checkpoint: int = -1
    applied: list[int] = field(default_factory=list)

    def process(self, messages: list[tuple[int, object]]) -> None:
        offsets = [m[0] for m in messages]
        assert offsets == sorted(offsets) and offsets[0] > self.checkpoint, offsets
        self.applied += offsets
        self.checkpoint = offsets[-1]


class FakeLogs:
    """In-memory logs: topic -> partition -> [(offset, key, value)], and the groups."""

    def __init__(self) -> None:
        self.logs: dict[str, dict[int, list[tuple[int, bytes | None, bytes | None]]]] = {}
        self.fail_next_reads = 0
        self.consumers: list[FakeConsumer] = []
        self.committed: dict[tuple[str, str, int], int] = {}
        self.stale_commits = False
        self.failing_commits = 0
        #: the group generation the members are in (what ``internals.group_generation`` reads)
        self.generation = -1
        #: getmany calls cancelled: aiokafka's poll accounting (max_poll_interval_ms) does not
        #: survive one, so only a stopping route may
        self.cancelled_fetches = 0

    def append(self, topic: str, partition: int, value: bytes | None, key: bytes | None = None) -> int:
        log = self.logs.setdefault(topic, {}).setdefault(partition, [])
        log.append((len(log), key, value))
        return len(log) - 1

    def end(self, topic: str, partition: int) -> int:
        return len(self.logs.get(topic, {}).get(partition, []))

    def members(self, topic: str) -> list[FakeConsumer]:
        return [c for c in self.consumers if c.group_id and topic in c.topics and c.started and not c.stopped]


class FakeConsumer:
    """What the routes and the changelog reader use of aiokafka's consumer; a group member
    is assigned partitions by the test (``rebalance``), through its listener."""

    def __init__(self, logs: FakeLogs, group_id: str | None = None, **options: Any) -> None:
        self.logs = logs
        self.group_id = group_id
        self.topics: list[str] = []
        self.listener: Any = None
        self.positions: dict[Any, int] = {}
        self.paused: set[Any] = set()
        self.started = self.stopped = False
        #: what ``internals.set_fetch_wait`` sets: how long the broker may hold a fetch
        self._fetcher = SimpleNamespace(_fetch_max_wait_ms=options.get("fetch_max_wait_ms", 500))
        logs.consumers.append(self)

    @property
    def _coordinator(self) -> SimpleNamespace:
        """What ``internals.group_generation`` reads: the generation of the last join."""
        return SimpleNamespace(generation=self.logs.generation)

    @property
    def fetch_wait_ms(self) -> int:
        """How long the broker may hold this consumer's next fetch."""
        return self._fetcher._fetch_max_wait_ms  # noqa: SLF001 - what internals.set_fetch_wait sets

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.topics, self.listener = topics, listener

    async def start(self) -> None:
        if self.logs.fail_next_reads and not self.group_id:
            self.logs.fail_next_reads -= 1
            raise ConnectionError("the broker went away")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def rebalance(self, partitions: list[int]) -> None:
        """The group's new assignment for this member (eager: all revoked, then assigned)."""
        from aiokafka.structs import TopicPartition as TP

        old = list(self.positions)
        await self.listener.on_partitions_revoked(old)
        topic = self.topics[0]
        self.positions = {TP(topic, p): 0 for p in partitions}
        self.paused = set()
        await self.listener.on_partitions_assigned(list(self.positions))

    def assignment(self) -> set[Any]:
        return set(self.positions)

    def assign(self, tps: list[Any]) -> None:
        self.positions = dict.fromkeys(tps, 0)
        self.paused = set()  # a new assignment, as aiokafka's: nothing of it paused

    def seek(self, tp: Any, offset: int) -> None:
        self.positions[tp] = offset

    async def seek_to_beginning(self, *tps: Any) -> None:
        for tp in tps:
            self.positions[tp] = 0

    def pause(self, *tps: Any) -> None:
        self.paused.update(tps)

    def resume(self, *tps: Any) -> None:
        self.paused.difference_update(tps)

    async def position(self, tp: Any) -> int:
        return self.positions[tp]

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.logs.end(tp.topic, tp.partition) for tp in tps}

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    async def committed(self, tp: Any) -> int | None:
        return self.logs.committed.get((self.group_id, tp.topic, tp.partition))

    async def commit(self, offsets: dict[Any, int]) -> None:
        from aiokafka.errors import CommitFailedError, KafkaError

        if self.logs.stale_commits:
            raise CommitFailedError("the group rebalanced (a stale generation)")
        if self.logs.failing_commits:
            self.logs.failing_commits -= 1
            raise KafkaError("the coordinator refused the commit")
        for tp, offset in offsets.items():
            self.logs.committed[(self.group_id, tp.topic, tp.partition)] = offset

    async def getmany(self, *tps: Any, timeout_ms: int = 0, **kwargs: Any) -> dict[Any, list[Any]]:
        """As aiokafka's: what is fetchable now, else the first that is within the timeout
        (input of a paused partition does not end the wait; resuming it does)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        try:
            await asyncio.sleep(0.001)
            while True:
                out = self._take(tps)
                if out or loop.time() >= deadline:
                    return out
                await asyncio.sleep(0.002)
        except asyncio.CancelledError:
            self.logs.cancelled_fetches += 1
            raise

    def _take(self, tps: tuple[Any, ...]) -> dict[Any, list[Any]]:
        out = {}
        for tp, position in self.positions.items():
            if (tps and tp not in tps) or tp in self.paused:
                continue
            log = self.logs.logs.get(tp.topic, {}).get(tp.partition, [])
            taken = log[position : position + 3]  # a few at a time: fetches interleave with the test
            if taken:
                self.positions[tp] = taken[-1][0] + 1
                # an offset compaction removed (no key, no value) is not served, as Kafka's
                kept = [
                    SimpleNamespace(offset=o, key=k, value=v) for o, k, v in taken if k is not None or v is not None
                ]
                if kept:
                    out[tp] = kept
        return out


class FakeOutput:
    """The ordered producer as the writes see it: appends at once, acknowledges soon after."""

    def __init__(self, logs: FakeLogs) -> None:
        self.logs = logs
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []
        self.failed: BaseException | None = None

    def send(self, topic, key, value, partition=None, on_ack=None) -> None:
        if self.failed is not None:
            return  # as the ordered producer: nothing is handed over after a failure
        self.sent.append((topic, key, value, partition))
        offset = self.logs.append(topic, partition or 0, value, key)
        if on_ack is not None:
            asyncio.get_running_loop().call_later(0.002, on_ack, offset)

    def fail(self, topic: str, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc


async def _released_nothing() -> None:
    """A restore group's outputs in the fake stages: none."""


class FakeStages:
    """The stages as the driver sees them: a state per partition, restored to the checkpoint
    its changelog's valid state names (a ``c`` key, value the offset), applying input in order,
    once, each chunk a write group (its checkpoint) whose output is a line in ``released``."""

    def __init__(self, logs: FakeLogs, *, restore_group: bool = True) -> None:
        self.logs = logs
        #: False: a restore writes nothing (no checkpoint, no deletions): the delivery layer's
        #: own rules alone, without what the worker's stages write at a restore (rules 6, 8)
        self.restore_group = restore_group
        self.driver: DeliveryDriver | None = None
        self.builds: dict[tuple[str, int], int] = {}
        self.states: dict[tuple[str, int], list[Stage]] = {}
        self.hold_restore = asyncio.Event()
        self.hold_restore.set()
        self.hold_input = asyncio.Event()
        self.hold_input.set()
        self.released: list[tuple[str, int, int]] = []
        self.restore_steps = 0

    def changelog_of(self, topic: str) -> str:
        return f"{topic}-changelog"

    def restorer(self, topic, partition, valid, epoch) -> Generator[None, None, tuple[Any, Any]]:
        self.builds[(topic, partition)] = self.builds.get((topic, partition), 0) + 1
        checkpoint, found = -1, []
        for key, value in valid.entries:
            if split_key(key)[0].endswith(b"\x1fc"):
                checkpoint, found = int(value), [key]
        for _ in range(self.restore_steps):
            yield
        state = Stage(checkpoint)
        state.key_part = owner_key_part(partition, epoch)  # type: ignore[attr-defined]
        self.states.setdefault((topic, partition), []).append(state)
        if not self.restore_group:
            return state, lambda: None
        return state, lambda: self._restored(topic, partition, state, valid, found)

    def _restored(self, topic: str, partition: int, state: Stage, valid: Any, found: list[bytes]) -> None:
        """A restore's write group, as the worker's stages write theirs (``docs/ownership.md``,
        rules 2a, 6 and 8): the owner's checkpoint, found or not, the confirmations that hold
        the takeovers it counted after where they landed, and the deletion of what does not
        count (stray takeovers among it); once verified, the deletion of the checkpoint it
        found; a barrier for the groups after it."""
        assert self.driver is not None
        key = f"{state.key_part}\x1fc".encode()  # type: ignore[attr-defined]
        writes = [(key, str(state.checkpoint).encode()), *valid.pins, *((k, None) for k in valid.deletions)]
        # the checkpoint found, written again under the owner's tag: deleted once that counts
        self.driver.writes.submit(self.changelog_of(topic), partition, writes, _released_nothing, found, barrier=True)

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, Any]]) -> None:
        await self.hold_input.wait()
        state.process(messages)
        key = f"{state.key_part}\x1fc".encode()
        checkpoint = state.checkpoint

        async def release() -> None:
            self.released.append((topic, partition, checkpoint))

        assert self.driver is not None
        self.driver.writes.submit(self.changelog_of(topic), partition, [(key, str(checkpoint).encode())], release)

    async def reached(self, point: str) -> None:
        if point == "restore":
            await self.hold_restore.wait()


def fake_driver(logs: FakeLogs, stages: FakeStages) -> DeliveryDriver:
    settings = SimpleNamespace(
        topics=SimpleNamespace(records=R, partials=P),
        broker="unused:9092",
        security=SimpleNamespace(aiokafka_kwargs=dict),
        chunk_bytes=1_048_576,
        fetch_wait_ms=10,
        session_timeout_s=6.0,
        max_poll_interval_s=300.0,
        commit_interval_s=0.05,
        consumer_groups=("g-stage1", "g-stage2"),
    )
    driver = DeliveryDriver(
        settings, stages, output=FakeOutput(logs), new_consumer=lambda **options: FakeConsumer(logs, **options)
    )
    driver.RETRY_S = 0.01
    stages.driver = driver
    return driver
