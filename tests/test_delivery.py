"""The delivery rules without a broker: ``_delivery.Ledger``'s decisions, exactly.

Each test drives the sans-IO ledger the way the driver does (a ``Membership`` read
from Faust, fetched messages in) and checks the decision objects it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from specmeter.streams._delivery import (
    Apply,
    CatchUp,
    Claim,
    Fetched,
    Ledger,
    Membership,
    ReadGap,
    ReadRange,
    Restore,
    Seek,
)

R, P = "records", "partials"


@dataclass
class Stage:
    """A stage state as the ledger sees it: a checkpoint that moves when messages are applied."""

    checkpoint: int = -1

    def process(self, messages: list[tuple[int, object]]) -> None:
        assert [m[0] for m in messages] == list(range(self.checkpoint + 1, self.checkpoint + 1 + len(messages)))
        self.checkpoint = messages[-1][0]


def owning(records=(0, 1), partials=(), generation=7, settled=True) -> Membership:
    return Membership({R: frozenset(records), P: frozenset(partials)}, generation, settled)


def installed(ledger: Ledger, topic: str, partition: int, checkpoint: int, membership: Membership) -> Claim:
    epoch = ledger.begin_restore(topic, partition)
    claim = ledger.install(topic, partition, epoch, Stage(checkpoint), membership)
    assert claim is not None
    ledger.end_restore(topic, partition, epoch)
    return claim


def msgs(partition: int, offsets, generation=7) -> list[Fetched]:
    return [Fetched(partition, o, f"v{o}".encode(), generation) for o in offsets]


def test_contiguous_delivery_after_the_checkpoint_is_applied_in_offset_order():
    ledger, m = Ledger((R, P)), owning()
    claim = installed(ledger, R, 0, 9, m)
    delivered = ledger.delivered(R, msgs(0, [12, 10, 11]), m)
    assert delivered.stale == 0
    assert delivered.actions == [Apply(claim, [(10, b"v10"), (11, b"v11"), (12, b"v12")])]


def test_duplicate_redelivery_at_or_below_the_checkpoint_is_dropped():
    ledger, m = Ledger((R, P)), owning()
    claim = installed(ledger, R, 0, 9, m)
    assert ledger.delivered(R, msgs(0, [5, 8, 9]), m).actions == []  # all redelivered: nothing to do
    # a redelivery overlapping the checkpoint keeps only what follows it
    assert ledger.delivered(R, msgs(0, [8, 9, 10, 11]), m).actions == [Apply(claim, [(10, b"v10"), (11, b"v11")])]
    # a tail's fetch: the same rule
    assert ledger.follow(claim, [(8, b"v8"), (9, b"v9")]) is None
    assert ledger.follow(claim, [(9, b"v9"), (10, b"v10")]) == Apply(claim, [(10, b"v10")])


def test_a_skipped_offset_is_a_direct_read_of_the_gap_up_to_the_last_delivered():
    ledger, m = Ledger((R, P)), owning()
    claim = installed(ledger, R, 1, 9, m)
    # the consumer resumed past the checkpoint: 10..11 never delivered
    assert ledger.delivered(R, msgs(1, [12, 13]), m).actions == [ReadGap(claim, 10, 14)]
    # a hole inside a delivery is a gap too
    assert ledger.delivered(R, msgs(1, [10, 11, 13]), m).actions == [ReadGap(claim, 10, 14)]
    # the gap's read is a catch-up of exactly [10, 14)
    catch_up = ledger.catch_up(claim, 14, chunk=2000)
    assert catch_up.next_range() == ReadRange(10, 14, 2000)
    claim.state.process([(o, b"") for o in range(10, 14)])
    catch_up.read(4, 14)
    assert catch_up.next_range() is None
    # a tail seeks back instead
    assert ledger.follow(claim, [(20, b"v20")]) == Seek(14)


def test_messages_fetched_in_an_older_generation_or_of_an_unassigned_partition_are_stale():
    ledger, m = Ledger((R, P)), owning(records=(0,), generation=8)
    claim = installed(ledger, R, 0, -1, m)
    fetched = msgs(0, [0, 1], generation=7) + msgs(0, [0, 1, 2], generation=8) + msgs(3, [0], generation=8)
    delivered = ledger.delivered(R, fetched, m)
    assert delivered.stale == 3  # two of generation 7, one of partition 3 (not ours)
    assert delivered.actions == [Apply(claim, [(0, b"v0"), (1, b"v1"), (2, b"v2")])]
    # a message without a generation counts as current
    assert ledger.delivered(R, msgs(0, [0], generation=None), m).actions == [Apply(claim, [(0, b"v0")])]


def test_rebalance_mid_chunk_nothing_more_is_applied_under_the_old_claim():
    ledger, m = Ledger((R, P)), owning(records=(0, 1))
    a, b = installed(ledger, R, 0, -1, m), installed(ledger, R, 1, -1, m)
    delivered = ledger.delivered(R, msgs(0, [0, 1]) + msgs(1, [0, 1]), m)
    assert delivered.actions == [Apply(a, [(0, b"v0"), (1, b"v1")]), Apply(b, [(0, b"v0"), (1, b"v1")])]
    # partition 0's chunk was applied; while it awaited, a rebalance revoked everything
    a.state.process([(0, b""), (1, b"")])
    ledger.revoke([(R, 0), (R, 1)])
    after = owning(records=(1,), generation=8)
    assert not ledger.holds(a, after) and not ledger.holds(b, after)  # the driver skips partition 1's Apply
    # and a catch-up under the old claim is stopped too
    catch_up = ledger.catch_up(b, None, chunk=2)
    assert catch_up.next_range() == ReadRange(0, None, 2)
    assert not ledger.holds(b, after)
    # the old generation's remaining fetch is stale; the partition kept must be restored first
    assert ledger.delivered(R, msgs(1, [2, 3], generation=7), after).stale == 2
    assert ledger.delivered(R, msgs(1, [2, 3], generation=8), after).actions == [Restore(R, 1)]


def test_a_revoked_partition_has_nothing_applied_after_the_revocation():
    ledger, m = Ledger((R, P)), owning(records=(0,), partials=(0,))
    claim = installed(ledger, R, 0, 4, m)
    ledger.revoke([(R, 0)])
    assert ledger.states[R] == {} and ledger.epoch == 1
    revoked = owning(records=(), partials=(0,))
    assert not ledger.holds(claim, revoked)
    assert ledger.claim(R, 0, revoked) is None
    assert ledger.delivered(R, msgs(0, [5, 6]), revoked).stale == 2
    assert ledger.delivered(R, msgs(0, [5, 6]), revoked).actions == []
    assert ledger.followed(R, revoked) == {}
    assert ledger.idle(revoked, now=100.0, idle_s=1.0) == []
    assert ledger.commit_offsets(R, revoked) == {}
    # even if assigned again, the old claim never holds (a new epoch, a new state)
    again = owning(records=(0,))
    assert not ledger.holds(claim, again)
    assert ledger.to_restore(R, again) == [0]


def test_a_restore_that_outlived_its_epoch_is_not_installed():
    ledger, m = Ledger((R, P)), owning(records=(0,))
    epoch = ledger.begin_restore(R, 0)
    ledger.revoke([(R, 2)])  # any revocation: a rebalance happened meanwhile
    assert ledger.install(R, 0, epoch, Stage(3), m) is None
    assert ledger.states[R] == {}
    # nor one for a partition no longer assigned
    epoch = ledger.begin_restore(R, 0)
    assert ledger.install(R, 0, epoch, Stage(3), owning(records=())) is None


def test_restore_then_catch_up_reads_from_the_checkpoint_to_the_log_end_a_chunk_at_a_time():
    ledger, m = Ledger((R, P)), owning(records=(0,), partials=(0,))
    assert ledger.to_restore(R, m) == [0] and ledger.to_restore(P, m) == [0]
    epoch = ledger.begin_restore(R, 0)
    state = Stage(41)  # restored from the changelog: checkpoint 41
    claim = ledger.install(R, 0, epoch, state, m)
    assert claim == Claim(R, 0, epoch, state)
    assert ledger.to_restore(R, m) == []
    assert ledger.followed(R, m) == {}  # the tail waits while the restore catches up
    catch_up = ledger.catch_up(claim, None, chunk=3)
    assert catch_up.next_range() == ReadRange(42, None, 3)
    state.process([(42, b""), (43, b""), (44, b"")])
    catch_up.read(3, 45)  # a full chunk: more may follow
    assert catch_up.next_range() == ReadRange(45, None, 3)
    state.process([(45, b"")])
    catch_up.read(1, 46)  # a short read: the log end (46) was reached
    assert catch_up.end == 46 and catch_up.next_range() is None
    ledger.end_restore(R, 0, epoch)
    assert ledger.followed(R, m) == {0: state}
    assert ledger.commit_offsets(R, m) == {0: 46}


def test_batch_timers_wait_until_the_restore_has_caught_up():
    """A worker down past a batch's timeout left its input unread: the restored batch
    must not time out (or pass grace) before the catch-up has read that input."""
    ledger, m = Ledger((R, P)), owning(records=(0, 1), partials=(0,))
    epoch = ledger.begin_restore(R, 0)
    assert not ledger.timers_run(R, 0) and ledger.timers_run(R, 1) and ledger.timers_run(P, 0)
    ledger.install(R, 0, epoch, Stage(5), m)
    assert not ledger.timers_run(R, 0)  # installed, still catching up
    ledger.end_restore(R, 0, epoch)
    assert ledger.timers_run(R, 0)
    epoch = ledger.begin_restore(P, 0)
    ledger.revoke([(P, 0)])  # a revocation ends the restore: nothing of it is held any more
    assert ledger.timers_run(P, 0)


def test_an_empty_catch_up_and_a_stale_restore_ending_change_nothing():
    ledger, m = Ledger((R, P)), owning(records=(0,))
    claim = installed(ledger, R, 0, 9, m)
    catch_up = CatchUp(claim, None, 2000)
    assert catch_up.next_range() == ReadRange(10, None, 2000)
    catch_up.read(0, 10)
    assert catch_up.next_range() is None
    assert ledger.catch_up(claim, 10, 2000).next_range() is None  # already at the end
    # a restore of an older epoch ending late does not unblock a newer one
    old = ledger.begin_restore(R, 0)
    ledger.revoke([(R, 0)])
    new = ledger.begin_restore(R, 0)
    ledger.end_restore(R, 0, old)
    assert ledger.restoring == {(R, 0): new}


def test_idle_catch_up_triggers_only_for_a_partition_idle_and_behind_its_log_end():
    ledger, m = Ledger((R, P)), owning(records=(0, 1), partials=(0,))
    r0, r1, p0 = installed(ledger, R, 0, 9, m), installed(ledger, R, 1, 4, m), installed(ledger, P, 0, 2, m)
    ledger.progressed(R, 0, 100.0)  # just applied something
    ledger.progressed(R, 1, 98.0)
    ledger.progressed(P, 0, 100.5)
    assert ledger.idle(m, now=100.2, idle_s=1.0) == [r1]
    assert ledger.idle(m, now=101.0, idle_s=1.0) == [r0, r1]
    assert ledger.idle(m, now=101.5, idle_s=1.0) == [r0, r1, p0]
    assert ledger.idle(owning(settled=False), now=200.0, idle_s=1.0) == []  # never during a rebalance
    # behind its log end: read up to it; caught up: counts as progress, not asked again for idle_s
    assert ledger.idle_read(r1, log_end=8, now=101.5) == 8
    assert ledger.idle_read(r0, log_end=10, now=101.5) is None
    assert ledger.idle(m, now=102.0, idle_s=1.0) == [r1, p0]


def test_the_tails_follow_only_settled_owned_restored_partitions():
    ledger, m = Ledger((R, P)), owning(records=(0, 1, 2))
    r0 = installed(ledger, R, 0, 0, m)
    ledger.begin_restore(R, 1)
    ledger.install(R, 1, ledger.epoch, Stage(5), m)  # still catching up
    assert ledger.followed(R, m) == {0: r0.state}
    assert ledger.followed(R, m, during_catch_up=True) == {0: r0.state, 1: ledger.states[R][1]}  # the partials tail
    assert ledger.followed(R, owning(records=(0, 1, 2), settled=False)) == {}
    assert ledger.followed(P, m) == {}


def test_the_direct_reader_serves_changelog_reads_before_input_reads_and_survives_cancellation():
    import asyncio

    from specmeter.streams._reader import CHANGELOG, INPUT, _Turns

    async def run() -> list[str]:
        turns, order = _Turns(), []

        async def read(name: str, priority: int, hold: float = 0.01) -> None:
            async with turns.turn(priority):
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.create_task(read("catch-up 1", INPUT))
        await asyncio.sleep(0)  # it holds the turn
        waiting = [
            asyncio.create_task(read(n, p))
            for n, p in (
                ("catch-up 2", INPUT),
                ("gone", CHANGELOG),
                ("changelog a", CHANGELOG),
                ("changelog b", CHANGELOG),
            )
        ]
        await asyncio.sleep(0)
        waiting[1].cancel()  # a restore cancelled by a revocation while waiting
        await asyncio.gather(first, *waiting, return_exceptions=True)
        async with turns.turn(INPUT):  # free again
            order.append("after")
        return order

    assert asyncio.run(run()) == ["catch-up 1", "changelog a", "changelog b", "catch-up 2", "after"]


def test_a_restore_decided_before_an_await_starts_no_second_restore():
    """The fresh-clone CI failure: a hand-over decided ``Restore`` for a partition while its
    restore was still reading; carried out after that restore had installed and caught up,
    it restored again from a changelog lacking the first state's writes still on their way,
    applied the input twice (dead letters twice) and left two sets of deltas behind."""
    ledger, m = Ledger((R, P)), owning(records=(0, 1))
    epoch = ledger.begin_restore(R, 1)
    assert epoch is not None
    assert ledger.begin_restore(R, 1) is None  # under way in this epoch
    (decision,) = ledger.delivered(R, msgs(1, [0, 1]), m).actions
    assert decision == Restore(R, 1)
    ledger.install(R, 1, epoch, Stage(1), m)
    ledger.end_restore(R, 1, epoch)
    assert ledger.begin_restore(R, 1) is None  # the decision is stale: restored already
    # a failed restore (nothing installed) may be tried again, as may one after a revocation
    failed = ledger.begin_restore(R, 0)
    assert failed is not None
    ledger.end_restore(R, 0, failed)
    assert ledger.begin_restore(R, 0) is not None
    ledger.revoke([(R, 1)])
    assert ledger.begin_restore(R, 1) is not None


class FakeIO:
    """The driver's I/O without a broker: an input log per partition, empty changelogs, and
    a stage that records what it applied. ``hold_gap_reads``: gap reads (of partition 0, with
    an end) wait for it; ``failures``: how many catch-up reads fail first."""

    def __init__(self, log: dict[int, list[int]], *, failures: int = 0) -> None:
        import asyncio

        self.log = log
        self.hold_gap_reads = asyncio.Event()
        self.hold_gap_reads.set()
        self.failures = failures
        self.builds = dict.fromkeys(log, 0)
        self.applied: dict[int, list[int]] = {p: [] for p in log}

    def driver(self):
        from types import SimpleNamespace

        from specmeter.streams._reader import DeliveryDriver

        assignment = [SimpleNamespace(topic=R, partition=p) for p in self.log]
        app = SimpleNamespace(
            consumer=SimpleNamespace(assignment=lambda: assignment), consumer_generation_id=7, rebalancing=False
        )
        settings = SimpleNamespace(
            topics=SimpleNamespace(records=R, partials=P),
            broker="unused:9092",
            security=SimpleNamespace(aiokafka_kwargs=dict),
            chunk_messages=1000,
        )

        async def run_stage(topic, state, partition, messages):
            state.process(messages)
            self.applied[partition].extend(o for o, _ in messages)

        def build(topic, partition, entries):
            self.builds[partition] += 1
            return Stage(-1), lambda: None

        async def reached(*args):
            pass

        driver = DeliveryDriver(
            app,
            settings,
            run=run_stage,
            build=build,
            changelog_of=lambda t: f"{t}-changelog",
            crash_points=SimpleNamespace(reached=reached),
        )
        driver._reader_for = lambda topic, partition: self  # type: ignore[method-assign]
        return driver

    async def read_changelog(self, topic, partition, **kwargs):
        import asyncio

        await asyncio.sleep(0.01)
        return []

    async def read_range(self, topic, partition, start, end=None, *, max_messages=None, **kwargs):
        if partition == 0 and end is not None:
            await self.hold_gap_reads.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the broker went away")
        stop = len(self.log[partition]) if end is None else end
        offsets = [o for o in self.log[partition] if start <= o < stop][:max_messages]
        return [(o, b"") for o in offsets], (offsets[-1] + 1 if offsets else start)

    async def close(self):
        pass


def test_the_driver_restores_a_partition_once_when_a_hand_over_waits_behind_a_gap_read():
    """Driver and ledger together, the I/O faked: a hand-over holds a gap read of
    partition 0 (slow) and a ``Restore`` of partition 1, whose restore (started by the
    tick) completes during the gap read. Partition 1 is built and its input applied once."""
    import asyncio
    from types import SimpleNamespace

    io = FakeIO({0: list(range(6)), 1: list(range(4))})

    async def run() -> None:
        driver = io.driver()
        io.hold_gap_reads.clear()
        # partition 0 is restored with its checkpoint at 2; partition 1's restore is under way
        epoch = driver.ledger.begin_restore(R, 0)
        driver.ledger.install(R, 0, epoch, Stage(2), driver.membership())
        driver.ledger.end_restore(R, 0, epoch)
        driver.ensure_restore(R, 1)
        # Faust hands over offset 5 of partition 0 (3 and 4 skipped) and 0..3 of partition 1
        events = [
            SimpleNamespace(message=SimpleNamespace(partition=p, offset=o, generation_id=7), value=b"")
            for p, o in [(0, 5), (1, 0), (1, 1), (1, 2), (1, 3)]
        ]
        delivered = asyncio.create_task(driver.on_delivered(R, events))
        await asyncio.sleep(0.05)  # partition 1's restore installs and catches up meanwhile
        assert io.builds[1] == 1 and io.applied[1] == [0, 1, 2, 3]
        io.hold_gap_reads.set()
        await delivered
        for task in list(driver._restoring.values()):
            await task

    asyncio.run(run())
    assert io.builds == {0: 0, 1: 1}
    assert io.applied == {0: [3, 4, 5], 1: [0, 1, 2, 3]}


def test_a_catch_up_that_fails_is_retried_and_holds_the_timers_until_it_is_caught_up():
    """A worker down for a while restarts; its catch-up read fails (the broker went away).
    Until the input that arrived meanwhile is read, the batch timers must not run: the
    catch-up is retried, not left to the idle watchdog while the timers run."""
    import asyncio

    io = FakeIO({0: list(range(5))}, failures=2)

    async def run() -> list[bool]:
        driver = io.driver()
        driver.RETRY_S = 0.01
        driver.ensure_restore(R, 0)
        held = []
        for _ in range(20):
            await asyncio.sleep(0.01)
            held.append(driver.ledger.timers_run(R, 0))
        for task in list(driver._restoring.values()):
            await task
        return held

    held = asyncio.run(run())
    assert io.applied == {0: [0, 1, 2, 3, 4]}
    assert held[0] is False and held[-1] is True  # held while failing, released once caught up
    assert held == sorted(held)
