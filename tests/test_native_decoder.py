"""The native records decoder (streams/core/native, issue #14) against msgspec's.

Whatever the input, a message the native decoder accepts decodes to exactly what
the Python path decodes (tests/support/native_check.py); every clean record or packed batch
is accepted (the hot path is really taken); anything it is not sure of goes to
Python, so dead-letter reasons stay as precise as msgspec's.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import (
    MAX_BINS,
    MAX_COUNTER,
    MAX_ID,
    BatchMarker,
    GenerationRecord,
    RecordBatch,
    encode_records_message,
)

from .support.native_check import FIELDS, _native, native_agrees

pytestmark = pytest.mark.skipif(
    _native is None, reason="the native core is not built (no Rust toolchain, or SPECMETER_NO_NATIVE=1)"
)

ids = st.one_of(
    st.sampled_from(["s1", "s2", "g", "t1", "v1", "é", "日本", "x" * MAX_ID, "é" * MAX_ID]),
    st.text(min_size=1, max_size=12),
)
counters = st.one_of(
    st.none(), st.integers(0, 300), st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, 2**31, MAX_COUNTER])
)
records = st.builds(
    GenerationRecord,
    batch_id=st.sampled_from(["b", "c", "step-1"]),
    session_id=ids,
    generation_id=ids,
    sample_id=st.one_of(st.none(), ids),
    state_hash=st.one_of(st.none(), ids),
    accepted=counters,
    proposed=counters,
    verify=counters,
    completion=counters,
    accept_histogram=st.one_of(st.none(), st.lists(st.integers(0, MAX_COUNTER), max_size=4), st.just([1] * MAX_BINS)),
    producer_id=st.one_of(st.none(), st.sampled_from(["p0", "p1"])),
    weight_version=st.one_of(st.none(), ids),
    run_id=st.one_of(st.none(), st.sampled_from(["r1", "r2"])),
    task=st.one_of(st.none(), ids),
    draft_lag=counters,
)
batches = st.builds(
    RecordBatch,
    records=st.lists(records, max_size=8),
    producer_id=st.one_of(st.none(), st.sampled_from(["p0", "p9"])),
    run_id=st.one_of(st.none(), st.sampled_from(["r1", "r2"])),
)


@settings(max_examples=400, deadline=None)
@given(records)
def test_every_valid_record_is_taken_natively_and_agrees(record):
    assert native_agrees(encode_records_message(record))


@settings(max_examples=300, deadline=None)
@given(batches)
def test_every_valid_batch_is_taken_natively_and_agrees(batch):
    data = encode_records_message(batch)
    other_run = batch.run_id is not None and any(r.run_id not in (None, batch.run_id) for r in batch.records)
    # a record naming another run than its envelope is invalid: Python names it
    assert native_agrees(data) is not other_run


def _map(pairs: list[tuple[object, object]]) -> bytes:
    """A msgpack map from pairs, in order, duplicates kept."""
    out = bytearray(b"\xdf" + len(pairs).to_bytes(4, "big"))
    for key, value in pairs:
        out += msgspec.msgpack.encode(key) + msgspec.msgpack.encode(value)
    return bytes(out)


RECORD = [("type", "record"), ("batch_id", "b"), ("session_id", "s"), ("generation_id", "g")]


@pytest.mark.parametrize(
    "data",
    [
        _map([*RECORD, ("batch_id", "other")]),  # duplicate key: msgspec keeps the last, native hands over
        _map([*RECORD, ("type", "record")]),
        _map([*RECORD, ("unknown", 1)]),  # msgspec ignores unknown fields; native is not sure, hands over
        _map([*RECORD, ("accepted", 5.0)]),
        _map([*RECORD, ("accepted", True)]),
        _map([*RECORD, ("accepted", -1)]),
        _map([*RECORD, ("accepted", MAX_COUNTER + 1)]),
        _map([*RECORD, ("accept_histogram", [1] * (MAX_BINS + 1))]),
        _map([*RECORD, ("accept_histogram", [MAX_COUNTER + 1])]),
        _map([*RECORD, ("sample_id", "")]),
        _map([*RECORD, ("sample_id", "x" * (MAX_ID + 1))]),
        _map([*RECORD, ("sample_id", b"bytes")]),
        _map([*RECORD, ("task", "")]),  # revision 4: task is an id like the others
        _map([*RECORD, ("task", 7)]),
        _map([*RECORD, ("task", "x" * (MAX_ID + 1))]),
        _map([*RECORD, ("task", "gsm8k"), ("task", "chat")]),
        _map([*RECORD, ("tasx", "gsm8k")]),  # the length of "task" and "type", neither
        _map([("type", "batch"), ("records", [dict(RECORD[1:], task="gsm8k")]), ("task", "gsm8k")]),
        _map([*RECORD, ("draft_lag", -1)]),  # revision 5: draft_lag is a counter like the others
        _map([*RECORD, ("draft_lag", 1.0)]),
        _map([*RECORD, ("draft_lag", "1")]),
        _map([*RECORD, ("draft_lag", MAX_COUNTER + 1)]),
        _map([*RECORD, ("draft_lag", 1), ("draft_lag", 2)]),
        _map([*RECORD, ("draft_lax", 1)]),  # the length of "draft_lag" and "sample_id", neither
        _map([("type", "batch"), ("records", [dict(RECORD[1:], draft_lag=1)]), ("draft_lag", 1)]),
        _map(RECORD[:3]),  # no generation_id
        _map([("type", "marker"), ("batch_id", "b"), ("producer_id", "p")]),
        _map([("type", "nope"), *RECORD[1:]]),
        _map([("type", "batch"), ("records", []), ("batch_id", "b")]),
        _map([("type", "batch"), ("records", [dict(RECORD[1:], type="batch")])]),
        _map([("type", "batch"), ("records", [dict(RECORD[1:])]), ("run_id", "r1")]) + b"\xc0",  # trailing byte
        encode_records_message(
            RecordBatch(
                records=[GenerationRecord(batch_id="b", session_id="s", generation_id="g", run_id="r2")], run_id="r1"
            )
        ),
        encode_records_message(BatchMarker(batch_id="b", producer_id="p")),
        b"\x84" + b"".join(msgspec.msgpack.encode(x) for x in ("type", "record", "batch_id")) + b"\xa3\xed\xa0\x80",
        b"",
        b"\xc0",
    ],
)
def test_anything_unsure_goes_to_python(data):
    assert not native_agrees(data)


def test_a_message_over_max_bytes_goes_to_python():
    data = encode_records_message(GenerationRecord(batch_id="b", session_id="s", generation_id="g"))
    assert native_agrees(data, max_bytes=len(data))
    assert not native_agrees(data, max_bytes=len(data) - 1)


def test_a_nested_record_may_name_its_type_or_not():
    nested = dict(RECORD[1:])
    for record in (nested, dict(nested, type="record")):
        assert native_agrees(msgspec.msgpack.encode({"type": "batch", "records": [record]}))


@pytest.mark.parametrize("order", ["task first", "type first"])
def test_a_record_naming_its_task_is_taken_natively(order):
    """ "task" has the length of "type" (the parser dispatches keys by length): both are
    read, in either order, in a plain record and inside a batch."""
    pairs = [("task", "gsm8k"), *RECORD] if order == "task first" else [*RECORD, ("task", "gsm8k")]
    data = _map(pairs)
    assert native_agrees(data) and _native.decode(data)._fields(0)[-2] == "gsm8k"
    nested = dict(pairs)
    assert native_agrees(msgspec.msgpack.encode({"type": "batch", "records": [nested, dict(nested, task="chat")]}))


@pytest.mark.parametrize("order", ["lag first", "sample first"])
def test_a_record_naming_its_draft_lag_is_taken_natively(order):
    """ "draft_lag" has the length of "sample_id" (the parser dispatches keys by length):
    both are read, in either order, in a plain record and inside a batch."""
    fields = [("draft_lag", 3), ("sample_id", "t1")]
    pairs = [*(fields if order == "lag first" else fields[::-1]), *RECORD]
    data = _map(pairs)
    assert native_agrees(data) and _native.decode(data)._fields(0)[-1] == 3
    assert _native.decode(data)._fields(0)[3] == "t1"
    nested = dict(pairs)
    assert native_agrees(msgspec.msgpack.encode({"type": "batch", "records": [nested, dict(nested, draft_lag=0)]}))


def test_declared_lengths_are_not_trusted():
    # a map, an array and a str each declaring 4 GiB - 1 with nothing behind
    for data in (
        b"\xdf\xff\xff\xff\xff",
        b"\x82\xa4type\xa5batch\xa7records\xdd\xff\xff\xff\xff",
        b"\x81\xa4type\xdb\xff\xff\xff\xff",
    ):
        assert _native.decode(data) is None


def test_anything_but_bytes_goes_to_python():
    data = encode_records_message(GenerationRecord(batch_id="b", session_id="s", generation_id="g"))
    assert _native.decode(bytearray(data)) is None and _native.decode(memoryview(data)) is None


mutations = st.tuples(st.integers(0, 10_000), st.integers(0, 255))


@settings(max_examples=500, deadline=None)
@given(batches, st.lists(mutations, min_size=1, max_size=4), st.integers(0, 20))
def test_mutated_messages_agree_or_go_to_python(batch, flips, cut):
    data = bytearray(encode_records_message(batch))
    for position, value in flips:
        data[position % len(data)] = value
    native_agrees(bytes(data[: max(1, len(data) - cut)]))


leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=6), st.binary(max_size=6)
)
loose_record = st.dictionaries(
    st.sampled_from(["type", *FIELDS]),
    st.one_of(leaf, st.lists(st.one_of(st.integers(-2, 2**33), leaf), max_size=3)),
    max_size=14,
)


@settings(max_examples=500, deadline=None)
@given(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["record", "batch"])},
        optional={
            "records": st.lists(loose_record, max_size=3),
            "producer_id": leaf,
            "run_id": leaf,
            "batch_id": leaf,
            "session_id": leaf,
            "generation_id": leaf,
            "accepted": leaf,
        },
    )
)
def test_wrong_types_agree_or_go_to_python(obj):
    native_agrees(msgspec.msgpack.encode(obj))
