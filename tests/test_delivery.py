"""The delivery rules without a broker: the sans-IO ``delivery.ledger.Ledger`` exactly, then the
``delivery.routes.DeliveryDriver`` over fake group consumers and a fake producer that serve
in-memory logs (takeovers, write groups, rebalances, fencing)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from specmeter.streams.core.ownership import (
    ChangelogView,
    Takeover,
    encode_takeover,
    is_confirmation,
    owner_key_part,
    split_key,
    takeover_key,
)
from specmeter.streams.delivery.ledger import Admitted, Claim, Ledger

from .support.fake_kafka import FakeConsumer, FakeLogs, FakeOutput, FakeStages, P, R, Stage, fake_driver


def installed(ledger: Ledger, topic: str, partition: int, checkpoint: int, log_end: int = 0) -> Claim:
    turn = ledger.begin_restore(topic, partition)
    assert turn is not None
    claim = ledger.install(topic, partition, turn, Stage(checkpoint), log_end)
    assert claim is not None
    return claim


# -- the ledger -----------------------------------------------------------------------------------------
def test_an_assignment_asks_to_restore_the_stages_partitions_once_per_epoch():
    ledger = Ledger((R, P))
    assert ledger.assign(R, [0, 1]) == [0, 1]
    ledger.assign(P, [0])
    assert ledger.assign("other-topic", [0]) == []
    assert ledger.to_restore() == [(P, 0), (R, 0), (R, 1)]
    turn = ledger.begin_restore(R, 0)
    assert turn is not None
    assert ledger.begin_restore(R, 0) is None  # a decision taken again before an await: no second restore
    assert ledger.to_restore() == [(P, 0), (R, 1)]
    assert ledger.begin_restore(R, 7) is None  # not ours
    ledger.end_restore(R, 0, turn)  # it failed: it may be tried again
    assert ledger.begin_restore(R, 0) is not None


def test_a_restore_that_outlived_its_epoch_installs_nothing():
    ledger = Ledger((R, P))
    ledger.assign(R, [0])
    turn = ledger.begin_restore(R, 0)
    assert turn is not None
    ledger.assign(R, [])  # revoked
    ledger.assign(R, [0])  # assigned again in the next generation: restored again
    assert ledger.install(R, 0, turn, Stage(5), 10) is None
    assert ledger.following(R) == {}
    again = ledger.begin_restore(R, 0)
    assert again is not None and again != turn
    assert ledger.install(R, 0, again, Stage(5), 10) is not None


def test_a_revocation_ends_the_claims_on_the_revoked_partition_only():
    """Issue 30: one epoch for all partitions made every revocation drop the fetched input
    of the partitions that stayed, without reading it again."""
    ledger = Ledger((R, P))
    ledger.assign(R, [0, 1])
    zero, one = installed(ledger, R, 0, -1), installed(ledger, R, 1, -1)
    assert ledger.holds(zero) and ledger.holds(one)
    ledger.assign(R, [0])
    assert not ledger.holds(one) and not ledger.owns(R, 1)
    assert ledger.holds(zero)  # its work goes on


def test_a_revoked_state_is_kept_suspended_until_the_next_assignment():
    ledger = Ledger((R, P))
    ledger.assign(R, [0, 1])
    zero = installed(ledger, R, 0, 41)
    ledger.assign(R, [1])
    assert ledger.suspended(R) == {0: zero.state}
    ledger.assign(R, [0, 1])
    assert ledger.take_suspended(R, 0) is zero.state and ledger.take_suspended(R, 0) is None
    assert ledger.to_restore(R) == [(R, 0), (R, 1)]  # kept or restored: the driver decides


def test_a_fenced_partition_drops_its_state_and_is_taken_over_again_while_assigned():
    ledger = Ledger((R, P))
    ledger.assign(R, [0])
    claim = installed(ledger, R, 0, 9)
    assert ledger.fence(R, 0) is True
    assert not ledger.holds(claim) and ledger.following(R) == {} and ledger.to_restore(R) == [(R, 0)]
    ledger.assign(R, [])
    assert ledger.fence(R, 0) is False and ledger.suspended(R) == {}


def test_only_offsets_after_the_checkpoint_are_admitted_and_a_gap_in_the_log_is_counted():
    ledger = Ledger((R, P))
    ledger.assign(R, [0])
    claim = installed(ledger, R, 0, 9)
    assert ledger.admit(claim, [(8, b""), (9, b""), (10, b"a"), (11, b"b")]) == Admitted([(10, b"a"), (11, b"b")])
    assert ledger.admit(claim, [(5, b""), (9, b"")]) == Admitted([])
    gap = ledger.admit(claim, [(14, b"c"), (15, b"d")])  # 10..13 gone (retention, compaction)
    assert gap == Admitted([(14, b"c"), (15, b"d")], (10, 14))
    assert ledger.gaps == 4


def test_timers_wait_until_the_route_reached_the_log_end_of_the_install():
    ledger = Ledger((R, P))
    ledger.assign(R, [0, 1])
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
    ledger.assign(R, [0])
    ledger.assign(P, [0])
    assert not ledger.ready()
    records = installed(ledger, R, 0, -1)
    assert not ledger.ready()
    installed(ledger, P, 0, 41)
    assert ledger.ready()
    assert ledger.commit_offsets() == {(P, 0): 42}
    records.state.process([(0, b""), (1, b"")])
    assert ledger.commit_offsets() == {(P, 0): 42, (R, 0): 2}
    assert ledger.commit_offsets(R) == {(R, 0): 2}


# -- the driver over fakes ------------------------------------------------------------------------------
def _four_records_restore_held() -> tuple[FakeLogs, FakeStages]:
    """Records partition 0 holding offsets 0-3, and stages whose restores wait at their
    crash point until the test sets ``hold_restore``."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(4):
        logs.append(R, 0, b"r")
    stages.hold_restore.clear()
    return logs, stages


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def _member(logs: FakeLogs, topic: str) -> FakeConsumer:
    await _until(lambda: bool(logs.members(topic)))
    return logs.members(topic)[0]


