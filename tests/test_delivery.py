"""The delivery rules without a broker: the sans-IO ``_delivery.Ledger`` exactly, then the
``_routes.DeliveryDriver`` over a fake consumer that serves in-memory logs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from specmeter.streams._delivery import Admitted, Claim, Ledger
from specmeter.streams._routes import DeliveryDriver

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


def installed(ledger: Ledger, topic: str, partition: int, checkpoint: int, log_end: int = 0) -> Claim:
    epoch = ledger.begin_restore(topic, partition)
    assert epoch is not None
    claim = ledger.install(topic, partition, epoch, Stage(checkpoint), log_end)
    assert claim is not None
    return claim


# -- the ledger -----------------------------------------------------------------------------------------
def test_an_assignment_asks_to_restore_the_stages_partitions_once_per_epoch():
    ledger = Ledger((R, P))
    ledger.assign([(R, 0), (R, 1), (P, 0), ("other-topic", 0)])
    assert ledger.to_restore() == [(P, 0), (R, 0), (R, 1)]
    assert ledger.begin_restore(R, 0) == ledger.epoch
    assert ledger.begin_restore(R, 0) is None  # a decision taken again before an await: no second restore
    assert ledger.to_restore() == [(P, 0), (R, 1)]
    assert ledger.begin_restore(R, 7) is None  # not ours
    ledger.end_restore(R, 0, ledger.epoch)  # it failed: it may be tried again
    assert ledger.begin_restore(R, 0) is not None


def test_a_restore_that_outlived_its_epoch_installs_nothing():
    ledger = Ledger((R, P))
    ledger.assign([(R, 0)])
    epoch = ledger.begin_restore(R, 0)
    assert epoch is not None
    ledger.revoke([(R, 0)])
    ledger.assign([(R, 0)])  # assigned again in the next generation: restored again, from the changelog
    assert ledger.install(R, 0, epoch, Stage(5), 10) is None
    assert ledger.following(R) == {}
    again = ledger.begin_restore(R, 0)
    assert again is not None and again != epoch
    assert ledger.install(R, 0, again, Stage(5), 10) is not None


def test_a_revocation_of_any_partition_ends_every_claim_taken_before_it():
    ledger = Ledger((R, P))
    ledger.assign([(R, 0), (R, 1)])
    zero, one = installed(ledger, R, 0, -1), installed(ledger, R, 1, -1)
    assert ledger.holds(zero) and ledger.holds(one)
    ledger.revoke([(R, 1)])
    assert not ledger.holds(one) and not ledger.owns(R, 1)
    assert not ledger.holds(zero)  # taken before the revocation: claimed again before more work
    assert ledger.holds(ledger.claim(R, 0))


def test_only_offsets_after_the_checkpoint_are_admitted_and_a_gap_in_the_log_is_counted():
    ledger = Ledger((R, P))
    ledger.assign([(R, 0)])
    claim = installed(ledger, R, 0, 9)
    assert ledger.admit(claim, [(8, b""), (9, b""), (10, b"a"), (11, b"b")]) == Admitted([(10, b"a"), (11, b"b")])
    assert ledger.admit(claim, [(5, b""), (9, b"")]) == Admitted([])
    gap = ledger.admit(claim, [(14, b"c"), (15, b"d")])  # 10..13 gone (retention, compaction)
    assert gap == Admitted([(14, b"c"), (15, b"d")], (10, 14))
    assert ledger.gaps == 4


def test_timers_wait_until_the_route_reached_the_log_end_of_the_install():
    ledger = Ledger((R, P))
    ledger.assign([(R, 0), (R, 1)])
    behind = installed(ledger, R, 0, checkpoint=4, log_end=20)
    current = installed(ledger, R, 1, checkpoint=4, log_end=5)  # nothing after its checkpoint
    assert not ledger.timers_run(R, 0) and ledger.timers_run(R, 1)
    assert ledger.catching_up(R) == {0: 20}
    assert ledger.reached(behind, 12) is False
    assert not ledger.timers_run(R, 0)
    assert ledger.reached(behind, 20) is True
    assert ledger.timers_run(R, 0) and ledger.catching_up(R) == {}
    assert ledger.reached(current, 30) is False  # nothing to end: not a second "caught up"
    assert not ledger.timers_run(R, 2)  # not ours


def test_ready_once_every_assigned_partition_is_installed_and_commits_only_what_was_applied():
    ledger = Ledger((R, P))
    assert ledger.ready()  # nothing assigned
    ledger.assign([(R, 0), (P, 0)])
    assert not ledger.ready()
    records = installed(ledger, R, 0, -1)
    assert not ledger.ready()
    installed(ledger, P, 0, 41)
    assert ledger.ready()
    assert ledger.commit_offsets() == {(P, 0): 42}
    records.state.process([(0, b""), (1, b"")])
    assert ledger.commit_offsets() == {(P, 0): 42, (R, 0): 2}
    assert set(ledger.following(R)) == {0} and set(ledger.following(P)) == {0}


# -- the driver over a fake consumer ----------------------------------------------------------------------
class FakeLogs:
    """In-memory logs for ``FakeConsumer``: topic -> partition -> [(offset, key, value)]."""

    def __init__(self) -> None:
        self.logs: dict[str, dict[int, list[tuple[int, bytes | None, bytes | None]]]] = {}
        self.fail_next_reads = 0
        self.consumers: list[FakeConsumer] = []

    def append(self, topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        log = self.logs.setdefault(topic, {}).setdefault(partition, [])
        log.append((len(log), key, value))

    def end(self, topic: str, partition: int) -> int:
        return len(self.logs.get(topic, {}).get(partition, []))


class FakeConsumer:
    """What the routes and the changelog reader use of aiokafka's consumer."""

    def __init__(self, logs: FakeLogs, **options: Any) -> None:
        self.logs = logs
        self.positions: dict[Any, int] = {}
        self.paused: set[Any] = set()
        self.started = self.stopped = False
        logs.consumers.append(self)

    async def start(self) -> None:
        if self.logs.fail_next_reads:
            self.logs.fail_next_reads -= 1
            raise ConnectionError("the broker went away")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, tps: list[Any]) -> None:
        self.positions = dict.fromkeys(tps, 0)

    def seek(self, tp: Any, offset: int) -> None:
        self.positions[tp] = offset

    async def seek_to_beginning(self, *tps: Any) -> None:
        for tp in tps:
            self.positions[tp] = 0

    def pause(self, tp: Any) -> None:
        self.paused.add(tp)

    async def position(self, tp: Any) -> int:
        return self.positions[tp]

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.logs.end(tp.topic, tp.partition) for tp in tps}

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    async def getmany(self, *tps: Any, timeout_ms: int = 0, **kwargs: Any) -> dict[Any, list[Any]]:
        await asyncio.sleep(0.001)
        out = self._take(tps)
        if not out and timeout_ms:  # as aiokafka: wait up to the timeout for data
            await asyncio.sleep(min(timeout_ms, 2_000) / 1000)
            out = self._take(tps)
        return out

    def _take(self, tps: tuple[Any, ...]) -> dict[Any, list[Any]]:
        out = {}
        for tp, position in self.positions.items():
            if (tps and tp not in tps) or tp in self.paused:
                continue
            log = self.logs.logs.get(tp.topic, {}).get(tp.partition, [])
            taken = log[position : position + 3]  # a few at a time: fetches interleave with the test
            if taken:
                out[tp] = [SimpleNamespace(offset=o, key=k, value=v) for o, k, v in taken]
                self.positions[tp] = taken[-1][0] + 1
        return out


