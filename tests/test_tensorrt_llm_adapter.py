"""Records from TensorRT-LLM's perf metrics (issue 44.3), without tensorrt_llm installed:
accepted and proposed exact, verify steps unknown unless counted (PR #19311, unreleased),
zeroed counters unknown, draft lags on every record, the batch metrics of meta_info."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest

from specmeter.producers import counters_from_meta_info, record_from_counters
from specmeter.producers.tensorrt_llm_adapter import (
    counters_from_speculative_decoding,
    publish_request_outputs,
    records_from_request_outputs,
    records_from_response,
)
from specmeter.schemas import GenerationRecord
from specmeter.streams import OfflineAggregator

from .engines.tensorrt_llm_shapes import (
    MEASURED,
    NO_PERF_METRICS,
    PR_19311_CHOICE,
    RELEASED_CHOICE,
    TWO_SEQUENCES,
    ZEROED,
    chat_response,
)


def counters(record: GenerationRecord):
    return (record.accepted, record.proposed, record.verify, record.completion, record.accept_histogram)


def test_perf_metrics_give_accepted_and_proposed_and_leave_verify_unknown():
    """avg_decoded_tokens_per_iter is a float mean: verify steps are not made up from it."""
    (record,) = records_from_request_outputs(MEASURED, batch_id="b", session_ids="s", draft_lags=1, tasks="gsm8k")
    assert counters(record) == (30, 60, None, 50, None)
    assert (record.generation_id, record.draft_lag, record.task) == ("7", 1, "gsm8k")


def test_zeroed_counters_of_the_pytorch_flow_are_unknown_never_0():
    """Before TensorRT-LLM PR #17082 the PyTorch flow returned 0/0 though drafting ran."""
    (record,) = records_from_request_outputs(ZEROED, batch_id="b", session_ids="s")
    assert counters(record) == (None, None, None, 50, None)
    (no_perf,) = records_from_request_outputs(NO_PERF_METRICS, batch_id="b", session_ids="s")
    assert counters(no_perf) == (None, None, None, 12, None)


def test_n_2_gives_each_sequence_its_own_record():
    records = records_from_request_outputs(
        [TWO_SEQUENCES, MEASURED], batch_id="b", session_ids=["s0", "s1"], draft_lags=[0, 2]
    )
    assert [(r.generation_id, r.session_id, r.draft_lag, r.accepted, r.proposed) for r in records] == [
        ("10:0", "s0", 0, 4, 9),
        ("10:1", "s0", 0, 1, 6),
        ("7", "s1", 2, 30, 60),
    ]


def test_the_per_choice_object_of_pr_19311_as_written_there():
    """Not yet released: num_spec_steps is the verify steps and the histogram is dense."""
    (record,) = records_from_response(chat_response(PR_19311_CHOICE), batch_id="b", session_id="s", draft_lags=0)
    assert counters(record) == (30, 60, 20, 50, [8, 0, 6, 6])
    assert record.generation_id == "chatcmpl-3f1c9a"


def test_a_released_server_s_choice_has_no_counters():
    (record,) = records_from_response(chat_response(RELEASED_CHOICE), batch_id="b", session_id="s")
    assert counters(record) == (None, None, None, 50, None)
    two = chat_response(PR_19311_CHOICE, {**PR_19311_CHOICE, "index": 1}, completion_tokens=100)
    records = records_from_response(two, batch_id="b", session_id="s", draft_lags=[1, 2])
    assert [(r.generation_id, r.completion, r.verify, r.draft_lag) for r in records] == [
        ("chatcmpl-3f1c9a:0", None, 20, 1),
        ("chatcmpl-3f1c9a:1", None, 20, 2),
    ]


@pytest.mark.parametrize(
    ("metrics", "want"),
    [
        ({"total_accepted_draft_tokens": -1, "total_draft_tokens": 4}, (None, 4, None)),
        ({"total_accepted_draft_tokens": 2.0, "total_draft_tokens": "4"}, (2, 4, None)),
        ({**PR_19311_CHOICE["speculative_decoding"], "num_spec_steps": 2.5}, (30, 60, None)),
        ({"total_accepted_draft_tokens": 0, "total_draft_tokens": 0, "num_spec_steps": 3}, (0, 0, 3)),
    ],
)
def test_values_are_normalised_and_zeros_with_a_step_count_are_observations(metrics, want):
    got = counters_from_speculative_decoding(metrics)
    assert (got.accepted, got.proposed, got.verify) == want


def test_the_batch_metrics_are_those_of_the_same_generations_through_meta_info():
    """Issue 44's target for TensorRT-LLM: the same generations as SGLang meta_info."""
    from_engine = records_from_request_outputs(
        [MEASURED, TWO_SEQUENCES], batch_id="b", session_ids="s", draft_lags=[1, 2]
    )
    from_http = records_from_response(chat_response(PR_19311_CHOICE), batch_id="b", session_id="s", draft_lags=0)
    as_meta_info = [
        ({"completion_tokens": 50, "spec_num_correct_drafts": 30, "spec_num_proposed_drafts": 60}, 1),
        ({"completion_tokens": 9, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 9}, 2),
        ({"completion_tokens": 6, "spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 6}, 2),
        (
            {
                "completion_tokens": 50,
                "spec_num_correct_drafts": 30,
                "spec_num_proposed_drafts": 60,
                "spec_verify_ct": 20,
                "spec_correct_drafts_histogram": [8, 0, 6, 6],
            },
            0,
        ),
    ]
    via_meta = [
        record_from_counters(
            counters_from_meta_info(m), batch_id="b", session_id="s", generation_id=f"g{i}", draft_lag=lag
        )
        for i, (m, lag) in enumerate(as_meta_info)
    ]

    def metrics(records):
        aggregator = OfflineAggregator(speculative_algorithm="EAGLE3")
        for record in records:
            aggregator.feed(record)
        (result,) = aggregator.results(closed_at=0.0)
        return result.metrics, result.by_draft_lag, result.accept_histogram

    assert metrics([*from_engine, *from_http]) == metrics(via_meta)
    got, by_lag, _ = metrics(via_meta)
    assert got["spec/accept_count_coverage"] == 1.0 and got["spec/verify_count_coverage"] == 0.25
    assert [entry.draft_lag for entry in by_lag] == [0, 1, 2]


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="request_id=None"):
        records_from_request_outputs(SimpleNamespace(outputs=[]), batch_id="b", session_ids="s")
    with pytest.raises(ValueError, match="id=None"):
        records_from_response({"choices": []}, batch_id="b", session_id="s")
    with pytest.raises(ValueError, match="2 request outputs but 1 draft lags"):
        records_from_request_outputs([MEASURED, ZEROED], batch_id="b", session_ids="s", draft_lags=[1])


def test_publish_request_outputs_in_the_publisher_s_run():
    published: list[GenerationRecord] = []

    class FakePublisher:
        settings = SimpleNamespace(producer_id="w1", run_id="grpo-2")

        async def publish(self, record: GenerationRecord) -> None:
            published.append(record)

    sent = asyncio.run(
        publish_request_outputs(FakePublisher(), [MEASURED], batch_id="b", session_ids="s", draft_lags=3)
    )
    assert sent == 1 and (published[0].producer_id, published[0].run_id, published[0].draft_lag) == ("w1", "grpo-2", 3)


def test_adapter_does_not_import_tensorrt_llm():
    assert "tensorrt_llm" not in sys.modules
