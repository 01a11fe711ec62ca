"""A sticky, balanced assignment of a stage's partitions: a rebalance moves only what
must move, so only the partitions that move are restored.

Each member tells the group, when it joins, the partitions it holds and the number of the
assignment that gave them (``metadata``; the **assignment number**, the assignor's own
counter: not an owner epoch, not a group generation). The group's leader (``assign``)
keeps every member's partitions up to a fair share, gives a partition two members hold to
the one with the newer assignment (a member that was frozen and woke up still holds
partitions that moved meanwhile), and hands the rest to the members below their share.
Adding a fourth worker to three at 12 partitions moves 3, one from each; a worker leaving
moves only its own. Every assignment carries a new number, one past the highest any
member reported.

Each member's userdata also names the newest format it writes, and each assignment the
group's format, the oldest of them (``core.formats``): a group of format 0 (a member of
the release before formats were carried) gets the plain number that release reads.

The rule is ``sticky_assignment`` (pure); ``StickyAssignor`` is aiokafka's assignor
interface around it (public: ``partition_assignment_strategy``), one instance per route,
so that the two stages' groups in one process keep apart what each holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from ..core.formats import FORMAT, OLDEST_FORMAT, FormatRefused, group_format, refusal

__all__ = ["StickyAssignor", "Member", "sticky_assignment"]

#: (topic, partition)
Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Member:
    """What a member told the group: its topics, what it holds and the number of the
    assignment that gave it."""

    topics: frozenset[str]
    held: tuple[Partition, ...] = ()
    assignment: int = -1
    #: the newest format it writes (0: a member of the release before formats were carried)
    format: int = 0


def sticky_assignment(partitions: Iterable[Partition], members: Mapping[str, Member]) -> dict[str, list[Partition]]:
    """Every partition to one member subscribed to its topic: balanced (shares differ by
    one at most, among members of the same topics), each member keeping what it holds as
    far as its share allows; a partition two hold goes to the newer assignment."""
    out: dict[str, list[Partition]] = {m: [] for m in members}
    for topic, tps in sorted(_by_topic(partitions).items()):
        subscribed = _subscribed(topic, members)
        if subscribed:
            for member, given in _assign_topic(tps, subscribed).items():
                out[member].extend(given)
    return out


def _subscribed(topic: str, members: Mapping[str, Member]) -> dict[str, Member]:
    """The members subscribed to ``topic``, sorted."""
    return {m: info for m, info in sorted(members.items()) if topic in info.topics}


def _by_topic(partitions: Iterable[Partition]) -> dict[str, list[Partition]]:
    """The distinct partitions, sorted, by topic."""
    by_topic: dict[str, list[Partition]] = {}
    for tp in sorted(set(partitions)):
        by_topic.setdefault(tp[0], []).append(tp)
    return by_topic


def _assign_topic(tps: list[Partition], members: Mapping[str, Member]) -> dict[str, list[Partition]]:
    owner = _owners(tps, members)
    held = _held(owner, members)
    share = _shares(len(tps), held)
    out: dict[str, list[Partition]] = {}
    free: list[Partition] = sorted(tp for tp in tps if tp not in owner)
    for m in members:
        out[m] = held[m][: share[m]]
        free.extend(held[m][share[m] :])
    free.sort()
    _fill(out, share, free)
    return out


def _owners(tps: list[Partition], members: Mapping[str, Member]) -> dict[Partition, str]:
    """Each existing partition a member holds -> that member (of two, the newer assignment)."""
    existing = set(tps)
    owner: dict[Partition, str] = {}
    for member in sorted(members, key=lambda m: (members[m].assignment, m)):  # the newest last: it wins
        for tp in members[member].held:
            if tp in existing:
                owner[tp] = member
    return owner


def _held(owner: dict[Partition, str], members: Mapping[str, Member]) -> dict[str, list[Partition]]:
    """Each member's partitions as ``_owners`` gave them (sorted; none for some)."""
    return {m: sorted(tp for tp, o in owner.items() if o == m) for m in members}


