"""vLLM integration: records from vLLM's per-request speculative-decoding metrics.

Install with ``pip install 'specmeter[vllm]'``. Nothing here imports vllm at module
level: the helpers read objects by attribute and dicts by key, so they work on
``LLM.generate`` / ``AsyncLLM.generate`` outputs in the rollout process and on
OpenAI-compatible responses fetched over HTTP by a process without vllm installed.
SGLang stays the first engine (``sglang_adapter``); both give the same
``GenerationRecord`` (docs/vllm.md; the wire contract is unchanged).

vLLM reports per-request acceptance when the server or engine runs with
``--per-request-spec-decode-metrics summary`` (or ``detailed``; default ``none``),
added in vLLM 0.29.0 (vllm-project/vllm PR #48915). Field names, from vLLM's source:

* ``vllm/outputs.py``: ``CompletionOutput.spec_decode_metrics`` — a
  ``vllm.v1.metrics.stats.RequestSpecDecodeMetrics`` on the finished output of each
  sequence (``None`` while unfinished, without speculative decoding, or with the flag
  ``none``); ``tests/test_outputs.py`` builds one with
  ``RequestSpecDecodeMetrics.new(num_spec_tokens=2)`` and
  ``observe(num_draft_tokens=2, num_accepted=1)``. Its fields: ``num_spec_tokens``
  (the configured k), ``histogram`` (k + 1 counts: steps that accepted exactly j
  drafts, at index j), ``num_draft_tokens`` (drafts proposed, less those a grammar
  invalidated) and, with ``detailed``, ``per_step_accepted`` / ``per_step_drafted``.
* ``docs/features/speculative_decoding/acceptance_metrics.md``: the OpenAI-compatible
  response carries the same as ``metrics.speculative_decoding`` (``acceptance_histogram``,
  ``num_spec_steps`` = sum of the histogram, ``num_accepted_draft_tokens``,
  ``num_draft_tokens``, ``num_spec_tokens``, ...), on the final usage chunk when
  streaming, and **null for n > 1** ("reported only for single-sequence requests").

The record (docs/vllm.md): ``accepted`` = accepted draft tokens (sum_j j * H[j]),
``proposed`` = ``num_draft_tokens``, ``verify`` = the verify steps that had drafts
(sum H, vLLM's ``num_spec_steps``), ``completion`` = the sequence's token count
(``len(token_ids)``; over HTTP ``usage.completion_tokens``), ``accept_histogram`` = H.
Anything vLLM does not report is null, never 0. ``n > 1``: from ``RequestOutput`` each
``CompletionOutput`` carries its own metrics and gives its own record (``generation_id``
``f"{request_id}:{index}"``); over HTTP vLLM gives none for n > 1, so each choice's
record has every counter null.

    llm = vllm.LLM(model=..., speculative_config={...}, per_request_spec_decode_metrics="summary")
    outs = llm.generate(prompts, sampling_params)
    await publish_request_outputs(publisher, outs, batch_id=f"step-{step}", session_ids=sessions)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from specmeter.schemas import GenerationRecord

from ._adapter_common import Caller, Slot, build_record, one_or_each, publish_records
from ._meta_info import SpecCounters, _normalize_histogram, normalize_counter
from ._publisher import Publisher

__all__ = [
    "counters_from_spec_decode_metrics",
    "records_from_request_outputs",
    "records_from_response",
    "publish_request_outputs",
    "publish_response",
    "require_vllm",
]


def require_vllm() -> Any:
    """Import vllm, or say how to get it."""
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the vLLM integration needs vllm: pip install 'specmeter[vllm]'") from exc
    return vllm


def _field(source: Any, *names: str) -> Any:
    """The first of ``names`` that ``source`` has, as a key (a mapping) or an attribute; None if none."""
    for name in names:
        if isinstance(source, Mapping):
            if name in source:
                return source[name]
        elif hasattr(source, name):
            return getattr(source, name)
    return None


def _dense(value: Any) -> list[int] | None:
    """vLLM's dense list; a sparse ``{"j": count}`` mapping is made dense (missing bins 0)."""
    if isinstance(value, Mapping):
        try:
            bins = {int(k): v for k, v in value.items()}
        except (TypeError, ValueError):
            return None
        if not bins or min(bins) < 0:
            return None
        value = [bins.get(j, 0) for j in range(max(bins) + 1)]
    return _normalize_histogram(value)


