"""TensorRT-LLM integration: records from its per-request speculative-decoding perf metrics.

Install with ``pip install 'specmeter[tensorrt_llm]'``. Nothing here imports tensorrt_llm at
module level: the helpers read objects by attribute and dicts by key, so they work on
``LLM.generate`` outputs in the rollout process and on JSON fetched over HTTP by a process
without tensorrt_llm installed. The wire contract does not change (docs/engines.md).

What TensorRT-LLM exposes, from its source (NVIDIA/TensorRT-LLM):

* ``SamplingParams(return_perf_metrics=True)``: each ``CompletionOutput`` of a
  ``RequestOutput`` carries ``request_perf_metrics`` (a ``RequestPerfMetrics``) whose
  ``speculative_decoding`` has ``acceptance_rate``, ``total_accepted_draft_tokens`` and
  ``total_draft_tokens`` (tensorrt_llm/serve/_perf_metrics_schema.py
  ``SpeculativeDecodingMetrics``; the server's ``/perf_metrics`` records carry the same
  under ``perf_metrics.speculative_decoding``). Before PR #17082 (merged 2026-07) the
  PyTorch flow returned them zeroed even when drafting ran; the C++ default is 0 too. So
  0 drafts and 0 accepted read as **unknown**, never as an observed 0.
* The request's ``avg_decoded_tokens_per_iter`` (and ``decoding_iter``): a float mean of
  tokens per iteration. Verify steps are not recovered from it (completion / mean is not
  exact, and ``decoding_iter`` counts iterations whose relation to verify steps differs
  by backend), so ``verify`` stays unknown and coverage says so.
* **Not yet released** — PR #19311 (open): a ``speculative_decoding`` object on each choice
  of ``/v1/completions`` and ``/v1/chat/completions`` with ``total_accepted_draft_tokens``,
  ``total_draft_tokens``, ``num_spec_steps`` (verify steps) and a dense
  ``acceptance_histogram`` (``max_draft_len + 1`` bins: steps that accepted j drafts),
  ``num_spec_tokens`` and ``acceptance_rate`` (PyTorch backend only; with tree drafting
  ``total_draft_tokens`` counts paths, not nodes). Mapped as written in that PR: accepted,
  proposed, verify = ``num_spec_steps``, histogram.

    llm = tensorrt_llm.LLM(model=..., speculative_config=...)
    outs = llm.generate(prompts, SamplingParams(max_tokens=256, return_perf_metrics=True))
    await publish_request_outputs(publisher, outs, batch_id=f"step-{step}", session_ids=sessions, draft_lags=lag)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from specmeter.schemas import GenerationRecord

from ._adapter_common import Caller, Slot, build_record, one_or_each, publish_records
from ._meta_info import SpecCounters, _normalize_histogram, normalize_counter
from ._publisher import Publisher

__all__ = [
    "counters_from_speculative_decoding",
    "records_from_request_outputs",
    "records_from_response",
    "publish_request_outputs",
    "publish_response",
    "require_tensorrt_llm",
]


def require_tensorrt_llm() -> Any:
    """Import tensorrt_llm, or say how to get it."""
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the TensorRT-LLM integration needs tensorrt_llm: pip install 'specmeter[tensorrt_llm]'"
        ) from exc


def _field(source: Any, name: str) -> Any:
    """``name`` of ``source`` as a key (a mapping) or an attribute; None if it has none."""
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _accept_pair(metrics: Any) -> tuple[int | None, int | None]:
    """accepted and proposed; both unknown when both are 0 in the released object
    (TensorRT-LLM's value for counters it did not fill, before PR #17082 on the PyTorch
    flow). PR #19311's object, which counts its steps (``num_spec_steps``), is taken as is."""
    accepted = normalize_counter(_field(metrics, "total_accepted_draft_tokens"))
    proposed = normalize_counter(_field(metrics, "total_draft_tokens"))
    if accepted == 0 and proposed == 0 and _field(metrics, "num_spec_steps") is None:
        return None, None
    return accepted, proposed