def _takeovers(logs: FakeLogs, topic: str, partition: int) -> list[int]:
    """The offsets of the takeover records appended (not their deletions: a restore deletes the strays)."""
    log = logs.logs.get(f"{topic}-changelog", {}).get(partition, [])
    return [o for o, k, v in log if k is not None and v is not None and b"\x1fe\x1f" in k]


def test_the_driver_takes_over_restores_then_reads_each_partition_from_its_checkpoint_once():
    logs = FakeLogs()
    stages = FakeStages(logs)
    for offset in range(10):
        logs.append(R, 0, f"r{offset}".encode())
        logs.append(R, 1, f"r{offset}".encode())
    logs.append(f"{R}-changelog", 0, b"6", key=b"0\x1fc")  # partition 0 applied up to 6 before (untagged)
    timers: list[bool] = []

    async def run() -> None:
        driver = fake_driver(logs, stages)
        stages.hold_input.clear()
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0, 1])
        await _until(lambda: driver.ledger.ready() and bool(driver.ledger.following(R)))
        await asyncio.sleep(0.02)
        timers.append(driver.ledger.timers_run(R, 0))
        stages.hold_input.set()
        await _until(lambda: driver.ledger.timers_run(R, 0) and driver.ledger.timers_run(R, 1))
        logs.append(R, 0, b"late")  # the route keeps following
        await _until(lambda: stages.states[(R, 0)][-1].checkpoint == 10)
        await _until(lambda: (R, 0, 10) in stages.released)  # the group's output, once its writes were acked
        await _until(lambda: logs.committed.get(("g-stage1", R, 0)) == 11)  # the group's lag follows
        await driver.close()

    asyncio.run(run())
    assert stages.builds == {(R, 0): 1, (R, 1): 1}
    assert stages.states[(R, 0)][0].applied == [7, 8, 9, 10]
    assert stages.states[(R, 1)][0].applied == list(range(10))
    assert timers == [False]  # held until the route had read what the log held at install
    assert len(_takeovers(logs, R, 0)) == len(_takeovers(logs, R, 1)) == 1
    # what a worker writes after its takeover carries its epoch (its deletions name the keys they delete)
    epoch = _takeovers(logs, R, 0)[0]
    written = [k for o, k, v in logs.logs[f"{R}-changelog"][0] if o > epoch and v is not None]
    assert is_confirmation(written[0])  # its confirmation, naming the epoch (issue 43)
    assert written[1:] and all(split_key(k)[1] == epoch for k in written[1:])
    assert all(c.stopped for c in logs.consumers if c.started)


