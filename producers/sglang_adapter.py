"""SGLang integration: records from what SGLang returns, published for you.

Install with ``pip install 'specmeter[sglang]'``. Nothing here imports sglang at
module level: the helpers read the dicts that ``Engine.generate``,
``Engine.async_generate`` and the HTTP ``/generate`` endpoint return (one dict,
a list for a batch of prompts, ``n`` dicts per prompt with ``n > 1``), so they
also work on outputs fetched over HTTP by a process without sglang installed.

    engine = sglang.Engine(model_path=..., speculative_algorithm="EAGLE3", ...)
    out = await engine.async_generate(prompts, sampling_params)
    await publish_outputs(
        publisher, out, batch_id=f"step-{step}", session_ids=sessions, tasks=datasets,
        draft_lags=policy_step - draft_refreshed_at_step,  # the draft's lag: the caller knows both
    )

Through the OpenAI-compatible API (``/v1/chat/completions``, ``/v1/completions``) the
counters come back in ``sglext.spec_tokens_details`` when the request sets
``"return_spec_tokens_details": true`` (SGLang PR #33518): ``records_from_openai_response``
reads a response, or a streamed response's chunks, the same way (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specmeter.schemas import GenerationRecord

from ._adapter_common import Caller, Slot, build_record, one_or_each, publish_records
from ._builders import _generation_id, record_from_counters
from ._meta_info import counters_from_meta_info
from ._meta_info_openai import assemble_stream, choice_counters, parse_response, sse_events
from ._publisher import Publisher

__all__ = [
    "records_from_outputs",
    "records_from_openai_response",
    "publish_outputs",
    "publish_openai_response",
    "sse_events",
    "require_sglang",
]


def require_sglang() -> Any:
    """Import sglang, or say how to get it."""
    try:
        import sglang
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the SGLang integration needs sglang: pip install 'specmeter[sglang]'") from exc
    return sglang


def _as_list(outputs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(outputs, Mapping):
        return [outputs]
    if isinstance(outputs, Sequence) and not isinstance(outputs, (str, bytes)):
        return list(outputs)
    raise TypeError(f"expected an SGLang output dict or a list of them, got {type(outputs).__name__}")


def records_from_outputs(
    outputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    batch_id: str,
    session_ids: str | Sequence[str],
    sample_ids: Sequence[str | None] | None = None,
    state_hashes: Sequence[str | None] | None = None,
    producer_id: str | None = None,
    run_id: str | None = None,
    tasks: str | Sequence[str | None] | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
    speculative: bool = False,
) -> list[GenerationRecord]:
    """One record per output dict, in order.

    Args:
        outputs: what SGLang returned (each item has a ``meta_info`` dict).
        session_ids: one session for all outputs, or one per output.
        sample_ids: the trajectory each output belongs to (None: its own sample).
        state_hashes: optional content hashes of the states produced.
        run_id: the training run (attempt); each record's weight_version comes
            from its ``meta_info["weight_version"]``.
        tasks: the prompts' dataset or task family (``gsm8k``, ``swe-bench``): one for
            all outputs, or one per output (a batch of prompts from several datasets);
            None: unknown (``by_task`` breaks a batch down by it).
        draft_lags: how many policy weight updates the draft model is behind the policy
            that generated each output (0: refreshed or trained for it): one for all
            outputs, or one per output. SGLang knows neither version's age; the caller
            (the rollout framework that updates the policy and the draft) does. None:
            unknown (``by_draft_lag`` breaks a batch down by it: the staleness curve).
        speculative: the server runs speculative decoding, so an output without any spec
            key had no verify step: its counters are the observed zeros, not unknown
            (``counters_from_meta_info``; docs/engines.md).

    Raises:
        ValueError: lengths do not match, or an output lacks ``meta_info``/its ``id``.
    """
    items = _as_list(outputs)
    sessions = [session_ids] * len(items) if isinstance(session_ids, str) else list(session_ids)
    samples = list(sample_ids) if sample_ids is not None else [None] * len(items)
    hashes = list(state_hashes) if state_hashes is not None else [None] * len(items)
    task_list = [tasks] * len(items) if tasks is None or isinstance(tasks, str) else list(tasks)
    lags = _one_or_each(draft_lags, len(items))
    if not len(sessions) == len(samples) == len(hashes) == len(task_list) == len(lags) == len(items):
        raise ValueError(
            f"{len(items)} outputs but {len(sessions)} session ids, {len(samples)} sample ids, "
            f"{len(hashes)} state hashes, {len(task_list)} tasks, {len(lags)} draft lags"
        )
    records = []
    columns = zip(items, sessions, samples, hashes, task_list, lags, strict=True)
    for item, session, sample, state_hash, task, lag in columns:
        meta_info = item.get("meta_info")
        if not isinstance(meta_info, Mapping):
            raise ValueError("an SGLang output has no `meta_info` dict (was return_text_in_logprobs used?)")
        records.append(
            record_from_counters(
                counters_from_meta_info(meta_info, speculative=speculative),
                batch_id=batch_id,
                session_id=session,
                generation_id=_generation_id(meta_info, None, "record_from_meta_info"),
                sample_id=sample,
                state_hash=state_hash,
                producer_id=producer_id,
                run_id=run_id,
                task=task,
                draft_lag=lag,
            )
        )
    return records


def _one_or_each(draft_lags: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    """``draft_lags`` as one per output: a single lag (or None) for all of them."""
    if draft_lags is None or isinstance(draft_lags, int):
        return [draft_lags] * n
    return list(draft_lags)


async def publish_outputs(
    publisher: Publisher,
    outputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    batch_id: str,
    session_ids: str | Sequence[str],
    sample_ids: Sequence[str | None] | None = None,
    state_hashes: Sequence[str | None] | None = None,
    tasks: str | Sequence[str | None] | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
    speculative: bool = False,
) -> int:
    """Publish the records of committed outputs, in the publisher's run; returns how
    many. Only publish what your rollout keeps: discarded branches and aborted
    requests are not metrics. ``tasks``, ``draft_lags`` and ``speculative`` as for
    ``records_from_outputs``."""
    return await publish_records(
        publisher,
        records_from_outputs,
        outputs,
        batch_id=batch_id,
        session_ids=session_ids,
        sample_ids=sample_ids,
        state_hashes=state_hashes,
        tasks=tasks,
        draft_lags=draft_lags,
        speculative=speculative,
    )


def records_from_openai_response(
    response: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    batch_id: str,
    session_id: str,
    sample_ids: Sequence[str | None] | None = None,
    producer_id: str | None = None,
    run_id: str | None = None,
    weight_version: str | None = None,
    task: str | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
    speculative: bool = False,
) -> list[GenerationRecord]:
    """One record per choice of an SGLang ``/v1/chat/completions`` or ``/v1/completions``
    response requested with ``"return_spec_tokens_details": true``, in order of ``choices``.

    Args:
        response: the response's JSON, or a streamed response's chunks (each event's
            JSON, in order; ``sse_events`` reads them from the body): the counters come on
            a chunk of their own near the end and the completion on the usage chunk
            (``stream_options.include_usage``).
        session_id: the session every choice belongs to (one request, one session).
        sample_ids: each choice's trajectory (None: its own sample).
        weight_version: the policy's; None: the response's ``metadata.weight_version``.
        task: the prompt's dataset or task family.
        draft_lags: one for every choice, or one per choice (docs/contract.md §3.6).
        speculative: as for ``records_from_outputs``: a choice SGLang wrote no spec key
            for had no verify step (only when the request did ask for the details).

    The record of a single choice has ``generation_id`` the response's ``id``; with
    several, ``f"{id}:{index}"``. Counters follow ``counters_from_meta_info`` exactly
    (the details are meta_info's keys), so a rollout gets the same records' counters as
    through ``/generate``; what cannot be told is unknown, never 0 (docs/engines.md).

    Raises:
        ValueError: not such a response (the message names the path), or lengths differ.
    """
    whole = assemble_stream(response) if isinstance(response, Sequence) else response
    view = parse_response(whole)
    if not view.id:
        raise ValueError("an SGLang OpenAI-compatible response has an empty id")
    counters = choice_counters(view, speculative=speculative)
    samples = one_or_each(sample_ids, len(counters), "sample ids", per="choices")
    lags = one_or_each(draft_lags, len(counters), "draft lags", per="choices")
    version = weight_version
    if version is None and view.metadata is not None and isinstance(view.metadata.weight_version, str):
        version = view.metadata.weight_version or None
    caller = Caller(batch_id=batch_id, producer_id=producer_id, run_id=run_id, weight_version=version)
    choices = view.choices or []
    records = []
    for position, (choice_counter, sample, lag) in enumerate(zip(counters, samples, lags, strict=True)):
        index = choices[position].index if choices else 0
        generation_id = view.id if len(counters) == 1 else f"{view.id}:{index}"
        slot = Slot(session_id=session_id, generation_id=generation_id, sample_id=sample, task=task, draft_lag=lag)
        records.append(build_record(choice_counter, caller, slot))
    return records


async def publish_openai_response(
    publisher: Publisher,
    response: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    batch_id: str,
    session_id: str,
    sample_ids: Sequence[str | None] | None = None,
    weight_version: str | None = None,
    task: str | None = None,
    draft_lags: int | Sequence[int | None] | None = None,
    speculative: bool = False,
) -> int:
    """Publish the records of one committed OpenAI-compatible response, in the publisher's
    run; returns how many. Arguments as ``records_from_openai_response``."""
    return await publish_records(
        publisher,
        records_from_openai_response,
        response,
        batch_id=batch_id,
        session_id=session_id,
        sample_ids=sample_ids,
        weight_version=weight_version,
        task=task,
        draft_lags=draft_lags,
        speculative=speculative,
    )
