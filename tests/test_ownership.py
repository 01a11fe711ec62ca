"""Which records of a changelog partition count (``core.ownership``), and the sticky assignment
(``delivery.assignor``): pure, no broker. Issue 30: a worker that lost a partition may still write
it; what it writes after the new owner's takeover never counts."""

from __future__ import annotations

import random

import pytest

from specmeter.streams.core.ownership import (
    CLOCK_SKEW_MS,
    ChangelogView,
    Confirmation,
    Takeover,
    confirmation_key,
    counts_after,
    encode_confirmation,
    encode_takeover,
    owner_key_part,
    split_key,
    takeover_key,
    takeover_of,
)
from specmeter.streams.delivery.assignor import Member, sticky_assignment


def _key(owner: int | None, kind: str, name: str = "b") -> bytes:
    return f"{owner_key_part(0, owner)}\x1f{kind}\x1f{name}".encode()


class Log:
    """A changelog partition: records appended at consecutive offsets."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, bytes | None]] = []

    def append(self, key: bytes, value: bytes | None) -> int:
        offset = len(self.records)
        self.records.append((offset, key, value))
        return offset

    def take_over(self, token: str) -> int:
        return self.append(takeover_key(0, token), encode_takeover(Takeover(token=token)))

    def view(self) -> ChangelogView:
        view = ChangelogView()
        for offset, key, value in self.records:
            view.add(offset, key, value)
        return view

    def compacted(self) -> Log:
        """What compaction keeps: the latest record per key, tombstones dropped."""
        latest = {key: (offset, value) for offset, key, value in self.records}
        out = Log()
        out.records = sorted((o, k, v) for k, (o, v) in latest.items() if v is not None)
        return out


def test_keys_carry_their_owner_and_split_back():
    assert owner_key_part(3, None) == "3" and owner_key_part(3, 1234) == "3@1234"
    assert split_key(b"3@1234\x1fs\x1fb") == (b"3\x1fs\x1fb", 1234)
    assert split_key(b"3\x1fs\x1fb") == (b"3\x1fs\x1fb", None)
    assert takeover_of(encode_takeover(Takeover(token="t", owner="w:1", at_ms=5))) == Takeover(
        token="t", owner="w:1", at_ms=5
    )
    assert takeover_of(b"not a takeover") is None


def test_a_stale_owner_s_writes_after_the_takeover_never_count():
    log = Log()
    log.append(_key(None, "c", ""), b"legacy")  # before any takeover: counts
    a = log.take_over("a")
    log.append(_key(a, "d", "1"), b"a1")
    log.append(_key(a, "c", ""), b"a-checkpoint-1")
    b = log.take_over("b")
    log.append(_key(a, "d", "2"), b"a2-late")  # A woke up: its writes land after B's takeover
    log.append(_key(a, "c", ""), b"a-checkpoint-2-late")
    log.append(_key(b, "c", ""), b"b-checkpoint")
    state = log.view().result()
    values = dict(state.entries)
    assert values == {_key(a, "d", "1"): b"a1", _key(b, "c", ""): b"b-checkpoint"}
    assert state.epoch == b
    # the late writes and the superseded checkpoints are deleted by the restore
    assert set(state.deletions) == {_key(a, "d", "2"), _key(a, "c", ""), _key(None, "c", "")}
    # A's takeover is kept while a record of A's is held (it makes that record count)


def test_the_takeover_that_a_held_record_needs_is_kept():
    log = Log()
    a = log.take_over("a")
    log.append(_key(a, "d", "1"), b"a1")
    log.take_over("b")
    deleted = set(log.view().result().deletions)
    assert takeover_key(0, "a") not in deleted and takeover_key(0, "b") not in deleted


def test_the_valid_state_survives_compaction_whatever_a_stale_owner_wrote():
    """Keys of different owners never collide: compaction cannot replace a valid value with a
    late one, so the compacted log gives the same state as the whole one."""
    rng = random.Random(7)
    for _ in range(200):
        log, owners = Log(), [None]
        for _ in range(rng.randint(1, 40)):
            roll = rng.random()
            if roll < 0.1:
                owners.append(log.take_over(f"t{len(owners)}"))
            elif roll < 0.2:
                log.append(_key(rng.choice(owners), rng.choice("dcs"), str(rng.randint(0, 3))), None)
            else:
                log.append(
                    _key(rng.choice(owners), rng.choice("dcs"), str(rng.randint(0, 3))), str(rng.random()).encode()
                )
        whole, compacted = log.view().result(), log.compacted().view().result()
        assert whole.entries == compacted.entries
        for physical, _ in whole.entries:  # only the latest owner up to its offset writes what counts
            assert split_key(physical)[1] in owners


def test_a_restore_that_deletes_what_it_was_told_leaves_the_same_state():
    log = Log()
    a = log.take_over("a")
    for i in range(5):
        log.append(_key(a, "d", str(i)), b"x")
    b = log.take_over("b")
    log.append(_key(a, "d", "9"), b"late")
    first = log.view().result()
    for key in first.deletions:
        log.append(key, None)
    log.append(_key(b, "c", ""), b"b")
    again = log.view().result()
    assert dict(again.entries) == {**dict(first.entries), _key(b, "c", ""): b"b"}
    assert not [k for k in again.deletions if k != takeover_key(0, "a") and split_key(k)[1] != a]


# -- confirmations (issue 43) ----------------------------------------------------------------------------
def _take(log: Log, token: str, generation: int = -1, at_ms: int = 0) -> int:
    """A takeover and its owner's confirmation naming its epoch, as ``OwnedWrites.take_over`` writes them."""
    takeover = Takeover(token=token, at_ms=at_ms, generation=generation)
    epoch = log.append(takeover_key(0, token), encode_takeover(takeover))
    _confirm(log, token, epoch, generation, at_ms)
    return epoch


