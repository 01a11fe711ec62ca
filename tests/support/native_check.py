"""The native decoder against msgspec's, message by message (used by the decoder
tests and by the atheris target in tests/fuzz/).

The native decoder may hand any message to Python (it answers None), but a message
it accepts must decode to exactly what the Python path decodes: the same records,
field by field, in the same groups, with the same envelope -- and nothing invalid.
"""

from __future__ import annotations

from specmeter.schemas import decode_records_message
from specmeter.streams.core.state import Decoded

try:
    from specmeter.streams.core import _native
except ImportError:  # built without Rust
    _native = None

FIELDS = (
    "batch_id",
    "session_id",
    "generation_id",
    "sample_id",
    "state_hash",
    "accepted",
    "proposed",
    "verify",
    "completion",
    "accept_histogram",
    "producer_id",
    "weight_version",
    "run_id",
    "task",
    "draft_lag",
)


def native_agrees(data: bytes, max_bytes: int | None = None) -> bool:
    """False when the native decoder hands the message to Python; True when it
    accepted it and agrees with msgspec; AssertionError when it accepted and disagrees."""
    if _native is None:
        return False
    native = _native.decode(data, max_bytes)
    if native is None:
        return False
    python = decode_records_message(data, max_bytes=max_bytes)
    assert not python.invalid, f"native accepted a message Python finds invalid: {python.invalid!r}"
    assert python.marker is None, "native accepted a marker"
    twin = Decoded(python)
    assert native.groups == twin.groups, (native.groups, twin.groups)
    assert (native.producer_id, native.run_id) == (python.producer_id, python.run_id)
    assert len(native) == len(python.records)
    for index, record in enumerate(python.records):
        want = tuple(getattr(record, f) for f in FIELDS)
        assert native._fields(index) == want, (native._fields(index), want)
    for group in range(len(twin.groups)):
        assert native.records(group) == twin.records(group)
    return True
