"""Records from vLLM's per-request speculative-decoding metrics, without vllm installed.

The shapes are vLLM's own (producers/vllm_adapter.py cites the files): a
``RequestSpecDecodeMetrics`` built as vLLM's tests/test_outputs.py builds one
(``new(num_spec_tokens)``, ``observe(num_draft_tokens, num_accepted)``) on each
``CompletionOutput``, and the OpenAI-compatible response's ``metrics.speculative_decoding``
of docs/features/speculative_decoding/acceptance_metrics.md, whose example is used as is."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from specmeter.producers.vllm_adapter import (
    counters_from_spec_decode_metrics,
    publish_request_outputs,
    records_from_request_outputs,
    records_from_response,
)
from specmeter.schemas import GenerationRecord


@dataclass
class RequestSpecDecodeMetrics:
    """vllm.v1.metrics.stats.RequestSpecDecodeMetrics: its fields and the two methods vLLM's
    tests call (``observe`` counts one verify step that had ``num_draft_tokens`` drafts)."""

    num_spec_tokens: int
    histogram: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> RequestSpecDecodeMetrics:
        return cls(num_spec_tokens=num_spec_tokens, histogram=[0] * (num_spec_tokens + 1))

    def observe(self, num_draft_tokens: int, num_accepted: int, detailed: bool = False) -> None:
        self.histogram[num_accepted] += 1
        self.num_draft_tokens += num_draft_tokens
        if detailed:
            self.per_step_accepted.append(num_accepted)
            self.per_step_drafted.append(num_draft_tokens)


def completion(index: int, tokens: int, metrics: Any) -> SimpleNamespace:
    """A vllm.outputs.CompletionOutput's fields the adapter reads."""
    return SimpleNamespace(index=index, text="...", token_ids=list(range(tokens)), spec_decode_metrics=metrics)


def request(request_id: str, *completions: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, prompt="p", outputs=list(completions), finished=True)


def steps(num_spec_tokens: int, observed: list[tuple[int, int]]) -> RequestSpecDecodeMetrics:
    metrics = RequestSpecDecodeMetrics.new(num_spec_tokens)
    for drafted, accepted in observed:
        metrics.observe(num_draft_tokens=drafted, num_accepted=accepted, detailed=True)
    return metrics


#: the summary response's metrics in vLLM's docs (acceptance_metrics.md), as printed there
DOC_EXAMPLE = {
    "mean_acceptance_length": 1.2325581395348837,
    "draft_acceptance_rate": 0.07751937984496124,
    "acceptance_histogram": [39, 1, 0, 3],
    "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
    "num_spec_steps": 43,
    "num_accepted_draft_tokens": 10,
    "num_draft_tokens": 129,
    "num_spec_tokens": 3,
}


def test_one_sequence_maps_to_the_record_fields():
    # vLLM's tests/test_outputs.py: new(num_spec_tokens=2), observe(num_draft_tokens=2, num_accepted=1)
    metrics = steps(2, [(2, 1)])
    (record,) = records_from_request_outputs(request("req-1", completion(0, 2, metrics)), batch_id="b", session_ids="s")
    assert (record.generation_id, record.accepted, record.proposed, record.verify, record.completion) == (
        "req-1",
        1,
        2,
        1,
        2,
    )
    assert record.accept_histogram == [0, 1, 0]


def test_the_counters_agree_with_the_histogram_as_the_contract_checks():
    """docs/contract.md §3.5: verify = sum(H) and accepted = sum_i i * H[i], or the stream
    counts the generation inconsistent."""
    metrics = steps(3, [(3, 3), (3, 0), (2, 2), (3, 1), (1, 0)])  # two steps had fewer drafts (grammar)
    counters = counters_from_spec_decode_metrics(metrics, 11)
    assert counters.accept_histogram == [2, 1, 1, 1]
    assert counters.verify == 5 == sum(counters.accept_histogram)
    assert counters.accepted == 6 == sum(i * n for i, n in enumerate(counters.accept_histogram))
    assert (counters.proposed, counters.completion) == (3 + 3 + 2 + 3 + 1, 11)


