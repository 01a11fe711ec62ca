"""Hostile input at the records decoder: it never raises, and every reject has a reason;
the native decoder, where built, agrees with it on whatever it accepts."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from specmeter.schemas import decode_records_message

from .support.native_check import native_agrees

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
record_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["record", "batch", "marker", "nope", 7])},
    optional=dict.fromkeys(
        (
            "batch_id",
            "session_id",
            "generation_id",
            "sample_id",
            "accepted",
            "proposed",
            "verify",
            "completion",
            "accept_histogram",
            "records",
            "producer_id",
            "records_sent",
            "expected_producers",
        ),
        values,
    ),
)


def _check(data: bytes) -> None:
    native_agrees(data, max_bytes=1 << 20)
    decoded = decode_records_message(data, max_bytes=1 << 20)
    for bad in decoded.invalid:
        assert bad.reason in {"invalid", "undecodable", "too_large"} and bad.detail
    if not decoded.records and decoded.marker is None and not decoded.invalid:
        obj = msgspec.msgpack.decode(data)  # only a valid, empty packed batch may yield nothing
        assert obj.get("type") == "batch" and obj.get("records") == [], obj


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data):
    _check(data)


@settings(max_examples=500, deadline=None)
@given(record_like)
def test_wrong_types_and_unknown_tags(obj):
    _check(msgspec.msgpack.encode(obj))


@settings(max_examples=300, deadline=None)
@given(record_like, st.integers(1, 40))
def test_truncated(obj, cut):
    data = msgspec.msgpack.encode(obj)
    _check(data[: max(0, len(data) - cut)])


def test_deep_nesting_and_huge_strings():
    deep = b"\x91" * 100_000 + b"\xc0"  # 100k nested one-element arrays
    _check(deep)
    _check(
        msgspec.msgpack.encode({"type": "record", "batch_id": "b" * 2_000_000, "session_id": "s", "generation_id": "g"})
    )
    huge = msgspec.msgpack.encode(
        {"type": "record", "batch_id": "b", "session_id": "s", "generation_id": "g", "accepted": 2**64 - 1}
    )
    (bad,) = decode_records_message(huge).invalid
    assert "accepted" in bad.detail


def test_coverage_guided_fuzzing_with_atheris():
    """libFuzzer's mutations through atheris (installed with the test extras where it has wheels)."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    pytest.importorskip("atheris", reason="atheris has no wheel for this platform")
    script = Path(__file__).parent / "fuzz" / "records_decoder.py"
    proc = subprocess.run(
        [sys.executable, str(script), "-runs=100000", "-seed=20261202"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Done 100000 runs" in proc.stderr
