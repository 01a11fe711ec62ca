"""An owner's writes to its changelog partitions: takeovers, and write groups whose
outputs are released only once their state is known to count.

Each call of a stage (a chunk of input, a tick, a restore) is one **write group** for
one partition: its changelog writes (deltas, checkpoint, statuses, deletions) and its
outputs (partials, dead letters, publications). The writes are handed to Kafka at once;
the outputs wait until every write of the group is acknowledged **in place**: at the
offsets that follow this owner's previous writes. Then nobody else wrote the partition
in between, so no newer owner took it over (``core.ownership``), and the state the outputs
rest on counts for every later restore. A group whose offsets skip some is checked: the
records skipped are read, and a takeover by another worker among them means this worker
was **fenced**: the outputs of that group and of every group after it are dropped and
the partition is given up (``on_fenced``). Anything else skipped (a stale owner's late
writes) is passed over.

Groups of a partition are pipelined (the next is handed over before the last is
acknowledged) and verified in order. What makes that safe: the producer is idempotent,
so a write Kafka refuses fails every later write of its partition with it (``delivery.output``);
outputs are released only once their own group is verified, so a worker that lost a
partition releases none, however many of its groups land after the takeover; and every
deletion of a group that writes (a batch gone once its ``x`` key is written, a version
superseded, a restore's) is handed over only once that group is verified, never with it:
a deletion that landed while the record that justifies it did not count would take state
the successor restored. A restore's group is a barrier: later groups wait for its
deletions (``docs/ownership.md``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.formats import FORMAT
from ..core.layout import REWRITTEN_KINDS
from ..core.ownership import (
    Confirmation,
    RewrittenKeys,
    Takeover,
    confirmation_key,
    confirmation_of,
    counts_after,
    encode_confirmation,
    encode_takeover,
    is_confirmation,
    is_takeover,
    takeover_key,
    takeover_of,
    takeover_token,
)
from .output import OrderedProducer

__all__ = ["OwnedWrites", "Ownership"]


async def _nothing() -> None:
    """The release of a group with no outputs (deletions)."""


log = logging.getLogger("specmeter.worker")

#: (topic, partition) of a changelog
ChangelogPartition = tuple[str, int]
#: reads a changelog partition's records in [start, end): [(offset, key, value)]
ReadRange = Callable[[str, int, int, int], Awaitable[list[tuple[int, bytes | None, bytes | None]]]]


@dataclass(slots=True)
class _Group:
    """One write group in flight: how many writes, the offsets acknowledged so far, what
    to release once it is verified and the deletions to hand over then."""

    expected: int
    release: Callable[[], Awaitable[None]]
    deletions: list[bytes]
    offsets: list[int] = field(default_factory=list)
    #: later groups wait until this one's deletions are handed over (a restore's)
    barrier: bool = False


@dataclass(slots=True)
class Ownership:
    """This worker's ownership of one changelog partition."""

    token: str
    #: the offset of its takeover record: the tag of every key it writes
    epoch: int
    #: where its next write must land
    next_offset: int
    #: its takeover record (whose generation a later takeover must not be older than)
    takeover: Takeover | None = None
    #: the physical keys of the keys it rewrites (None: not owned, keys as they are)
    keys: RewrittenKeys | None = None
    #: groups handed over and not verified yet, in order
    groups: collections.deque[_Group] = field(default_factory=collections.deque)
    #: groups whose writes are all acknowledged, waiting for the check of an earlier one
    acknowledged: collections.deque[_Group] = field(default_factory=collections.deque)
    checking: bool = False
    #: groups submitted behind a barrier group, not handed over yet, in order
    held_back: collections.deque[tuple[_Group, list[tuple[bytes, bytes | None]]]] = field(
        default_factory=collections.deque
    )
    #: a barrier group is in flight (its deletions not handed over yet)
    behind_barrier: bool = False
    #: set while no group is in flight
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def waiting_groups(self) -> bool:
        """Whether groups wait: handed over and not all acknowledged, acknowledged and not
        verified, or held back behind a barrier (a group under its check aside: ``checking``)."""
        return bool(self.groups or self.acknowledged or self.held_back)