class FakeStages:
    """The stages as the driver sees them: a state per partition, restored to the checkpoint
    its changelog names (key b"c", value the offset), applying input in order, once."""

    def __init__(self) -> None:
        self.builds: dict[tuple[str, int], int] = {}
        self.states: dict[tuple[str, int], list[Stage]] = {}
        self.hold_restore = asyncio.Event()
        self.hold_restore.set()
        self.hold_input = asyncio.Event()
        self.hold_input.set()

    def changelog_of(self, topic: str) -> str:
        return f"{topic}-changelog"

    def build(self, topic: str, partition: int, entries: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
        self.builds[(topic, partition)] = self.builds.get((topic, partition), 0) + 1
        checkpoint = int(dict(entries).get(b"c", b"-1"))
        state = Stage(checkpoint)
        self.states.setdefault((topic, partition), []).append(state)
        return state, lambda: None

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, Any]]) -> None:
        await self.hold_input.wait()
        state.process(messages)

    async def reached(self, point: str) -> None:
        if point == "restore":
            await self.hold_restore.wait()


def _driver(logs: FakeLogs, stages: FakeStages) -> DeliveryDriver:
    settings = SimpleNamespace(
        topics=SimpleNamespace(records=R, partials=P),
        broker="unused:9092",
        security=SimpleNamespace(aiokafka_kwargs=dict),
        chunk_bytes=1_048_576,
        fetch_wait_ms=10,
    )
    driver = DeliveryDriver(settings, stages, new_consumer=lambda **options: FakeConsumer(logs, **options))
    driver.RETRY_S = 0.01
    return driver


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_the_driver_restores_then_reads_each_partition_from_its_checkpoint_once_through_one_route():
    logs, stages = FakeLogs(), FakeStages()
    for offset in range(10):
        logs.append(R, 0, f"r{offset}".encode())
        logs.append(R, 1, f"r{offset}".encode())
    logs.append(f"{R}-changelog", 0, b"6", key=b"c")  # partition 0 applied up to 6 before
    timers: list[bool] = []

    async def run() -> None:
        driver = _driver(logs, stages)
        stages.hold_input.clear()
        driver.start()
        driver.assign([(R, 0), (R, 1)])
        await _until(lambda: driver.ledger.ready())
        await asyncio.sleep(0.02)
        timers.append(driver.ledger.timers_run(R, 0))
        stages.hold_input.set()
        await _until(lambda: driver.ledger.timers_run(R, 0) and driver.ledger.timers_run(R, 1))
        logs.append(R, 0, b"late")  # the route keeps following
        await _until(lambda: stages.states[(R, 0)][-1].checkpoint == 10)
        await driver.close()

    asyncio.run(run())
    assert stages.builds == {(R, 0): 1, (R, 1): 1}
    assert stages.states[(R, 0)][0].applied == [7, 8, 9, 10]
    assert stages.states[(R, 1)][0].applied == list(range(10))
    assert timers == [False]  # held until the route had read what the log held at install
    consumers = [c for c in logs.consumers if c.started]
    assert len(consumers) == 3  # one route per stage and one changelog reader, whatever the partitions
    assert all(c.stopped for c in consumers)


