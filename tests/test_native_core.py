"""The native stage-1 core against the Python reference (issue #14), on random streams.

Both cores are fed the same messages (raw bytes, through each core's decoder and
``add_decoded``, cut into slices as the open-generation limit cuts them), invalid
records, markers and algorithms, with deltas taken at random points. They must give
identical partials (the legacy ratio sums compared by exact value), and the deltas
of either must rebuild, in either core, the state they were taken from -- also
after a restore that goes on journaling.
"""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, encode_records_message
from specmeter.streams.core import cores
from specmeter.streams.core.layout import decode_delta

from .test_core_properties import _canonical
from .test_core_properties import _shaped as _shaped_dict

pytestmark = pytest.mark.skipif(cores.NATIVE is None, reason="the native core is not built or is switched off")

PY, NATIVE = cores.PYTHON, cores.NATIVE

counter = st.one_of(
    st.none(), st.integers(0, 5), st.sampled_from([2**20 - 2, 2**20 - 1, 2**24 - 2, 2**24 - 1, 2**31, 2**32 - 1])
)
record = st.builds(
    GenerationRecord,
    task=st.one_of(st.none(), st.none(), st.sampled_from(["gsm8k", "chat"])),
    draft_lag=st.one_of(st.none(), st.none(), st.sampled_from([0, 2, 10, 2**32 - 1])),
    batch_id=st.just("b"),
    session_id=st.sampled_from(["s1", "s2", "s3"]),
    generation_id=st.sampled_from(["g1", "g2", "g3", "g4"]),
    sample_id=st.one_of(st.none(), st.sampled_from(["t1", "t2"])),
    state_hash=st.one_of(st.none(), st.none(), st.just("h1")),
    accepted=counter,
    proposed=counter,
    verify=counter,
    completion=counter,
    accept_histogram=st.one_of(st.none(), st.none(), st.lists(st.integers(0, 3), max_size=3), st.just([2**32 - 1] * 2)),
    producer_id=st.one_of(st.none(), st.sampled_from(["p0", "p1"])),
    weight_version=st.one_of(st.none(), st.sampled_from(["v1", "v2", "v10"])),
)


def _shaped(r: GenerationRecord, shape: str) -> GenerationRecord:
    """``test_core_properties._shaped`` on a record: a histogram that agrees with its
    counters or contradicts one (SPEC §3.5), or the random counters as they are."""
    out = _shaped_dict(msgspec.structs.asdict(r), shape)
    return r if max(out["verify"] or 0, out["accepted"] or 0) > 2**32 - 1 else GenerationRecord(**out)


record = st.builds(_shaped, record, st.sampled_from(["as-is", "consistent", "verify off", "accepted off"]))
message = st.tuples(
    st.just("message"),
    st.lists(record, min_size=1, max_size=6),
    st.one_of(st.none(), st.sampled_from(["p0", "p9"])),
    st.booleans(),
    st.integers(0, 6),
)
invalid = st.tuples(st.just("invalid"), st.one_of(st.none(), st.sampled_from(["p0", "p2"])), st.booleans())
marker = st.tuples(
    st.just("marker"),
    st.builds(
        BatchMarker,
        batch_id=st.just("b"),
        producer_id=st.sampled_from(["p0", "p1"]),
        records_sent=st.integers(0, 9),
        speculative_algorithm=st.one_of(st.none(), st.just("EAGLE")),
        expected_producers=st.integers(1, 2),
    ),
)
algorithm = st.tuples(st.just("algorithm"), st.sampled_from(["", "NGRAM"]))
delta = st.tuples(st.just("delta"))
operations = st.lists(st.one_of(message, message, message, invalid, marker, algorithm, delta), max_size=25)


def _apply(core, state, op, offset) -> tuple[int, int, int] | None:
    kind = op[0]
    if kind == "message":
        _, records, producer, late, cut = op
        single = len(records) == 1 and producer is None
        data = encode_records_message(records[0] if single else RecordBatch(records=records, producer_id=producer))
        decoded = core.decode(data)
        counts = [0, 0, 0]
        for group, (key, n) in enumerate(decoded.groups):
            assert key == (None, "b")
            bounds = sorted({0, n, min(cut, n)})  # a slice boundary, as the open-generation limit makes one
            for start, stop in itertools.pairwise(bounds):
                got = state.add_decoded(decoded, group, start, stop, late=late, producer_id=decoded.producer_id)
                counts = [a + b for a, b in zip(counts, got, strict=True)]
        return tuple(counts)
    if kind == "invalid":
        state.add_invalid(op[1], late=op[2])
    elif kind == "marker":
        state.add_marker(op[1])
    elif kind == "algorithm":
        state.add_algorithm(op[1])
    return None