def test_the_response_of_vllm_s_docs():
    response = {
        "id": "cmpl-9",
        "choices": [{"index": 0, "text": "...", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 54, "total_tokens": 65},
        "metrics": {"speculative_decoding": DOC_EXAMPLE},
    }
    (record,) = records_from_response(response, batch_id="b", session_id="s", task="gsm8k", weight_version="v3")
    assert (record.generation_id, record.accepted, record.proposed, record.verify, record.completion) == (
        "cmpl-9",
        10,
        129,
        43,
        54,
    )
    assert (record.accept_histogram, record.task, record.weight_version) == ([39, 1, 0, 3], "gsm8k", "v3")
    # the dataclass's to_dict() has the same keys: the same counters
    assert counters_from_spec_decode_metrics(DOC_EXAMPLE, 54) == counters_from_spec_decode_metrics(
        RequestSpecDecodeMetrics(num_spec_tokens=3, histogram=[39, 1, 0, 3], num_draft_tokens=129), 54
    )


def test_a_streamed_response_s_final_usage_chunk_has_no_choices():
    """Streaming: ``metrics`` rides the final usage chunk, whose ``choices`` is empty."""
    chunk = {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {"completion_tokens": 54},
        "metrics": {"speculative_decoding": DOC_EXAMPLE},
    }
    (record,) = records_from_response(chunk, batch_id="b", session_id="s")
    assert (record.generation_id, record.verify, record.completion) == ("chatcmpl-1", 43, 54)


def test_n_greater_than_1_from_the_engine_gives_a_record_per_sequence_with_its_own_metrics():
    out = request("req-7", completion(0, 5, steps(2, [(2, 2), (2, 0)])), completion(1, 3, steps(2, [(2, 1)])))
    records = records_from_request_outputs(out, batch_id="b", session_ids="s", sample_ids=["t0", "t1"])
    assert [
        (r.generation_id, r.sample_id, r.accepted, r.verify, r.completion, r.accept_histogram) for r in records
    ] == [
        ("req-7:0", "t0", 2, 2, 5, [1, 0, 1]),
        ("req-7:1", "t1", 1, 1, 3, [0, 1, 0]),
    ]


def test_n_greater_than_1_over_http_leaves_every_counter_unknown_never_0():
    """vLLM reports ``metrics.speculative_decoding`` only for n == 1 (null otherwise), and
    ``usage.completion_tokens`` sums the choices: nothing is known per choice."""
    response = {
        "id": "cmpl-2",
        "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}],
        "usage": {"completion_tokens": 40},
        "metrics": {"speculative_decoding": None},
    }
    records = records_from_response(response, batch_id="b", session_id="s")
    assert [r.generation_id for r in records] == ["cmpl-2:0", "cmpl-2:1"]
    for r in records:
        assert (r.accepted, r.proposed, r.verify, r.completion, r.accept_histogram) == (None,) * 5
        assert b'"accepted"' not in msgspec.json.encode(r), "unknown is left out of the record, never 0"


def test_no_speculation_or_the_flag_off_leaves_the_counters_unknown():
    (record,) = records_from_request_outputs(request("req-3", completion(0, 9, None)), batch_id="b", session_ids="s")
    assert (record.accepted, record.proposed, record.verify, record.accept_histogram) == (None, None, None, None)
    assert record.completion == 9
    (over_http,) = records_from_response({"id": "c", "choices": [{"index": 0}]}, batch_id="b", session_id="s")
    assert (over_http.verify, over_http.completion) == (None, None)


@pytest.mark.parametrize(
    ("metrics", "want"),
    [
        ({**DOC_EXAMPLE, "num_draft_tokens": "lots"}, {"proposed": None, "accepted": 10}),
        ({**DOC_EXAMPLE, "acceptance_histogram": [39, -1, 0, 3]}, {"accept_histogram": None, "verify": 43}),
        ({"acceptance_histogram": {"0": 39, "1": 1, "3": 3}}, {"accept_histogram": [39, 1, 0, 3], "verify": 43}),
        ({"num_spec_steps": True, "num_draft_tokens": 2.5}, {"verify": None, "proposed": None}),
    ],
)
def test_malformed_values_become_unknown(metrics, want):
    counters = counters_from_spec_decode_metrics(metrics)
    for name, value in want.items():
        assert getattr(counters, name) == value, name


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="2 request outputs but 3 session ids"):
        records_from_request_outputs([request("a"), request("b")], batch_id="b", session_ids=["s0", "s1", "s2"])
    with pytest.raises(ValueError, match="request_id=None"):
        records_from_request_outputs(SimpleNamespace(outputs=[]), batch_id="b", session_ids="s")
    with pytest.raises(ValueError, match="id=None"):
        records_from_response({"choices": []}, batch_id="b", session_id="s")
    with pytest.raises(ValueError, match="1 sequences but 2 sample ids"):
        records_from_request_outputs(
            request("a", completion(0, 1, None)), batch_id="b", session_ids="s", sample_ids=["x", "y"]
        )