def test_a_revocation_during_a_restore_installs_nothing_and_the_next_assignment_restores_once():
    logs, stages = _four_records_restore_held()

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await asyncio.sleep(0.05)  # taken over, the changelog read; the install waits at the crash point
        await member.rebalance([])
        stages.hold_restore.set()
        await asyncio.sleep(0.05)
        assert driver.ledger.following(R) == {}
        await member.rebalance([0])
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await _until(lambda: bool(stages.states[(R, 0)][-1].applied == [0, 1, 2, 3]))
        await driver.close()

    asyncio.run(run())
    assert stages.builds[(R, 0)] == 1  # the held one was cancelled before it built anything
    assert [s.applied for s in stages.states[(R, 0)]] == [[0, 1, 2, 3]]


def test_a_takeover_that_fails_is_retried_and_the_timers_wait_for_it():
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(5):
        logs.append(R, 0, b"r")
    logs.fail_next_reads = 2
    held: list[bool] = []

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        for _ in range(3):
            held.append(driver.ledger.timers_run(R, 0))
            await asyncio.sleep(0.001)
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await _until(lambda: stages.states[(R, 0)][0].applied == [0, 1, 2, 3, 4])
        await driver.close()

    asyncio.run(run())
    assert held == [False, False, False]


def test_input_fetched_for_a_partition_revoked_meanwhile_is_not_applied():
    logs = FakeLogs()
    for _ in range(30):
        logs.append(R, 0, b"r")

    class SlowStages(FakeStages):
        async def run(self, topic, state, partition, messages):
            await super().run(topic, state, partition, messages)
            await asyncio.sleep(0.01)  # the revocation comes while a chunk is applied

    stages = SlowStages(logs)

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: bool(stages.states.get((R, 0))) and stages.states[(R, 0)][0].applied)
        await member.rebalance([])
        state = stages.states[(R, 0)][0]
        seen = list(state.applied)
        await asyncio.sleep(0.05)
        assert state.applied == seen  # nothing more under the old claim
        await driver.close()

    asyncio.run(run())
    assert stages.states[(R, 0)][0].applied[-1] < 29


def test_a_rebalance_that_leaves_partitions_alone_keeps_their_state_and_their_input():
    """Issue 30: every rebalance restored every partition, and dropped the fetched input of the
    partitions that stayed without reading it again."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(12):
        logs.append(R, 0, b"r")
        logs.append(R, 1, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0, 1])
        await _until(lambda: driver.ledger.timers_run(R, 0) and driver.ledger.timers_run(R, 1))
        await _until(lambda: stages.states[(R, 0)][0].checkpoint == 11 and stages.states[(R, 1)][0].checkpoint == 11)
        await asyncio.sleep(0.05)
        # a worker joins: partition 1 moves there, and its new owner writes its changelog
        await member.rebalance([0])
        logs.append(f"{R}-changelog", 1, encode_takeover(Takeover(token="other")), takeover_key(1, "other"))
        for _ in range(5):
            logs.append(R, 0, b"r")
        await _until(lambda: stages.states[(R, 0)][-1].checkpoint == 16)
        # and it leaves again: both come back; 0 kept as it is, 1 restored (its changelog moved)
        await member.rebalance([0, 1])
        await _until(lambda: driver.ledger.ready() and len(driver.ledger.following(R)) == 2)
        for _ in range(3):
            logs.append(R, 0, b"r")
        await _until(lambda: stages.states[(R, 0)][-1].checkpoint == 19)
        assert (driver.kept, driver.restored) == (2, 3)  # 0 kept at both rebalances; 1 restored again
        await driver.close()

    asyncio.run(run())
    assert stages.builds == {(R, 0): 1, (R, 1): 2}
    assert stages.states[(R, 0)][0].applied == list(range(20))  # one state, every offset once


def test_a_foreign_takeover_in_its_changelog_fences_the_worker_and_releases_nothing_more():
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(3):
        logs.append(R, 0, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: (R, 0, 2) in stages.released)
        first = stages.states[(R, 0)][0]
        # another worker took partition 0 over (this one was frozen past its session), and wrote
        # the checkpoint it restored under its own tag, as a restore does ...
        other = logs.append(
            f"{R}-changelog", 0, encode_takeover(Takeover(token="other", owner="w2")), takeover_key(0, "other")
        )
        logs.append(f"{R}-changelog", 0, b"2", f"{owner_key_part(0, other)}\x1fc".encode())
        logs.append(R, 0, b"r")  # ... and this worker still applies the input it fetched
        await _until(lambda: driver.writes.fenced == 1)
        assert (R, 0, 3) not in stages.released  # its output never leaves
        assert first.checkpoint == 3
        # still assigned here: taken over again, from the changelog (that says 2, and the other's takeover)
        await _until(lambda: len(stages.states[(R, 0)]) == 2 and driver.ledger.timers_run(R, 0))
        await _until(lambda: (R, 0, 3) in stages.released)
        await driver.close()

    asyncio.run(run())
    assert stages.states[(R, 0)][1].applied == [3]


def test_a_gap_that_compaction_emptied_gives_the_partition_up_and_releases_nothing():
    """Simulation seed 6134: a frozen owner's write lands after another worker's takeover;
    before the owner wakes, a second copy of that takeover (or a later owner's deletion of
    it) lets compaction remove the record in the gap. What the gap held cannot be known: the
    owner gives the partition up rather than release output of writes that may not count."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(3):
        logs.append(R, 0, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: (R, 0, 2) in stages.released)
        logs.append(f"{R}-changelog", 0, None, None)  # an offset compaction emptied, before this worker's next write
        logs.logs[f"{R}-changelog"][0][-1] = (len(logs.logs[f"{R}-changelog"][0]) - 1, None, None)
        logs.append(R, 0, b"r")
        await _until(lambda: driver.writes.unreadable_gaps == 1)
        assert (R, 0, 3) not in stages.released  # its output never leaves
        # still assigned here: taken over again, from the changelog, where its writes counted after all
        await _until(lambda: len(stages.states[(R, 0)]) == 2 and driver.ledger.timers_run(R, 0))
        assert stages.states[(R, 0)][1].checkpoint == 3 and driver.writes.unreadable_gaps == 1
        await driver.close()

    asyncio.run(run())