def _run(core, ops, state=None, first_offset=0):
    """Feed ``ops`` to a journaled state; returns it, the encoded deltas and the counts."""
    if state is None:
        state = core.BatchState("b")
        state.start_journal()
    deltas, counts = [], []
    start = first_offset
    for offset, op in enumerate(ops, start=first_offset):
        if op[0] == "delta":
            encoded = state.take_delta_encoded(first_offset=start, last_offset=offset, last_input_ms=offset)
            if encoded is not None:
                deltas.append(encoded)
            start = offset + 1
        else:
            counts.append(_apply(core, state, op, offset))
    end = first_offset + len(ops)
    encoded = state.take_delta_encoded(first_offset=start, last_offset=end, last_input_ms=end)
    if encoded is not None:
        deltas.append(encoded)
    return state, deltas, counts


def _restore(core, deltas):
    state = core.BatchState("b")
    state.start_journal()  # as stage 1 does: restored, then journaling on
    for encoded in deltas:
        state.apply_delta(decode_delta(encoded))
    return state


def _same(a, b) -> None:
    assert _canonical(a.partial()) == _canonical(b.partial())
    for name in (
        "record_count",
        "invalid_record_count",
        "late_record_count",
        "conflicting_record_count",
        "generation_count",
        "expected_producers",
        "markers_complete",
    ):
        assert getattr(a, name) == getattr(b, name), name


@settings(max_examples=300, deadline=None)
@given(operations)
def test_native_and_python_give_identical_partials_and_counts(ops):
    py, py_deltas, py_counts = _run(PY, ops)
    native, native_deltas, native_counts = _run(NATIVE, ops)
    assert native_counts == py_counts
    _same(native, py)
    assert len(native_deltas) == len(py_deltas)  # a delta exactly when something changed


@settings(max_examples=300, deadline=None)
@given(operations)
def test_deltas_of_either_core_restore_in_either(ops):
    py, py_deltas, _ = _run(PY, ops)
    _native, native_deltas, _ = _run(NATIVE, ops)
    for deltas in (py_deltas, native_deltas):
        for core in (PY, NATIVE):
            _same(_restore(core, deltas), py)


@settings(max_examples=200, deadline=None)
@given(operations, operations)
def test_a_restored_state_goes_on_journaling_in_either_core(before, after):
    """Restore (from the other core's deltas), apply more input, take deltas again:
    everything written restores the whole stream's state."""
    _, py_deltas, _ = _run(PY, before)
    _, native_deltas, _ = _run(NATIVE, before)
    reference, _, _ = _run(PY, before + after)
    for deltas, core in ((py_deltas, NATIVE), (native_deltas, PY), (native_deltas, NATIVE)):
        state = _restore(core, deltas)
        state, more, _ = _run(core, after, state, first_offset=len(before) + 1)
        _same(state, reference)
        for other in (PY, NATIVE):
            _same(_restore(other, deltas + more), reference)


@settings(max_examples=200, deadline=None)
@given(operations, operations)
def test_native_deltas_are_batch_deltas(before, last):
    """What the native core encodes is the durable struct itself: ``take_delta`` and
    ``take_delta_encoded`` of the same state are the same ``BatchDelta``."""
    a, _, _ = _run(NATIVE, before)
    b, _, _ = _run(NATIVE, before)
    for op in last:
        if op[0] != "delta":
            _apply(NATIVE, a, op, 0)
            _apply(NATIVE, b, op, 0)
    obj = a.take_delta(first_offset=1, last_offset=2, last_input_ms=3)
    encoded = b.take_delta_encoded(first_offset=1, last_offset=2, last_input_ms=3)
    assert (obj is None) == (encoded is None)
    if obj is not None:
        assert decode_delta(encoded) == obj
        assert obj.first_offset == 1 and obj.last_offset == 2 and obj.last_input_ms == 3 and obj.batch_id == "b"


def test_the_packed_form_of_a_new_entry_restores_in_python():
    """A generation first seen since the last delta, with one occurrence and small
    counters, is written by the native core in the packed delta layout (20/20/20/24
    bits), which the Python core restores."""
    state = NATIVE.BatchState("b")
    state.start_journal()
    state.add(
        GenerationRecord(
            batch_id="b",
            session_id="s",
            generation_id="g",
            sample_id="t",
            accepted=2**20 - 2,
            completion=2**24 - 2,
            weight_version="v1",
        )
    )
    state.add(GenerationRecord(batch_id="b", session_id="s", generation_id="h", accepted=2**20 - 1))
    delta = state.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    assert delta.packed_versioned[:3] == ["s", "g", "t"] and delta.packed_versioned[5] == "v1"
    assert [tuple(e[:2]) for e in delta.entries] == [("s", "h")]  # 2**20 - 1 does not fit: the wide form
    restored = PY.BatchState("b")
    restored.apply_delta(delta)
    _same(restored, state)


