"""Prebuilt encoders and decoders, one per message family (built once, reused).

The records topic is decoded leniently where it pays: a packed ``RecordBatch``
with one bad record costs only that record, and an invalid record still gives
up its batch identity ``(run_id, batch_id)`` (when readable) so that it is
counted in its batch. An invalid marker is never counted as a record.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._aggregates import PartialAggregate
from ._output import BatchMetrics, DeadLetter
from ._records import BatchMarker, GenerationRecord, RecordBatch, RecordsMessage
from ._types import MAX_ID

__all__ = [
    "InvalidRecord",
    "DecodedMessage",
    "decode_records_message",
    "encode_records_message",
    "decode_json_line",
    "encode_partial",
    "decode_partial",
    "encode_metrics",
    "decode_metrics",
    "encode_metrics_key",
    "encode_dead_letter",
    "decode_dead_letter",
    "record_to_builtins",
]

# --- built once -------------------------------------------------------------
_records_encoder = msgspec.msgpack.Encoder()
_records_decoder = msgspec.msgpack.Decoder(RecordsMessage)
_record_decoder = msgspec.msgpack.Decoder(GenerationRecord)
_partial_encoder = msgspec.msgpack.Encoder()
_partial_decoder = msgspec.msgpack.Decoder(PartialAggregate)
_json_encoder = msgspec.json.Encoder()
_metrics_decoder = msgspec.json.Decoder(BatchMetrics)
_dead_letter_decoder = msgspec.json.Decoder(DeadLetter)
_json_line_decoder = msgspec.json.Decoder()


class _LenientBatch(msgspec.Struct):
    """A RecordBatch whose records are kept raw, to validate them one by one."""

    records: list[msgspec.Raw]
    producer_id: Any = None
    run_id: Any = None


_lenient_batch_decoder = msgspec.msgpack.Decoder(_LenientBatch)


class InvalidRecord(msgspec.Struct, frozen=True):
    """A record (or whole message) that failed validation, and why.

    ``batch_id`` is set only when the input is a record whose batch identity is
    readable: it is then counted in batch ``(run_id, batch_id)``. An invalid marker,
    or a record with an unreadable batch_id or run_id, is counted in no batch.
    """

    reason: str  # "undecodable" | "invalid" | "too_large"
    detail: str
    raw: bytes
    batch_id: str | None = None
    producer_id: str | None = None
    run_id: str | None = None


class DecodedMessage(msgspec.Struct):
    """What one records-topic message holds after validation.

    ``run_id`` is the envelope's run (a ``RecordBatch``'s): a record without its
    own run_id belongs to it.
    """

    records: list[GenerationRecord]
    marker: BatchMarker | None = None
    invalid: list[InvalidRecord] = []
    producer_id: str | None = None
    run_id: str | None = None


class _Unreadable:
    """A field present with a value that is no valid id."""


_UNREADABLE = _Unreadable()


def _id_field(obj: Any, field: str) -> str | _Unreadable | None:
    """A field of a decoded object as an id: the str, None when absent or null,
    ``_UNREADABLE`` when present with anything else (empty, too long, not a str)."""
    if not isinstance(obj, dict) or obj.get(field) is None:
        return None
    value = obj[field]
    if isinstance(value, str) and 0 < len(value) <= MAX_ID:
        return value
    return _UNREADABLE


def _invalid(raw: bytes, reason: str, detail: str, obj: Any = None, *, envelope_run: Any = None) -> InvalidRecord:
    """An invalid input with the batch identity it can be counted under, if any."""
    batch_id = _id_field(obj, "batch_id")
    run_id = _id_field(obj, "run_id")
    if run_id is None:
        run_id = envelope_run
    producer_id = _id_field(obj, "producer_id")
    # anything but a marker (or a whole packed batch) counts as a record of its batch
    counted = (
        isinstance(obj, dict)
        and obj.get("type") not in ("marker", "batch")
        and isinstance(batch_id, str)
        and not isinstance(run_id, _Unreadable)
    )
    return InvalidRecord(
        reason=reason,
        detail=detail,
        raw=bytes(raw),
        batch_id=batch_id if counted else None,  # type: ignore[arg-type]
        producer_id=producer_id if isinstance(producer_id, str) else None,
        run_id=run_id if counted else None,  # type: ignore[arg-type]
    )


def encode_records_message(message: RecordsMessage) -> bytes:
    """msgpack bytes of a record, a packed batch or a marker."""
    return _records_encoder.encode(message)


def decode_records_message(data: bytes, *, max_bytes: int | None = None) -> DecodedMessage:
    """Decode one records-topic message; never raises on bad input.

    Args:
        data: the Kafka message value.
        max_bytes: reject larger messages whole (reason ``too_large``).

    Returns:
        The valid records, the marker if the message is one, and every
        invalid part with its reason and raw bytes.
    """
    if max_bytes is not None and len(data) > max_bytes:
        detail = f"message of {len(data)} bytes exceeds max_message_bytes={max_bytes}"
        return DecodedMessage(records=[], invalid=[_invalid(data, "too_large", detail)])
    try:
        message = _records_decoder.decode(data)
    except msgspec.ValidationError as exc:
        return _decode_leniently(data, str(exc))
    except msgspec.DecodeError as exc:
        return DecodedMessage(records=[], invalid=[_invalid(data, "undecodable", str(exc))])
    except (RecursionError, MemoryError) as exc:  # pathological nesting
        return DecodedMessage(records=[], invalid=[_invalid(data, "undecodable", repr(exc))])
    return _decoded(message)


def _decoded(message: RecordsMessage) -> DecodedMessage:
    """A message that decoded whole: a batch's records (split where one names another run
    than its envelope), a record, or a marker."""
    if type(message) is RecordBatch:
        run_id = message.run_id
        if run_id is not None and any(r.run_id is not None and r.run_id != run_id for r in message.records):
            return _split_runs(message)
        return DecodedMessage(records=message.records, producer_id=message.producer_id, run_id=run_id)
    if type(message) is GenerationRecord:
        return DecodedMessage(records=[message], producer_id=message.producer_id)
    assert isinstance(message, BatchMarker)
    return DecodedMessage(records=[], marker=message, producer_id=message.producer_id)


def _split_runs(batch: RecordBatch) -> DecodedMessage:
    """A batch whose envelope names a run and some records another: those records are
    invalid, counted in the envelope's run."""
    records: list[GenerationRecord] = []
    invalid: list[InvalidRecord] = []
    for index, record in enumerate(batch.records):
        if record.run_id is None or record.run_id == batch.run_id:
            records.append(record)
            continue
        invalid.append(_wrong_run(index, record, _records_encoder.encode(record), batch.run_id, batch.producer_id))
    return DecodedMessage(records=records, invalid=invalid, producer_id=batch.producer_id, run_id=batch.run_id)