def test_a_member_of_a_stale_generation_writes_no_takeover():
    logs = FakeLogs()
    stages = FakeStages(logs)
    logs.stale_commits = True

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await asyncio.sleep(0.1)
        assert not driver.ledger.ready() and not _takeovers(logs, R, 0)
        logs.stale_commits = False
        await member.rebalance([0])  # the next generation's assignment
        await _until(lambda: driver.ledger.ready() and bool(driver.ledger.following(R)))
        await driver.close()

    asyncio.run(run())
    assert len(_takeovers(logs, R, 0)) == 1


def test_a_large_restore_yields_to_the_event_loop():
    logs = FakeLogs()
    stages = FakeStages(logs)
    stages.restore_steps = 2_000
    ticks: list[float] = []

    async def heartbeat() -> None:
        while True:
            ticks.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0)

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.RESTORE_SLICE_S = 0.0  # yield at every step
        beat = asyncio.get_running_loop().create_task(heartbeat())
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: driver.ledger.ready() and bool(driver.ledger.following(R)))
        beat.cancel()
        await driver.close()

    asyncio.run(run())
    assert len(ticks) > 2_000  # the loop ran between the steps


@pytest.mark.parametrize("topic", [R, P])
def test_both_stages_are_fed_by_their_own_route_in_their_own_group(topic):
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(5):
        logs.append(topic, 3, b"x")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, topic)
        assert member.group_id == ("g-stage1" if topic == R else "g-stage2")
        await member.rebalance([3])
        await _until(lambda: driver.ledger.timers_run(topic, 3))
        await _until(lambda: stages.states[(topic, 3)][0].applied == [0, 1, 2, 3, 4])
        await driver.close()

    asyncio.run(run())


def test_a_partition_restored_while_its_route_idles_is_followed_at_once():
    """An idle route lets the broker hold its fetches long (``IDLE_FETCH_WAIT_MS``); a
    partition restored meanwhile is still read at the route's next short turn."""
    logs = FakeLogs()
    stages = FakeStages(logs)

    async def run() -> float:
        driver = fake_driver(logs, stages)
        for route in driver.routes:
            route.IDLE_AFTER_S = 0.0
            route.IDLE_FETCH_WAIT_MS = 5_000
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await asyncio.sleep(0.5)  # the route idles
        for _ in range(3):
            logs.append(R, 1, b"r")
        started = asyncio.get_running_loop().time()
        await member.rebalance([0, 1])
        await _until(lambda: driver.ledger.timers_run(R, 1) and bool(stages.states.get((R, 1))))
        await _until(lambda: stages.states[(R, 1)][-1].checkpoint == 2)
        elapsed = asyncio.get_running_loop().time() - started
        await driver.close()
        return elapsed

    assert asyncio.run(run()) < 1.0


