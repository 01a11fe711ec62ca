"""Packing pre-encoded records into one ``RecordBatch`` message without re-encoding.

``publish()`` encodes each record once, on the caller's side; the background
task only frames the bytes: a msgpack map {type, records: [...], producer_id}.
Decoding such a message with the schemas' decoder gives a ``RecordBatch``.
"""

from __future__ import annotations

import msgspec

__all__ = ["frame_batch", "FRAME_OVERHEAD"]

_TYPE = msgspec.msgpack.encode("type") + msgspec.msgpack.encode("batch")
_RECORDS = msgspec.msgpack.encode("records")
_PRODUCER = msgspec.msgpack.encode("producer_id")
#: bytes of framing around the records, producer id excluded
FRAME_OVERHEAD = 1 + len(_TYPE) + len(_RECORDS) + 5 + len(_PRODUCER)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def frame_batch(encoded_records: list[bytes], producer_id: str | None) -> bytes:
    """The msgpack bytes of ``RecordBatch(records=..., producer_id=...)``."""
    producer = msgspec.msgpack.encode(producer_id)
    return b"".join(
        (b"\x83", _TYPE, _RECORDS, _array_header(len(encoded_records)), *encoded_records, _PRODUCER, producer)
    )
