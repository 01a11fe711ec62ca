"""TensorRT-LLM's outputs with ``SamplingParams(return_perf_metrics=True)``, as its source has them.

Sources (NVIDIA/TensorRT-LLM, read for issue 44):

* tensorrt_llm/serve/_perf_metrics_schema.py (commit 4856bb73): ``SpeculativeDecodingMetrics``
  = ``acceptance_rate: float``, ``total_accepted_draft_tokens: int``,
  ``total_draft_tokens: int``, under ``PerfMetrics.speculative_decoding`` beside
  ``timing_metrics``, ``first_iter``, ``last_iter``, ``kv_cache_metrics``.
* tensorrt_llm/evaluate/lm_eval.py ``_log_spec_stats``: read as
  ``output.outputs[0].request_perf_metrics.speculative_decoding`` and
  ``output.avg_decoded_tokens_per_iter`` / ``output.decoding_iter`` on the RequestOutput;
  PR #17082 (merged 2026-07): before it the PyTorch flow returned the counters zeroed.
* tests/unittest (executor response fixtures): the response result has
  ``decoding_iter``, ``avg_decoded_tokens_per_iter`` (None when not computed) and
  ``request_perf_metrics`` (None without return_perf_metrics).
* PR #19311 (open, not released) as quoted in ai-dynamo/aiperf PR #1433: each choice of
  ``/v1/chat/completions`` carries ``avg_decoded_tokens_per_iter`` and a
  ``speculative_decoding`` object with ``num_spec_steps`` and a dense
  ``acceptance_histogram`` (20 steps: 8 accepted nothing, 6 accepted 2, 6 accepted 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpeculativeDecodingMetrics:
    """tensorrt_llm.bindings.executor.SpeculativeDecodingMetrics (C++ defaults 0)."""

    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    timing_metrics: dict[str, float] = field(default_factory=lambda: {"arrival_time": 0.0, "last_token_time": 0.9})
    kv_cache_metrics: dict[str, int] = field(default_factory=dict)
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)
    first_iter: int = 3
    last_iter: int = 24


@dataclass
class CompletionOutput:
    """tensorrt_llm.llmapi (executor/result.py) CompletionOutput: the fields read."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str = "stop"
    request_perf_metrics: RequestPerfMetrics | None = None


@dataclass
class RequestOutput:
    request_id: int
    outputs: list[CompletionOutput]
    finished: bool = True
    decoding_iter: int = 0
    avg_decoded_tokens_per_iter: float | None = None


def completion(index: int, tokens: int, accepted: int | None, drafted: int | None) -> CompletionOutput:
    """A sequence of ``tokens`` tokens; ``accepted``/``drafted`` None: no perf metrics."""
    perf = None
    if accepted is not None and drafted is not None:
        rate = accepted / drafted if drafted else 0.0
        perf = RequestPerfMetrics(speculative_decoding=SpeculativeDecodingMetrics(rate, accepted, drafted))
    return CompletionOutput(index=index, text="...", token_ids=list(range(tokens)), request_perf_metrics=perf)


#: 50 tokens, 30 of 60 drafts accepted (EAGLE3, max_draft_len 3), 2.5 tokens per iteration
MEASURED = RequestOutput(
    request_id=7, outputs=[completion(0, 50, 30, 60)], decoding_iter=20, avg_decoded_tokens_per_iter=2.5
)
#: before PR #17082 on the PyTorch flow: drafting ran, the counters came back zeroed
ZEROED = RequestOutput(
    request_id=8, outputs=[completion(0, 50, 0, 0)], decoding_iter=20, avg_decoded_tokens_per_iter=2.5
)
#: return_perf_metrics not set
NO_PERF_METRICS = RequestOutput(request_id=9, outputs=[completion(0, 12, None, None)], decoding_iter=12)
#: n = 2: each sequence its own metrics
TWO_SEQUENCES = RequestOutput(request_id=10, outputs=[completion(0, 9, 4, 9), completion(1, 6, 1, 6)])

#: PR #19311's per-choice object, as its description prints it
PR_19311_CHOICE: dict[str, Any] = {
    "index": 0,
    "message": {"role": "assistant", "content": "..."},
    "finish_reason": "stop",
    "avg_decoded_tokens_per_iter": 2.5,
    "speculative_decoding": {
        "acceptance_rate": 0.5,
        "total_accepted_draft_tokens": 30,
        "total_draft_tokens": 60,
        "num_spec_steps": 20,
        "acceptance_histogram": [8, 0, 6, 6],
        "num_spec_tokens": 3,
    },
}


def chat_response(*choices: dict[str, Any], completion_tokens: int = 50) -> dict[str, Any]:
    """A trtllm-serve /v1/chat/completions response around ``choices``."""
    return {
        "id": "chatcmpl-3f1c9a",
        "object": "chat.completion",
        "created": 1767600000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": list(choices),
        "usage": {"prompt_tokens": 40, "completion_tokens": completion_tokens, "total_tokens": 40 + completion_tokens},
    }


#: a released server's choice: the mean tokens per iteration only
RELEASED_CHOICE: dict[str, Any] = {
    "index": 0,
    "message": {"role": "assistant", "content": "..."},
    "finish_reason": "stop",
    "avg_decoded_tokens_per_iter": 2.5,
}