def test_a_partition_installed_while_its_route_fetches_is_read_without_waiting_out_the_fetch():
    """A fetch waits up to its timeout when nothing is fetchable (every partition paused,
    not restored yet); the route follows an install at once, while the fetch waits: the
    partition resumed, its records end the wait. Kept and restored partitions each wake the
    route as they are installed."""
    logs, stages = _four_records_restore_held()

    async def run() -> None:
        driver = fake_driver(logs, stages)
        for route in driver.routes:
            route.FETCH_TIMEOUT_MS = 60_000  # only records end a fetch in this test
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await asyncio.sleep(0.1)  # the route fetches, its one partition paused; the install is held
        stages.hold_restore.set()
        await _until(lambda: bool(stages.states.get((R, 0))) and stages.states[(R, 0)][-1].checkpoint == 3)
        assert logs.cancelled_fetches == 0  # the wait was ended by records, not cut short
        await driver.close()

    asyncio.run(run())


def test_an_idle_route_fetches_with_the_short_wait_while_an_assigned_partition_waits_for_its_state():
    """A consumer has one fetch in flight per broker: a partition resumed behind a fetch
    the broker holds (an idle route's long wait) would wait out the hold. So an assignment
    brings the short wait back at once, and it stays while a partition waits for its state."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    waits: list[int] = []

    async def run() -> None:
        driver = fake_driver(logs, stages)
        route = driver.routes[0]
        route.IDLE_AFTER_S = 0.05
        route.IDLE_FETCH_WAIT_MS = 5_000
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: member.fetch_wait_ms == 5_000)  # followed, no input: idle
        stages.hold_restore.clear()
        await member.rebalance([0, 1])
        waits.append(member.fetch_wait_ms)  # before the fetcher's next request
        await asyncio.sleep(0.3)  # idle for longer than IDLE_AFTER_S, partition 1 not restored
        waits.append(member.fetch_wait_ms)
        stages.hold_restore.set()
        await _until(lambda: member.fetch_wait_ms == 5_000)  # both followed: idle again
        await driver.close()

    asyncio.run(run())
    assert waits == [10, 10]


def test_a_commit_that_fails_is_said_and_retried_and_the_route_goes_on(caplog):
    """Issue 30: an error in the offset commit crashed Faust's consumer service instead of
    reaching the worker; the routes commit now, and a failure is a warning, retried."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(3):
        logs.append(R, 0, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])
        await _until(lambda: stages.states.get((R, 0)) is not None and stages.states[(R, 0)][0].checkpoint == 2)
        logs.failing_commits = 3
        for _ in range(3):
            logs.append(R, 0, b"r")
        await _until(lambda: stages.states[(R, 0)][0].checkpoint == 5)
        await _until(lambda: logs.committed.get(("g-stage1", R, 0)) == 6)  # retried at the next interval
        await driver.close()

    with caplog.at_level("WARNING", logger="specmeter.worker"):
        asyncio.run(run())
    assert [r for r in caplog.records if "committing the offsets of records failed" in r.getMessage()]


def test_a_commit_the_group_refused_after_a_rebalance_is_one_info_line(caplog):
    """A member back from a pause commits into a group that moved on: aiokafka's
    CommitFailedError carries ten lines of advice about poll(); the worker says it in one,
    at INFO (a rebalance is not a fault), and counts no failure."""
    from aiokafka.errors import CommitFailedError

    class Refusing:
        async def commit(self, offsets):
            raise CommitFailedError("Commit cannot be completed since the group has already\n rebalanced ...")

    route = fake_driver(FakeLogs(), FakeStages(FakeLogs())).routes[0]
    with caplog.at_level("DEBUG", logger="specmeter.worker"):
        asyncio.run(route._commit_offsets(Refusing(), {(R, 0): 3}))  # noqa: SLF001
    [line] = [r for r in caplog.records if "committing the offsets" in r.getMessage()]
    assert line.levelname == "INFO" and "rebalanced" in line.getMessage() and "\n" not in line.getMessage()
    assert route._commit_failures == 0  # noqa: SLF001