def counters_from_speculative_decoding(metrics: Any, completion: Any = None) -> SpecCounters:
    """The counters of one sequence from a ``speculative_decoding`` object: the released
    ``RequestPerfMetrics.speculative_decoding`` (an object or its dict) or PR #19311's
    per-choice dict. ``metrics`` None gives every counter unknown; ``completion`` is the
    sequence's token count (None: unknown).

    accepted = ``total_accepted_draft_tokens``, proposed = ``total_draft_tokens`` (both
    unknown when both are 0 and no step count is given); verify = ``num_spec_steps`` and the histogram =
    ``acceptance_histogram`` only where given (PR #19311), else unknown.
    ``acceptance_rate`` is a ratio and is not read. Values are normalised as SGLang's are.
    """
    completion_tokens = normalize_counter(completion)
    if metrics is None:
        return SpecCounters(completion=completion_tokens)
    accepted, proposed = _accept_pair(metrics)
    return SpecCounters(
        accepted=accepted,
        proposed=proposed,
        verify=normalize_counter(_field(metrics, "num_spec_steps")),
        completion=completion_tokens,
        accept_histogram=_normalize_histogram(_field(metrics, "acceptance_histogram")),
    )


def _sequence_counters(sequence: Any) -> SpecCounters:
    perf = _field(sequence, "request_perf_metrics")
    token_ids = _field(sequence, "token_ids")
    completion = len(token_ids) if isinstance(token_ids, Sequence) else None
    return counters_from_speculative_decoding(_field(perf, "speculative_decoding") if perf else None, completion)


def _request_id(request: Any) -> str:
    """TensorRT-LLM's request id is an int in the LLM API: its decimal string."""
    request_id = _field(request, "request_id")
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)) or request_id == "":
        raise ValueError(f"a TensorRT-LLM request output has request_id={request_id!r}, not an int or a string")
    return str(request_id)


def records_from_request_outputs(
    outputs: Any,
    *,
    batch_id: str,
    session_ids: str | Sequence[str],
    sample_ids: Sequence[str | None] | None = None,
    producer_id: str | None = None,
    run_id: str | None = None,
    weight_version: str | None = None,
    tasks: str | Sequence[str | None] | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
) -> list[GenerationRecord]:
    """One record per sequence of TensorRT-LLM ``RequestOutput``s (one, or a list), in order,
    generated with ``SamplingParams(return_perf_metrics=True)``.

    A request with one sequence gives ``generation_id`` its ``request_id``; with several
    (``n > 1``), ``f"{request_id}:{index}"``, each with its own perf metrics.

    Args:
        session_ids, tasks, draft_lags: one for every request, or one per request output.
        sample_ids: the trajectory of each record (one per sequence); None: its own sample.
        weight_version: the policy weights that generated them (TensorRT-LLM does not say).

    Raises:
        ValueError: lengths do not match, or a request output has no ``request_id``.
    """
    requests = [outputs] if not isinstance(outputs, Sequence) else list(outputs)
    sessions = one_or_each(session_ids, len(requests), "session ids", per="request outputs")
    task_list = one_or_each(tasks, len(requests), "tasks", per="request outputs")
    lags = one_or_each(draft_lags, len(requests), "draft lags", per="request outputs")
    made: list[tuple[Slot, SpecCounters]] = []
    for request, session, task, lag in zip(requests, sessions, task_list, lags, strict=True):
        request_id = _request_id(request)
        sequences = list(_field(request, "outputs") or [])
        for sequence in sequences:
            generation_id = request_id if len(sequences) == 1 else f"{request_id}:{_field(sequence, 'index')}"
            slot = Slot(session_id=session, generation_id=generation_id, task=task, draft_lag=lag)
            made.append((slot, _sequence_counters(sequence)))
    samples = one_or_each(sample_ids, len(made), "sample ids", per="sequences")
    caller = Caller(batch_id=batch_id, producer_id=producer_id, run_id=run_id, weight_version=weight_version)
    return [
        build_record(counters, caller, msgspec.structs.replace(slot, sample_id=sample))
        for (slot, counters), sample in zip(made, samples, strict=True)
    ]


