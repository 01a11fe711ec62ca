"""SGLang through its OpenAI-compatible API (issue 44.1): ``sglext.spec_tokens_details`` on
/v1/chat/completions and /v1/completions, whole and streamed, gives exactly the records the
same generations give through ``meta_info``; SGLang's placeholder zeros stay unknown;
measured proposals are preferred over nominal ones; draft lags reach every record."""

from __future__ import annotations

import msgspec
import pytest

from specmeter.producers import counters_from_meta_info
from specmeter.producers.sglang_adapter import records_from_openai_response, records_from_outputs, sse_events
from specmeter.schemas import GenerationRecord
from specmeter.streams import OfflineAggregator

from .engines.sglang_shapes import (
    DECOUPLED_MEASURED,
    DECOUPLED_MEASURED_COUNTERS,
    EAGLE_0_5_12,
    EAGLE_0_5_12_COUNTERS,
    NOMINAL_FALLBACK,
    NOMINAL_FALLBACK_COUNTERS,
    NOTHING_VERIFIED,
    openai_response,
    openai_stream,
    ret_item,
)


def counters(record: GenerationRecord):
    return (record.accepted, record.proposed, record.verify, record.completion, record.accept_histogram)


def batch_metrics(records: list[GenerationRecord]):
    aggregator = OfflineAggregator(speculative_algorithm="EAGLE3")
    for record in records:
        aggregator.feed(record)
    (result,) = aggregator.results(closed_at=0.0)
    return result.metrics, result.by_draft_lag, result.accept_histogram


@pytest.mark.parametrize(
    ("meta_info", "want"),
    [
        (EAGLE_0_5_12, EAGLE_0_5_12_COUNTERS),
        (DECOUPLED_MEASURED, DECOUPLED_MEASURED_COUNTERS),
        (NOMINAL_FALLBACK, NOMINAL_FALLBACK_COUNTERS),
    ],
    ids=["0.5.12", "decoupled-measured", "nominal-fallback"],
)
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_one_choice_gives_the_counters_of_its_meta_info(meta_info, want, chat):
    response = openai_response([ret_item(meta_info)], chat=chat)
    (record,) = records_from_openai_response(response, batch_id="b", session_id="s", draft_lags=2)
    assert counters(record) == want
    assert record.generation_id == meta_info["id"] and record.draft_lag == 2
    assert record.weight_version == "step-000042", "from the response's metadata, as /generate's meta_info"


def test_measured_proposals_are_preferred_to_nominal_ones():
    assert counters_from_meta_info(DECOUPLED_MEASURED).proposed == 2
    lengths_only = {k: v for k, v in DECOUPLED_MEASURED.items() if k != "spec_num_proposed_drafts_by_position"}
    assert counters_from_meta_info({**lengths_only, "spec_num_proposed_drafts": 6}).proposed == 2
    assert counters_from_meta_info(NOMINAL_FALLBACK).proposed == 6
    assert counters_from_meta_info({**NOMINAL_FALLBACK, "spec_proposed_drafts_histogram": []}).proposed == 6


def test_a_streamed_response_gives_the_same_records_as_the_whole_one():
    ret = [ret_item(EAGLE_0_5_12)]
    whole = records_from_openai_response(openai_response(ret), batch_id="b", session_id="s", draft_lags=1)
    events = sse_events(openai_stream(ret))
    assert events[-2]["choices"] == [] and "sglext" in events[-2], "the counters' own chunk, before usage"
    streamed = records_from_openai_response(events, batch_id="b", session_id="s", draft_lags=1)
    assert streamed[0].weight_version is None, "the chunks carry no metadata: the caller names the version"
    named = records_from_openai_response(
        events, batch_id="b", session_id="s", draft_lags=1, weight_version="step-000042"
    )
    assert named == whole


def test_n_2_gives_each_choice_its_own_details_and_unknown_completion():
    ret = [ret_item(EAGLE_0_5_12), ret_item(DECOUPLED_MEASURED)]
    response = openai_response(ret, n=2)
    assert isinstance(response["sglext"]["spec_tokens_details"], list)
    records = records_from_openai_response(response, batch_id="b", session_id="s", draft_lags=[0, 3])
    assert [r.generation_id for r in records] == ["7d2c1f0e9a:0", "7d2c1f0e9a:1"]
    assert [r.draft_lag for r in records] == [0, 3]
    assert counters(records[0]) == (7, 15, 5, None, [1, 2, 1, 1]), "usage sums the choices: not this one's"
    assert counters(records[1])[:3] == (1, 2, 2)