def test_a_commit_given_up_on_leaves_no_failure_unretrieved():
    """aiokafka shields a commit's request; ``wait_for`` cancelling it at its deadline
    dropped the request's failure, and asyncio logged "Task exception was never retrieved"
    with a traceback every 10 s while a coordinator was away. ``within`` gives up without
    cancelling: the request ends on its own and its outcome is read."""
    import gc

    from aiokafka.errors import KafkaError

    from specmeter.streams.delivery.routes import within

    async def shielded_commit() -> None:  # aiokafka's GroupCoordinator.commit_offsets, in short
        async def request() -> None:
            await asyncio.sleep(0.05)
            raise KafkaError("the group coordinator is not available")

        await asyncio.shield(request())

    async def unretrieved(give_up) -> list[dict]:
        said: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: said.append(context))
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            await give_up(shielded_commit(), 0.01)
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0)
        return said

    assert [c["message"] for c in asyncio.run(unretrieved(asyncio.wait_for))] == ["Task exception was never retrieved"]
    assert asyncio.run(unretrieved(within)) == []


def test_a_commit_whose_caller_is_cancelled_is_left_to_its_owner():
    """A route stopping while a commit waits on an absent coordinator: the commit is not
    cancelled mid-request (aiokafka's shield would drop its failure); it is left in the
    route's set, which the route cancels once its consumer stopped."""
    import gc

    from aiokafka.errors import KafkaError

    from specmeter.streams.delivery.routes import within

    async def shielded_commit() -> None:
        async def request() -> None:
            await asyncio.sleep(0.05)
            raise KafkaError("the group coordinator is not available")

        await asyncio.shield(request())

    async def run() -> tuple[list[dict], bool]:
        said: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: said.append(context))
        left: set[asyncio.Future] = set()
        caller = asyncio.ensure_future(within(shielded_commit(), 10, left))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        was_left = len(left) == 1 and not next(iter(left)).done()
        await asyncio.sleep(0.1)  # the request ends on its own; its outcome is read
        gc.collect()
        await asyncio.sleep(0)
        return said, was_left and not left

    said, left_then_gone = asyncio.run(run())
    assert said == [] and left_then_gone


