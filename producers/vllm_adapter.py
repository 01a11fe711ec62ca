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

from specmeter.schemas import GenerationRecord

from ._builders import record_from_counters
from ._meta_info import SpecCounters, _normalize_histogram, normalize_counter
from ._publisher import Publisher

__all__ = [
    "counters_from_spec_decode_metrics",
    "records_from_request_outputs",
    "records_from_response",
    "publish_request_outputs",
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


def _histogram(value: Any) -> list[int] | None:
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


def counters_from_spec_decode_metrics(metrics: Any, completion: Any = None) -> SpecCounters:
    """The counters of one sequence from vLLM's per-request metrics: a
    ``RequestSpecDecodeMetrics`` (``CompletionOutput.spec_decode_metrics``), its
    ``to_dict()``, or a response's ``metrics.speculative_decoding`` dict; ``metrics`` None
    gives every counter null. ``completion`` is the sequence's token count (None: unknown).

    accepted is ``num_accepted_draft_tokens`` where given, else sum_j j * H[j]; verify is
    ``num_spec_steps`` where given, else sum(H); proposed is ``num_draft_tokens``. Values
    are normalised as SGLang's are (docs/contract.md §2): malformed becomes null, never 0.
    """
    completion_tokens = normalize_counter(completion)
    if metrics is None:
        return SpecCounters(completion=completion_tokens)
    histogram = _histogram(_field(metrics, "acceptance_histogram", "histogram"))
    accepted = normalize_counter(_field(metrics, "num_accepted_draft_tokens"))
    verify = normalize_counter(_field(metrics, "num_spec_steps"))
    if histogram is not None:
        if _field(metrics, "num_accepted_draft_tokens") is None:
            accepted = normalize_counter(sum(j * n for j, n in enumerate(histogram)))
        if _field(metrics, "num_spec_steps") is None:
            verify = normalize_counter(sum(histogram))
    return SpecCounters(
        accepted=accepted,
        proposed=normalize_counter(_field(metrics, "num_draft_tokens")),
        verify=verify,
        completion=completion_tokens,
        accept_histogram=histogram,
    )


def _per_request(values: Any, count: int, what: str) -> list[Any]:
    """One value for every request (a str or None), or one per request."""
    if values is None or isinstance(values, str):
        return [values] * count
    values = list(values)
    if len(values) != count:
        raise ValueError(f"{count} request outputs but {len(values)} {what}")
    return values


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
) -> list[GenerationRecord]:
    """One record per sequence of vLLM ``RequestOutput``s (one, or a list), in order.

    A request with one sequence gives a record whose ``generation_id`` is its
    ``request_id``; with several (``n > 1``), each ``CompletionOutput`` gives its own, with
    its own metrics, ``generation_id`` ``f"{request_id}:{index}"``.

    Args:
        outputs: what ``LLM.generate`` returned (finished ``RequestOutput``s).
        session_ids, tasks: one for every request, or one per request output.
        sample_ids: the trajectory of each record, in order (one per sequence); None:
            each generation is its own sample.
        weight_version: the policy weights that generated them (vLLM does not say).

    Raises:
        ValueError: lengths do not match, or a request output has no ``request_id``.
    """
    requests = [outputs] if not isinstance(outputs, Sequence) else list(outputs)
    sessions = _per_request(session_ids, len(requests), "session ids")
    task_list = _per_request(tasks, len(requests), "tasks")
    made: list[tuple[str, str, str | None, SpecCounters]] = []
    for request, session, task in zip(requests, sessions, task_list, strict=True):
        request_id = _field(request, "request_id")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"a vLLM request output has request_id={request_id!r}, not a non-empty string")
        sequences = list(_field(request, "outputs") or [])
        for sequence in sequences:
            token_ids = _field(sequence, "token_ids")
            counters = counters_from_spec_decode_metrics(
                _field(sequence, "spec_decode_metrics"), None if token_ids is None else len(token_ids)
            )
            generation_id = request_id if len(sequences) == 1 else f"{request_id}:{_field(sequence, 'index')}"
            made.append((session, generation_id, task, counters))
    samples = list(sample_ids) if sample_ids is not None else [None] * len(made)
    if len(samples) != len(made):
        raise ValueError(f"{len(made)} sequences but {len(samples)} sample ids")
    return [
        record_from_counters(
            counters,
            batch_id=batch_id,
            session_id=session,
            generation_id=generation_id,
            sample_id=sample,
            producer_id=producer_id,
            weight_version=weight_version,
            run_id=run_id,
            task=task,
        )
        for (session, generation_id, task, counters), sample in zip(made, samples, strict=True)
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
) -> list[GenerationRecord]:
    """One record per choice of an OpenAI-compatible vLLM response (``/v1/completions``,
    ``/v1/chat/completions``; when streaming, the final usage chunk's ``metrics`` with the
    choices assembled), in order of ``choices``.

    With one choice, its record has ``metrics.speculative_decoding`` and
    ``usage.completion_tokens`` and ``generation_id`` the response's ``id``. With several
    (``n > 1``) vLLM reports neither per choice: every counter is null, and each
    ``generation_id`` is ``f"{id}:{index}"``.

    Raises:
        ValueError: no ``id``, or ``sample_ids`` not one per choice.
    """
    response_id = response.get("id")
    if not isinstance(response_id, str) or not response_id:
        raise ValueError(f"a vLLM response has id={response_id!r}, not a non-empty string")
    choices = list(response.get("choices") or [{"index": 0}])
    samples = list(sample_ids) if sample_ids is not None else [None] * len(choices)
    if len(samples) != len(choices):
        raise ValueError(f"{len(choices)} choices but {len(samples)} sample ids")
    records = []
    for choice, sample in zip(choices, samples, strict=True):
        if len(choices) == 1:
            metrics = _field(response.get("metrics") or {}, "speculative_decoding")
            usage = response.get("usage") or {}
            counters = counters_from_spec_decode_metrics(metrics, _field(usage, "completion_tokens"))
            generation_id = response_id
        else:
            counters = SpecCounters()
            generation_id = f"{response_id}:{_field(choice, 'index')}"
        records.append(
            record_from_counters(
                counters,
                batch_id=batch_id,
                session_id=session_id,
                generation_id=generation_id,
                sample_id=sample,
                producer_id=producer_id,
                weight_version=weight_version,
                run_id=run_id,
                task=task,
            )
        )
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
) -> int:
    """Publish the records of committed vLLM outputs, in the publisher's run; returns how
    many. Only publish what your rollout keeps. Arguments as ``records_from_request_outputs``."""
    records = records_from_request_outputs(
        outputs,
        batch_id=batch_id,
        session_ids=session_ids,
        sample_ids=sample_ids,
        producer_id=publisher.settings.producer_id,
        run_id=publisher.settings.run_id,
        weight_version=weight_version,
        tasks=tasks,
    )
    for record in records:
        await publisher.publish(record)
    return len(records)
