"""Coverage-guided fuzzing of the records decoder with atheris (libFuzzer).

    python tests/fuzz/records_decoder.py -runs=100000   # bounded
    python tests/fuzz/records_decoder.py corpus/        # open-ended, keeps a corpus

Any exception out of ``decode_records_message``, or a reject without a reason,
is a crash: atheris prints the input and exits non-zero. Where the native core is
built, its decoder is driven too: a message it accepts must decode to exactly what
msgspec decodes (tests/support/native_check.py), and nothing may panic or raise.

Both decoders' hard work happens in compiled code that libFuzzer does not see, so
random bytes rarely reach a valid message. Each input is therefore also read as a
recipe (``FuzzedDataProvider``) for a structured message -- a record or a packed
batch whose fields are mostly right and sometimes wrong in type or limit, then
perhaps one byte flipped -- which keeps both decoders' accept paths under test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.support.native_check

with atheris.instrument_imports():
    from specmeter.schemas import decode_records_message
    from tests.support.native_check import native_agrees

REASONS = {"invalid", "undecodable", "too_large"}
ID_FIELDS = (
    "batch_id",
    "session_id",
    "generation_id",
    "sample_id",
    "state_hash",
    "producer_id",
    "weight_version",
    "run_id",
)
COUNTERS = ("accepted", "proposed", "verify", "completion")


def _check(data: bytes) -> None:
    native_agrees(data, max_bytes=1 << 16)
    decoded = decode_records_message(data, max_bytes=1 << 16)
    for bad in decoded.invalid:
        if bad.reason not in REASONS or not bad.detail:
            raise AssertionError(f"reject without a reason: {bad!r}")


def _value(fdp: atheris.FuzzedDataProvider, field: str) -> object:
    """Mostly a valid value of the field, sometimes one that breaks a type or a limit."""
    kind = fdp.ConsumeIntInRange(0, 15)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.PickValueInList([True, 1.5, b"x", "", -1, 2**32, 2**64 - 1, [1], {"a": 1}, "x" * 1025])
    if field in COUNTERS:
        return fdp.ConsumeIntInRange(0, 2**32 - 1) if kind > 8 else fdp.ConsumeIntInRange(0, 200)
    if field == "accept_histogram":
        return [fdp.ConsumeIntInRange(0, 2**32 - 1) for _ in range(fdp.ConsumeIntInRange(0, 5))]
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(1, 12)) or "x"


def _record(fdp: atheris.FuzzedDataProvider, nested: bool) -> dict:
    out: dict = {} if nested and fdp.ConsumeBool() else {"type": "record"}
    for field in ID_FIELDS + COUNTERS + ("accept_histogram",):
        if field in ("batch_id", "session_id", "generation_id") or fdp.ConsumeIntInRange(0, 3) == 0:
            out[field] = _value(fdp, field)
    return out


def structured(data: bytes) -> bytes:
    """A record or a packed batch built from the input, perhaps with one byte flipped."""
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        message = _record(fdp, nested=False)
    else:
        message = {"type": "batch", "records": [_record(fdp, nested=True) for _ in range(fdp.ConsumeIntInRange(0, 4))]}
        for field in ("producer_id", "run_id"):
            if fdp.ConsumeBool():
                message[field] = _value(fdp, field)
    raw = bytearray(msgspec.msgpack.encode(message))
    if fdp.ConsumeIntInRange(0, 3) == 0:
        raw[fdp.ConsumeIntInRange(0, len(raw) - 1)] = fdp.ConsumeIntInRange(0, 255)
    return bytes(raw)


def one_input(data: bytes) -> None:
    _check(data)
    _check(structured(data))


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