def test_a_revocation_during_a_restore_installs_nothing_and_the_next_assignment_restores_once():
    logs, stages = FakeLogs(), FakeStages()
    for _ in range(4):
        logs.append(R, 0, b"r")
    stages.hold_restore.clear()

    async def run() -> None:
        driver = _driver(logs, stages)
        driver.start()
        driver.assign([(R, 0)])
        await asyncio.sleep(0.05)  # the changelog is read; the install waits at the crash point
        driver.revoke([(R, 0)])
        stages.hold_restore.set()
        await asyncio.sleep(0.05)
        assert driver.ledger.following(R) == {}
        driver.assign([(R, 0)])
        driver.assign([(R, 0)])  # a second signal for the same assignment: no second restore
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await driver.close()

    asyncio.run(run())
    assert stages.builds[(R, 0)] == 1  # the held one was cancelled before it built anything
    assert [s.applied for s in stages.states[(R, 0)]] == [[0, 1, 2, 3]]


def test_a_restore_that_fails_is_retried_and_the_timers_wait_for_it():
    logs, stages = FakeLogs(), FakeStages()
    for _ in range(5):
        logs.append(R, 0, b"r")
    logs.fail_next_reads = 2
    held: list[bool] = []

    async def run() -> None:
        driver = _driver(logs, stages)
        driver.assign([(R, 0)])
        driver.start()
        for _ in range(3):
            held.append(driver.ledger.timers_run(R, 0))
            await asyncio.sleep(0.001)
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await driver.close()

    asyncio.run(run())
    assert held == [False, False, False]
    assert stages.states[(R, 0)][0].applied == [0, 1, 2, 3, 4]


def test_input_fetched_for_a_partition_revoked_meanwhile_is_not_applied():
    logs, stages = FakeLogs(), FakeStages()
    for _ in range(30):
        logs.append(R, 0, b"r")

    class SlowStages(FakeStages):
        async def run(self, topic, state, partition, messages):
            state.process(messages)
            await asyncio.sleep(0.01)  # the revocation comes while a chunk is applied

    stages = SlowStages()

    async def run() -> None:
        driver = _driver(logs, stages)
        driver.start()
        driver.assign([(R, 0)])
        await _until(lambda: bool(stages.states.get((R, 0))) and stages.states[(R, 0)][0].applied)
        driver.revoke([(R, 0)])
        state = stages.states[(R, 0)][0]
        seen = list(state.applied)
        await asyncio.sleep(0.05)
        assert state.applied == seen  # nothing more under the old claim
        await driver.close()

    asyncio.run(run())
    assert stages.states[(R, 0)][0].applied[-1] < 29


@pytest.mark.parametrize("topic", [R, P])
def test_both_stages_are_fed_by_their_own_route(topic):
    logs, stages = FakeLogs(), FakeStages()
    for _ in range(5):
        logs.append(topic, 3, b"x")

    async def run() -> None:
        driver = _driver(logs, stages)
        driver.start()
        driver.assign([(topic, 3)])
        await _until(lambda: driver.ledger.timers_run(topic, 3))
        await driver.close()

    asyncio.run(run())
    assert stages.states[(topic, 3)][0].applied == [0, 1, 2, 3, 4]


def test_a_partition_restored_while_its_route_idles_is_followed_at_once():
    """An idle route lets the broker hold its fetches long (``IDLE_FETCH_WAIT_MS``); a
    partition restored meanwhile is still read at the route's next short turn."""
    logs, stages = FakeLogs(), FakeStages()

    async def run() -> float:
        driver = _driver(logs, stages)
        for route in driver.routes:
            route.IDLE_AFTER_S = 0.0
            route.IDLE_FETCH_WAIT_MS = 5_000
        driver.start()
        driver.assign([(R, 0)])
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await asyncio.sleep(0.5)  # the route idles
        for _ in range(3):
            logs.append(R, 1, b"r")
        started = asyncio.get_running_loop().time()
        driver.assign([(R, 0), (R, 1)])
        await _until(lambda: driver.ledger.timers_run(R, 1) and bool(stages.states.get((R, 1))))
        await _until(lambda: stages.states[(R, 1)][-1].checkpoint == 2)
        elapsed = asyncio.get_running_loop().time() - started
        await driver.close()
        return elapsed

    assert asyncio.run(run()) < 1.0
