"""SGLang meta_info -> counters: golden cases, release-shaped fixtures, folding."""

from __future__ import annotations

import msgspec
import pytest

from specmeter.producers import (
    SpecCounters,
    counters_from_meta_info,
    fold_attempts,
    normalize_counter,
    normalize_weight_version,
    record_from_attempts,
    record_from_counters,
    record_from_meta_info,
)
from specmeter.schemas import MAX_BINS, MAX_COUNTER, MAX_ID

from .support.golden_cases import meta_info_cases
from .support.sglang_meta_info import ABORTED_BEFORE_RUN, RESUMED, SGLANG_OUTPUTS

CASES = meta_info_cases()


def _tuple(c: SpecCounters):
    return (c.accepted, c.proposed, c.verify, c.completion, c.accept_histogram)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden_meta_info_case(case):
    """The counters after docs/contract.md §2; where the case names it, the record's
    weight_version too."""
    got = msgspec.structs.asdict(counters_from_meta_info(case["meta_info"]))
    expected = dict(case["expected"])
    want_version = expected.pop("weight_version", None)
    got_version = got.pop("weight_version")
    assert got == expected
    if "weight_version" in case["expected"]:
        assert got_version == want_version
        record = record_from_meta_info(case["meta_info"], batch_id="b", session_id="s", generation_id="g")
        assert record.weight_version == want_version


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
    folded = fold_attempts(
        [
            SpecCounters(accepted=1, proposed=2, verify=1, completion=3, accept_histogram=[1]),
            SpecCounters(accepted=None, proposed=4, verify=2, completion=5),
        ]
    )
    assert _tuple(folded) == (None, 6, 3, 8, None)
    assert _tuple(fold_attempts([])) == (None, None, None, None, None)


class _NumpyLikeInt:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        (0, 0),
        (5.0, 5),
        ("07", 7),
        (_NumpyLikeInt(9), 9),
        (True, None),
        (False, None),
        (-1, None),
        (1.5, None),
        (float("nan"), None),
        (float("inf"), None),
        ("", None),
        (" 3", None),
        ("٣", None),
        ("x", None),
        (None, None),
        ([1], None),
        (2**63, None),
        ("9" * 30, None),
        (2**63 - 1, None),
        (MAX_COUNTER, MAX_COUNTER),
        (MAX_COUNTER + 1, None),
        (float(MAX_COUNTER), MAX_COUNTER),
        (float(MAX_COUNTER + 1), None),
        (str(MAX_COUNTER), MAX_COUNTER),
        (str(MAX_COUNTER + 1), None),
        (_NumpyLikeInt(MAX_COUNTER + 1), None),
    ],
)
def test_value_normalisation(value, expected):
    """Kept up to the wire limit MAX_COUNTER = 2^32 - 1, unknown past it."""
    assert normalize_counter(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("v12", "v12"),
        ("default", "default"),
        (12, "12"),
        (0, "0"),
        (_NumpyLikeInt(7), "7"),
        ("", None),
        ("v" * MAX_ID, "v" * MAX_ID),
        ("v" * (MAX_ID + 1), None),
        (-1, None),
        (True, None),
        (1.0, None),
        (None, None),
        (["v1"], None),
        (b"v1", None),
    ],
)
def test_weight_version_normalisation(value, expected):
    assert normalize_weight_version(value) == expected
    assert counters_from_meta_info({"weight_version": value}).weight_version == expected


def test_histogram_past_the_bin_limit_is_unknown():
    assert counters_from_meta_info({"spec_accept_histogram": [1] * MAX_BINS}).accept_histogram == [1] * MAX_BINS
    assert counters_from_meta_info({"spec_accept_histogram": [1] * (MAX_BINS + 1)}).accept_histogram is None
    assert counters_from_meta_info({"spec_accept_histogram": [MAX_COUNTER + 1]}).accept_histogram is None


def test_fold_past_the_counter_limit_is_unknown_and_versions_must_agree():
    half = MAX_COUNTER // 2 + 1
    folded = fold_attempts(
        [
            SpecCounters(accepted=half, proposed=1, accept_histogram=[half], weight_version="v3"),
            SpecCounters(accepted=half, proposed=2, accept_histogram=[half], weight_version="v3"),
        ]
    )
    assert (folded.accepted, folded.proposed, folded.accept_histogram, folded.weight_version) == (None, 3, None, "v3")
    mixed = fold_attempts([SpecCounters(weight_version="v3"), SpecCounters(weight_version="v4")])
    assert mixed.weight_version is None
    assert fold_attempts([SpecCounters(weight_version="v3"), SpecCounters()]).weight_version is None


def test_an_int_version_too_long_for_the_wire_is_unknown_not_an_error():
    """Regression: 10**1024 became a 1025-character version and the record failed
    validation (10**5000 raised in int-to-str conversion)."""
    assert normalize_weight_version(10**MAX_ID - 1) == "9" * MAX_ID
    for value in (10**MAX_ID, 10**5000):
        assert normalize_weight_version(value) is None
        record = record_from_meta_info({"id": "r", "weight_version": value}, batch_id="b", session_id="s")
        assert record.weight_version is None


def test_explicit_ids_and_run_reach_the_record():
    meta = {"id": "req-1", "weight_version": "v1", "spec_verify_ct": 2}
    record = record_from_meta_info(meta, batch_id="b", session_id="s", run_id="attempt-2")
    assert (record.run_id, record.weight_version) == ("attempt-2", "v1")
    assert record_from_meta_info(meta, batch_id="b", session_id="s", weight_version="v9").weight_version == "v9"
    with pytest.raises(msgspec.ValidationError, match="length"):
        record_from_meta_info(meta, batch_id="b" * (MAX_ID + 1), session_id="s")


