"""Coverage-guided fuzzing of the records decoder with atheris (libFuzzer).

    python tests/fuzz/records_decoder.py -runs=100000   # bounded
    python tests/fuzz/records_decoder.py corpus/        # open-ended, keeps a corpus

Any exception out of ``decode_records_message``, or a reject without a reason,
is a crash: atheris prints the input and exits non-zero.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from specmeter.schemas import decode_records_message

REASONS = {"invalid", "undecodable", "too_large"}


def one_input(data: bytes) -> None:
    decoded = decode_records_message(data, max_bytes=1 << 16)
    for bad in decoded.invalid:
        if bad.reason not in REASONS or not bad.detail:
            raise AssertionError(f"reject without a reason: {bad!r}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
