"""Which input offsets a stage applies: the delivery rules Faust is not trusted for.

Sans-IO: no asyncio, no Kafka, no Faust. The driver (``_reader``) reads what
Faust's group membership says into a ``Membership``, hands fetched messages
to the ``Ledger`` and carries out the small decisions it returns (apply these,
read that range directly, seek there, restore this partition).

The rules, per (topic, partition):

* the checkpoint is the last offset the stage state applied; it is the state's
  own (restored from and written to its changelog with it), the ledger reads
  it and never keeps a copy that could drift;
* only the offsets that follow the checkpoint are applied, in order; those at
  or below it are redeliveries and are dropped;
* a message fetched in an older consumer generation, or of a partition not
  assigned now, is dropped: its owner reads it again from its checkpoint;
* when a consumer resumed past the checkpoint (a gap), the missing range is
  read directly (Faust's delivery) or the consumer seeks back (a tail);
* every revocation bumps the epoch: work begun before it (a ``Claim``) no
  longer holds, and nothing more is applied for it;
* a partition that is assigned but has no state is restored from its
  changelog, then caught up from its checkpoint to the log end;
* a partition that made no progress for a while is compared with its log end
  and, if behind, caught up by a direct read (Faust can stall after a
  rebalance).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

__all__ = [
    "Apply",
    "CatchUp",
    "Checkpointed",
    "Claim",
    "Delivered",
    "Fetched",
    "Ledger",
    "Membership",
    "ReadGap",
    "ReadRange",
    "Restore",
    "Seek",
]


class Checkpointed(Protocol):
    """A stage's state of one partition (``PartitionProcessor``, ``BatchMerger``)."""

    checkpoint: int  # the last offset applied (-1: none)


@dataclass(frozen=True, slots=True)
class Membership:
    """What Faust's group membership says now, read afresh by the driver before a decision."""

    #: topic -> the partitions of it assigned to this worker now
    assigned: Mapping[str, frozenset[int]]
    #: Faust's consumer generation now (None: unknown, every fetch counts as current)
    generation: int | None = None
    #: a consumer exists and no rebalance is under way (the tails follow only then)
    settled: bool = True

    def owns(self, topic: str, partition: int) -> bool:
        return partition in self.assigned.get(topic, frozenset())


@dataclass(frozen=True, slots=True)
class Claim:
    """A partition's state as it was when work on it began: that work may carry on
    (after an await) only while the ledger still ``holds`` the claim."""

    topic: str
    partition: int
    epoch: int
    state: Any


@dataclass(frozen=True, slots=True)
class Fetched:
    """One message delivered by Faust's consumer, with the generation it was fetched in."""

    partition: int
    offset: int
    value: Any
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply these (offset, value) messages, in order: they follow the checkpoint."""

    claim: Claim
    messages: list[tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class ReadGap:
    """The consumer skipped offsets: read [start, end) directly and apply it (it holds
    everything delivered, so nothing delivered is applied besides)."""

    claim: Claim
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Seek:
    """A tail's consumer is past the checkpoint: seek it back to ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class Restore:
    """Assigned but no state yet: restore it (its catch-up reads what was delivered)."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Read at most ``max_messages`` of a partition from ``start`` up to ``end``
    (exclusive; None: the log end now)."""

    start: int
    end: int | None
    max_messages: int


@dataclass(slots=True)
class Delivered:
    """What to do with one hand-over of Faust's delivery, partition by partition."""

    actions: list[Apply | ReadGap | Restore] = field(default_factory=list)
    #: messages dropped as fetched before a rebalance (older generation, or not ours now)
    stale: int = 0


@dataclass(slots=True)
class CatchUp:
    """A direct read of [checkpoint + 1, end) of a claimed partition, ``chunk`` messages at a
    time (bounded memory). ``end`` None: up to the log end as the first short read finds it."""

    claim: Claim
    end: int | None
    chunk: int
    done: bool = False

    def next_range(self) -> ReadRange | None:
        """The next range to read, from the checkpoint as it stands now; None: finished."""
        if self.done:
            return None
        start = self.claim.state.checkpoint + 1
        if self.end is not None and start >= self.end:
            self.done = True
            return None
        return ReadRange(start, self.end, self.chunk)

    def read(self, count: int, upto: int) -> None:
        """A read returned ``count`` messages and reached ``upto`` (exclusive); call once they
        are applied. A short read means the end was reached."""
        if self.end is None and count < self.chunk:
            self.end = upto
        if count < self.chunk or (self.end is not None and self.claim.state.checkpoint + 1 >= self.end):
            self.done = True


