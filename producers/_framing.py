"""Packing pre-encoded records into one ``RecordBatch`` message without re-encoding.

``publish()`` encodes each record once, on the caller's side; the background
task only frames the bytes: a msgpack map {type, records: [...], producer_id,
run_id} (run_id only when the publisher names a run).
Decoding such a message with the schemas' decoder gives a ``RecordBatch``.
"""

from __future__ import annotations

import msgspec

__all__ = ["frame_batch", "frame_overhead", "FRAME_OVERHEAD"]

_TYPE = msgspec.msgpack.encode("type") + msgspec.msgpack.encode("batch")
_RECORDS = msgspec.msgpack.encode("records")
_PRODUCER = msgspec.msgpack.encode("producer_id")
_RUN = msgspec.msgpack.encode("run_id")
#: bytes of framing around the records, the producer and run ids excluded
FRAME_OVERHEAD = 1 + len(_TYPE) + len(_RECORDS) + 5 + len(_PRODUCER) + len(_RUN)


def frame_overhead(producer_id: str | None, run_id: str | None = None) -> int:
    """Bytes ``frame_batch`` adds around the records, at most: the ids count too
    (up to 1024 characters each), so packing to ``max_message_bytes`` stays under it."""
    run = len(_RUN) + len(msgspec.msgpack.encode(run_id)) if run_id is not None else 0
    return FRAME_OVERHEAD - len(_RUN) + len(msgspec.msgpack.encode(producer_id)) + run


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def frame_batch(encoded_records: list[bytes], producer_id: str | None, run_id: str | None = None) -> bytes:
    """The msgpack bytes of ``RecordBatch(records=..., producer_id=..., run_id=...)``."""
    producer = msgspec.msgpack.encode(producer_id)
    run = (_RUN, msgspec.msgpack.encode(run_id)) if run_id is not None else ()
    return b"".join(
        (
            b"\x84" if run else b"\x83",
            _TYPE,
            _RECORDS,
            _array_header(len(encoded_records)),
            *encoded_records,
            _PRODUCER,
            producer,
            *run,
        )
    )