def test_publish_request_outputs_in_the_publisher_s_run():
    published: list[GenerationRecord] = []

    class FakePublisher:
        settings = SimpleNamespace(producer_id="w3", run_id="grpo-1")

        async def publish(self, record: GenerationRecord) -> None:
            published.append(record)

    outs = [request("r0", completion(0, 4, steps(1, [(1, 1), (1, 0)]))), request("r1", completion(0, 2, None))]
    sent = asyncio.run(
        publish_request_outputs(FakePublisher(), outs, batch_id="step-1", session_ids=["s0", "s1"], tasks="chat")
    )
    assert sent == 2
    assert [(r.generation_id, r.session_id, r.producer_id, r.run_id, r.task, r.verify) for r in published] == [
        ("r0", "s0", "w3", "grpo-1", "chat", 2),
        ("r1", "s1", "w3", "grpo-1", "chat", None),
    ]


def test_adapter_does_not_import_vllm():
    assert "vllm" not in sys.modules


# --- issue 44.2: draft lags, the by-draft-length histogram, the EOS over-count, the refusal,
# multi-prompt nulls and /inference/v1/generate


def test_draft_lags_reach_every_record_on_both_entry_points():
    outs = [
        request("r0", completion(0, 4, steps(1, [(1, 1)])), completion(1, 2, steps(1, [(1, 0)]))),
        request("r1", completion(0, 3, None)),
    ]
    records = records_from_request_outputs(outs, batch_id="b", session_ids="s", draft_lags=[0, 2])
    assert [(r.generation_id, r.draft_lag) for r in records] == [("r0:0", 0), ("r0:1", 0), ("r1", 2)]
    assert {r.draft_lag for r in records_from_request_outputs(outs, batch_id="b", session_ids="s", draft_lags=5)} == {5}
    response = {"id": "cmpl-4", "choices": [{"index": 0}], "metrics": {"speculative_decoding": DOC_EXAMPLE}}
    (record,) = records_from_response(response, batch_id="b", session_id="s", draft_lags=3)
    assert record.draft_lag == 3
    two = {"id": "cmpl-5", "choices": [{"index": 0}, {"index": 1}]}
    assert [r.draft_lag for r in records_from_response(two, batch_id="b", session_id="s", draft_lags=[1, None])] == [
        1,
        None,
    ]
    with pytest.raises(ValueError, match="2 request outputs but 3 draft lags"):
        records_from_request_outputs(outs, batch_id="b", session_ids="s", draft_lags=[0, 1, 2])


def test_the_by_draft_length_histogram_where_the_plain_one_is_absent():
    """PR #56278 (main-branch docs): {"k": [k + 1 counts]}. Summed bin by bin it is the plain
    histogram; what was drafted is sum_k k × steps(k), measured under variable drafting."""
    metrics = {"acceptance_histogram_by_draft_length": {"3": [4, 1, 0, 2], "1": [3, 2]}, "num_spec_tokens": 3}
    counters = counters_from_spec_decode_metrics(metrics, 30)
    assert counters.accept_histogram == [7, 3, 0, 2]
    assert (counters.verify, counters.accepted, counters.proposed) == (12, 3 + 6, 3 * 7 + 1 * 5)
    # the docs' example carries both: the plain histogram and num_draft_tokens are kept
    assert counters_from_spec_decode_metrics(DOC_EXAMPLE).proposed == 129
    broken = {"acceptance_histogram_by_draft_length": {"3": [1, -2, 0, 0]}}
    assert counters_from_spec_decode_metrics(broken).accept_histogram is None


