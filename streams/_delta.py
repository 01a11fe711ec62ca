"""Durable forms of stage-1 state, written to the stage-1 state changelog.

A ``BatchDelta`` is what one processed chunk of messages changed in one batch
on one partition; replaying every delta up to the partition's ``Checkpoint``
rebuilds the state exactly. Internal to streams (not the producers' contract),
but typed and versioned like every boundary: fields are only appended.
"""

from __future__ import annotations

import msgspec

from specmeter.schemas import BatchMarker

__all__ = ["BatchDelta", "BatchStatus", "Checkpoint", "encode_state", "decode_delta", "decode_status",
           "decode_checkpoint"]

class BatchDelta(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Changes of one batch on one partition from source offsets first..last (inclusive)."""

    batch_id: str
    first_offset: int
    last_offset: int
    last_input_ms: int
    #: wide entries: [session_id, generation_id, conflict, state_hash, accepted, proposed,
    #: verify, completion, histogram, weight_version] (deltas written before weight
    #: versions existed lack the last item)
    entries: list[tuple] = []
    occurrences: list[tuple[str, str | None, str]] = []
    record_count: int = 0
    invalid_record_count: int = 0
    late_record_count: int = 0
    conflicting_record_count: int = 0
    received: dict[str, int] = {}
    markers: list[BatchMarker] = []
    algorithms: list[str] = []
    counters_seen: bool = False
    #: generations first seen in this delta's chunk with one occurrence, no state
    #: hash or histogram and small counters, five flat items each: session,
    #: generation, sample, counters' low 64 bits and high bits (the packed layout
    #: of ``_state``)
    packed: list[str | int | None] = []
    run_id: str | None = None
    #: like ``packed`` for entries that name a weight_version: six items each, the
    #: sixth the version
    packed_versioned: list[str | int | None] = []


class BatchStatus(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Closing state of one batch on one partition (latest wins)."""

    batch_id: str
    closed: bool
    close_reason: str | None = None
    closed_at_ms: int = 0
    revision: int = -1
    partial_digest: bytes = b""
    run_id: str | None = None


class Checkpoint(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """The last source offset whose effects are durable, and recently expired batches
    (``overflowed``: those closed early at the open-generation limit). A batch of the
    default run is its batch_id, one of a named run ``[run_id, batch_id]``."""

    offset: int
    expired: list[str | tuple[str, str]] = []
    overflowed: list[str | tuple[str, str]] = []


_encoder = msgspec.msgpack.Encoder()
_delta_decoder = msgspec.msgpack.Decoder(BatchDelta)
_status_decoder = msgspec.msgpack.Decoder(BatchStatus)
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)


def encode_state(obj: BatchDelta | BatchStatus | Checkpoint) -> bytes:
    return _encoder.encode(obj)


def decode_delta(data: bytes) -> BatchDelta:
    return _delta_decoder.decode(data)


def decode_status(data: bytes) -> BatchStatus:
    return _status_decoder.decode(data)


def decode_checkpoint(data: bytes) -> Checkpoint:
    return _checkpoint_decoder.decode(data)