def _shares(partitions: int, held: dict[str, list[Partition]]) -> dict[str, int]:
    """Each member's fair share of ``partitions`` (they differ by one at most)."""
    base, extra = divmod(partitions, len(held))
    # the larger shares go to the members that hold the most: fewer partitions move
    ranked = sorted(held, key=lambda m: (-len(held[m]), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}


def _fill(out: dict[str, list[Partition]], share: dict[str, int], free: list[Partition]) -> None:
    """The free partitions (sorted) to the members below their share, fewest first."""
    for m in sorted(out, key=lambda m: (len(out[m]), m)):
        while len(out[m]) < share[m] and free:
            out[m].append(free.pop(0))
        out[m].sort()


class _Metadata(msgspec.Struct, array_like=True):
    held: list[tuple[str, int]] = []
    #: the assignment number (encoded by position: renaming it changed nothing on the wire)
    assignment: int = -1
    #: appended (format 1): a member of format 0 sends two fields, and reads two of three
    format: int = 0


class _Assignment(msgspec.Struct, array_like=True):
    """An assignment's userdata in a group of format 1 or later (format 0: the plain number)."""

    assignment: int
    format: int


_decode_metadata = msgspec.msgpack.Decoder(_Metadata).decode
_decode_assignment = msgspec.msgpack.Decoder(int | _Assignment).decode


def assignment_userdata(number: int, group: int) -> bytes:
    """What the leader hands each member: the assignment number, and the group's format
    where every member reads it (a group of format 0 gets the plain number its old
    members decode)."""
    return msgspec.msgpack.encode(number if group == 0 else _Assignment(assignment=number, format=group))


def read_assignment_userdata(data: bytes) -> tuple[int, int]:
    """(assignment number, group format) of an assignment's userdata; (-1, 0) for neither form."""
    try:
        decoded = _decode_assignment(data)
    except msgspec.MsgspecError:
        return -1, 0
    return (decoded, 0) if isinstance(decoded, int) else (decoded.assignment, decoded.format)


class StickyAssignor:
    """aiokafka's assignor interface (``name``, ``version``, ``metadata``, ``assign``,
    ``on_assignment``) around ``sticky_assignment``; one instance per consumer."""

    name = "specmeter-sticky"
    version = 0

    def __init__(self, *, format: int = FORMAT, oldest_format: int = OLDEST_FORMAT) -> None:
        self.held: list[Partition] = []
        self.assignment = -1
        #: the newest format this member writes, and the oldest it can (tests pick others)
        self.format = format
        self.oldest_format = oldest_format
        #: the format the group's last assignment said it writes
        self.group_format = format
        #: set when that format is older than this member can write (``core.formats``)
        self.refused: FormatRefused | None = None

    def metadata(self, topics: Iterable[str]) -> object:
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

        user_data = msgspec.msgpack.encode(_Metadata(held=self.held, assignment=self.assignment, format=self.format))
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), user_data)

    def assign(self, cluster: object, members: Mapping[str, object]) -> dict[str, object]:
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        infos = {member_id: _member(metadata) for member_id, metadata in members.items()}
        partitions = _partitions(cluster, {t for info in infos.values() for t in info.topics})
        userdata = _next_userdata(infos.values())
        out = {}
        for member_id, given in sticky_assignment(partitions, infos).items():
            out[member_id] = ConsumerProtocolMemberAssignment(
                self.version, sorted(_numbers_by_topic(given).items()), userdata
            )
        return out

    def on_assignment(self, assignment: object) -> None:
        self.held = [(tp.topic, tp.partition) for tp in assignment.partitions()]  # type: ignore[attr-defined]
        self.assignment, self.group_format = read_assignment_userdata(assignment.user_data)  # type: ignore[attr-defined]
        self.refused = refusal(self.group_format, self.oldest_format)


def _next_userdata(infos: Collection[Member]) -> bytes:
    """The userdata of the assignment the members' metadata calls for: the number one past
    the highest any of them reported, and the oldest format any of them writes."""
    number = max((info.assignment for info in infos), default=-1) + 1
    return assignment_userdata(number, group_format(info.format for info in infos))


def _partitions(cluster: object, topics: set[str]) -> list[Partition]:
    """Every partition of ``topics`` the cluster's metadata knows."""
    return [
        (topic, p)
        for topic in topics
        for p in (cluster.partitions_for_topic(topic) or ())  # type: ignore[attr-defined]
    ]


def _numbers_by_topic(given: list[Partition]) -> dict[str, list[int]]:
    """A member's partitions as the assignment protocol lists them: numbers by topic."""
    by_topic: dict[str, list[int]] = {}
    for topic, p in given:
        by_topic.setdefault(topic, []).append(p)
    return by_topic


def _member(metadata: object) -> Member:
    topics = frozenset(metadata.subscription)  # type: ignore[attr-defined]
    try:
        data = _decode_metadata(metadata.user_data or b"")  # type: ignore[attr-defined]
    except msgspec.MsgspecError:
        return Member(topics)
    return Member(topics, tuple((t, p) for t, p in data.held), data.assignment, data.format)