def _confirm(log: Log, token: str, epoch: int, generation: int, at_ms: int) -> int:
    confirmation = Confirmation(token=token, epoch=epoch, at_ms=at_ms, generation=generation)
    return log.append(confirmation_key(0, f"{token}-{len(log.records)}"), encode_confirmation(confirmation))


def test_a_kept_owners_confirmation_makes_an_older_rebalances_takeover_a_stray():
    log = Log()
    b = _take(log, "b", generation=7, at_ms=1_000)
    log.append(_key(b, "c", ""), b"b1")
    _confirm(log, "b", b, generation=11, at_ms=5_000)  # kept through the rebalance of generation 11
    log.append(takeover_key(0, "a"), encode_takeover(Takeover(token="a", generation=10, at_ms=4_000)))
    log.append(_key(b, "c", ""), b"b2")
    state = log.view().result()
    assert state.epoch == b and dict(state.entries) == {_key(b, "c", ""): b"b2"}
    assert takeover_key(0, "a") in state.deletions
    assert state.counting is not None and state.counting.generation == 11


def test_a_confirmation_of_a_takeover_that_did_not_come_first_confirms_nothing():
    log = Log()
    b = _take(log, "b", generation=7, at_ms=1_000)
    a = _take(log, "a", generation=10, at_ms=4_000)  # landed before B's confirmation: it counts
    _confirm(log, "b", b, generation=11, at_ms=5_000)
    log.append(_key(b, "c", ""), b"late")
    state = log.view().result()
    assert state.epoch == a and state.entries == [] and _key(b, "c", "") in state.deletions


def test_a_takeover_appended_twice_keeps_its_epoch_whichever_copy_compaction_keeps():
    log = Log()
    x = _take(log, "x", generation=3, at_ms=1_000)
    log.append(_key(x, "c", ""), b"x1")
    log.append(*log.records[x][1:])  # the second copy of the takeover record
    log.append(_key(x, "d", "1"), b"d1")
    whole, compacted = log.view().result(), log.compacted().view().result()
    assert whole.epoch == compacted.epoch == x
    assert whole.entries == compacted.entries == [(_key(x, "c", ""), b"x1"), (_key(x, "d", "1"), b"d1")]


def test_an_old_groups_takeover_confirmed_past_the_bound_before_the_counting_one_is_a_stray():
    log = Log()
    _take(log, "old", generation=39, at_ms=1_000)
    new = _take(log, "new", generation=1, at_ms=2_000 + CLOCK_SKEW_MS)  # the group started again
    log.append(takeover_key(0, "late"), encode_takeover(Takeover(token="late", generation=39, at_ms=900)))
    log.append(_key(new, "c", ""), b"n")
    state = log.view().result()
    assert state.epoch == new and dict(state.entries) == {_key(new, "c", ""): b"n"}