def test_the_eos_over_count_passes_through_unchanged_and_aggregate_counts_it_inconsistent(tmp_path):
    """vLLM issue #56101 (open against 0.29.0): drafts accepted after an EOS inside the
    accepted prefix are counted, so accepted can exceed the completion. The adapter never
    clips it; SPEC revision 6 counts the generation inconsistent in `specmeter aggregate`."""
    from click.testing import CliRunner

    from specmeter.streams.cli import main

    over = {**DOC_EXAMPLE, "num_accepted_draft_tokens": 10, "acceptance_histogram": [39, 1, 0, 3]}
    response = {"id": "cmpl-eos", "choices": [{"index": 0}], "usage": {"completion_tokens": 6}}
    response["metrics"] = {"speculative_decoding": over}
    (record,) = records_from_response(response, batch_id="step-1", session_id="s", draft_lags=0)
    assert (record.accepted, record.completion) == (10, 6), "reported as is, never clipped to the completion"
    fine = records_from_response(
        {**response, "id": "cmpl-ok", "usage": {"completion_tokens": 54}}, batch_id="step-1", session_id="s"
    )
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in [record, *fine]))
    result = CliRunner().invoke(main, ["aggregate", "--format", "jsonl", "--speculative-algorithm", "EAGLE", str(path)])
    assert result.exit_code == 0, result.output
    (batch,) = [msgspec.json.decode(line) for line in result.stdout.splitlines()]
    assert batch["metrics"]["spec/inconsistent_generation_count"] == 1
    assert batch["metrics"]["spec/accepted_total"] == 20, "still aggregated as reported"


def test_several_prompts_in_one_completions_request_give_null_counters():
    """/v1/completions with a list of prompts answers one choice per prompt and reports
    ``metrics.speculative_decoding`` null, as for n > 1."""
    response = {
        "id": "cmpl-multi",
        "choices": [{"index": 0, "text": "x"}, {"index": 1, "text": "y"}, {"index": 2, "text": "z"}],
        "usage": {"completion_tokens": 30},
        "metrics": {"speculative_decoding": None},
    }
    records = records_from_response(response, batch_id="b", session_id="s", sample_ids=["p0", "p1", "p2"])
    assert [(r.generation_id, r.sample_id) for r in records] == [
        ("cmpl-multi:0", "p0"),
        ("cmpl-multi:1", "p1"),
        ("cmpl-multi:2", "p2"),
    ]
    assert all((r.accepted, r.proposed, r.verify, r.completion) == (None,) * 4 for r in records)


def test_the_inference_generate_endpoint_carries_the_same_object():
    """/inference/v1/generate (vLLM PR #43310, token in, token out): ``request_id``, choices
    with ``token_ids``, and the same ``metrics.speculative_decoding``."""
    response = {
        "request_id": "gen-11",
        "choices": [{"index": 0, "token_ids": list(range(54)), "finish_reason": "stop", "logprobs": None}],
        "metrics": {"speculative_decoding": DOC_EXAMPLE},
    }
    (record,) = records_from_response(response, batch_id="b", session_id="s", draft_lags=1)
    assert (record.generation_id, record.accepted, record.proposed, record.verify, record.completion) == (
        "gen-11",
        10,
        129,
        43,
        54,
    )


def test_the_docs_say_vllm_0_29_refuses_the_flag_without_a_speculative_config():
    """vLLM 0.29.0 does not start with --per-request-spec-decode-metrics set and no
    --speculative-config (it no longer silently reports null); docs/vllm.md says so."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "vllm.md").read_text()
    assert "refuses to start" in page and "--speculative-config" in page
    assert "#56101" in page and "/inference/v1/generate" in page and "acceptance_histogram_by_draft_length" in page
