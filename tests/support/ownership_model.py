"""A model of the ownership protocol over schedules: sans-IO, no Kafka, no sleeping.

One records partition and its stage-1 changelog partition, a consumer group that
moves the partition between two or three workers, and a scheduler that interleaves
every step: a worker confirms its generation and appends a takeover, reads the
changelog up to it and restores, applies chunks of input and ticks its timers; its
writes land one at a time (the changelog is the only order); workers freeze and wake
at any step (a frozen worker's writes in flight still land), crash (some of their
writes in flight land afterwards), miss a rebalance until they notice it; a takeover
round is cancelled at any point while its record may still land; a write is
acknowledged without its offset (an idempotent retry of a write that had landed: the
worker's output fails and it stops); the changelog is compacted (tombstones kept or
dropped) at any point.

The pieces are the worker's own: ``OwnedWrites`` (takeovers, write groups verified in
place, fencing, held deletions) over a producer that queues, ``ChangelogView`` and
``PartitionProcessor`` (restore, chunks, ticks). Each worker runs its tasks on an event
loop of its own, advanced only when the scheduler lets it run: a frozen worker does
nothing.

After a schedule, everything still in flight lands, and a fresh worker takes the
partition over, restores and reads the rest of the input. The invariants:

* ``one content per (batch, revision)``: no two releases of a partial of one batch and
  revision differ in content;
* ``no stray fences``: a worker is fenced only by a takeover of a generation not older
  than the one it confirmed (a stale member's late record fences nobody);
* ``restore never goes back``: the fresh worker's restored checkpoint is not below the
  checkpoint of any write group whose outputs were released, and a restore never stops
  on a state without checkpoint;
* ``exact``: what it then holds equals what one worker that never stopped holds for the
  same input (each batch's generations and sums; its closing aside).
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, encode_records_message
from specmeter.streams.core.ownership import ChangelogView, StateWithoutCheckpoint, is_takeover, takeover_of
from specmeter.streams.core.stage1 import PartitionProcessor, _digest
from specmeter.streams.delivery.writes import OwnedWrites

CHANGELOG = "model-changelog"
BATCH_TIMEOUT_MS = 40
GRACE_MS = 10**9  # no batch expires within a schedule: the reference never ticks


class Violation(AssertionError):
    """An invariant broken; the message names it and the schedule's trace."""


def input_messages(rng: random.Random) -> list[tuple[int, bytes]]:
    """A records partition's messages: two or three batches from two producers, with
    generations shared between samples (dedup) and each producer's marker."""
    batches = [f"b{i}" for i in range(rng.randint(2, 3))]
    messages: list[bytes] = []
    for batch in batches:
        for producer in ("p0", "p1"):
            records = [
                GenerationRecord(
                    batch_id=batch,
                    session_id=f"s{rng.randint(0, 3)}",
                    generation_id=f"g{rng.randint(0, 2)}",
                    sample_id=f"t{k}",
                    accepted=3,
                    proposed=4,
                    verify=2,
                    completion=5,
                    producer_id=producer,
                )
                for k in range(rng.randint(1, 3))
            ]
            messages.append(encode_records_message(RecordBatch(records=records, producer_id=producer)))
    rng.shuffle(messages)
    for batch in batches:
        for producer in ("p0", "p1"):
            marker = BatchMarker(batch_id=batch, producer_id=producer, expected_producers=2)
            messages.insert(rng.randint(0, len(messages)), encode_records_message(marker))
    return list(enumerate(messages))


@dataclass
class Log:
    """One changelog partition: offsets grow; compaction keeps the latest record per key."""

    records: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)
    end: int = 0

    def append(self, key: bytes, value: bytes | None) -> int:
        offset = self.end
        self.records.append((offset, key, value))
        self.end += 1
        return offset

    def read(self, start: int, end: int) -> list[tuple[int, bytes | None, bytes | None]]:
        return [(o, k, v) for o, k, v in self.records if start <= o < end]

    def compact(self, drop_tombstones: bool) -> None:
        latest = {key: offset for offset, key, _ in self.records}
        self.records = [
            (o, k, v)
            for o, k, v in self.records
            if latest[k] == o and (v is not None or not drop_tombstones or is_takeover(k))
        ]