def _wrong_run(
    index: int, record: GenerationRecord, raw: bytes, envelope_run: str | None, envelope_producer: str | None
) -> InvalidRecord:
    return InvalidRecord(
        reason="invalid",
        detail=(
            f"run_id {_shorten(record.run_id)} differs from the envelope's run_id "
            f"{_shorten(envelope_run)} - at `$.records[{index}].run_id`"
        ),
        raw=raw,
        batch_id=record.batch_id,
        producer_id=record.producer_id or envelope_producer,
        run_id=envelope_run,
    )


def _shorten(value: Any, limit: int = 80) -> str:
    """repr() of a value for a message, cut to ``limit`` characters (ids may be long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _decode_leniently(data: bytes, whole_error: str) -> DecodedMessage:
    """Slow path: salvage the valid records of a packed batch, name the rest."""
    try:
        obj = msgspec.msgpack.decode(data)
    except Exception as exc:  # noqa: BLE001 - any failure here is "undecodable"
        return DecodedMessage(records=[], invalid=[_invalid(data, "undecodable", str(exc))])
    if not (isinstance(obj, dict) and obj.get("type") == "batch" and isinstance(obj.get("records"), list)):
        return DecodedMessage(records=[], invalid=[_invalid(data, "invalid", whole_error, obj)])
    try:
        batch = _lenient_batch_decoder.decode(data)
    except msgspec.MsgspecError as exc:
        return DecodedMessage(records=[], invalid=[_invalid(data, "invalid", str(exc), obj)])
    envelope_producer = _id_field(obj, "producer_id")
    envelope_run = _id_field(obj, "run_id")
    if isinstance(envelope_producer, _Unreadable) or isinstance(envelope_run, _Unreadable):
        # the envelope's own fields are invalid: no record in it has a readable identity
        return DecodedMessage(records=[], invalid=[_invalid(data, "invalid", whole_error)])
    return _salvaged(batch.records, obj["records"], envelope_producer, envelope_run)


def _salvaged(raws: list[Any], elements: list[Any], envelope_producer: Any, envelope_run: Any) -> DecodedMessage:
    """A packed batch's records one by one: the valid ones kept, each invalid one named
    with its path (``$.records[i]``), and those of another run than the envelope's."""
    records: list[GenerationRecord] = []
    invalid: list[InvalidRecord] = []
    for index, (raw, element) in enumerate(zip(raws, elements, strict=True)):
        try:
            record = _record_decoder.decode(raw)
        except msgspec.MsgspecError as exc:
            invalid.append(_bad_record(index, bytes(raw), element, str(exc), envelope_producer, envelope_run))
            continue
        if envelope_run is not None and record.run_id is not None and record.run_id != envelope_run:
            invalid.append(_wrong_run(index, record, bytes(raw), envelope_run, envelope_producer))
            continue
        records.append(record)
    return DecodedMessage(records=records, invalid=invalid, producer_id=envelope_producer, run_id=envelope_run)


