"""The wire contract: validation in the types, clear errors, pinned bytes."""

from __future__ import annotations

import msgspec
import pytest

from specmeter.schemas import (
    BatchMarker,
    BatchMetrics,
    DeadLetter,
    GenerationRecord,
    RecordBatch,
    decode_dead_letter,
    decode_json_line,
    decode_metrics,
    decode_partial,
    decode_records_message,
    encode_dead_letter,
    encode_metrics,
    encode_partial,
    encode_records_message,
)
from specmeter.streams import BatchState

RECORD = GenerationRecord(batch_id="b", session_id="s", generation_id="g", accepted=1, proposed=2)


def test_encoded_bytes_are_pinned():
    """Wire format v1: changing these bytes breaks every deployed producer or worker.

    Since revision 5 (``draft_lag``, a record's 16th field) msgspec writes a record's map
    with a map16 header (``\\xde`` and two length bytes) where it wrote a fixmap: the same
    msgpack map, read by every msgpack reader, the native decoder included. What producers
    before revision 5 send (the fixmap) still decodes to the same record."""
    assert encode_records_message(RECORD) == (
        b"\xde\x00\x06\xa4type\xa6record\xa8batch_id\xa1b\xaasession_id\xa1s\xadgeneration_id\xa1g"
        b"\xa8accepted\x01\xa8proposed\x02"
    )
    before_revision_5 = (
        b"\x86\xa4type\xa6record\xa8batch_id\xa1b\xaasession_id\xa1s\xadgeneration_id\xa1g"
        b"\xa8accepted\x01\xa8proposed\x02"
    )
    assert decode_records_message(before_revision_5).records == [RECORD]
    marker = BatchMarker(batch_id="b", producer_id="p", records_sent=3, speculative_algorithm="NGRAM")
    assert encode_records_message(marker) == (
        b"\x85\xa4type\xa6marker\xa8batch_id\xa1b\xabproducer_id\xa1p\xacrecords_sent\x03"
        b"\xb5speculative_algorithm\xa5NGRAM"
    )


@pytest.mark.parametrize(
    "message",
    [RECORD, RecordBatch(records=[RECORD, RECORD], producer_id="p"), BatchMarker(batch_id="b", producer_id="p")],
)
def test_records_topic_roundtrip(message):
    decoded = decode_records_message(encode_records_message(message))
    assert not decoded.invalid
    assert (decoded.marker or decoded.records[0]) == (
        message.records[0] if isinstance(message, RecordBatch) else message
    )


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g", "accepted": -1},
            "Expected `int` >= 0 - at `$.accepted`",
        ),
        (
            {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g", "verify": "3"},
            "Expected `int | null`, got `str` - at `$.verify`",
        ),
        (
            {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g", "proposed": True},
            "Expected `int | null`, got `bool` - at `$.proposed`",
        ),
        (
            {"type": "record", "batch_id": "b", "session_id": "", "generation_id": "g"},
            "Expected `str` of length >= 1 - at `$.session_id`",
        ),
        ({"type": "record", "batch_id": "b", "session_id": "s"}, "Object missing required field `generation_id`"),
        (
            {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g", "completion": 1.5},
            "got `float` - at `$.completion`",
        ),
        ({"type": "nonsense", "batch_id": "b"}, "Invalid value 'nonsense' - at `$.type`"),
    ],
)
def test_invalid_message_names_the_problem(obj, expected):
    decoded = decode_records_message(msgspec.msgpack.encode(obj))
    assert decoded.records == [] and decoded.marker is None
    (bad,) = decoded.invalid
    assert bad.reason == "invalid"
    assert expected in bad.detail
    assert bad.batch_id == "b"  # readable, so it is counted in its batch
    assert bad.raw == msgspec.msgpack.encode(obj)


def test_not_msgpack_is_undecodable():
    (bad,) = decode_records_message(b"\xc1 not msgpack").invalid
    assert bad.reason == "undecodable" and "malformed" in bad.detail and bad.batch_id is None


def test_truncated_msgpack_is_undecodable():
    data = encode_records_message(RECORD)[:-3]
    (bad,) = decode_records_message(data).invalid
    assert bad.reason == "undecodable" and "truncated" in bad.detail.lower()


def test_one_bad_record_in_a_packed_batch_costs_only_that_record():
    good = [
        msgspec.structs.asdict(RECORD) | {"type": "record"},
        {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g2", "completion": 4},
    ]
    bad = {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g3", "accepted": -5}
    data = msgspec.msgpack.encode({"type": "batch", "producer_id": "p7", "records": [good[0], bad, good[1]]})
    decoded = decode_records_message(data)
    assert [r.generation_id for r in decoded.records] == ["g", "g2"]
    (invalid,) = decoded.invalid
    assert "at `$.records[1].accepted`" in invalid.detail
    assert invalid.batch_id == "b" and invalid.producer_id == "p7"
    assert msgspec.msgpack.decode(invalid.raw) == bad


def test_size_limit_rejects_whole_message():
    data = encode_records_message(RECORD)
    (bad,) = decode_records_message(data, max_bytes=10).invalid
    assert bad.reason == "too_large" and "max_message_bytes=10" in bad.detail


def test_json_line_kinds():
    assert isinstance(decode_json_line('{"type": "marker", "batch_id": "b", "producer_id": "p"}'), BatchMarker)
    assert decode_json_line('{"batch_id": "b", "session_id": "s", "generation_id": "g"}') == GenerationRecord(
        batch_id="b", session_id="s", generation_id="g"
    )
    assert decode_json_line("[1, 2]").reason == "invalid"
    assert decode_json_line("{oops").reason == "undecodable"


def test_partial_metrics_and_dead_letter_roundtrip():
    state = BatchState("b")
    state.add(RECORD)
    partial = state.partial(partition=3)
    assert decode_partial(encode_partial(partial)) == partial
    metrics = BatchMetrics(
        batch_id="b",
        revision=0,
        close_reason="markers",
        closed_at=1.5,
        speculative=True,
        complete=True,
        partitions_reported=1,
        partitions_expected=1,
        record_count=1,
        invalid_record_count=0,
        missing_record_count=0,
        late_record_count=0,
        accept_histogram=None,
        metrics={"spec/accept_rate": 0.5, "spec/sample_count": 1},
    )
    assert decode_metrics(encode_metrics(metrics)) == metrics
    letter = DeadLetter(
        reason="invalid", detail="x", raw=b"\x00\xff", source_topic="t", source_partition=1, source_offset=7
    )
    assert decode_dead_letter(encode_dead_letter(letter)) == letter