def _by_draft_length(value: Any) -> dict[int, list[int]] | None:
    """``acceptance_histogram_by_draft_length`` (vLLM PR #56278): ``{"k": [k + 1 counts]}``,
    the steps that drafted k tokens by how many of them were accepted. None if any part
    is malformed."""
    if not isinstance(value, Mapping) or not value:
        return None
    parsed = {}
    for key, bins in value.items():
        length = normalize_counter(key)
        histogram = _dense(bins)
        if length is None or histogram is None:
            return None
        parsed[length] = histogram
    return parsed


def _histogram(metrics: Any, by_length: dict[int, list[int]] | None) -> list[int] | None:
    """The plain histogram where given, else the by-draft-length ones summed bin by bin
    (a step that accepted j drafts counts at j whatever it drafted)."""
    plain = _field(metrics, "acceptance_histogram", "histogram")
    if plain is not None or by_length is None:
        return _dense(plain)
    width = max(len(h) for h in by_length.values())
    summed = [sum(h[j] for h in by_length.values() if j < len(h)) for j in range(width)]
    return _normalize_histogram(summed)


def _proposed(metrics: Any, by_length: dict[int, list[int]] | None) -> int | None:
    """``num_draft_tokens``; without it, sum_k k × (steps that drafted k) from the
    by-draft-length histograms (what was drafted, measured)."""
    given = _field(metrics, "num_draft_tokens")
    if given is not None or by_length is None:
        return normalize_counter(given)
    return normalize_counter(sum(length * sum(h) for length, h in by_length.items()))


def counters_from_spec_decode_metrics(metrics: Any, completion: Any = None) -> SpecCounters:
    """The counters of one sequence from vLLM's per-request metrics: a
    ``RequestSpecDecodeMetrics`` (``CompletionOutput.spec_decode_metrics``), its
    ``to_dict()``, or a response's ``metrics.speculative_decoding`` dict; ``metrics`` None
    gives every counter null. ``completion`` is the sequence's token count (None: unknown).

    accepted is ``num_accepted_draft_tokens`` where given, else sum_j j * H[j]; verify is
    ``num_spec_steps`` where given, else sum(H); proposed is ``num_draft_tokens``, else what
    the by-draft-length histograms say was drafted; H is ``acceptance_histogram``, else the
    by-draft-length histograms summed. Values are normalised as SGLang's are
    (docs/contract.md §2): malformed becomes null, never 0. Nothing is clipped: vLLM's
    accepted drafts past an end-of-sequence token (vLLM issue #56101) reach the record as
    reported, and the contract counts the generation inconsistent (accepted > completion).
    """
    completion_tokens = normalize_counter(completion)
    if metrics is None:
        return SpecCounters(completion=completion_tokens)
    by_length = _by_draft_length(_field(metrics, "acceptance_histogram_by_draft_length"))
    histogram = _histogram(metrics, by_length)
    accepted = normalize_counter(_field(metrics, "num_accepted_draft_tokens"))
    verify = normalize_counter(_field(metrics, "num_spec_steps"))
    if histogram is not None:
        if _field(metrics, "num_accepted_draft_tokens") is None:
            accepted = normalize_counter(sum(j * n for j, n in enumerate(histogram)))
        if _field(metrics, "num_spec_steps") is None:
            verify = normalize_counter(sum(histogram))
    return SpecCounters(
        accepted=accepted,
        proposed=_proposed(metrics, by_length),
        verify=verify,
        completion=completion_tokens,
        accept_histogram=histogram,
    )


def _sequences(request: Any) -> tuple[str, list[Any]]:
    """A request output's id and its sequences; raises when the id is unusable."""
    request_id = _field(request, "request_id")
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"a vLLM request output has request_id={request_id!r}, not a non-empty string")
    return request_id, list(_field(request, "outputs") or [])