def test_a_takeover_of_the_same_generation_by_another_member_waits_for_the_bound():
    """Simulation seed 8811: a member of generation 1 appends its takeover and freezes; the
    group starts again (generations from 1) and another member takes over, as generation 1
    too. Counted after the first, its records were lost once a second copy of the first
    landed after it and compaction dropped the first copy (the copy judged where it
    landed). The same generation by another member counts only past the bound; the owner
    asks again then (``routes._ask_again``), and no copy of the first counts after that."""
    log = Log()
    stale = Takeover(token="stale", generation=1, at_ms=1_000, member="w1-0")
    first = log.append(takeover_key(0, "stale"), encode_takeover(stale))  # its owner froze: no confirmation
    early = Takeover(token="early", generation=1, at_ms=3_000, member="w0-5")
    e = log.append(takeover_key(0, "early"), encode_takeover(early))
    log.append(confirmation_key(0, "early-r"), encode_confirmation(_confirmation(early, e)))
    assert log.view().result().epoch == first, "another member's generation 1, within the bound: it does not count"
    again = Takeover(token="again", generation=1, at_ms=3_000 + CLOCK_SKEW_MS, member="w0-5")
    new = log.append(takeover_key(0, "again"), encode_takeover(again))
    log.append(confirmation_key(0, "again-r"), encode_confirmation(_confirmation(again, new)))
    log.append(_key(new, "c", ""), b"n")
    log.append(takeover_key(0, "stale"), encode_takeover(stale))  # the second copy, after
    whole, compacted = log.view().result(), log.compacted().view().result()
    assert whole.epoch == compacted.epoch == new
    assert dict(whole.entries) == dict(compacted.entries) == {_key(new, "c", ""): b"n"}


def _restored_past_an_unconfirmed_takeover(*, pins: bool) -> tuple[Log, int]:
    """A changelog where the new owner counted only after an unconfirmed takeover: T0 holds
    the state (checkpoint 7); T1, the same member's own takeover of T0's generation,
    confirmed earlier and frozen in flight, lands after it and counts (its own again); T2,
    a restarted group's generation 1 confirmed more than the bound after T1 but within it
    of T0, counts after T1 (not after T0: ``counts_after`` is not transitive). T2's restore
    writes its checkpoint under its own tag, ``pins`` when asked, and deletes T0's
    checkpoint; T2 then releases checkpoint 9. Returns the log and T2's epoch."""
    log = Log()
    t0 = Takeover(token="t0", generation=5, at_ms=100_000, member="m")
    e0 = log.append(takeover_key(0, "t0"), encode_takeover(t0))
    log.append(confirmation_key(0, "t0-r"), encode_confirmation(_confirmation(t0, e0)))
    log.append(_key(e0, "c", ""), b"7")
    t1 = Takeover(token="t1", generation=5, at_ms=50_000, member="m")
    log.append(takeover_key(0, "t1"), encode_takeover(t1))  # no confirmation: its round ended
    t2 = Takeover(token="t2", generation=1, at_ms=120_000, member="n")
    e2 = log.append(takeover_key(0, "t2"), encode_takeover(t2))
    log.append(confirmation_key(0, "t2-r"), encode_confirmation(_confirmation(t2, e2)))
    valid = log.view().result()
    assert valid.epoch == e2 and dict(valid.entries) == {_key(e0, "c", ""): b"7"}
    log.append(_key(e2, "c", "").replace(b"@%d" % e2, b"@%d.0" % e2), b"7")  # the restore's checkpoint
    for key, value in valid.pins if pins else []:
        log.append(key, value)
    for key in [*valid.deletions, _key(e0, "c", "")]:  # T0's checkpoint: superseded once verified
        log.append(key, None)
    log.append(_key(e2, "c", "").replace(b"@%d" % e2, b"@%d.1" % e2), b"9")  # released
    return log, e2


def test_a_restore_holds_the_unconfirmed_takeover_it_counted_after_where_it_landed():
    """Review of the simulation's finding at seed 1,121,455: the restore deletes the strays
    but keeps a counting takeover whose records are gone and which no valid record needs
    yet, if it comes after the oldest one that is. Its owner never confirmed it, so it sits
    at its first copy; a second copy landing later, the first compacted away, moved it, T2
    was judged against T0 and stopped counting, and checkpoint 9, released, was lost. The
    restore writes a confirmation that holds it where it landed (``ValidState.pins``)."""
    for pins, epoch_after in ((True, "kept"), (False, "lost")):
        log, e2 = _restored_past_an_unconfirmed_takeover(pins=pins)
        log.append(takeover_key(0, "t1"), encode_takeover(Takeover(token="t1", generation=5, at_ms=50_000, member="m")))
        after = log.compacted().view().result()
        checkpoint = dict(after.entries).get(_key(e2, "c", "").replace(b"@%d" % e2, b"@%d.1" % e2))
        if epoch_after == "kept":
            assert after.epoch == e2 and checkpoint == b"9", "the released checkpoint must still count"
        else:  # without the pin the hazard is real: what T2 released stops counting
            assert after.epoch != e2 and checkpoint is None


def _confirmation(takeover: Takeover, epoch: int) -> Confirmation:
    return Confirmation(
        token=takeover.token,
        epoch=epoch,
        at_ms=takeover.at_ms,
        generation=takeover.generation,
        member=takeover.member,
    )