def _bad_record(
    index: int, raw: bytes, element: Any, error: str, envelope_producer: Any, envelope_run: Any
) -> InvalidRecord:
    """A record of a batch that does not decode, its error's path from the batch's root;
    the envelope's producer where the record names none."""
    detail = error.replace("at `$", f"at `$.records[{index}]", 1)
    bad = _invalid(raw, "invalid", detail, element, envelope_run=envelope_run)
    if bad.producer_id is None and envelope_producer is not None:
        bad = msgspec.structs.replace(bad, producer_id=envelope_producer)
    return bad


def decode_json_line(line: bytes | str) -> GenerationRecord | BatchMarker | InvalidRecord:
    """Decode one line of a JSON-lines rollout dump (offline ``aggregate``/``replay``).

    A line with ``"type": "marker"`` is a marker; any other object is a record
    (``"type": "record"`` optional). Never raises on bad input.
    """
    raw = line.encode() if isinstance(line, str) else bytes(line)
    try:
        obj = _json_line_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return _invalid(raw, "undecodable", str(exc))
    if not isinstance(obj, dict):
        return _invalid(raw, "invalid", f"Expected `object`, got `{type(obj).__name__}`")
    kind = obj.get("type", "record")
    target: type[GenerationRecord] | type[BatchMarker]
    if kind == "marker":
        target = BatchMarker
    elif kind == "record":
        target = GenerationRecord
    else:
        return _invalid(
            raw, "invalid", f"Unknown message type {kind!r} - at `$.type` (expected 'record' or 'marker')", obj
        )
    try:
        return msgspec.convert(obj, type=target)
    except msgspec.ValidationError as exc:
        return _invalid(raw, "invalid", str(exc), obj)


def record_to_builtins(message: GenerationRecord | BatchMarker) -> dict[str, Any]:
    """Plain dict of a record or marker, with every field (for JSON dumps)."""
    out = msgspec.structs.asdict(message)
    out["type"] = "marker" if isinstance(message, BatchMarker) else "record"
    return out


def encode_partial(partial: PartialAggregate) -> bytes:
    return _partial_encoder.encode(partial)


def decode_partial(data: bytes) -> PartialAggregate:
    return _partial_decoder.decode(data)


def encode_metrics(metrics: BatchMetrics) -> bytes:
    """JSON bytes of a batch's metrics (the output topic is JSON for dashboards)."""
    return _json_encoder.encode(metrics)


def decode_metrics(data: bytes) -> BatchMetrics:
    return _metrics_decoder.decode(data)


def encode_metrics_key(run_id: str | None, batch_id: str) -> bytes:
    """The metrics topic's message key: the batch's identity ``(run_id, batch_id)`` as a
    JSON array, ``["grpo-7", "step-12"]`` (``[null, "step-12"]`` in the default run).

    The topic is compacted on it, so it keeps the newest revision of every batch of
    every run; a key of the batch id alone let two runs' ``step-N`` compact each other."""
    return _json_encoder.encode((run_id, batch_id))


def encode_dead_letter(letter: DeadLetter) -> bytes:
    """JSON bytes; ``raw`` is base64 so any tool can recover the original message."""
    return _json_encoder.encode(letter)


def decode_dead_letter(data: bytes) -> DeadLetter:
    return _dead_letter_decoder.decode(data)
