"""SGLang meta_info -> counters: golden cases, release-shaped fixtures, folding."""

from __future__ import annotations

import msgspec
import pytest

from specmeter.producers import (
    SpecCounters,
    counters_from_meta_info,
    fold_attempts,
    normalize_counter,
    record_from_attempts,
    record_from_meta_info,
)

from .fixtures.sglang_meta_info import ABORTED_BEFORE_RUN, RESUMED, SGLANG_OUTPUTS
from .golden_cases import meta_info_cases

CASES = meta_info_cases()


def _tuple(c: SpecCounters):
    return (c.accepted, c.proposed, c.verify, c.completion, c.accept_histogram)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden_meta_info_case(case):
    assert msgspec.structs.asdict(counters_from_meta_info(case["meta_info"])) == case["expected"]


@pytest.mark.parametrize("version", sorted(SGLANG_OUTPUTS))
def test_sglang_release_shapes(version):
    meta_info, expected = SGLANG_OUTPUTS[version]
    assert _tuple(counters_from_meta_info(meta_info)) == expected


def test_abort_before_run_gives_unknowns_not_zeros():
    meta_info, expected = ABORTED_BEFORE_RUN
    assert _tuple(counters_from_meta_info(meta_info)) == expected
    record = record_from_meta_info(meta_info, batch_id="b", session_id="s")
    assert record.generation_id == "f6c5b8" and record.accepted is None and record.verify is None


def test_resumed_generation_folds_attempts():
    attempts, expected = RESUMED
    record = record_from_attempts(attempts, batch_id="b", session_id="s", sample_id="t1")
    assert (record.accepted, record.proposed, record.verify, record.completion, record.accept_histogram) == expected
    assert record.generation_id == "g7d6c9"


def test_fold_unknown_in_any_attempt_is_unknown():
    folded = fold_attempts([SpecCounters(accepted=1, proposed=2, verify=1, completion=3, accept_histogram=[1]),
                            SpecCounters(accepted=None, proposed=4, verify=2, completion=5)])
    assert _tuple(folded) == (None, 6, 3, 8, None)
    assert _tuple(fold_attempts([])) == (None, None, None, None, None)


class _NumpyLikeInt:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (0, 0), (5.0, 5), ("07", 7), (_NumpyLikeInt(9), 9), (True, None), (False, None), (-1, None),
     (1.5, None), (float("nan"), None), (float("inf"), None), ("", None), (" 3", None), ("٣", None), ("x", None),
     (None, None), ([1], None), (2**63, None), ("9" * 30, None), (2**63 - 1, 2**63 - 1)],
)
def test_value_normalisation(value, expected):
    assert normalize_counter(value) == expected


def test_histogram_with_one_bad_bin_is_unknown():
    assert counters_from_meta_info({"spec_accept_histogram": [1, -1]}).accept_histogram is None
    assert counters_from_meta_info({"spec_accept_histogram": "1,2"}).accept_histogram is None
    assert counters_from_meta_info({"spec_accept_histogram": [1.0, "2"]}).accept_histogram == [1, 2]


def test_missing_request_id_says_what_to_do():
    with pytest.raises(ValueError, match="generation_id="):
        record_from_meta_info({"completion_tokens": 3}, batch_id="b", session_id="s")
