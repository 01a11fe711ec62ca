"""The delivery rules: which input a stage applies, and when a partition is ready.

Sans-IO: no asyncio, no Kafka. Each stage has one route for its input (``routes``):
the route's consumer is a member of the stage's consumer group, which says which
partitions are this worker's; a partition's state is taken over and restored from its
changelog (``core.ownership``); then the route reads the partition from the state's
checkpoint on. Restore and catch-up are states of that one route, never rival readers:

    assigned ──► taking over, restoring ──install──► catching up ──log end reached──► following
        ▲                                                                               │
        └──── assigned again: kept when nobody wrote its changelog meanwhile ◄── revoked (suspended)
              fenced (another owner's takeover in its changelog): dropped, taken over again if still assigned

The rules, per (topic, partition):

* the checkpoint is the last offset the stage state applied; it is the state's own
  (restored from and written to its changelog with it): the ledger reads it and
  never keeps a copy that could drift;
* only offsets after the checkpoint are applied, in order; those at or below it are
  redeliveries and are dropped. A first offset past checkpoint + 1 means the log no
  longer holds the ones between (retention, compaction): it is applied, and the gap
  is counted and reported;
* each partition has its own turn, moved whenever its state is installed, suspended,
  dropped or fenced: work begun before (a ``Claim``) no longer holds, nothing more is
  applied for it (and its route reads the partition again from the checkpoint), and a
  restore begun before installs nothing. Other partitions' work goes on;
* a partition is restored once per turn: a decision taken before an await may be
  stale when it is carried out;
* a revoked partition's state is kept (suspended) until the next assignment: a
  rebalance that leaves it with this worker costs no restore, provided nobody else
  wrote its changelog in between (the driver checks; a partition that moved is
  restored from its changelog like any other);
* a partition's batch timers (timeout, grace) run only once its route has read up
  to the log end it had when its state was installed: before that, its batches'
  last input times are the changelog's, and input that waited while no worker read
  it would find its batch timed out, or past grace, before it is even read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Admitted", "Checkpointed", "Claim", "Ledger", "TopicPartition"]

#: (topic, partition)
TopicPartition = tuple[str, int]


class Checkpointed(Protocol):
    """A stage's state of one partition (``PartitionProcessor``, ``BatchMerger``)."""

    checkpoint: int  # the last offset applied (-1: none)


@dataclass(frozen=True, slots=True)
class Claim:
    """A partition's state as it was when work on it began: that work may carry on
    (after an await) only while the ledger still ``holds`` the claim."""

    topic: str
    partition: int
    turn: int
    state: Any


@dataclass(frozen=True, slots=True)
class Admitted:
    """What of a fetched run of messages follows the checkpoint, to apply in order."""

    messages: list[tuple[int, Any]]
    #: (first missing offset, first offset present) when the log skips offsets after the checkpoint
    gap: tuple[int, int] | None = None


@dataclass(slots=True)
class _Partition:
    """One assigned partition's delivery state."""

    turn: int
    state: Any = None  # installed stage state (None: not restored yet)
    restoring: bool = False  # a takeover and restore is under way in this turn
    catch_up_end: int | None = None  # installed, timers held until the route reaches this offset

    @property
    def awaits_restore(self) -> bool:
        """No state installed, and no restore under way in this turn."""
        return self.state is None and not self.restoring


def _of_topic(tp: TopicPartition, topic: str | None) -> bool:
    """Whether a partition is of ``topic`` (None: of any topic)."""
    return topic is None or tp[0] == topic