def test_a_new_entry_with_a_task_is_written_wide_and_restores_in_python():
    """The packed forms hold no task: an entry that names one is written wide, its task
    the eleventh item (after the weight version, None here); one without stays packed."""
    state = NATIVE.BatchState("b")
    state.start_journal()
    state.add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=1, task="gsm8k"))
    state.add(GenerationRecord(batch_id="b", session_id="s", generation_id="h", accepted=1, weight_version="v1"))
    state.add(
        GenerationRecord(batch_id="b", session_id="s", generation_id="i", accepted=1, task="chat", weight_version="v1")
    )
    delta = state.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    assert [(e[1], e[9], e[10]) for e in delta.entries] == [("g", None, "gsm8k"), ("i", "v1", "chat")]
    assert delta.packed_versioned[:2] == ["s", "h"] and not delta.packed
    restored = PY.BatchState("b")
    restored.apply_delta(delta)
    _same(restored, state)
    assert [(e.key, e.unique_generation_count) for e in restored.partial().tasks] == [
        ("chat", 1),
        ("gsm8k", 1),
        (None, 1),
    ]


def test_a_new_entry_with_a_draft_lag_is_written_wide_in_twelve_items_and_restores_in_python():
    """Revision 5: the packed forms hold no lag either: an entry that names one is written
    wide, its lag the twelfth item (its task the eleventh, None when it has none); the two
    cores agree on the partial, per-lag sums and spread included."""
    state = NATIVE.BatchState("b")
    state.start_journal()
    add = state.add
    add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=1, draft_lag=10))
    add(GenerationRecord(batch_id="b", session_id="s", generation_id="h", accepted=1, weight_version="v1"))
    add(
        GenerationRecord(
            batch_id="b", session_id="s", generation_id="i", verify=2, completion=5, task="chat", draft_lag=2
        )
    )
    add(GenerationRecord(batch_id="b", session_id="s", generation_id="j", accepted=1, task="chat"))
    delta = state.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    assert sorted((e[1], len(e), e[9:]) for e in delta.entries) == [
        ("g", 12, (None, None, 10)),
        ("i", 12, (None, "chat", 2)),
        ("j", 11, (None, "chat")),
    ]
    restored = PY.BatchState("b")
    restored.apply_delta(delta)
    _same(restored, state)
    partial = restored.partial()
    assert [(e.key, e.unique_generation_count) for e in partial.draft_lags] == [(2, 1), (10, 1), (None, 2)]
    assert partial.tokens_per_verify_distribution == [0] * 6 + [1] + [0] * 57
    add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=1, draft_lag=11))  # a conflict
    assert state.partial().conflicting_generation_count == 1
    assert [e.key for e in state.partial().draft_lags] == [2, None]


def test_journal_must_be_started():
    for core in (PY, NATIVE):
        with pytest.raises(RuntimeError, match="start_journal"):
            core.BatchState("b").take_delta_encoded(first_offset=0, last_offset=0, last_input_ms=0)


def test_counters_past_32_bits_from_an_old_changelog_restore_exactly():
    """Before the limits, a counter could be any 64-bit value: the native core keeps it."""
    live = PY.BatchState("b")
    live.start_journal()
    big = 2**63 + 5
    live.add(
        GenerationRecord(
            batch_id="b", session_id="s", generation_id="g", accepted=big, proposed=big + 1, accept_histogram=[big]
        )
    )
    delta = live.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    native = NATIVE.BatchState("b")
    native.apply_delta(delta)
    _same(native, live)
    assert native.partial().accepted_total == big and native.partial().accept_histogram == [big]


def test_legacy_ratios_are_correctly_rounded_past_2_to_the_53():
    """Python's int / int rounds once, however large the ints; so must the native core."""
    state, reference = NATIVE.BatchState("b"), PY.BatchState("b")
    for i in range(3):
        for s in (state, reference):
            s.add(
                GenerationRecord(
                    batch_id="b",
                    session_id="s",
                    generation_id=f"g{i}",
                    sample_id="t",
                    accepted=2**32 - 1 - i,
                    proposed=2**32 - 1,
                    completion=2**32 - 3,
                    verify=3,
                )
            )
    huge = PY.BatchState("b")  # a counter past 2**53 from an old changelog
    delta_source = PY.BatchState("b")
    delta_source.start_journal()
    delta_source.add(GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=2**62 + 1, proposed=3))
    huge_native = NATIVE.BatchState("b")
    d = delta_source.take_delta(first_offset=0, last_offset=0, last_input_ms=0)
    huge.apply_delta(d)
    huge_native.apply_delta(d)
    _same(state, reference)
    _same(huge_native, huge)
    assert huge_native.partial().accept_ratio_parts == [(2**62 + 1) / 3]
