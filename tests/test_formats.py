"""Formats in a group of mixed releases (issue 47.4, ``core.formats``): each member names
the newest format it writes in its assignor userdata, the leader hands every member the
oldest, and the release before formats were carried still reads what a new leader sends.
Pure: aiokafka's protocol objects, no broker."""

from __future__ import annotations

import msgspec
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from specmeter.streams.core.formats import FORMAT, OLDEST_FORMAT, FormatRefused, group_format, refusal
from specmeter.streams.delivery.assignor import StickyAssignor, read_assignment_userdata

TOPIC = "t"


class _PreviousMetadata(msgspec.Struct, array_like=True):
    """The userdata of the release before formats (37714f1, ``delivery.assignor._Metadata``)."""

    held: list[tuple[str, int]] = []
    epoch: int = -1


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(4)) if topic == TOPIC else set()


def _previous_member(held: list[tuple[str, int]], epoch: int) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, [TOPIC], msgspec.msgpack.encode(_PreviousMetadata(held, epoch)))


def _assign(leader: StickyAssignor, members: dict[str, object]) -> dict[str, ConsumerProtocolMemberAssignment]:
    return leader.assign(_Cluster(), members)  # type: ignore[return-value]


def _deliver(member: StickyAssignor, assignment: ConsumerProtocolMemberAssignment) -> None:
    member.on_assignment(ConsumerProtocolMemberAssignment.decode(assignment.encode()))


def test_a_group_of_this_release_writes_its_format():
    a, b = StickyAssignor(), StickyAssignor()
    out = _assign(a, {"a": a.metadata([TOPIC]), "b": b.metadata([TOPIC])})
    for member, name in ((a, "a"), (b, "b")):
        _deliver(member, out[name])
        assert member.group_format == FORMAT and member.refused is None
    assert sorted(a.held + b.held) == [(TOPIC, p) for p in range(4)]


def test_a_group_with_a_member_of_the_previous_release_writes_format_0_in_the_form_it_reads():
    new = StickyAssignor()
    out = _assign(new, {"new": new.metadata([TOPIC]), "old": _previous_member([(TOPIC, 0), (TOPIC, 1)], 7)})
    # the previous release decodes its assignment's userdata as a plain int (its epoch)
    assert msgspec.msgpack.decode(out["old"].user_data, type=int) == 8
    _deliver(new, out["new"])
    assert new.group_format == 0 and new.assignment == 8 and new.refused is None
    assert sorted(out["old"].partitions()) == [(TOPIC, 0), (TOPIC, 1)]  # sticky across releases


def test_the_previous_release_reads_a_new_members_userdata():
    new = StickyAssignor()
    new.held, new.assignment = [(TOPIC, 2)], 5
    metadata = new.metadata([TOPIC])
    assert msgspec.msgpack.decode(metadata.user_data, type=_PreviousMetadata) == _PreviousMetadata([(TOPIC, 2)], 5)


def test_an_assignment_from_a_leader_of_the_previous_release_means_format_0():
    member = StickyAssignor()
    member.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPIC, [3])], msgspec.msgpack.encode(4)))
    assert (member.assignment, member.group_format, member.refused) == (4, 0, None)
    assert read_assignment_userdata(b"\xc1") == (-1, 0)  # neither form


def test_a_member_that_cannot_write_the_groups_format_is_refused_with_a_line_that_says_why():
    future = StickyAssignor(format=FORMAT + 1, oldest_format=FORMAT + 1)  # a release past this one
    ours = StickyAssignor()
    out = _assign(ours, {"ours": ours.metadata([TOPIC]), "future": future.metadata([TOPIC])})
    _deliver(future, out["future"])
    assert future.group_format == FORMAT
    assert isinstance(future.refused, FormatRefused)
    assert f"format {FORMAT}" in str(future.refused) and "docs/operations.md" in str(future.refused)
    _deliver(ours, out["ours"])
    assert ours.refused is None


@pytest.mark.parametrize(("formats", "group"), [((), FORMAT), ((1, 1), 1), ((1, 0, 1), 0), ((2, 1), 1)])
def test_the_group_format_is_the_oldest_any_member_speaks(formats, group):
    assert group_format(formats) == group


def test_this_release_writes_the_previous_format():
    assert OLDEST_FORMAT <= 0 < FORMAT
    assert refusal(0) is None and refusal(OLDEST_FORMAT - 1) is not None


def test_a_route_says_its_groups_format_and_stops_the_output_when_refused(caplog):
    """The route reads its group's format after each assignment: a change is one INFO line
    (a rolling upgrade's progress); a format it cannot write fails the output (nothing is
    written; the worker stops with the refusal as its reason) and takes no partition."""
    from .support.fake_kafka import FakeLogs, FakeStages, R, fake_driver

    logs = FakeLogs()
    driver = fake_driver(logs, FakeStages(logs))
    (route,) = (r for r in driver.routes if r.topic == R)
    route.assignor.group_format = 0
    with caplog.at_level("INFO", logger="specmeter.worker"):
        assert route.group_format_refused() is False
        assert route.group_format_refused() is False  # said once, not at every assignment
    said = [r.getMessage() for r in caplog.records if "the group writes format" in r.getMessage()]
    assert said == [f"{R}: the group writes format 0 (this release writes {OLDEST_FORMAT} to {FORMAT})"]
    assert driver.writes.output.failed is None
    route.assignor.refused = refusal(0, oldest=1)
    assert route.group_format_refused() is True
    assert isinstance(driver.writes.output.failed, FormatRefused)


class _PreviousTakeover(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """A takeover record as the release before formats decodes it (37714f1, ``core.ownership``)."""

    token: str
    owner: str = ""
    at_ms: int = 0
    generation: int = -1


def test_takeover_records_carry_the_format_and_the_previous_release_still_reads_them():
    from specmeter.streams.core.ownership import Takeover, encode_takeover, takeover_of

    written = Takeover(token="t", owner="w:1", at_ms=5, generation=3, format=FORMAT)
    assert msgspec.msgpack.decode(encode_takeover(written), type=_PreviousTakeover) == _PreviousTakeover(
        token="t", owner="w:1", at_ms=5, generation=3
    )
    previous = msgspec.msgpack.encode(_PreviousTakeover(token="t", at_ms=5, generation=3))
    assert takeover_of(previous) == Takeover(token="t", at_ms=5, generation=3, format=0)
