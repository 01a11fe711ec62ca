"""One conformance suite for every engine adapter (issue 44.4).

Each case feeds an adapter a shape its engine really emits — built from the engine's own
source, tests and docs; ``source`` names the file and version, the shape modules under
tests/engines/ (and tests/support/sglang_meta_info.py, test_vllm_adapter.py) say more —
and every case is held to the same expectations:

* the counters are exactly what the engine reported (accepted, proposed, verify,
  completion, histogram);
* what the engine did not report is None, and is left out of the record on the wire,
  never 0 (the suite fails if an adapter turns a missing counter into 0);
* the record is unchanged on the wire: msgpack and JSON encode/decode give it back;
* the draft lag the caller passes reaches the record.

docs/engines.md is the table of the same fields, engine by engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import pytest

from specmeter.producers import sglang_adapter, tensorrt_llm_adapter, vllm_adapter
from specmeter.schemas import GenerationRecord

from .engines import sglang_shapes as sg
from .engines import tensorrt_llm_shapes as trt
from .support.sglang_meta_info import SGLANG_OUTPUTS
from .test_vllm_adapter import DOC_EXAMPLE, completion, request, steps

COUNTERS = ("accepted", "proposed", "verify", "completion", "accept_histogram")
LAG = 3


class Case(NamedTuple):
    engine: str
    shape: str
    source: str
    records: Callable[[], list[GenerationRecord]]
    want: list[tuple[Any, ...]]


def _sglang_meta(meta_info: dict[str, Any], **kwargs: Any) -> Callable[[], list[GenerationRecord]]:
    return lambda: sglang_adapter.records_from_outputs(
        [sg.ret_item(meta_info)], batch_id="b", session_ids="s", draft_lags=LAG, **kwargs
    )


def _sglang_openai(response: Any, **kwargs: Any) -> Callable[[], list[GenerationRecord]]:
    return lambda: sglang_adapter.records_from_openai_response(
        response, batch_id="b", session_id="s", draft_lags=LAG, **kwargs
    )


def _vllm_engine(outputs: Any) -> Callable[[], list[GenerationRecord]]:
    return lambda: vllm_adapter.records_from_request_outputs(outputs, batch_id="b", session_ids="s", draft_lags=LAG)


def _vllm_http(response: dict[str, Any]) -> Callable[[], list[GenerationRecord]]:
    return lambda: vllm_adapter.records_from_response(response, batch_id="b", session_id="s", draft_lags=LAG)


def _trt_engine(outputs: Any) -> Callable[[], list[GenerationRecord]]:
    return lambda: tensorrt_llm_adapter.records_from_request_outputs(
        outputs, batch_id="b", session_ids="s", draft_lags=LAG
    )


def _trt_http(response: dict[str, Any]) -> Callable[[], list[GenerationRecord]]:
    return lambda: tensorrt_llm_adapter.records_from_response(response, batch_id="b", session_id="s", draft_lags=LAG)


def _vllm_response(metrics: Any, *, choices: int = 1, completion_tokens: int | None = 54) -> dict[str, Any]:
    return {
        "id": "cmpl-c",
        "choices": [{"index": i, "text": "..."} for i in range(choices)],
        "usage": {"completion_tokens": completion_tokens},
        "metrics": {"speculative_decoding": metrics},
    }


_NONE = (None, None, None, None, None)
SGLANG_CASES = [
    Case(
        "sglang",
        f"meta_info {version}",
        "tests/support/sglang_meta_info.py: SGLang's documented meta_info of that release",
        _sglang_meta(meta_info),
        [expected],
    )
    for version, (meta_info, expected) in sorted(SGLANG_OUTPUTS.items())
] + [
    Case(
        "sglang",
        "meta_info decoupled, measured proposals",
        "sglang test/registered/spec/test_speculative_response_metrics.py (main)",
        _sglang_meta(sg.DECOUPLED_MEASURED),
        [sg.DECOUPLED_MEASURED_COUNTERS],
    ),
    Case(
        "sglang",
        "meta_info nothing verified",
        "sglang spec_decoding_meta.py fill_spec_decoding_meta (main): no key without a verify step",
        _sglang_meta(sg.NOTHING_VERIFIED),
        [(None, None, None, 1, None)],
    ),
    Case(
        "sglang",
        "meta_info nothing verified, speculative=True",
        "the same; the caller says the server speculates",
        _sglang_meta(sg.NOTHING_VERIFIED, speculative=True),
        [(0, 0, 0, 1, None)],
    ),
    Case(
        "sglang",
        "/v1/chat/completions sglext",
        "sglang serving_chat.py, utils.py spec_tokens_details_from_meta_info (PR #33518)",
        _sglang_openai(sg.openai_response([sg.ret_item(sg.EAGLE_0_5_12)])),
        [sg.EAGLE_0_5_12_COUNTERS],
    ),
    Case(
        "sglang",
        "/v1/completions sglext n=2",
        "sglang serving_completions.py; test_serving_completions.py parallel sampling (PR #33518)",
        _sglang_openai(sg.openai_response([sg.ret_item(sg.EAGLE_0_5_12), sg.ret_item(sg.NOMINAL_FALLBACK)], n=2)),
        [(7, 15, 5, None, [1, 2, 1, 1]), (1, 6, 2, None, None)],
    ),
    Case(
        "sglang",
        "/v1/chat/completions streamed",
        "sglang serving_chat.py streaming: sglext chunk, then the usage chunk",
        _sglang_openai(sglang_adapter.sse_events(sg.openai_stream([sg.ret_item(sg.DECOUPLED_MEASURED)]))),
        [sg.DECOUPLED_MEASURED_COUNTERS],
    ),
    Case(
        "sglang",
        "sglext placeholder zeros",
        "sglang utils.py: meta_info.get(key) or 0 for keys never written",
        _sglang_openai(sg.openai_response([sg.ret_item({**sg.NOTHING_VERIFIED, "spec_cap_length": 0.0})])),
        [(None, None, None, 1, None)],
    ),
]

VLLM_CASES = [
    Case(
        "vllm",
        "RequestSpecDecodeMetrics",
        "vllm/v1/metrics/stats.py, tests/test_outputs.py (0.29.0)",
        _vllm_engine(request("r1", completion(0, 11, steps(3, [(3, 2), (3, 0), (2, 1), (3, 3), (1, 0)])))),
        [(6, 12, 5, 11, [2, 1, 1, 1])],
    ),
    Case(
        "vllm",
        "RequestSpecDecodeMetrics None (flag none, unfinished)",
        "vllm/outputs.py CompletionOutput.spec_decode_metrics (0.29.0)",
        _vllm_engine(request("r2", completion(0, 9, None))),
        [(None, None, None, 9, None)],
    ),
    Case(
        "vllm",
        "metrics.speculative_decoding",
        "vllm docs/features/speculative_decoding/acceptance_metrics.md (0.29.0+, v0.32.0 docs)",
        _vllm_http(_vllm_response(DOC_EXAMPLE)),
        [(10, 129, 43, 54, [39, 1, 0, 3])],
    ),
    Case(
        "vllm",
        "metrics.speculative_decoding, by draft length only",
        "vllm PR #56278 (main-branch docs)",
        _vllm_http(_vllm_response({"acceptance_histogram_by_draft_length": {"2": [3, 1, 2], "1": [1, 1]}})),
        [(6, 2 * 6 + 1 * 2, 8, 54, [4, 2, 2])],
    ),
    Case(
        "vllm",
        "n > 1 / several prompts: null",
        "acceptance_metrics.md: reported only for single-sequence requests",
        _vllm_http(_vllm_response(None, choices=2, completion_tokens=80)),
        [_NONE, _NONE],
    ),
    Case(
        "vllm",
        "/inference/v1/generate",
        "vllm PR #43310 (token in, token out), request_id and choices' token_ids",
        _vllm_http(
            {
                "request_id": "g",
                "choices": [{"index": 0, "token_ids": [1] * 54}],
                "metrics": _vllm_response(DOC_EXAMPLE)["metrics"],
            }
        ),
        [(10, 129, 43, 54, [39, 1, 0, 3])],
    ),
    Case(
        "vllm",
        "EOS over-count (issue #56101)",
        "vllm issue #56101 (open against 0.29.0): accepted > completion, passed on as reported",
        _vllm_http(_vllm_response(DOC_EXAMPLE, completion_tokens=6)),
        [(10, 129, 43, 6, [39, 1, 0, 3])],
    ),
]

TRT_CASES = [
    Case(
        "tensorrt_llm",
        "RequestPerfMetrics.speculative_decoding",
        "tensorrt_llm/serve/_perf_metrics_schema.py (4856bb73); PR #17082",
        _trt_engine(trt.MEASURED),
        [(30, 60, None, 50, None)],
    ),
    Case(
        "tensorrt_llm",
        "zeroed counters (PyTorch flow before PR #17082)",
        "TensorRT-LLM PR #17082 description",
        _trt_engine(trt.ZEROED),
        [(None, None, None, 50, None)],
    ),
    Case(
        "tensorrt_llm",
        "return_perf_metrics unset",
        "executor response fixtures: request_perf_metrics None",
        _trt_engine(trt.NO_PERF_METRICS),
        [(None, None, None, 12, None)],
    ),
    Case(
        "tensorrt_llm",
        "choice with avg_decoded_tokens_per_iter only (released)",
        "trtllm-serve chat choice (released)",
        _trt_http(trt.chat_response(trt.RELEASED_CHOICE)),
        [(None, None, None, 50, None)],
    ),
    Case(
        "tensorrt_llm",
        "choice speculative_decoding (PR #19311, unreleased)",
        "TensorRT-LLM PR #19311 (open), as quoted in ai-dynamo/aiperf PR #1433",
        _trt_http(trt.chat_response(trt.PR_19311_CHOICE)),
        [(30, 60, 20, 50, [8, 0, 6, 6])],
    ),
]

CASES = SGLANG_CASES + VLLM_CASES + TRT_CASES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.engine}: {c.shape}" for c in CASES])
def test_every_engine_shape_gives_its_exact_counters_unknown_never_0_and_survives_the_wire(case: Case):
    assert case.source, "each shape names where it comes from"
    records = case.records()
    assert [tuple(getattr(r, name) for name in COUNTERS) for r in records] == case.want
    for record, want in zip(records, case.want, strict=True):
        assert record.draft_lag == LAG
        as_json = msgspec.json.decode(msgspec.json.encode(record))
        for name, value in zip(COUNTERS, want, strict=True):
            if value is None:
                assert as_json.get(name) is None, f"{case.engine} turned a missing {name} into {as_json.get(name)!r}"
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=GenerationRecord) == record
        assert msgspec.json.decode(msgspec.json.encode(record), type=GenerationRecord) == record


def test_every_engine_is_in_the_suite_and_in_docs_engines():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()
    for engine in ("sglang", "vllm", "tensorrt_llm"):
        assert any(c.engine == engine for c in CASES)
    for field in (
        "spec_tokens_details",
        "spec_num_proposed_drafts_by_position",
        "acceptance_histogram_by_draft_length",
        "total_accepted_draft_tokens",
        "num_spec_steps",
        "avg_decoded_tokens_per_iter",
    ):
        assert field in page, field