class QueuedProducer:
    """The worker's ordered producer, as ``OwnedWrites`` uses it: what is sent waits in a
    queue until the scheduler lands it in the log (then its acknowledgement is due)."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[bytes, bytes | None, Callable[[int], None] | None]] = collections.deque()
        self.failed: BaseException | None = None

    def send(self, topic: str, key: bytes, value: bytes | None, partition: int | None = None, on_ack=None) -> None:
        if self.failed is None:
            self.queue.append((key, value, on_ack))

    def fail(self, topic: str, exc: BaseException) -> None:
        """What ``OwnedWrites`` calls when completing a write group failed: the worker
        stops. In the model that is a failure of the schedule (a ``Violation`` raised in a
        worker's task, an error of the worker's code): never swallowed."""
        if self.failed is None:
            self.failed = exc


class Worker:
    """One incarnation of a worker: its loop, producer, writes and stage state."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.producer = QueuedProducer()
        self.writes = OwnedWrites(self.producer, self._read_range, self._fenced, owner=name)  # type: ignore[arg-type]
        self.generation = -1  # the group generation it is in
        self.frozen = False
        self.round: asyncio.Task | None = None
        self.epoch: int | None = None
        self.processor: PartitionProcessor | None = None
        self.confirmed_generation = -1

    async def _read_range(self, topic: str, partition: int, start: int, end: int) -> list:
        return self.world.log.read(start, end)

    def _fenced(self, topic: str, partition: int) -> None:
        """Fenced: only a takeover of a generation not older than its own may do that."""
        self.world.say(f"{self.name} fenced")
        if self.epoch is not None:
            newer = [
                t
                for o, k, v in self.world.log.read(self.epoch + 1, self.world.log.end)
                if v is not None and is_takeover(k) and (t := takeover_of(v)) is not None
                if t.generation >= self.confirmed_generation
            ]
            if not newer:
                raise self.world.violation(
                    f"a stray takeover fenced {self.name}, the owner of generation {self.confirmed_generation}"
                )
        self.processor = None
        self.epoch = None

    def run(self) -> None:
        """Let its tasks go on (acknowledgements, checks, releases)."""

        async def turns() -> None:
            for _ in range(4):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())
        self.raise_failure()

    def raise_failure(self) -> None:
        """A failure inside one of its tasks (a check that raised there) fails the schedule."""
        failed = self.producer.failed
        if isinstance(failed, Violation):
            raise failed
        if failed is not None:
            raise self.world.violation(f"{self.name}: completing a write group failed: {failed!r}") from failed

    def close(self, *, check: bool = True) -> None:
        """Cancel what the worker had under way (and what that spawned), then close its loop
        (``check``: and fail the schedule if one of its tasks failed meanwhile)."""
        for _ in range(10):
            self.loop.run_until_complete(asyncio.sleep(0))  # the callbacks due (acknowledgements)
            tasks = asyncio.all_tasks(self.loop)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()
        if check:
            self.raise_failure()  # a check that failed in a task it ran meanwhile

    # -- the driver's steps --------------------------------------------------------------
    def confirm_and_take_over(self) -> None:
        """Confirm the generation (the group assigns it the partition now), then hand the
        takeover record over: it goes out when the worker next runs."""
        group = self.world
        if group.assignee != self.name or self.generation != group.generation or self.round or self.processor:
            return
        self.world.say(f"{self.name} confirms gen {self.generation}, takes over")
        self.epoch = None
        self.confirmed_generation = self.generation
        self.round = self.loop.create_task(self.writes.take_over(CHANGELOG, 0, self.generation, self.world.clock_ms))

    def restore(self) -> None:
        """The takeover acknowledged: read the changelog up to it, restore, install."""
        if self.round is None or not self.round.done() or self.round.cancelled():
            return
        epoch = self.round.result()
        self.round = None
        owned = self.writes.ownership(CHANGELOG, 0)
        end = owned.next_offset if owned is not None else epoch + 1  # past its confirmation, as the driver reads
        view = ChangelogView()
        for offset, key, value in self.world.log.read(0, end):
            view.add(offset, key, value)
        valid = view.result()
        if valid.epoch != epoch:
            self.world.say(f"{self.name} takeover at {epoch} does not count")
            self.writes.forget(CHANGELOG, 0)
            return
        processor = self.world.new_processor(epoch)
        try:
            effects = processor.restore(valid.entries, self.world.clock_ms)
        except StateWithoutCheckpoint as exc:
            # a stale reader may see a newer owner's deletions without the writes behind its
            # takeover that justify them: the driver confirms its generation again, and a
            # stale one gives up quietly; a current one must never get here
            if self.generation == self.world.generation and self.world.assignee == self.name:
                raise self.world.violation(f"restore stopped: {exc}") from exc
            self.world.say(f"{self.name} (stale) finds no checkpoint, gives up")
            self.writes.forget(CHANGELOG, 0)
            return
        effects.changelog.extend((key, None) for key in valid.deletions)
        self.world.say(f"{self.name} restored at epoch {epoch}, checkpoint {processor.checkpoint}")
        self.epoch, self.processor = epoch, processor
        self.submit(effects, restore=True)

    def process(self, rng: random.Random) -> None:
        processor = self.processor
        if processor is None:
            return
        chunk = [m for m in self.world.input if m[0] > processor.checkpoint][: rng.randint(1, 3)]
        if chunk:
            self.submit(processor.process(chunk, self.world.clock_ms))

    def tick(self) -> None:
        if self.processor is not None:
            self.submit(self.processor.tick(self.world.clock_ms))

    def submit(self, effects: Any, *, restore: bool = False) -> None:
        processor = self.processor
        assert processor is not None
        # what a released group claims: the checkpoint its writes (and those verified before
        # them, in order) made durable; a group without writes completes at once and claims none
        checkpoint = processor.checkpoint if effects.changelog else -1
        name = self.name

        async def release() -> None:
            self.world.released(name, checkpoint, effects.partials)

        async def submit() -> None:  # on the worker's own loop, as the worker submits
            self.writes.submit(CHANGELOG, 0, effects.changelog, release, effects.verified_deletions, barrier=restore)

        self.loop.run_until_complete(submit())
        self.raise_failure()

    def notice(self) -> None:
        """It learns of the rebalance it missed: its round is cancelled (its record may
        still land) and what it held is given up."""
        if self.generation == self.world.generation:
            return
        self.world.say(f"{self.name} notices gen {self.world.generation}")
        if self.round is not None:
            self.round.cancel()
            self.round = None
        self.writes.forget(CHANGELOG, 0)
        self.processor, self.epoch = None, None
        self.generation = self.world.generation


