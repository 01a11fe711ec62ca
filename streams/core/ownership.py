"""Who may write a changelog partition, and which of its records count: pure, no I/O.

A stage's state of one input partition lives in one changelog partition, written by
whichever worker owns the input partition. Ownership moves (rebalances, crashes), and a
worker that lost a partition may still write it for a while: one frozen past its session
(a stalled VM, a SIGSTOP) wakes up with writes in flight. Kafka's group generations do
not reach a plain producer's writes, so the changelog orders them itself. The protocol,
its invariants and the tests that check each are on one page: ``docs/ownership.md``.
The words, one meaning each:

* **owner epoch**: the offset of an owner's takeover record; every key it writes is
  tagged with it.
* **group generation** (``generation`` here): the consumer group's generation (Kafka's) in
  which a member confirmed it holds a partition; carried in its takeover record and its
  confirmations. (An LLM generation is the stages' word, never this module's.)
* **confirmation**: an owner's record naming its epoch and a group generation it
  confirmed (``Confirmation``).
* **write version**: a number an owner gives each rewritten key (``RewrittenKeys``).

The rules:

* **Takeover.** A worker that takes a partition over confirms its generation, then
  appends a *takeover record* (key ``P e <token>``; its generation and the time of the
  confirmation in the value) and waits for its acknowledgement. Its offset is the new
  owner's epoch. Only then does it read the changelog, up to and including that record.
* **Counting takeovers.** A takeover counts when its generation is not older than the
  generation of the counting takeover before it (the ordering KIP-447 gives transactional
  producers at the broker): a record appended late by a member that was stale when it
  wrote it (it confirmed, froze, and the group moved on) fences nobody. One exception, for
  a group whose generations started again (its metadata expired while no member ran): a
  takeover confirmed more than ``CLOCK_SKEW_MS`` after the one before it counts (a stale
  member confirmed before the rebalance that made it stale, so before any takeover of the
  newer generation); and one confirmed more than ``CLOCK_SKEW_MS`` *before* the counting
  one counts for nothing (an older group's member appending late).
* **Confirmations.** Once its takeover is acknowledged, the owner appends a confirmation
  naming that offset: where the takeover landed is what a confirmation says (else its
  first copy), so a takeover record appended twice keeps its epoch whichever copy
  compaction keeps. An owner keeping a partition through a rebalance appends one with the
  generation it confirmed then: later takeovers are judged against that generation.
* **Tags.** Every key an owner writes carries its epoch in its first part
  (``P@<epoch>``), and each key it rewrites a version of its own (``P@<epoch>.<version>``):
  no key is ever written twice, so compaction never lets a write that does not count
  replace one that does.
* **Validity.** A record counts when its tag is the epoch of the latest counting takeover
  before it (keys without a tag, written before takeovers existed, count until the
  first one). A stale owner's late writes land after the new owner's takeover: they
  never count, whatever they say, and the next restore deletes them.
* **Supersession.** Keys of one logical state (a batch's status, the checkpoint) may
  exist under several tags and versions; the valid one with the highest offset holds the
  state, the others are deleted once it is known to count (``delivery.writes``).

``ChangelogView`` applies these rules to one partition's records read in offset order,
exactly as compaction keeps them (the latest value per key, tombstones deleting it).
What the writer checks so that a stale owner's writes never release an output is in
``delivery.writes`` (the writes of a partition are acknowledged at consecutive offsets, or
the offsets skipped are read for a newer counting takeover).
"""

from __future__ import annotations

import bisect
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from ..errors import SpecmeterError

__all__ = [
    "StateWithoutCheckpoint",
    "refuse_without_checkpoint",
    "CLOCK_SKEW_MS",
    "Takeover",
    "ChangelogView",
    "RewrittenKeys",
    "ValidState",
    "owner_key_part",
    "split_key",
    "takeover_key",
    "takeover_token",
    "is_takeover",
    "takeover_of",
    "counts_after",
    "encode_takeover",
    "Confirmation",
    "confirmation_key",
    "confirmation_of",
    "encode_confirmation",
    "is_confirmation",
]