@dataclass(slots=True)
class Ledger:
    """Per (topic, partition) of the stages' inputs: assignment, restore, catch-up and
    the state installed; answers what to restore, follow, apply and commit."""

    topics: Sequence[str]
    #: offsets the log lacked after a checkpoint (retention, compaction), over the worker's life
    gaps: int = 0
    _partitions: dict[TopicPartition, _Partition] = field(default_factory=dict)
    #: states of revoked partitions, kept until the next assignment of their topic
    _suspended: dict[TopicPartition, Any] = field(default_factory=dict)
    _turns: Iterable[int] = field(default_factory=itertools.count)

    def _new(self, tp: TopicPartition) -> _Partition:
        part = self._partitions[tp] = _Partition(turn=next(self._turns))  # type: ignore[call-overload]
        return part

    # -- the assignment ---------------------------------------------------------------------
    def assign(self, topic: str, partitions: Iterable[int]) -> list[int]:
        """The group's whole assignment of ``topic`` now: partitions in it become this
        worker's, those no longer in it are revoked (suspended). Returns the partitions
        that are new to this assignment."""
        if topic not in self.topics:
            return []
        wanted = {(topic, p) for p in partitions}
        self._revoke_unwanted(topic, wanted)
        return self._add_new(topic, wanted)

    def _revoke_unwanted(self, topic: str, wanted: set[TopicPartition]) -> None:
        """The partitions of ``topic`` held and no longer wanted, revoked (suspended)."""
        self.revoke([tp for tp in self._partitions if tp[0] == topic and tp not in wanted])

    def _add_new(self, topic: str, wanted: set[TopicPartition]) -> list[int]:
        """The wanted partitions not held yet, each new in its own turn; returns them."""
        new = sorted(p for t, p in wanted if (t, p) not in self._partitions)
        for p in new:
            self._new((topic, p))
        return new

    def revoke(self, revoked: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Revoked partitions: their work stops; an installed state is kept, suspended, for
        the next assignment. Returns those suspended."""
        suspended = []
        for tp in revoked:
            part = self._partitions.pop(tp, None)
            if part is not None and part.state is not None:
                self._suspended[tp] = part.state
                suspended.append(tp)
        return suspended

    def suspended(self, topic: str) -> dict[int, Any]:
        return {p: state for (t, p), state in self._suspended.items() if t == topic}

    def take_suspended(self, topic: str, partition: int) -> Any:
        """A suspended state, taken out (None when there is none)."""
        return self._suspended.pop((topic, partition), None)

    def drop_suspended(self, topic: str) -> list[int]:
        """Forget the suspended states of ``topic`` (not assigned again); returns their partitions."""
        gone = [tp for tp in self._suspended if tp[0] == topic]
        for tp in gone:
            del self._suspended[tp]
        return [p for _, p in gone]

    def fence(self, topic: str, partition: int) -> bool:
        """Another worker took the partition over: its state is dropped (not suspended),
        work on it stops. Returns whether the partition is still assigned here (then it is
        taken over again, if the group still says so)."""
        self._suspended.pop((topic, partition), None)
        if (topic, partition) not in self._partitions:
            return False
        self._new((topic, partition))
        return True

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._partitions

    def assigned(self, topic: str) -> list[int]:
        return sorted(p for t, p in self._partitions if t == topic)

    # -- restore ----------------------------------------------------------------------------
    def to_restore(self, topic: str | None = None) -> list[TopicPartition]:
        """Assigned partitions without a state and no restore under way in their turn."""
        return sorted(tp for tp, part in self._partitions.items() if part.awaits_restore and _of_topic(tp, topic))

    def begin_restore(self, topic: str, partition: int) -> int | None:
        """A restore starts; returns its turn (its token for ``install`` and
        ``end_restore``), or None when the partition is not ours, has its state, or is
        being restored in this turn already."""
        part = self._partitions.get((topic, partition))
        if part is None or not part.awaits_restore:
            return None
        part.restoring = True
        return part.turn

    def install(self, topic: str, partition: int, turn: int, state: Checkpointed, log_end: int) -> Claim | None:
        """Install a restored (or suspended, kept) state, unless the partition stopped being
        ours since the restore began; its timers wait until the route has read up to
        ``log_end``."""
        part = self._partitions.get((topic, partition))
        if part is None or part.turn != turn or not part.restoring:
            return None
        part.turn = next(self._turns)  # type: ignore[call-overload]
        part.state, part.restoring = state, False
        part.catch_up_end = log_end if log_end > state.checkpoint + 1 else None
        return Claim(topic, partition, part.turn, state)

    def end_restore(self, topic: str, partition: int, turn: int) -> None:
        """A restore ended without installing (failed, cancelled, stale): it may be retried."""
        part = self._partitions.get((topic, partition))
        if part is not None and part.turn == turn and part.state is None:
            part.restoring = False

    # -- the route ----------------------------------------------------------------------------
    def following(self, topic: str) -> dict[int, Any]:
        """partition -> installed state, for every owned partition of ``topic`` the route reads."""
        return {p: part.state for (t, p), part in self._partitions.items() if t == topic and part.state is not None}

    def claim(self, topic: str, partition: int) -> Claim | None:
        part = self._partitions.get((topic, partition))
        if part is None or part.state is None:
            return None
        return Claim(topic, partition, part.turn, part.state)

    def holds(self, claim: Claim) -> bool:
        """Whether the partition is still ours as claimed: the same state installed, in
        the same turn (no revocation, fencing or newer restore of this partition since)."""
        part = self._partitions.get((claim.topic, claim.partition))
        return part is not None and part.turn == claim.turn and part.state is claim.state

    def admit(self, claim: Claim, messages: Sequence[tuple[int, Any]]) -> Admitted:
        """Of ``messages`` (offset order) fetched for a claimed partition, those after the
        checkpoint; a first one past checkpoint + 1 is a gap in the log, counted."""
        checkpoint = claim.state.checkpoint
        fresh = [m for m in messages if m[0] > checkpoint]
        if fresh and fresh[0][0] != checkpoint + 1:
            self.gaps += fresh[0][0] - checkpoint - 1
            return Admitted(fresh, (checkpoint + 1, fresh[0][0]))
        return Admitted(fresh)

    def reached(self, claim: Claim, position: int) -> bool:
        """The route has read the partition up to ``position`` (exclusive; at least the
        checkpoint + 1): returns True when this ends its catch-up (its timers may run)."""
        part = self._partitions.get((claim.topic, claim.partition))
        if part is None or part.state is not claim.state or part.catch_up_end is None:
            return False
        if max(position, claim.state.checkpoint + 1) >= part.catch_up_end:
            part.catch_up_end = None
            return True
        return False

    @property
    def any_catching_up(self) -> bool:
        """Whether some installed partition still catches up (a cheap test for the routes)."""
        return any(part.catch_up_end is not None for part in self._partitions.values())

    def catching_up(self, topic: str) -> dict[int, int]:
        """partition -> the log end its route must reach before the timers run."""
        return {
            p: part.catch_up_end
            for (t, p), part in self._partitions.items()
            if t == topic and part.state is not None and part.catch_up_end is not None
        }

    def timers_run(self, topic: str, partition: int) -> bool:
        """Whether the partition's batch timers may run: restored and caught up."""
        part = self._partitions.get((topic, partition))
        return part is not None and part.state is not None and part.catch_up_end is None

    def ready(self) -> bool:
        """Every assigned partition has its state installed."""
        return all(part.state is not None for part in self._partitions.values())

    def commit_offsets(self, topic: str | None = None) -> dict[TopicPartition, int]:
        """(topic, partition) -> next offset to commit for the consumer group (checkpoint
        + 1), for owned partitions that applied something. Recovery never reads these:
        they are the group's lag, for operators."""
        return {
            tp: part.state.checkpoint + 1
            for tp, part in self._partitions.items()
            if part.state is not None and part.state.checkpoint >= 0 and _of_topic(tp, topic)
        }