def test_n_2_where_one_choice_had_no_details_leaves_both_unknown_never_shifted():
    """SGLang's list drops the choices with none and carries no index: [details of choice 1]
    could be choice 0's. Neither is guessed."""
    response = openai_response([ret_item(NOTHING_VERIFIED), ret_item(EAGLE_0_5_12)], n=2)
    assert len(response["sglext"]["spec_tokens_details"]) == 1
    for speculative in (False, True):
        records = records_from_openai_response(response, batch_id="b", session_id="s", speculative=speculative)
        assert [counters(r) for r in records] == [(None, None, None, None, None)] * 2


def test_sglang_s_placeholder_zeros_are_unknown_never_0():
    """``meta_info.get(key) or 0``: a details object written for another key (cap lengths)
    carries counters SGLang never wrote as 0 and histograms as []."""
    meta_info = {**NOTHING_VERIFIED, "spec_cap_length": 0.0}
    response = openai_response([ret_item(meta_info)])
    details = response["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] == 0 and details["spec_num_proposed_drafts"] == 0
    (record,) = records_from_openai_response(response, batch_id="b", session_id="s")
    assert counters(record) == (None, None, None, 1, None)


def test_nothing_verified_is_not_reported_unless_the_caller_says_the_server_speculates():
    """fill_spec_decoding_meta writes no spec key without a verify step: meta_info and the
    OpenAI answer (no sglext at all) read the same, unknown by default and the observed
    zeros with speculative=True."""
    ret = [ret_item(NOTHING_VERIFIED)]
    response = openai_response(ret)
    assert "sglext" not in response
    for speculative, want in ((False, (None, None, None, 1, None)), (True, (0, 0, 0, 1, None))):
        (from_meta,) = records_from_outputs(ret, batch_id="b", session_ids="s", speculative=speculative)
        (from_openai,) = records_from_openai_response(response, batch_id="b", session_id="s", speculative=speculative)
        assert counters(from_meta) == counters(from_openai) == want


def test_a_rollout_through_the_openai_api_gets_the_batch_metrics_of_meta_info():
    """Issue 44's target: the same generations through /generate (meta_info) and through
    /v1/chat/completions (one request each, streamed for every other one) aggregate to the
    same batch metrics, by draft lag too."""
    generations = [EAGLE_0_5_12, DECOUPLED_MEASURED, NOMINAL_FALLBACK, NOTHING_VERIFIED]
    lags = [0, 1, 1, 2]
    via_meta = records_from_outputs(
        [ret_item(m) for m in generations], batch_id="b", session_ids="s", draft_lags=lags, speculative=True
    )
    via_openai = []
    for number, (meta_info, lag) in enumerate(zip(generations, lags, strict=True)):
        ret = [ret_item(meta_info)]
        answer = sse_events(openai_stream(ret)) if number % 2 else openai_response(ret)
        via_openai += records_from_openai_response(
            answer, batch_id="b", session_id="s", draft_lags=lag, speculative=True
        )
    assert [counters(r) for r in via_openai] == [counters(r) for r in via_meta]
    assert batch_metrics(via_openai) == batch_metrics(via_meta)
    metrics, by_lag, _ = batch_metrics(via_openai)
    assert metrics["spec/accepted_total"] == 9 and metrics["spec/proposed_total"] == 23
    assert [entry.draft_lag for entry in by_lag] == [0, 1, 2]


def test_a_choice_s_own_meta_info_is_read_first():
    response = openai_response([ret_item(EAGLE_0_5_12)])
    del response["sglext"]
    response["choices"][0]["meta_info"] = DECOUPLED_MEASURED
    (record,) = records_from_openai_response(response, batch_id="b", session_id="s")
    assert counters(record) == DECOUPLED_MEASURED_COUNTERS


def test_what_is_not_a_response_is_refused_with_its_path():
    with pytest.raises(ValueError, match=r"\$\.id"):
        records_from_openai_response({"id": 7, "choices": []}, batch_id="b", session_id="s")
    with pytest.raises(ValueError, match="no chunk"):
        records_from_openai_response([], batch_id="b", session_id="s")
    with pytest.raises(ValueError, match="2 choices but 1 draft lags"):
        response = openai_response([ret_item(EAGLE_0_5_12)] * 2, n=2)
        records_from_openai_response(response, batch_id="b", session_id="s", draft_lags=[1])


def test_records_are_unchanged_on_the_wire():
    response = openai_response([ret_item(EAGLE_0_5_12), ret_item(DECOUPLED_MEASURED)], n=2)
    for record in records_from_openai_response(response, batch_id="b", session_id="s", draft_lags=4):
        wire = msgspec.msgpack.encode(record)
        assert msgspec.msgpack.decode(wire, type=GenerationRecord) == record