log = logging.getLogger("specmeter.ownership")

_SEP = b"\x1f"
_TAG = b"@"
_VERSION = b"."
#: the key kind of a takeover record: ``P e <token>`` (never tagged)
TAKEOVER_KIND = b"e"
#: the key kind of a confirmation record: ``P r <key token>`` (never tagged, a key of its own)
CONFIRMATION_KIND = b"r"
#: how far two workers' clocks may differ: a takeover confirmed this much later than the
#: counting one before it counts whatever its generation (the group started again)
CLOCK_SKEW_MS = 60_000


class Takeover(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """A worker's takeover of a changelog partition (its offset is the owner's epoch)."""

    token: str
    #: who took it over, for operators reading the changelog
    owner: str = ""
    #: when the worker confirmed its generation (wall clock, ms): before its commit was sent
    at_ms: int = 0
    #: the consumer group's generation it confirmed (-1: written before generations were
    #: carried, or offline: counts like any generation)
    generation: int = -1
    #: the format its owner writes (``core.formats``; 0: written before formats were
    #: carried): the keys tagged with this takeover's epoch follow it. Appended: a reader
    #: of format 0 decodes the fields before it and ignores it
    format: int = 0
    #: the group member id its owner confirmed ``generation`` as ("": not known, or written
    #: before it was carried). In one group generation a partition has one member: two
    #: takeovers of the same generation by different members come from two incarnations
    #: of the group (deleted and started again). Appended, as ``format``
    member: str = ""


class Confirmation(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """An owner's word on its takeover, in a record of its own (``P r <key token>``).

    Written right after its takeover is acknowledged (the same generation and time), it
    says where the takeover landed: the owner's epoch no longer depends on which copy of
    a takeover record appended twice compaction keeps. Written when the owner keeps the
    partition through a rebalance (the kept path), it carries the generation the owner
    confirmed then: a takeover of an older rebalance landing after it counts for nothing.
    """

    #: the token of the takeover it confirms
    token: str
    #: the offset that takeover was acknowledged at: the owner's epoch
    epoch: int
    owner: str = ""
    #: when the owner confirmed ``generation`` (wall clock, ms)
    at_ms: int = 0
    generation: int = -1
    #: the format its owner writes (``core.formats``)
    format: int = 0
    #: the group member id its owner confirmed ``generation`` as (``Takeover.member``)
    member: str = ""

    @classmethod
    def of(cls, takeover: Takeover, epoch: int) -> Confirmation:
        """A confirmation that ``takeover`` landed at ``epoch``, with its generation, time and
        member (``as_takeover`` gives it back)."""
        return cls(
            token=takeover.token,
            epoch=epoch,
            owner=takeover.owner,
            at_ms=takeover.at_ms,
            generation=takeover.generation,
            format=takeover.format,
            member=takeover.member,
        )

    def as_takeover(self) -> Takeover:
        """The takeover it stands for, judged by ``counts_after``: its generation, time and member."""
        return Takeover(
            token=self.token,
            owner=self.owner,
            at_ms=self.at_ms,
            generation=self.generation,
            format=self.format,
            member=self.member,
        )


_takeover_decoder = msgspec.msgpack.Decoder(Takeover)
_confirmation_decoder = msgspec.msgpack.Decoder(Confirmation)
_encoder = msgspec.msgpack.Encoder()
#: a record of the owners' own: a takeover or a confirmation
_R = TypeVar("_R", Takeover, Confirmation)


def takeover_token() -> str:
    """A token no other takeover has (it names the record's key)."""
    return uuid.uuid4().hex


def takeover_key(partition: int, token: str) -> bytes:
    return f"{partition}\x1fe\x1f{token}".encode()


def encode_takeover(takeover: Takeover) -> bytes:
    return _encoder.encode(takeover)


def confirmation_key(partition: int, key_token: str) -> bytes:
    """A confirmation record's key: a token of its own, so that no two share a key."""
    return f"{partition}\x1fr\x1f{key_token}".encode()


def encode_confirmation(confirmation: Confirmation) -> bytes:
    return _encoder.encode(confirmation)


def owner_key_part(partition: int, epoch: int | None, version: int | None = None) -> str:
    """The first part of every key an owner writes: the partition, tagged with the owner's
    epoch (None: untagged, as written before takeovers existed, and offline) and, for a
    key it rewrites, the write's version."""
    if epoch is None:
        return str(partition)
    return f"{partition}@{epoch}" if version is None else f"{partition}@{epoch}.{version}"


def split_key(key: bytes) -> tuple[bytes, int | None]:
    """A key's logical form (its tag and version removed) and its tag (None: untagged)."""
    head, sep, rest = key.partition(_SEP)
    partition, tagged, tag = head.partition(_TAG)
    if not tagged:
        return key, None
    try:
        return partition + sep + rest, int(tag.partition(_VERSION)[0])
    except ValueError:  # not ours to read: left as it is
        return key, None


def is_takeover(key: bytes) -> bool:
    return _kind(key) == TAKEOVER_KIND


def is_confirmation(key: bytes) -> bool:
    return _kind(key) == CONFIRMATION_KIND


def _kind(key: bytes) -> bytes | None:
    """The kind of an untagged ``P <kind> <token>`` key (None: another key)."""
    head, sep, rest = key.partition(_SEP)
    if not sep or _TAG in head or rest[1:2] != _SEP:
        return None
    return rest[:1]


def takeover_of(value: bytes) -> Takeover | None:
    """A takeover record's value (None when it is not one this worker can read)."""
    try:
        return _takeover_decoder.decode(value)
    except msgspec.MsgspecError:
        return None


def confirmation_of(value: bytes) -> Confirmation | None:
    """A confirmation record's value (None when it is not one this worker can read)."""
    try:
        return _confirmation_decoder.decode(value)
    except msgspec.MsgspecError:
        return None


def counts_after(takeover: Takeover, before: Takeover | None) -> bool:
    """Whether ``takeover`` counts after ``before``, the latest counting takeover ahead of it
    (with the generation its owner last confirmed; None: none): its generation is not
    older, or it was confirmed more than ``CLOCK_SKEW_MS`` later (the group's generations
    started again). One confirmed more than ``CLOCK_SKEW_MS`` *earlier* counts for nothing,
    whatever its generation: it is an older group's (a member of the group before its
    generations started again, appending late). Within the bound, the same generation
    counts only for the same member (its own takeover again): another member's is of
    another incarnation of the group, and which came first cannot be told (a copy of an
    older incarnation's takeover appended late, its first copy compacted away, must not
    count after the newer one's); it counts once the bound has passed."""
    if before is None or takeover.generation < 0 or before.generation < 0:
        return True
    if takeover.at_ms + CLOCK_SKEW_MS < before.at_ms:
        return False
    if takeover.at_ms > before.at_ms + CLOCK_SKEW_MS:
        return True
    if takeover.generation == before.generation and takeover.member and before.member:
        return takeover.member == before.member
    return takeover.generation >= before.generation


class StateWithoutCheckpoint(SpecmeterError, RuntimeError):
    """A changelog partition holds an owner's valid state but no valid checkpoint: restoring
    it would start from offset -1 and delete that state. Cannot happen to a current owner
    while these rules hold (``docs/ownership.md``, rule 8): the restore stops instead of
    wiping."""


def refuse_without_checkpoint(where: str, restored: Iterable[bytes], checkpoint_found: bool) -> None:
    """Stop, loudly, a restore that found records of an owner (``restored``: their physical
    keys) and no checkpoint. Every owner writes its checkpoint at its restore, before any
    other record of its can land, and a checkpoint is deleted only once a newer one counts;
    records without a tag (written before takeovers) may precede their first checkpoint
    after a crash."""
    if checkpoint_found:
        return
    tagged = [key for key in restored if split_key(key)[1] is not None]
    if tagged:
        message = (
            f"{where}: the changelog holds {len(tagged)} valid record(s) of an owner (first: {tagged[0]!r}) and "
            "no valid checkpoint; restoring would read the input from offset -1 and delete them. Not restoring: "
            "keep the changelog as it is and report it (docs/ownership.md)"
        )
        log.error(message)
        raise StateWithoutCheckpoint(message)


@dataclass(frozen=True, slots=True)
class ValidState:
    """What one changelog partition holds that counts, and what to delete."""

    #: (physical key, value) of every valid record that holds its logical key's state,
    #: in offset order
    entries: list[tuple[bytes, bytes]]
    #: physical keys to delete, in the order they must land: records that do not count (a
    #: stale owner's late writes) and takeovers that do not count, then records superseded
    #: by a valid record of the same logical key, then counting takeovers no longer needed
    #: (last: a takeover deleted earlier could make a stray one count)
    deletions: list[bytes]
    #: the epoch of the latest counting takeover read (None: none yet)
    epoch: int | None
    #: that takeover, with the generation and time its owner last confirmed (None: none)
    counting: Takeover | None = None
    #: (key, value) of a confirmation to write for each counting takeover before the latest
    #: that has none and stays (``ChangelogView.result``): where it landed, written down
    pins: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class _Owner:
    """One takeover token as the log holds it: where its takeover landed (its owner's word
    when a confirmation says it, else the first copy read), the takeover it was, and the
    keys of its records (confirmations first, then the takeover's)."""

    position: int
    base: Takeover
    confirmations: list[bytes] = field(default_factory=list)
    takeovers: list[bytes] = field(default_factory=list)

    @property
    def keys(self) -> list[bytes]:
        return self.confirmations + self.takeovers


@dataclass(slots=True)
class _Counted:
    """Which takeovers count (their positions: the epochs, sorted), the keys of those that
    do not, the latest counting one (with its owner's last counting confirmation) and
    every token's records; built up event by event, in the order they landed."""

    epochs: list[int]
    strays: list[bytes]
    latest: Takeover | None
    owners: dict[str, _Owner]
    #: the token of the latest counting takeover
    current: str | None = None

    def landed(self, offset: int, token: str) -> None:
        """A takeover landed at ``offset``: it counts after the latest counting one (then it
        is the latest), or its records are strays."""
        owner = self.owners[token]
        if counts_after(owner.base, self.latest):
            self.epochs.append(offset)
            self.latest, self.current = owner.base, token
        else:
            self.strays.extend(owner.keys)

    def confirmed(self, token: str, confirmation: Confirmation) -> None:
        """A confirmation landed: the latest counting takeover's owner confirmed a newer
        generation when it counts after the latest (another's confirms nothing here)."""
        if token == self.current and counts_after(confirmation.as_takeover(), self.latest):
            self.latest = confirmation.as_takeover()


@dataclass
class ChangelogView:
    """One changelog partition's records, fed in offset order (``add``), and what of them
    counts (``result``): see the module docstring for the rules."""

    #: physical key -> (offset, value) of its latest record (what compaction keeps)
    _latest: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    #: takeover records: physical key -> (offset of its first copy, its value)
    _takeovers: dict[bytes, tuple[int, Takeover]] = field(default_factory=dict)
    #: confirmation records: physical key -> (offset, its value)
    _confirmations: dict[bytes, tuple[int, Confirmation]] = field(default_factory=dict)

    def add(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        if value is None:
            self._latest.pop(key, None)
            self._takeovers.pop(key, None)
            self._confirmations.pop(key, None)
        elif is_takeover(key):
            _keep_first(self._takeovers, key, offset, takeover_of(value))
        elif is_confirmation(key):
            _keep_first(self._confirmations, key, offset, confirmation_of(value))
        else:
            self._latest[key] = (offset, value)

    def counting(self) -> tuple[list[int], list[bytes]]:
        """The offsets of the counting takeovers (sorted), and the keys of those that do not count."""
        counted = self._count()
        return counted.epochs, counted.strays

    def _owners(self) -> dict[str, _Owner]:
        """Every token's takeover: where it landed and its records. The first confirmation's
        word on where its takeover landed wins over the copies read (a copy appended twice,
        the first compacted away) and over any later confirmation of it, and stands for the
        takeover when no copy is left."""
        owners: dict[str, _Owner] = {}
        for key, (offset, takeover) in sorted(self._takeovers.items(), key=lambda kv: kv[1][0]):
            owner = owners.setdefault(takeover.token, _Owner(offset, takeover))
            owner.takeovers.append(key)
        for key, (_, confirmation) in sorted(self._confirmations.items(), key=lambda kv: kv[1][0]):
            owner = owners.setdefault(confirmation.token, _Owner(confirmation.epoch, confirmation.as_takeover()))
            if not owner.confirmations:
                owner.position = confirmation.epoch
            owner.confirmations.append(key)
        return owners

    def _count(self) -> _Counted:
        """The takeovers in the order they landed, each judged against the latest counting one
        before it (as its owner last confirmed it before that point: ``counts_after``)."""
        owners = self._owners()
        events: list[tuple[int, str, Confirmation | None]] = [(o.position, token, None) for token, o in owners.items()]
        events += [(offset, c.token, c) for offset, c in self._confirmations.values()]
        counted = _Counted([], [], None, owners)
        for offset, token, confirmation in sorted(events, key=lambda e: (e[0], e[2] is not None)):
            if confirmation is None:
                counted.landed(offset, token)
            else:
                counted.confirmed(token, confirmation)
        return counted

    def result(self) -> ValidState:
        """The valid state now (the view can take more records afterwards)."""
        counted = self._count()
        epochs = counted.epochs
        latest_epoch = epochs[-1] if epochs else None
        valid, stale, superseded = self._valid(epochs)
        needed_from = _needed_from(valid, epochs[-1]) if epochs else 0
        unneeded = self._unneeded_takeovers(needed_from, epochs, counted.owners)
        entries = [(physical, value) for _, physical, value in sorted(valid.values())]
        deletions = sorted(stale) + counted.strays + sorted(superseded) + unneeded
        pins = _pins(needed_from, epochs, counted.owners)
        return ValidState(entries=entries, deletions=deletions, epoch=latest_epoch, counting=counted.latest, pins=pins)

    def _valid(self, epochs: list[int]) -> tuple[dict[bytes, tuple[int, bytes, bytes]], list[bytes], list[bytes]]:
        """Each logical key's latest record its epoch's owner wrote (logical -> (offset,
        physical, value)), the physical keys of records that do not count, and those of
        the records that lost to a valid one."""
        valid: dict[bytes, tuple[int, bytes, bytes]] = {}
        stale: list[bytes] = []
        superseded: list[bytes] = []
        for physical, (offset, value) in self._latest.items():
            logical, tag = split_key(physical)
            if tag != _epoch_at(epochs, offset):
                stale.append(physical)  # a stale owner's late write
                continue
            held = valid.get(logical)
            if held is not None:
                if held[0] > offset:
                    superseded.append(physical)
                    continue
                superseded.append(held[1])
            valid[logical] = (offset, physical, value)
        return valid, stale, superseded

    def _unneeded_takeovers(self, needed_from: int, epochs: list[int], owners: dict[str, _Owner]) -> list[bytes]:
        """The records of the counting takeovers no valid record needs any more (before
        ``needed_from``), oldest first (each one's confirmations, then its takeover)."""
        if not epochs:
            return []
        counting = set(epochs)
        return [
            key
            for owner in sorted(owners.values(), key=lambda o: o.position)
            if owner.position in counting and owner.position < needed_from
            for key in owner.keys
        ]


def _pins(needed_from: int, epochs: list[int], owners: dict[str, _Owner]) -> list[tuple[bytes, bytes]]:
    """A confirmation for each counting takeover that has none and stays (from
    ``needed_from`` on) before the latest: where its first copy landed, written down by the
    owner that restores. Without it, a second copy of that takeover landing later, the first
    compacted away, moves it, and the takeovers after it are judged against the one before
    it instead: the latest one, counted only after it (``counts_after`` is not transitive),
    may stop counting, with everything its owner released (``docs/ownership.md``, rule 2a)."""
    counting = set(epochs[:-1])
    pins = []
    for owner in sorted(owners.values(), key=lambda o: o.position):
        if owner.position in counting and owner.position >= needed_from and not owner.confirmations and owner.takeovers:
            pinned = Confirmation.of(owner.base, owner.position)
            pins.append((_pin_key(owner.takeovers[0], owner.base.token), encode_confirmation(pinned)))
    return pins


def _pin_key(takeover_key: bytes, token: str) -> bytes:
    """The key of the confirmation a restore writes for another owner's takeover: the same for
    every restore that writes it (one record, whichever copy compaction keeps)."""
    partition = takeover_key.partition(_SEP)[0]
    return partition + _SEP + CONFIRMATION_KIND + _SEP + f"pin-{token}".encode()


def _keep_first(records: dict[bytes, tuple[int, _R]], key: bytes, offset: int, record: _R | None) -> None:
    """A takeover's or a confirmation's first readable copy, kept with its offset (a later
    copy of its key changes nothing)."""
    if record is not None and key not in records:
        records[key] = (offset, record)


def _needed_from(valid: dict[bytes, tuple[int, bytes, bytes]], latest_epoch: int) -> int:
    """The oldest epoch a valid record still needs: the oldest of the tags held and the
    latest epoch. A takeover older than every tag still held judges no record any more: records
    written later by its owner land after a newer takeover, and are judged by that one."""
    tags = [tag for _, physical, _ in valid.values() if (tag := split_key(physical)[1]) is not None]
    return min([*tags, latest_epoch])


def _epoch_at(epochs: list[int], offset: int) -> int | None:
    """The epoch of the latest takeover before ``offset`` (epochs sorted), None if none."""
    i = bisect.bisect_left(epochs, offset)
    return epochs[i - 1] if i else None


class RewrittenKeys:
    """The keys one owner rewrites, each write under a key of its own.

    A stage writes a partition's checkpoint, a batch's status or a merge's bookkeeping
    again and again under one logical key. Written under one physical key, a write that
    does not count (landed after a newer takeover) would replace, under compaction, the
    owner's last write that does. So each write of a rewritten kind gets the owner's next
    write version in its tag, and the key it supersedes is returned, to delete once the
    write is known to count. A deletion of a logical key deletes the physical key last
    written for it. Kinds written once (deltas, gone batches) pass through as they are.
    """

    def __init__(self, partition: int, epoch: int, kinds: Iterable[bytes]) -> None:
        self._plain = f"{partition}@{epoch}".encode()
        self._partition = partition
        self._epoch = epoch
        self._kinds = frozenset(kind.lower() for kind in kinds)
        self._next_version = 0
        #: logical key (as the stage writes it, tagged with the plain epoch) -> physical key
        self._written: dict[bytes, bytes] = {}

    def rewrite(self, key: bytes, value: bytes | None) -> tuple[bytes, bytes | None]:
        """The physical key of one write, and the key it supersedes (None: none)."""
        head, sep, rest = key.partition(_SEP)
        if head != self._plain or rest[:1].lower() not in self._kinds or rest[1:2] not in (_SEP, b""):
            return key, None
        if value is None:
            return self._written.pop(key, key), None
        physical = owner_key_part(self._partition, self._epoch, self._next_version).encode() + sep + rest
        self._next_version += 1
        superseded = self._written.get(key)
        self._written[key] = physical
        return physical, superseded
