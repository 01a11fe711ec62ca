"""Coverage-guided fuzzing of the records decoder with atheris (libFuzzer).

    python tests/fuzz/records_decoder.py -runs=100000   # bounded
    python tests/fuzz/records_decoder.py corpus/        # open-ended, keeps a corpus

Any exception out of ``decode_records_message``, or a reject without a reason,
is a crash: atheris prints the input and exits non-zero. Where the native core is
built, its decoder is driven too: a message it accepts must decode to exactly what
msgspec decodes (tests/native_check.py), and nothing may panic or raise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.native_check

with atheris.instrument_imports():
    from specmeter.schemas import decode_records_message
    from tests.native_check import native_agrees

REASONS = {"invalid", "undecodable", "too_large"}


def one_input(data: bytes) -> None:
    native_agrees(data, max_bytes=1 << 16)
    decoded = decode_records_message(data, max_bytes=1 << 16)
    for bad in decoded.invalid:
        if bad.reason not in REASONS or not bad.detail:
            raise AssertionError(f"reject without a reason: {bad!r}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