class OwnedWrites:
    """Takeovers and write groups of the changelog partitions this worker owns."""

    def __init__(
        self,
        output: OrderedProducer,
        read_range: ReadRange,
        on_fenced: Callable[[str, int], None],
        *,
        owner: str | None = None,
    ) -> None:
        self.output = output
        self.read_range = read_range
        self.on_fenced = on_fenced
        #: who this worker is, in its takeover records (for operators reading a changelog)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        #: a fresh token for a takeover or a confirmation's key (a seeded one in a simulation)
        self.new_token: Callable[[], str] = takeover_token
        self._owned: dict[ChangelogPartition, Ownership] = {}
        self._tasks: set[asyncio.Task] = set()
        #: groups whose offsets skipped some, and fencings, over the worker's life (stats)
        self.gaps_checked = 0
        self.fenced = 0
        #: gaps with offsets compaction removed, each giving the partition up (stats)
        self.unreadable_gaps = 0

    # -- ownership ---------------------------------------------------------------------
    async def take_over(
        self, topic: str, partition: int, generation: int = -1, confirmed_at_ms: int = 0, member: str = ""
    ) -> int:
        """Append a takeover record to the changelog partition and wait for it, then a
        confirmation that names the offset it landed at; returns the new epoch (that
        offset). ``generation`` is the group generation this worker confirmed at
        ``confirmed_at_ms`` (wall clock, taken before the confirmation was sent) as group
        member ``member``: the record counts only if no newer generation took the partition before it
        (``core.ownership``). Whatever this worker held of the partition is forgotten. The
        changelog is to be read up to ``ownership(...).next_offset`` (the confirmation
        included): a takeover landing between the two is one this worker must see."""
        self.forget(topic, partition)
        takeover = Takeover(
            token=self.new_token(),
            owner=self.owner,
            at_ms=confirmed_at_ms or int(time.time() * 1000),
            generation=generation,
            format=FORMAT,
            member=member,
        )
        epoch = await self._append(topic, partition, takeover_key(partition, takeover.token), encode_takeover(takeover))
        confirmation = self._confirmation(takeover.token, epoch, takeover.at_ms, generation, member)
        confirmed = await self._append(
            topic, partition, confirmation_key(partition, self.new_token()), encode_confirmation(confirmation)
        )
        owned = self._owned[(topic, partition)] = Ownership(
            token=takeover.token,
            epoch=epoch,
            next_offset=confirmed + 1,
            takeover=takeover,
            keys=RewrittenKeys(partition, epoch, REWRITTEN_KINDS),
        )
        owned.idle.set()
        return epoch

    async def confirm(
        self, topic: str, partition: int, generation: int, confirmed_at_ms: int, member: str = ""
    ) -> bool:
        """Keep owning a partition through a rebalance: append a confirmation carrying the
        group generation confirmed again (at ``confirmed_at_ms``) and wait for it. Whether
        it counts and landed where this owner's next write was due (nobody wrote the
        partition since): then a takeover of an older rebalance landing later counts for
        nothing, and the partition is kept; else it is to be taken over and restored."""
        owned = self._owned.get((topic, partition))
        if owned is None or owned.takeover is None or owned.waiting_groups:
            return False
        confirmation = self._confirmation(owned.token, owned.epoch, confirmed_at_ms, generation, member)
        if not counts_after(confirmation.as_takeover(), owned.takeover):
            return False  # a group that started again, within the clock-skew bound: a takeover must wait
        offset = await self._append(
            topic, partition, confirmation_key(partition, self.new_token()), encode_confirmation(confirmation)
        )
        if self._owned.get((topic, partition)) is not owned or offset != owned.next_offset:
            return False
        owned.next_offset = offset + 1
        owned.takeover = confirmation.as_takeover()
        return True

    def _confirmation(self, token: str, epoch: int, at_ms: int, generation: int, member: str) -> Confirmation:
        """This worker's confirmation of its takeover ``token`` landed at ``epoch``: after the
        takeover itself, or when it keeps the partition through a rebalance."""
        return Confirmation(
            token=token, epoch=epoch, owner=self.owner, at_ms=at_ms, generation=generation, format=FORMAT, member=member
        )

    async def _append(self, topic: str, partition: int, key: bytes, value: bytes) -> int:
        """Append one record of this worker's own (a takeover, a confirmation) and wait for
        it; returns its offset."""
        acked: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_ack(offset: int) -> None:
            if not acked.done():
                acked.set_result(offset)

        self.output.send(topic, key, value, partition, on_ack=on_ack)
        return await acked

    def ownership(self, topic: str, partition: int) -> Ownership | None:
        return self._owned.get((topic, partition))

    def forget(self, topic: str, partition: int) -> None:
        """Stop owning the partition's changelog (revoked for good, fenced); the groups in
        flight release nothing."""
        owned = self._owned.pop((topic, partition), None)
        if owned is not None:
            owned.groups.clear()
            owned.acknowledged.clear()
            owned.held_back.clear()
            owned.idle.set()

    # -- write groups ------------------------------------------------------------------
    async def idle(self, partitions: Iterable[ChangelogPartition], timeout_s: float) -> bool:
        """Until no group of ``partitions`` is in flight, all under one deadline (a
        revocation, a stop waits for it); whether they all got there in time."""
        owned = [o for tp in partitions if (o := self._owned.get(tp)) is not None]
        busy = [o.idle for o in owned if not o.idle.is_set()]
        if not busy:  # the common case of a revocation: nothing in flight, no task to wait on
            return True
        waits = [idle.wait() for idle in busy]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except TimeoutError:
            return False
        return True

    def submit(
        self,
        topic: str,
        partition: int,
        writes: list[tuple[bytes, bytes | None]],
        release: Callable[[], Awaitable[None]],
        deletions: list[bytes] | None = None,
        *,
        barrier: bool = False,
    ) -> None:
        """Hand one group's changelog writes to Kafka; ``release`` (its outputs) runs, and
        ``deletions`` are handed over as a group of their own, once they are acknowledged
        in place. A partition this worker does not own (offline tools, tests without
        takeovers) releases once its writes are acknowledged.

        Every deletion of a group that writes something waits, with ``deletions``, until
        the group is verified: it lands only once what makes it safe counts, so a late one
        (its owner fenced meanwhile) takes nothing a restore needs. A rewritten key is
        written under a version of its own (``RewrittenKeys``) and the version it
        supersedes is deleted so. A group of deletions alone (a horizon passed) goes at once.

        ``barrier`` (a restore's group): the groups submitted after it wait until its
        deletions are handed over. A restore deletes the deltas past its checkpoint, and
        they must be gone before a newer checkpoint lands; a stale reader's restore (a
        newer takeover landed meanwhile) is never verified, and deletes nothing."""
        owned = self._owned.get((topic, partition))
        if owned is None:  # not owned: released on the acknowledgements alone
            owned = Ownership(token="", epoch=-1, next_offset=-1)
        writes, held = _physical(owned.keys, writes, deletions or [])
        group = _Group(expected=len(writes), release=release, deletions=held, barrier=barrier and owned.epoch >= 0)
        self._submit_group(topic, partition, owned, group, writes)

    def _submit_group(
        self, topic: str, partition: int, owned: Ownership, group: _Group, writes: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Send a group's writes (physical keys), or complete it at once when it has none;
        behind a barrier, hold it back until the barrier's deletions are handed over."""
        if owned.behind_barrier:
            owned.held_back.append((group, writes))
            owned.idle.clear()
            return
        owned.behind_barrier = group.barrier
        if not writes:
            self._spawn(topic, self._complete(topic, partition, owned, group))
            return
        owned.groups.append(group)
        owned.idle.clear()
        self._send(topic, partition, owned, writes)

    def _send(self, topic: str, partition: int, owned: Ownership, writes: list[tuple[bytes, bytes | None]]) -> None:
        """A group's writes to the producer, each acknowledgement counted (``_acked``)."""

        def on_ack(offset: int) -> None:
            self._acked(topic, partition, owned, offset)

        for key, value in writes:
            self.output.send(topic, key, value, partition, on_ack=on_ack)

    def _acked(self, topic: str, partition: int, owned: Ownership, offset: int) -> None:
        if not owned.groups:
            return  # forgotten meanwhile (fenced, revoked): nothing of it is released
        group = owned.groups[0]  # a partition's acknowledgements come in the order of its writes
        group.offsets.append(offset)
        if len(group.offsets) < group.expected:
            return
        owned.groups.popleft()
        owned.acknowledged.append(group)
        if not owned.checking:
            self._verify(topic, partition, owned)

    def _verify(self, topic: str, partition: int, owned: Ownership) -> None:
        """Verify the acknowledged groups in order: in place, released; skipped offsets,
        checked (and the groups after wait for the check)."""
        while owned.acknowledged and not owned.checking:
            group = owned.acknowledged.popleft()
            if _in_place(owned, group):
                owned.next_offset = max(group.offsets) + 1
                self._spawn(topic, self._complete(topic, partition, owned, group))
            else:
                owned.checking = True
                self._spawn(topic, self._check_gap(topic, partition, owned, group))

    async def _check_gap(self, topic: str, partition: int, owned: Ownership, group: _Group) -> None:
        """Offsets were skipped: read them; another worker's takeover among them fences this one."""
        self.gaps_checked += 1
        ours = set(group.offsets)
        start, end = owned.next_offset, max(ours) + 1
        records = await self._read_skipped(topic, partition, start, end)
        found = _other_takeover(records, ours, owned)
        if found is not None:
            self._fenced_by(topic, partition, owned, found[1], found[0])
            return
        gone = sorted(set(range(start, end)) - ours - {offset for offset, _, _ in records})
        if gone:
            self._fenced_unread(topic, partition, owned, gone)
            return
        owned.next_offset = end
        owned.checking = False
        await self._complete(topic, partition, owned, group)
        self._verify(topic, partition, owned)

    async def _read_skipped(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """The records of offsets ``start`` to ``end`` - 1, read until a read succeeds (the
        first failure said, the rest logged at debug)."""
        for attempt in range(1_000_000):
            try:
                records = await self.read_range(topic, partition, start, end)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broker away: the group waits, and tries again
                (log.warning if attempt == 0 else log.debug)(
                    "%s[%d]: reading offsets %d-%d to check a takeover failed (%r); trying again",
                    topic,
                    partition,
                    start,
                    end - 1,
                    exc,
                )
                await asyncio.sleep(1.0)
        return records

    def _fenced_by(self, topic: str, partition: int, owned: Ownership, takeover: Takeover, offset: int) -> None:
        """Another worker's takeover since this one's: say so, and give the partition up
        (unless it was given up meanwhile)."""
        self.fenced += 1
        log.warning(
            "%s[%d]: taken over by %s at offset %d since this worker's takeover at %d: its writes there "
            "no longer count, and it gives the partition up",
            topic,
            partition,
            takeover.owner or "another worker",
            offset,
            owned.epoch,
        )
        if self._owned.get((topic, partition)) is owned:
            self.forget(topic, partition)
            self.on_fenced(topic, partition)

    def _fenced_unread(self, topic: str, partition: int, owned: Ownership, gone: list[int]) -> None:
        """Skipped offsets compaction removed: what was there cannot be known (a takeover
        whose second copy, or whose deletion by a later owner, superseded it, and its
        confirmation after this group's writes). The group may not count: the partition is
        given up like a fenced one (taken over again if still assigned)."""
        if self._owned.get((topic, partition)) is not owned:
            return  # given up meanwhile
        self.unreadable_gaps += 1
        log.warning(
            "%s[%d]: offsets %s before this worker's writes are gone (compacted): another worker's takeover may "
            "have been among them, so they may not count; it gives the partition up",
            topic,
            partition,
            gone[:5],
        )
        self.forget(topic, partition)
        self.on_fenced(topic, partition)

    async def _complete(self, topic: str, partition: int, owned: Ownership, group: _Group) -> None:
        """A group verified: its outputs leave, then the deletions it made safe."""
        try:
            await self._release(topic, partition, owned, group)
        finally:
            if not owned.waiting_groups and not owned.checking:
                owned.idle.set()

    async def _release(self, topic: str, partition: int, owned: Ownership, group: _Group) -> None:
        """Unless the partition was given up meanwhile: the group's outputs, then its
        deletions as a group of their own."""
        if self._owned.get((topic, partition)) is owned or owned.epoch < 0:
            try:
                await group.release()
            finally:
                self._after_release(topic, partition, owned, group)

    def _after_release(self, topic: str, partition: int, owned: Ownership, group: _Group) -> None:
        """Once a group's outputs left (or failed to): its deletions handed over as a group
        of their own and, for a barrier, the groups held back behind it after them."""
        if group.barrier:
            owned.behind_barrier = False  # its deletions go first, then what waited
        if group.deletions:
            deletions = _Group(expected=len(group.deletions), release=_nothing, deletions=[])
            self._submit_group(topic, partition, owned, deletions, [(key, None) for key in group.deletions])
        if group.barrier:
            self._past_barrier(topic, partition, owned)

    def _past_barrier(self, topic: str, partition: int, owned: Ownership) -> None:
        """A barrier group's deletions are handed over: the groups held back behind it go."""
        while owned.held_back and not owned.behind_barrier:
            group, writes = owned.held_back.popleft()
            self._submit_group(topic, partition, owned, group, writes)

    def _spawn(self, topic: str, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._done(topic, done))

    def _done(self, topic: str, task: asyncio.Task) -> None:
        """A group's completion (its check, its release, its deletions handed over) ended.
        One that failed stops the worker, as writes still in flight at a revocation do: its
        outputs may have left in part, and the partition's later groups would wait behind
        it for good (or its deletions never land); retrying could send an output twice.
        The output fails (nothing more is handed to Kafka), the worker exits, and its
        successors restore what counts (``docs/ownership.md``, rule 11)."""
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.error("%s: completing a write group failed (%r): stopping the worker (restart it)", topic, exc)
        self.output.fail(topic, exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except BaseException:  # noqa: BLE001 - stopping
                pass

    def stats(self) -> dict[str, Any]:
        return {
            "owned": len(self._owned),
            "gaps_checked": self.gaps_checked,
            "fenced": self.fenced,
            "unreadable_gaps": self.unreadable_gaps,
        }


def _in_place(owned: Ownership, group: _Group) -> bool:
    """Whether a group's offsets follow the partition's last ones without a gap (or the
    partition is not owned: nothing to check)."""
    first, last = min(group.offsets), max(group.offsets)
    return owned.epoch < 0 or (first == owned.next_offset and last - first + 1 == len(group.offsets))


def _physical(
    keys: RewrittenKeys | None, writes: list[tuple[bytes, bytes | None]], deletions: list[bytes]
) -> tuple[list[tuple[bytes, bytes | None]], list[bytes]]:
    """A group's writes to send now under their physical keys, and the deletions to hold
    until it is verified: those it makes or supersedes, then ``deletions``. A group that
    writes nothing sends its deletions at once."""
    if keys is None:
        return writes, deletions
    sent: list[tuple[bytes, bytes | None]] = []
    held: list[bytes] = []
    for key, value in writes:
        physical, superseded = keys.rewrite(key, value)
        if value is None:
            held.append(physical)
            continue
        sent.append((physical, value))
        if superseded is not None:
            held.append(superseded)
    held.extend(keys.rewrite(key, None)[0] for key in deletions)
    if not sent:
        return [(key, None) for key in held], []
    return sent, held


def _other_takeover(
    records: list[tuple[int, bytes | None, bytes | None]], ours: set[int], owned: Ownership
) -> tuple[int, Takeover] | None:
    """The first takeover among ``records`` (none of ``ours``) by another worker that counts
    after this one's (``core.ownership.counts_after``), and its offset; None when there is
    none. A stray one (a stale member's late append) fences nobody. Another owner's
    confirmation naming an epoch past this owner's stands for its takeover (whose copy
    compaction may have dropped)."""
    for offset, key, value in records:
        if offset in ours or key is None or value is None:
            continue
        found = _takeover_in(key, value, owned)
        if found is not None and _fences(found, owned):
            return offset, found
    return None


def _fences(takeover: Takeover, owned: Ownership) -> bool:
    """Whether a takeover found fences this owner: another's (another token) that counts
    after this one's."""
    return takeover.token != owned.token and counts_after(takeover, owned.takeover)


def _takeover_in(key: bytes, value: bytes, owned: Ownership) -> Takeover | None:
    """The takeover a record is or stands for, after this owner's (None: none)."""
    if is_takeover(key):
        return takeover_of(value)
    if is_confirmation(key):
        confirmation = confirmation_of(value)
        if confirmation is not None and confirmation.epoch > owned.epoch:
            return confirmation.as_takeover()
    return None
