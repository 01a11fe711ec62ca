"""The scheduler: the logs, the groups' coordinator, the workers and the input, driven one
random step at a time by the seed, with the trace of what it did. Here because the
invariants are judged against what the scheduler knows and a worker does not.

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

import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from specmeter.schemas import decode_dead_letter, decode_metrics
from specmeter.streams.core.layout import changelog_topics
from specmeter.streams.core.ownership import ChangelogView, is_takeover
from specmeter.streams.delivery.assignor import Member, sticky_assignment

from .changelog_records import _checkpoint_in, _may_fence, _takeover_at
from .deployment import CL, PARTITIONS, SETTINGS, R
from .fleet_input import SimInput
from .kafka import InFlight, SimLogs, _answer
from .outcomes import Stopped, Violation
from .worker import Worker


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


class Simulation:
    """The scheduler: the logs, the groups' coordinator, the workers, the input and the trace."""

    def __init__(self, seed: int, *, workers: int = 3, real: bool = False, bare: bool = False) -> None:
        self.rng = random.Random(seed)
        self.tokens = random.Random(~seed)  # takeover tokens: of the seed, apart from the schedule's draws
        #: ``bare``: checkpoint-only stages whose restore writes nothing (``FakeStages.restore_group``)
        self.seed, self.real, self.bare = seed, real, bare
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
        #: how many compactions ran; (changelog, partition) -> what counted when last read
        self.compactions = 0
        self._valid_read: dict[tuple[str, int], tuple[tuple[int, int], Any]] = {}
        for topic in (*self.changelog_of, *self.input_of, topics.metrics, topics.deadletter):
            for p in range(PARTITIONS):
                self.logs.logs.setdefault(topic, {}).setdefault(p, [])
        self.workers = [Worker(self, f"w{i}", self.rng.randint(-20_000, 20_000)) for i in range(workers)]

    def say(self, line: str) -> None:
        self.trace.append(f"{self.now:9.3f} {line}")

    def violation(self, what: str) -> Violation:
        kind = " (real stages)" if self.real else " (bare stages)" if self.bare else ""
        return Violation(f"seed {self.seed}{kind}: {what}\n  " + "\n  ".join(self.trace[-40:]))

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
        """What counts in a changelog partition now (read again only when it changed: a
        record appended or a compaction since)."""
        log = self.logs.logs[changelog][p]
        read = (len(log), self.compactions)
        cached = self._valid_read.get((changelog, p))
        if cached is not None and cached[0] == read:
            return cached[1]
        view = ChangelogView()
        for offset, key, value in log:
            view.add(offset, key, value)
        result = view.result()
        self._valid_read[(changelog, p)] = (read, result)
        return result

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
        self.compactions += 1
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