def test_the_same_generation_counts_again_for_the_same_member_and_past_the_bound_for_another():
    before = Takeover(token="a", generation=4, at_ms=10_000, member="m1")
    assert counts_after(Takeover(token="b", generation=4, at_ms=11_000, member="m1"), before)  # its own, again
    assert not counts_after(Takeover(token="c", generation=4, at_ms=11_000, member="m2"), before)
    assert counts_after(Takeover(token="d", generation=4, at_ms=11_000 + CLOCK_SKEW_MS, member="m2"), before)
    assert counts_after(Takeover(token="e", generation=4, at_ms=11_000), before)  # no member said: as before
    assert counts_after(Takeover(token="f", generation=5, at_ms=11_000, member="m2"), before)


@pytest.mark.parametrize("seed", range(100))
def test_the_valid_state_survives_compaction_with_confirmations_and_copies(seed):
    """Takeovers with their confirmations, kept owners confirming newer generations,
    takeover records appended twice, stale owners writing late: the compacted log gives
    the same state as the whole one."""
    rng = random.Random(seed)
    log, owners, clock = Log(), [None], 1_000
    for _ in range(rng.randint(1, 50)):
        roll, clock = rng.random(), clock + rng.randint(0, 30)
        if roll < 0.1:
            token = f"t{len(owners)}"
            owners.append(_take(log, token, generation=rng.randint(0, 5), at_ms=clock))
        elif roll < 0.15 and len(owners) > 1:
            i = rng.randrange(1, len(owners))
            _confirm(log, f"t{i}", owners[i], generation=rng.randint(0, 6), at_ms=clock)
        elif roll < 0.2 and len(owners) > 1:
            log.append(*log.records[owners[rng.randrange(1, len(owners))]][1:])  # a second copy
        else:
            value = None if roll < 0.3 else str(rng.random()).encode()
            log.append(_key(rng.choice(owners), rng.choice("dcs"), str(rng.randint(0, 3))), value)
    whole, compacted = log.view().result(), log.compacted().view().result()
    assert whole.entries == compacted.entries and whole.epoch == compacted.epoch


# -- the sticky assignment ------------------------------------------------------------------------------
T = "records"


def _members(held: dict[str, list[int]], assignments: dict[str, int] | None = None) -> dict[str, Member]:
    assignments = assignments or {}
    return {m: Member(frozenset({T}), tuple((T, p) for p in ps), assignments.get(m, 0)) for m, ps in held.items()}


def _moves(before: dict[str, list[int]], after: dict[str, list[tuple[str, int]]]) -> int:
    owner = {p: m for m, ps in before.items() for p in ps}
    return sum(1 for m, ps in after.items() for _, p in ps if owner.get(p) != m)


def test_a_fourth_worker_takes_one_partition_from_each_of_three():
    held = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7], "c": [8, 9, 10, 11], "d": []}
    out = sticky_assignment([(T, p) for p in range(12)], _members(held))
    assert sorted(len(v) for v in out.values()) == [3, 3, 3, 3]
    assert _moves(held, out) == 3
    assert all(set(out[m]) <= {(T, p) for p in held[m]} for m in "abc")


def test_a_worker_leaving_moves_only_its_own_partitions():
    held = {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7, 8]}  # d held 9, 10, 11 and left
    out = sticky_assignment([(T, p) for p in range(12)], _members(held))
    assert sorted(len(v) for v in out.values()) == [4, 4, 4]
    assert _moves(held, out) == 3  # 9, 10, 11: d's, and nothing else


def test_a_partition_two_members_hold_goes_to_the_newer_assignment():
    """A worker frozen past its session wakes up holding what moved meanwhile."""
    held = {"zombie": [0, 1, 2, 3], "new": [2, 3]}
    out = sticky_assignment([(T, p) for p in range(4)], _members(held, {"zombie": 3, "new": 5}))
    assert out["new"] == [(T, 2), (T, 3)]  # the newer assignment keeps what it holds
    assert out["zombie"] == [(T, 0), (T, 1)]
    older = sticky_assignment([(T, p) for p in range(4)], _members(held, {"zombie": 5, "new": 3}))
    assert len(older["zombie"]) == 2 and len(older["new"]) == 2  # balanced either way


@pytest.mark.parametrize("seed", range(50))
def test_every_partition_is_assigned_once_and_shares_differ_by_one_at_most(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 24)
    members = [f"m{i}" for i in range(rng.randint(1, 6))]
    held = {m: rng.sample(range(n + 3), rng.randint(0, n)) for m in members}  # some gone, some double
    out = sticky_assignment([(T, p) for p in range(n)], _members(held, {m: rng.randint(0, 3) for m in members}))
    assigned = [tp for tps in out.values() for tp in tps]
    assert sorted(assigned) == [(T, p) for p in range(n)]
    sizes = [len(v) for v in out.values()]
    assert max(sizes) - min(sizes) <= 1