def test_histogram_with_one_bad_bin_is_unknown():
    assert counters_from_meta_info({"spec_accept_histogram": [1, -1]}).accept_histogram is None
    assert counters_from_meta_info({"spec_accept_histogram": "1,2"}).accept_histogram is None
    assert counters_from_meta_info({"spec_accept_histogram": [1.0, "2"]}).accept_histogram == [1, 2]


def test_missing_request_id_says_what_to_do():
    with pytest.raises(ValueError, match="generation_id="):
        record_from_meta_info({"completion_tokens": 3}, batch_id="b", session_id="s")


@pytest.mark.parametrize(
    ("meta_info", "found"),
    [({"completion_tokens": 3}, "has no 'id' key"), ({"id": 7}, "has 'id' = 7, not a non-empty string")],
)
def test_a_missing_or_unusable_request_id_names_what_was_found_and_the_call_to_make(meta_info, found):
    """Issue 33: the README's snippet raised "no usable 'id'" on a meta_info without
    SGLang's request id, without saying what it had found or which argument of which
    call to pass."""
    with pytest.raises(ValueError) as raised:
        record_from_meta_info(meta_info, batch_id="b", session_id="s")
    message = str(raised.value)
    assert found in message and "record_from_meta_info(..., generation_id=ID)" in message, message
    assert "stays the same" in message, "the id must be stable across redeliveries: say so"
    with pytest.raises(ValueError, match=r"record_from_attempts\(\.\.\., generation_id=ID\)"):
        record_from_attempts([meta_info], batch_id="b", session_id="s")
    assert record_from_meta_info(meta_info, batch_id="b", session_id="s", generation_id="g").generation_id == "g"


def test_dump_lines_of_sglang_outputs_carry_version_and_run():
    import json

    from specmeter.streams.fleet.dumps import parse_dump_line

    line = {
        "meta_info": {"id": "r1", "weight_version": 12, "spec_verify_ct": 1},
        "batch_id": "b",
        "session_id": "s",
        "run_id": "attempt-2",
    }
    record = parse_dump_line(json.dumps(line))
    assert (record.weight_version, record.run_id) == ("12", "attempt-2")
    bad = parse_dump_line(json.dumps({**line, "session_id": ""}))
    assert (bad.reason, bad.batch_id, bad.run_id) == ("invalid", "b", "attempt-2")
    unreadable = parse_dump_line(json.dumps({**line, "session_id": "", "run_id": ""}))
    assert unreadable.batch_id is None


def test_the_task_reaches_the_record_and_is_one_for_every_attempt():
    """Revision 4: ``task=`` is the prompt's dataset, not read from meta_info; a resumed
    generation has one task for all its attempts; an empty or too long one is refused."""
    import json

    from specmeter.streams.fleet.dumps import parse_dump_line

    meta = {"id": "req-1", "spec_verify_ct": 2, "task": "ignored"}
    assert record_from_meta_info(meta, batch_id="b", session_id="s").task is None
    assert record_from_meta_info(meta, batch_id="b", session_id="s", task="gsm8k").task == "gsm8k"
    attempts = [meta, {**meta, "spec_verify_ct": 3}]
    record = record_from_attempts(attempts, batch_id="b", session_id="s", task="swe-bench")
    assert (record.task, record.verify) == ("swe-bench", 5)
    for bad in ("", "t" * (MAX_ID + 1)):
        with pytest.raises(msgspec.ValidationError):
            record_from_meta_info(meta, batch_id="b", session_id="s", task=bad)
    line = {"meta_info": meta, "batch_id": "b", "session_id": "s", "task": "chat"}
    assert parse_dump_line(json.dumps(line)).task == "chat"
    assert parse_dump_line(json.dumps({"attempts": attempts, **line})).task == "chat"
    bad_line = parse_dump_line(json.dumps({**line, "task": 7}))
    assert (bad_line.reason, bad_line.batch_id) == ("invalid", "b")


def test_the_draft_lag_reaches_the_record_and_is_one_for_every_attempt():
    """Revision 5: ``draft_lag=`` is the rollout's (not read from meta_info); a resumed
    generation has one lag for all its attempts; a negative, fractional or too large one
    is refused; a dump's SGLang output line may name it."""
    import json

    from specmeter.streams.fleet.dumps import parse_dump_line

    meta = {"id": "req-1", "spec_verify_ct": 2, "draft_lag": 9}
    assert record_from_meta_info(meta, batch_id="b", session_id="s").draft_lag is None
    assert record_from_meta_info(meta, batch_id="b", session_id="s", draft_lag=0).draft_lag == 0
    attempts = [meta, {**meta, "spec_verify_ct": 3}]
    record = record_from_attempts(attempts, batch_id="b", session_id="s", draft_lag=3)
    assert (record.draft_lag, record.verify) == (3, 5)
    counters = record_from_counters(
        SpecCounters(accepted=1), batch_id="b", session_id="s", generation_id="g", draft_lag=1
    )
    assert counters.draft_lag == 1
    for bad in (-1, 1.5, 2**32, "1"):
        with pytest.raises(msgspec.ValidationError):
            record_from_meta_info(meta, batch_id="b", session_id="s", draft_lag=bad)
    line = {"meta_info": meta, "batch_id": "b", "session_id": "s", "draft_lag": 4}
    assert parse_dump_line(json.dumps(line)).draft_lag == 4
    assert parse_dump_line(json.dumps({"attempts": attempts, **line})).draft_lag == 4
    bad_line = parse_dump_line(json.dumps({**line, "draft_lag": -2}))
    assert (bad_line.reason, bad_line.batch_id) == ("invalid", "b")