class World:
    """The scheduler's world: the log, the input, the group and the workers."""

    def __init__(self, seed: int, *, workers: int = 3) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = Log()
        self.input = input_messages(self.rng)
        self.clock_ms = 1_000
        self.generation = 0
        self.assignee: str | None = None
        self.trace: list[str] = []
        self.workers = {f"w{i}": Worker(self, f"w{i}") for i in range(workers)}
        #: writes handed over by crashed workers that may still land
        self.orphans: collections.deque = collections.deque()
        #: (batch, revision) -> content digest of every partial released
        self.published: dict[tuple[str | None, str, int], bytes] = {}
        #: the highest checkpoint of a write group whose outputs were released
        self.released_checkpoint = -1

    def say(self, line: str) -> None:
        self.trace.append(line)

    def violation(self, what: str) -> Violation:
        return Violation(f"seed {self.seed}: {what}\n  " + "\n  ".join(self.trace[-60:]))

    def new_processor(self, epoch: int | None) -> PartitionProcessor:
        return PartitionProcessor(
            0, source_topic="records", batch_timeout_ms=BATCH_TIMEOUT_MS, grace_ms=GRACE_MS, owner_epoch=epoch
        )

    def released(self, name: str, checkpoint: int, partials: list) -> None:
        self.released_checkpoint = max(self.released_checkpoint, checkpoint)
        for partial in partials:
            key = (partial.run_id, partial.batch_id, partial.revision)
            digest = _digest(partial)
            if self.published.setdefault(key, digest) != digest:
                raise self.violation(f"{name} released {key} with another content")
            self.say(f"{name} released {partial.batch_id} r{partial.revision} {partial.close_reason}")

    # -- steps -----------------------------------------------------------------------------
    def rebalance(self) -> None:
        live = sorted(self.workers)
        self.generation += 1
        # sticky, mostly: the partition stays where it was unless its worker is frozen
        keep = self.assignee in self.workers and not self.workers[self.assignee].frozen and self.rng.random() < 0.3
        self.assignee = self.assignee if keep else self.rng.choice(live)
        self.say(f"rebalance: gen {self.generation} -> {self.assignee}")
        for worker in self.workers.values():
            if not worker.frozen:
                worker.notice()

    def land(self, worker: Worker, *, unacknowledged: bool = False) -> None:
        """The first write the worker handed over lands; ``unacknowledged``: its
        acknowledgement comes without an offset (aiokafka's duplicate-sequence path, the
        idempotent producer's retry of a write that had landed): the output fails, and
        the worker stops."""
        if not worker.producer.queue:
            return
        key, value, on_ack = worker.producer.queue.popleft()
        offset = self.log.append(key, value)
        self.say(f"  {worker.name}'s write lands at {offset}: {key!r}{'' if value is not None else ' (deletion)'}")
        if unacknowledged:
            self.say(f"{worker.name}'s write at {offset} is acknowledged without its offset")
            self.crash(worker)
        elif on_ack is not None:
            worker.loop.call_soon(on_ack, offset)

    def land_orphan(self) -> None:
        if self.orphans:
            key, value = self.orphans.popleft()
            self.say(f"a crashed worker's write lands at {self.log.append(key, value)}")

    def crash(self, worker: Worker) -> None:
        """The worker dies; a prefix of its writes in flight still lands later."""
        queued = list(worker.producer.queue)
        self.orphans.extend((k, v) for k, v, _ in queued[: self.rng.randint(0, len(queued))])
        worker.close()
        self.say(f"{worker.name} crashes")
        self.workers[worker.name] = Worker(self, worker.name)
        self.rebalance()  # its session ends: the group moves on

    def step(self) -> None:
        rng = self.rng
        self.clock_ms += rng.randint(0, 20)
        worker = self.workers[rng.choice(sorted(self.workers))]
        roll = rng.random()
        if roll < 0.03:
            self.rebalance()
        elif roll < 0.07:
            worker.frozen = not worker.frozen
            self.say(f"{worker.name} {'freezes' if worker.frozen else 'wakes'}")
        elif roll < 0.075:
            self.crash(worker)
        elif roll < 0.10:
            drop = rng.random() < 0.5
            self.log.compact(drop)
            self.say(f"compaction{' (tombstones dropped)' if drop else ''}")
        elif roll < 0.12:
            self.land_orphan()
        elif roll < 0.45:
            self.land(worker, unacknowledged=rng.random() < 0.01)
        elif not worker.frozen:
            self._act(worker, rng.random())

    def _act(self, worker: Worker, roll: float) -> None:
        """The worker runs, then takes its next step (now and then an untimely one)."""
        worker.run()
        if roll < 0.1:
            self.rng.choice((worker.notice, worker.confirm_and_take_over, worker.restore, worker.tick))()
        elif worker.generation != self.generation and roll < 0.4:
            worker.notice()
        elif worker.round is not None:
            worker.restore()
        elif worker.processor is None:
            worker.confirm_and_take_over()
        elif roll < 0.85:
            worker.process(self.rng)
        else:
            worker.tick()
        worker.run()

    # -- the end -----------------------------------------------------------------------------
    def settle(self) -> None:
        """Everything in flight lands (in some interleaving) and every worker runs."""
        for worker in self.workers.values():
            worker.frozen = False
        while self.orphans or any(w.producer.queue for w in self.workers.values()):
            busy = [w for w in self.workers.values() if w.producer.queue]
            if self.orphans and (not busy or self.rng.random() < 0.3):
                self.land_orphan()
            else:
                worker = self.rng.choice(busy)
                self.land(worker)
                worker.run()
        for worker in self.workers.values():
            worker.run()

    def check(self) -> None:
        """A fresh worker takes over at a newer generation and reads the rest of the input:
        the invariants of the module docstring."""
        self.settle()
        fresh = Worker(self, "fresh")
        self.workers["fresh"] = fresh
        self.generation += 1
        self.assignee, fresh.generation = "fresh", self.generation
        self.clock_ms += 10 * CLOCK_STEP_MS
        fresh.confirm_and_take_over()
        while fresh.round is not None and not fresh.round.done():
            fresh.run()
            self.land(fresh)
        fresh.restore()
        processor = fresh.processor
        if processor is None:
            raise self.violation("the fresh worker's takeover did not count")
        if processor.checkpoint < self.released_checkpoint:
            raise self.violation(
                f"restored checkpoint {processor.checkpoint} is below {self.released_checkpoint}, released"
            )
        rest = [m for m in self.input if m[0] > processor.checkpoint]
        processor.process(rest, self.clock_ms)
        self._same_as_reference(processor)
        for worker in self.workers.values():
            worker.close()

    def _same_as_reference(self, processor: PartitionProcessor) -> None:
        reference = self.new_processor(None)
        reference.process(self.input, 0)
        got, want = _contents(processor), _contents(reference)
        if got != want:
            raise self.violation(f"state differs from one worker that never stopped:\n  {got}\n  {want}")


CLOCK_STEP_MS = 20


def _contents(processor: PartitionProcessor) -> dict[tuple[str | None, str], tuple[bool, bytes]]:
    """Each batch's generations and sums (its closing aside: when it closed, and so how
    many of its records came late), and whether it is closed."""
    out = {}
    for key, batch in processor.batches.items():
        partial = batch.state.partial(partition=0, revision=0, close_reason="markers", closed_at_ms=0)
        out[key] = (batch.closed, _digest(msgspec.structs.replace(partial, late_record_count=0)))
    return out


def run_schedule(seed: int, *, steps: int = 80, workers: int = 3) -> World:
    """One schedule of ``steps`` scheduler steps; raises ``Violation`` when an invariant breaks."""
    world = World(seed, workers=workers)
    world.rebalance()
    try:
        for _ in range(steps):
            world.step()
        world.check()
    finally:
        for worker in world.workers.values():
            if not worker.loop.is_closed():
                worker.close(check=False)
    return world