class Ledger:
    """Per (topic, partition) of the stages' inputs: the state installed, the epoch, restores
    under way and the last progress; answers what to apply, read, seek or restore."""

    def __init__(self, topics: Iterable[str]) -> None:
        #: topic -> partition -> the stage state installed for it (restored, ours)
        self.states: dict[str, dict[int, Any]] = {topic: {} for topic in topics}
        #: bumped on every revocation: a claim taken before one no longer holds
        self.epoch = 0
        #: (topic, partition) -> the epoch of the restore (and catch-up) under way
        self.restoring: dict[tuple[str, int], int] = {}
        #: (topic, partition) -> when it last applied or was found caught up (monotonic s)
        self.last_progress: dict[tuple[str, int], float] = {}

    # -- ownership ------------------------------------------------------------------------------
    def claim(self, topic: str, partition: int, membership: Membership) -> Claim | None:
        """The partition's state to work on, if it is assigned and restored."""
        state = self.states[topic].get(partition)
        if state is None or not membership.owns(topic, partition):
            return None
        return Claim(topic, partition, self.epoch, state)

    def holds(self, claim: Claim, membership: Membership) -> bool:
        """Whether the partition is still ours as claimed: no revocation since, still
        assigned, and the same state installed (not a newer restore's)."""
        return (
            claim.epoch == self.epoch
            and membership.owns(claim.topic, claim.partition)
            and self.states[claim.topic].get(claim.partition) is claim.state
        )

    def revoke(self, topic_partitions: Iterable[tuple[str, int]]) -> None:
        """Forget revoked partitions: the next owner restores them from the changelog."""
        self.epoch += 1
        for topic, partition in topic_partitions:
            self.restoring.pop((topic, partition), None)
            if topic in self.states:
                self.states[topic].pop(partition, None)

    # -- restore --------------------------------------------------------------------------------
    def to_restore(self, topic: str, membership: Membership) -> list[int]:
        """Assigned partitions without a state, in order (an idle partition is restored too)."""
        states = self.states[topic]
        return [p for p in sorted(membership.assigned.get(topic, ())) if p not in states]

    def begin_restore(self, topic: str, partition: int) -> int | None:
        """A restore starts; returns its epoch (its token for ``install`` and ``end_restore``).
        None when the partition has its state already, or a restore of it is under way in
        this epoch: a ``Restore`` decided before an await may be stale when it is carried
        out, and a second restore would read a changelog that lacks the first one's writes
        still on their way, apply the input again and leave two sets of deltas behind."""
        if partition in self.states[topic] or self.restoring.get((topic, partition)) == self.epoch:
            return None
        self.restoring[(topic, partition)] = self.epoch
        return self.epoch

    def install(self, topic: str, partition: int, epoch: int, state: Any, membership: Membership) -> Claim | None:
        """Install a restored state, unless the partition stopped being ours meanwhile;
        returns the claim its catch-up works under."""
        if epoch != self.epoch or not membership.owns(topic, partition):
            return None
        self.states[topic][partition] = state
        return Claim(topic, partition, epoch, state)

    def end_restore(self, topic: str, partition: int, epoch: int) -> None:
        """A restore (and its catch-up) ended, however: the tails may follow the partition."""
        if self.restoring.get((topic, partition)) == epoch:
            del self.restoring[(topic, partition)]

    def timers_run(self, topic: str, partition: int) -> bool:
        """Whether the partition's batch timers (timeout, grace) may run: not while its
        restore still catches up. Until then its batches' last input times are the
        changelog's, and the input that followed them (a worker down for a while left it
        unread) would find its batch timed out, or past grace, before it is even read."""
        return (topic, partition) not in self.restoring

    def catch_up(self, claim: Claim, end: int | None, chunk: int) -> CatchUp:
        """Read [checkpoint + 1, end) directly (after a restore: ``end`` None, to the log end)."""
        return CatchUp(claim, end, chunk)

    # -- Faust's delivery -----------------------------------------------------------------------
    def delivered(self, topic: str, fetched: Iterable[Fetched], membership: Membership) -> Delivered:
        """Sort one hand-over of Faust's delivery: per partition, in offset order, apply what
        follows the checkpoint contiguously, read a gap directly, or restore first; drop what
        was fetched in an older generation or is not ours now (Faust never commits revoked
        partitions; their owner reads them again) and what is at or below the checkpoint."""
        out = Delivered()
        by_partition: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        for message in fetched:
            if not membership.owns(topic, message.partition) or (
                membership.generation is not None
                and message.generation is not None
                and message.generation != membership.generation
            ):
                out.stale += 1
                continue
            by_partition[message.partition].append((message.offset, message.value))
        for partition, messages in by_partition.items():
            messages.sort(key=lambda m: m[0])
            claim = self.claim(topic, partition, membership)
            if claim is None:
                out.actions.append(Restore(topic, partition))
                continue
            checkpoint = claim.state.checkpoint
            fresh = [m for m in messages if m[0] > checkpoint]
            if not fresh:
                continue
            if fresh[0][0] == checkpoint + 1 and all(b[0] == a[0] + 1 for a, b in pairwise(fresh)):
                out.actions.append(Apply(claim, fresh))  # the usual case: contiguous
            else:
                out.actions.append(ReadGap(claim, checkpoint + 1, fresh[-1][0] + 1))
        return out

    # -- the tails --------------------------------------------------------------------------------
    def followed(self, topic: str, membership: Membership, *, during_catch_up: bool = False) -> dict[int, Any]:
        """The partitions a tail follows: assigned and restored; none while a rebalance is under
        way. Not while their restore still catches up, unless ``during_catch_up`` (the partials
        tail: whichever path applies first wins, the other skips to the checkpoint; the records
        tail would fetch the same backlog twice)."""
        if not membership.settled:
            return {}
        return {
            p: state
            for p, state in self.states[topic].items()
            if membership.owns(topic, p) and (during_catch_up or (topic, p) not in self.restoring)
        }

    def follow(self, claim: Claim, messages: Sequence[tuple[int, Any]]) -> Apply | Seek | None:
        """A tail fetched ``messages`` (in offset order) for a claimed partition: apply those
        after the checkpoint, or seek back when the first of them is past it; None: all
        were redeliveries."""
        checkpoint = claim.state.checkpoint
        fresh = [m for m in messages if m[0] > checkpoint]
        if not fresh:
            return None
        if fresh[0][0] != checkpoint + 1:
            return Seek(checkpoint + 1)
        return Apply(claim, list(fresh))

    def commit_offsets(self, topic: str, membership: Membership) -> dict[int, int]:
        """partition -> next offset to commit for the consumer group (checkpoint + 1), for the
        owned partitions that applied something. Recovery never reads these."""
        return {
            p: state.checkpoint + 1
            for p, state in self.states[topic].items()
            if membership.owns(topic, p) and state.checkpoint >= 0
        }

    # -- idle catch-up ----------------------------------------------------------------------------
    def progressed(self, topic: str, partition: int, now: float) -> None:
        self.last_progress[(topic, partition)] = now

    def idle(self, membership: Membership, now: float, idle_s: float) -> list[Claim]:
        """Owned, restored partitions that made no progress for ``idle_s``: the driver asks
        for their log ends (``idle_read``). None while a rebalance is under way."""
        if not membership.settled:
            return []
        out = []
        for topic, states in self.states.items():
            for partition in list(states):
                claim = self.claim(topic, partition, membership)
                if claim is not None and now - self.last_progress.get((topic, partition), 0.0) >= idle_s:
                    out.append(claim)
        return out

    def idle_read(self, claim: Claim, log_end: int, now: float) -> int | None:
        """The end of the direct read an idle partition needs (its log end), or None when it
        is caught up (then it counts as progress: not asked again for ``idle_s``)."""
        if log_end - 1 <= claim.state.checkpoint:
            self.progressed(claim.topic, claim.partition, now)
            return None
        return log_end
