"""Turning one SGLang output (or several attempts of it) into a GenerationRecord."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specmeter.schemas import GenerationRecord

from ._meta_info import SpecCounters, counters_from_meta_info, fold_attempts

__all__ = ["record_from_meta_info", "record_from_attempts", "record_from_counters"]


def record_from_counters(
    counters: SpecCounters,
    *,
    batch_id: str,
    session_id: str,
    generation_id: str,
    sample_id: str | None = None,
    state_hash: str | None = None,
    producer_id: str | None = None,
    weight_version: str | None = None,
    run_id: str | None = None,
    task: str | None = None,
    draft_lag: int | None = None,
) -> GenerationRecord:
    """A validated record; raises ``msgspec.ValidationError`` on an empty id or one
    past the 1024-character limit (``task`` included), or on a ``draft_lag`` that is not
    an int from 0 to 2**32 - 1. ``weight_version`` overrides the counters' own."""
    import msgspec

    return msgspec.convert(
        {
            "batch_id": batch_id,
            "session_id": session_id,
            "generation_id": generation_id,
            "sample_id": sample_id,
            "state_hash": state_hash,
            "accepted": counters.accepted,
            "proposed": counters.proposed,
            "verify": counters.verify,
            "completion": counters.completion,
            "accept_histogram": counters.accept_histogram,
            "producer_id": producer_id,
            "weight_version": weight_version if weight_version is not None else counters.weight_version,
            "run_id": run_id,
            "task": task,
            "draft_lag": draft_lag,
        },
        type=GenerationRecord,
    )


def _generation_id(meta_info: Mapping[str, Any], generation_id: str | None, caller: str) -> str:
    """``generation_id`` when given, else SGLang's request id ``meta_info["id"]``: one of
    the two is required, since a generation is deduplicated by it (docs/contract.md §2)."""
    if generation_id is not None:
        return generation_id
    rid = meta_info.get("id")
    if isinstance(rid, str) and rid:
        return rid
    found = "has no 'id' key" if "id" not in meta_info else f"has 'id' = {rid!r}, not a non-empty string"
    raise ValueError(
        f"meta_info {found}, and no generation_id was passed: a generation is deduplicated by its id. "
        f"Pass {caller}(..., generation_id=ID) with an id that names this generation and stays the same "
        "whenever it is published again (SGLang's request id is meta_info['id'])"
    )


def record_from_meta_info(
    meta_info: Mapping[str, Any],
    *,
    batch_id: str,
    session_id: str,
    sample_id: str | None = None,
    generation_id: str | None = None,
    state_hash: str | None = None,
    producer_id: str | None = None,
    weight_version: str | None = None,
    run_id: str | None = None,
    task: str | None = None,
    draft_lag: int | None = None,
) -> GenerationRecord:
    """The record of one committed generation from its SGLang ``meta_info``.

    ``generation_id`` defaults to ``meta_info["id"]`` (SGLang's request id) and
    ``weight_version`` to ``meta_info["weight_version"]``. Raises ``ValueError`` when
    neither ``generation_id`` nor a non-empty ``meta_info["id"]`` is there. ``producer_id`` and
    ``run_id`` may stay None: a ``Publisher`` counts the record as its own, in its run.
    ``task`` is the prompt's dataset or task family (``gsm8k``, ``swe-bench``, ``chat``):
    SGLang does not know it, the rollout does (docs/contract.md §3.4). ``draft_lag`` is
    how many policy weight updates the draft model is behind the policy that generated
    this (0: refreshed or trained for it): SGLang does not know it either, the rollout
    framework that updates both does (docs/contract.md §3.6).
    """
    return record_from_counters(
        counters_from_meta_info(meta_info),
        batch_id=batch_id,
        session_id=session_id,
        generation_id=_generation_id(meta_info, generation_id, "record_from_meta_info"),
        sample_id=sample_id,
        state_hash=state_hash,
        producer_id=producer_id,
        weight_version=weight_version,
        run_id=run_id,
        task=task,
        draft_lag=draft_lag,
    )


def record_from_attempts(
    attempts: Sequence[Mapping[str, Any]],
    *,
    batch_id: str,
    session_id: str,
    sample_id: str | None = None,
    generation_id: str | None = None,
    state_hash: str | None = None,
    producer_id: str | None = None,
    weight_version: str | None = None,
    run_id: str | None = None,
    task: str | None = None,
    draft_lag: int | None = None,
) -> GenerationRecord:
    """One generation resumed over several attempts, folded (docs/contract.md §2).

    ``generation_id`` defaults to the first attempt's request id; ``task`` is the
    prompt's, the same for every attempt; ``draft_lag`` is the generation's (its attempts
    ran on one policy).
    """
    if not attempts:
        raise ValueError("record_from_attempts() needs at least one meta_info")
    return record_from_counters(
        fold_attempts(counters_from_meta_info(m) for m in attempts),
        batch_id=batch_id,
        session_id=session_id,
        generation_id=_generation_id(attempts[0], generation_id, "record_from_attempts"),
        sample_id=sample_id,
        state_hash=state_hash,
        producer_id=producer_id,
        weight_version=weight_version,
        run_id=run_id,
        task=task,
        draft_lag=draft_lag,
    )