def _sequence_counters(sequence: Any) -> SpecCounters:
    token_ids = _field(sequence, "token_ids")
    return counters_from_spec_decode_metrics(
        _field(sequence, "spec_decode_metrics"), None if token_ids is None else len(token_ids)
    )


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
    """One record per sequence of vLLM ``RequestOutput``s (one, or a list), in order.

    A request with one sequence gives a record whose ``generation_id`` is its
    ``request_id``; with several (``n > 1``), each ``CompletionOutput`` gives its own, with
    its own metrics, ``generation_id`` ``f"{request_id}:{index}"``.

    Args:
        outputs: what ``LLM.generate`` returned (finished ``RequestOutput``s).
        session_ids, tasks, draft_lags: one for every request, or one per request output
            (a request's sequences share its session, task and draft lag).
        sample_ids: the trajectory of each record, in order (one per sequence); None:
            each generation is its own sample.
        weight_version: the policy weights that generated them (vLLM does not say).
        draft_lags: how many policy updates the draft is behind (docs/contract.md §3.6);
            vLLM knows neither version, the rollout does. None: unknown.

    Raises:
        ValueError: lengths do not match, or a request output has no ``request_id``.
    """
    requests = [outputs] if not isinstance(outputs, Sequence) else list(outputs)
    sessions = one_or_each(session_ids, len(requests), "session ids", per="request outputs")
    task_list = one_or_each(tasks, len(requests), "tasks", per="request outputs")
    lags = one_or_each(draft_lags, len(requests), "draft lags", per="request outputs")
    made: list[tuple[Slot, SpecCounters]] = []
    for request, session, task, lag in zip(requests, sessions, task_list, lags, strict=True):
        request_id, sequences = _sequences(request)
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


def _response_id(response: Mapping[str, Any]) -> str:
    """``id`` (OpenAI-compatible responses), else ``request_id`` (``/inference/v1/generate``)."""
    response_id = response.get("id", response.get("request_id"))
    if not isinstance(response_id, str) or not response_id:
        raise ValueError(f"a vLLM response has id={response_id!r}, not a non-empty string")
    return response_id


def _single_choice_counters(response: Mapping[str, Any], choice: Any) -> SpecCounters:
    """The one choice's counters: ``metrics.speculative_decoding`` and the completion from
    ``usage.completion_tokens``, else (``/inference/v1/generate``) its ``token_ids``."""
    metrics = _field(response.get("metrics") or {}, "speculative_decoding")
    completion = _field(response.get("usage") or {}, "completion_tokens")
    if completion is None:
        token_ids = _field(choice, "token_ids")
        completion = len(token_ids) if isinstance(token_ids, Sequence) else None
    return counters_from_spec_decode_metrics(metrics, completion)


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
    """One record per choice of an OpenAI-compatible vLLM response (``/v1/completions``,
    ``/v1/chat/completions``; when streaming, the final usage chunk's ``metrics`` with the
    choices assembled) or of a ``/inference/v1/generate`` response (vLLM PR #43310: its
    ``request_id``, its choices' ``token_ids``, the same ``metrics`` object), in order of
    ``choices``.

    With one choice, its record has ``metrics.speculative_decoding`` and
    ``usage.completion_tokens`` and ``generation_id`` the response's ``id``. With several
    (``n > 1``, or several prompts in one ``/v1/completions`` request) vLLM reports neither
    per choice: every counter is null, and each ``generation_id`` is ``f"{id}:{index}"``.
    ``draft_lags``: one for every choice, or one per choice.

    Raises:
        ValueError: no ``id``, or ``sample_ids``/``draft_lags`` not one per choice.
    """
    response_id = _response_id(response)
    choices = list(response.get("choices") or [{"index": 0}])
    samples = one_or_each(sample_ids, len(choices), "sample ids", per="choices")
    lags = one_or_each(draft_lags, len(choices), "draft lags", per="choices")
    caller = Caller(batch_id=batch_id, producer_id=producer_id, run_id=run_id, weight_version=weight_version)
    records = []
    for choice, sample, lag in zip(choices, samples, lags, strict=True):
        single = len(choices) == 1
        counters = _single_choice_counters(response, choice) if single else SpecCounters()
        generation_id = response_id if single else f"{response_id}:{_field(choice, 'index')}"
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
    """Publish the records of committed vLLM outputs, in the publisher's run; returns how
    many. Only publish what your rollout keeps. Arguments as ``records_from_request_outputs``."""
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
    """Publish the records of one committed vLLM response, in the publisher's run;
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