def records_from_response(
    response: Mapping[str, Any],
    *,
    batch_id: str,
    session_id: str,
    sample_ids: Sequence[str | None] | None = None,
    producer_id: str | None = None,
    run_id: str | None = None,
    weight_version: str | None = None,
    task: str | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
) -> list[GenerationRecord]:
    """One record per choice of a ``trtllm-serve`` ``/v1/completions`` or
    ``/v1/chat/completions`` response, in order of ``choices``.

    Each choice's counters come from its ``speculative_decoding`` object (PR #19311, not
    yet released); a released server's choices carry only ``avg_decoded_tokens_per_iter``,
    so their counters are unknown (read them in the rollout process with
    ``records_from_request_outputs`` instead). The completion is ``usage.completion_tokens``
    when there is one choice (with several it is their sum: unknown per choice).
    ``generation_id``: the response's ``id``; with several choices ``f"{id}:{index}"``.

    Raises:
        ValueError: no ``id``, or ``sample_ids``/``draft_lags`` not one per choice.
    """
    response_id = response.get("id")
    if not isinstance(response_id, str) or not response_id:
        raise ValueError(f"a TensorRT-LLM response has id={response_id!r}, not a non-empty string")
    choices = list(response.get("choices") or [{"index": 0}])
    samples = one_or_each(sample_ids, len(choices), "sample ids", per="choices")
    lags = one_or_each(draft_lags, len(choices), "draft lags", per="choices")
    completion = _field(response.get("usage") or {}, "completion_tokens") if len(choices) == 1 else None
    caller = Caller(batch_id=batch_id, producer_id=producer_id, run_id=run_id, weight_version=weight_version)
    records = []
    for choice, sample, lag in zip(choices, samples, lags, strict=True):
        counters = counters_from_speculative_decoding(_field(choice, "speculative_decoding"), completion)
        generation_id = response_id if len(choices) == 1 else f"{response_id}:{_field(choice, 'index')}"
        slot = Slot(session_id=session_id, generation_id=generation_id, sample_id=sample, task=task, draft_lag=lag)
        records.append(build_record(counters, caller, slot))
    return records


async def publish_request_outputs(
    publisher: Publisher,
    outputs: Any,
    *,
    batch_id: str,
    session_ids: str | Sequence[str],
    sample_ids: Sequence[str | None] | None = None,
    weight_version: str | None = None,
    tasks: str | Sequence[str | None] | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
) -> int:
    """Publish the records of committed TensorRT-LLM outputs, in the publisher's run;
    returns how many. Arguments as ``records_from_request_outputs``."""
    return await publish_records(
        publisher,
        records_from_request_outputs,
        outputs,
        batch_id=batch_id,
        session_ids=session_ids,
        sample_ids=sample_ids,
        weight_version=weight_version,
        tasks=tasks,
        draft_lags=draft_lags,
    )


async def publish_response(
    publisher: Publisher,
    response: Mapping[str, Any],
    *,
    batch_id: str,
    session_id: str,
    sample_ids: Sequence[str | None] | None = None,
    weight_version: str | None = None,
    task: str | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
) -> int:
    """Publish the records of one committed TensorRT-LLM response, in the publisher's run;
    returns how many. Arguments as ``records_from_response``."""
    return await publish_records(
        publisher,
        records_from_response,
        response,
        batch_id=batch_id,
        session_id=session_id,
        sample_ids=sample_ids,
        weight_version=weight_version,
        task=task,
        draft_lags=draft_lags,
    )