def test_a_generation_check_that_lands_late_does_not_leave_the_group_lag_behind(monkeypatch):
    """A takeover's generation check commits the offsets it read before it was sent. One
    given up on (the coordinator slow) lands whenever the coordinator answers, possibly
    after the route committed newer checkpoints: the committed offset went back, and a
    partition without new input would show that lag for good. The route commits its
    checkpoints again at the next interval."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(3):
        logs.append(R, 0, b"r")
    release = asyncio.Event()
    history: list[int] = []  # partition 0's committed offset after each commit, in order
    held: list[bool] = []
    commit = FakeConsumer.commit

    async def first_commit_held(self, offsets):
        if not held:  # the first takeover's generation check: no answer until released
            held.append(True)
            await release.wait()
        await commit(self, offsets)
        history.append(logs.committed[("g-stage1", R, 0)])

    monkeypatch.setattr(FakeConsumer, "commit", first_commit_held)

    async def run() -> None:
        driver = fake_driver(logs, stages)
        for route in driver.routes:
            route.COMMIT_TIMEOUT_S = 0.05
        driver.start()
        member = await _member(logs, R)
        await member.rebalance([0])  # the check given up on; the takeover retried, and done
        await _until(lambda: 3 in history)
        release.set()  # the first check lands: offset 0, read before it was sent
        await _until(lambda: 0 in history[history.index(3) :])
        await asyncio.sleep(0.3)  # a few commit intervals, no new input
        await driver.close()

    asyncio.run(run())
    assert history[-1] == 3, history


# -- the writer's failures (issue 43) ---------------------------------------------------------------
def test_a_write_acknowledged_without_its_offset_fails_the_output():
    """Rule 9 (``docs/ownership.md``): aiokafka's duplicate-sequence path may complete a write
    with offset -1; where it landed is unknown, so nothing that rests on its place (a
    takeover's epoch, a group's check) may go on: the output fails and ``on_ack`` is not
    called. A write acknowledged with its offset is passed on."""
    from specmeter.streams.delivery.output import OrderedProducer

    failures: list[tuple[str, BaseException]] = []
    acked: list[int] = []

    async def run() -> None:
        out = OrderedProducer(on_failed=lambda topic, exc: failures.append((topic, exc)))
        for offset in (7, -1, 9):
            out.send("log", b"k", b"v", 0, on_ack=acked.append)
            if out.failed is not None:
                assert out.pending == 0  # dropped: nothing is handed over after a failure
                break
            topic, _, _, _, on_ack = out._next()  # noqa: SLF001 - what the producer's task hands aiokafka
            future = asyncio.get_running_loop().create_future()
            out._handed_over(topic, future, on_ack)  # noqa: SLF001
            future.set_result(SimpleNamespace(offset=offset))
            await asyncio.sleep(0)

    asyncio.run(run())
    assert acked == [7]  # the write at -1 failed the output; nothing after it is passed on
    [(topic, exc)] = failures
    assert topic == "log" and "without its offset" in str(exc)


def test_a_write_group_whose_completion_fails_stops_the_worker(caplog):
    """``OwnedWrites._done`` logged a failed completion (a release that raised, a check
    that failed) and went on: the partition's outputs may have left in part, later groups
    behind a barrier would wait for good. It stops the worker now, as writes still in
    flight at a revocation do: the output fails, nothing more is handed over."""
    from specmeter.streams.delivery.writes import OwnedWrites

    logs = FakeLogs()
    output = FakeOutput(logs)
    released: list[int] = []

    async def read_range(*_: object) -> list:
        return []

    async def run() -> None:
        writes = OwnedWrites(output, read_range, lambda *_: None, owner="w")  # type: ignore[arg-type]
        epoch = await writes.take_over("log", 0, generation=1, confirmed_at_ms=1)

        async def broken() -> None:
            raise RuntimeError("an output could not be built")

        async def fine() -> None:
            released.append(1)

        writes.submit("log", 0, [(f"0@{epoch}\x1fc".encode(), b"1")], broken)
        await _until(lambda: output.failed is not None)
        writes.submit("log", 0, [(f"0@{epoch}\x1fc".encode(), b"2")], fine)
        await asyncio.sleep(0.05)
        await writes.close()

    with caplog.at_level("ERROR", logger="specmeter.worker"):
        asyncio.run(run())
    assert isinstance(output.failed, RuntimeError) and released == []
    assert [r for r in caplog.records if "stopping the worker" in r.getMessage()]


# -- the holes of issue 43, point 3: the real driver over the fakes ---------------------------------------
CL = f"{R}-changelog"


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _changelog_view(logs: FakeLogs, partition: int = 0) -> Any:
    view = ChangelogView()
    for offset, key, value in logs.logs.get(CL, {}).get(partition, []):
        view.add(offset, key, value)
    return view.result()


def _checkpoint_of(valid: Any) -> int:
    return max((int(v) for k, v in valid.entries if split_key(k)[0].endswith(b"\x1fc")), default=-1)


def test_a_kept_partition_is_not_fenced_by_a_takeover_of_an_older_rebalance():
    """B owns P0 at generation 7; B drops out; A is given P0 at generation 10 and confirms,
    its takeover record still in flight; B rejoins at 11 and keeps P0 (nobody wrote its
    changelog). A's record lands: it must count for nothing. The kept path used to give
    the partition back without a generation check or a record, so A's generation 10
    counted against B's 7 and fenced B (a re-take, a restore)."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(3):
        logs.append(R, 0, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        logs.generation = 7
        await member.rebalance([0])
        await _until(lambda: (R, 0, 2) in stages.released)
        # B drops out unaware (frozen past its session); at generation 10 A is given P0 and
        # confirms, its record in flight; B is back at 11, given P0 again: it keeps its state
        stray = Takeover(token="a", owner="A", at_ms=_now_ms(), generation=10)
        logs.generation = 11
        await member.rebalance([0])
        await _until(lambda: driver.kept == 1 and driver.ledger.timers_run(R, 0))
        logs.append(CL, 0, encode_takeover(stray), takeover_key(0, "a"))  # A's record lands
        logs.append(R, 0, b"r")
        await _until(lambda: (R, 0, 3) in stages.released)
        assert driver.writes.fenced == 0, "a takeover of an older rebalance fenced the kept owner"
        await driver.close()

    asyncio.run(run())
    assert stages.builds == {(R, 0): 1} and driver_restored_once(stages)
    valid = _changelog_view(logs)
    assert valid.epoch == _takeovers(logs, R, 0)[0] and _checkpoint_of(valid) == 3  # a reader agrees


def driver_restored_once(stages: FakeStages) -> bool:
    return len(stages.states[(R, 0)]) == 1 and stages.states[(R, 0)][0].applied == [0, 1, 2, 3]


def _restarted_group_logs(old_at_ms: int) -> FakeLogs:
    """A changelog whose last counting takeover is generation 39 of a group that then
    started again (confirmed at ``old_at_ms``), with its owner's checkpoint 1, and four
    records of input."""
    logs = FakeLogs()
    for _ in range(4):
        logs.append(R, 0, b"r")
    old = Takeover(token="old", owner="old", at_ms=old_at_ms, generation=39)
    epoch = logs.append(CL, 0, encode_takeover(old), takeover_key(0, "old"))
    logs.append(CL, 0, b"1", f"{owner_key_part(0, epoch)}.0\x1fc".encode())
    return logs


def test_a_group_that_started_again_gets_its_owners_partition_working():
    """The group's generations started again (1) within 60 s of the last counting takeover
    (39): the new owner's takeover does not count. The driver forgot the partition without
    asking for it again: assigned, unread and unready until another rebalance. It tries
    again once the clock-skew bound has passed, and that takeover counts."""
    logs = _restarted_group_logs(_now_ms() - 59_700)  # the bound passes 0.3 s from now
    stages = FakeStages(logs)

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        logs.generation = 1
        await member.rebalance([0])
        await _until(lambda: driver.ledger.timers_run(R, 0), timeout_s=5.0)
        await _until(lambda: stages.states[(R, 0)][-1].checkpoint == 3)
        await driver.close()

    asyncio.run(run())
    assert stages.states[(R, 0)][-1].applied == [2, 3]  # from the old group's checkpoint on
    assert len(_takeovers(logs, R, 0)) == 3  # the old one, the one that did not count, the one that did


def test_after_a_restart_a_late_record_of_the_old_group_fences_nobody():
    """After the group started again, a late takeover of the old group (generation 39,
    confirmed before the new group's owner more than the clock-skew bound) lands: it
    counted (39 >= 1) and fenced the new group's owner. It counts for nothing now."""
    now = _now_ms()
    logs = _restarted_group_logs(now - 61_000)  # the new group's takeover counts at once
    stages = FakeStages(logs)

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        logs.generation = 1
        await member.rebalance([0])
        await _until(lambda: driver.ledger.timers_run(R, 0) and stages.states[(R, 0)][-1].checkpoint == 3)
        late = Takeover(token="late", owner="old", at_ms=now - 62_000, generation=39)  # its cancelled round's
        logs.append(CL, 0, encode_takeover(late), takeover_key(0, "late"))
        logs.append(R, 0, b"r")
        await _until(lambda: (R, 0, 4) in stages.released)
        assert driver.writes.fenced == 0, "an old group's record fenced the new group's owner"
        await driver.close()

    asyncio.run(run())
    assert len(stages.states[(R, 0)]) == 1
    valid = _changelog_view(logs)
    assert _checkpoint_of(valid) == 4 and valid.counting is not None and valid.counting.generation == 1


def test_a_takeover_record_appended_twice_changes_nothing():
    """A takeover record lands twice (a send retried after its delivery timed out, a
    producer whose idempotence session was reset), and compaction keeps only the later
    copy: every record of that owner stopped counting (its epoch moved to the copy), and
    the next owner restored from -1 and deleted them. The owner's confirmation says where
    its takeover landed: the next owner restores its checkpoint."""
    logs = FakeLogs()
    stages = FakeStages(logs)
    for _ in range(4):
        logs.append(R, 0, b"r")

    async def run() -> None:
        driver = fake_driver(logs, stages)
        driver.start()
        member = await _member(logs, R)
        logs.generation = 3
        await member.rebalance([0])
        await _until(lambda: (R, 0, 3) in stages.released)
        [epoch] = _takeovers(logs, R, 0)
        _, key, value = logs.logs[CL][0][epoch]
        logs.append(CL, 0, value, key)  # the second copy
        logs.logs[CL][0][epoch] = (epoch, None, None)  # compaction keeps the later copy only
        await member.rebalance([])
        await driver.close()

    asyncio.run(run())
    later = FakeStages(logs)

    async def next_owner() -> None:
        driver = fake_driver(logs, later)
        driver.start()
        await _until(lambda: bool(logs.members(R)))
        member = logs.members(R)[-1]
        logs.generation = 4
        await member.rebalance([0])
        await _until(lambda: driver.ledger.timers_run(R, 0))
        await driver.close()

    asyncio.run(next_owner())
    [state] = later.states[(R, 0)]
    assert state.checkpoint == 3 and state.applied == [], "the next owner lost the state (read the input again)"
