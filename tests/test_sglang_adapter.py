"""Records from what SGLang returns (single, batched, n > 1), without sglang installed."""

from __future__ import annotations

import sys

import pytest

from specmeter.producers.sglang_adapter import records_from_outputs

from .fixtures.sglang_meta_info import SGLANG_OUTPUTS


def _output(version: str, rid: str) -> dict:
    meta_info = dict(SGLANG_OUTPUTS[version][0], id=rid)
    return {"text": "...", "output_ids": [1, 2, 3], "meta_info": meta_info}


def test_single_output_dict():
    (record,) = records_from_outputs(_output("0.5.12", "r1"), batch_id="b", session_ids="s", producer_id="w0")
    assert (record.generation_id, record.accepted, record.proposed, record.verify) == ("r1", 361, 604, 151)
    assert record.producer_id == "w0" and record.sample_id is None


def test_batch_and_parallel_samples():
    # two prompts, n = 2: SGLang returns prompt-major lists of dicts
    outputs = [_output("0.5.9", f"r{i}") for i in range(4)]
    records = records_from_outputs(outputs, batch_id="b", session_ids=["s0", "s0", "s1", "s1"],
                                   sample_ids=["t0", "t1", "t0", "t1"])
    assert [(r.session_id, r.sample_id, r.generation_id) for r in records] == [
        ("s0", "t0", "r0"), ("s0", "t1", "r1"), ("s1", "t0", "r2"), ("s1", "t1", "r3")]
    assert all(r.accept_histogram == [6, 9, 11, 14] for r in records)


def test_mismatched_lengths_and_missing_meta_info_are_clear():
    with pytest.raises(ValueError, match="2 outputs but 3 session ids"):
        records_from_outputs([_output("0.5.4", "a"), _output("0.5.4", "b")], batch_id="b",
                             session_ids=["s0", "s1", "s2"])
    with pytest.raises(ValueError, match="meta_info"):
        records_from_outputs({"text": "x"}, batch_id="b", session_ids="s")


def test_adapter_does_not_import_sglang():
    assert "sglang" not in sys.modules
