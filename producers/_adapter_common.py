"""What every engine adapter shares: one record builder and the per-output arguments.

An engine knows its counters and its request ids; the rollout knows the rest (the
batch, the run, the producer, the policy version, each generation's session, sample,
task and draft lag). ``Caller`` holds what is the same for a whole call, ``Slot`` what
each record has of its own, and ``build_record`` is the one place a record is made
from them, so that an adapter cannot forget a field on one of its paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from specmeter.schemas import GenerationRecord

from ._builders import record_from_counters
from ._meta_info import SpecCounters

if TYPE_CHECKING:
    from ._publisher import Publisher

__all__ = ["Caller", "Slot", "build_record", "one_or_each", "publish_records"]


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """The same for every record of one call: no engine knows any of it."""

    batch_id: str
    producer_id: str | None = None
    run_id: str | None = None
    #: the policy weights that generated them; None: the engine's own where it says (SGLang)
    weight_version: str | None = None


class Slot(msgspec.Struct, frozen=True, kw_only=True):
    """One record's own identity and labels."""

    session_id: str
    generation_id: str
    sample_id: str | None = None
    task: str | None = None
    draft_lag: int | None = None


def build_record(counters: SpecCounters, caller: Caller, slot: Slot) -> GenerationRecord:
    """The validated record (``record_from_counters`` raises ``msgspec.ValidationError`` on
    an empty or too long id, or a draft lag that is not an int from 0 to 2**32 - 1)."""
    return record_from_counters(
        counters,
        batch_id=caller.batch_id,
        session_id=slot.session_id,
        generation_id=slot.generation_id,
        sample_id=slot.sample_id,
        producer_id=caller.producer_id,
        weight_version=caller.weight_version,
        run_id=caller.run_id,
        task=slot.task,
        draft_lag=slot.draft_lag,
    )


def one_or_each(values: Any, count: int, what: str, per: str = "outputs") -> list[Any]:
    """``values`` as one per output: a single value (a str, an int, or None) for all of
    them, or a sequence of exactly ``count``; a sequence of another length raises
    ``ValueError`` naming both lengths."""
    if values is None or isinstance(values, (str, int)):
        return [values] * count
    if not isinstance(values, Sequence):
        raise TypeError(f"{what}: expected one value or a list of {count}, got {type(values).__name__}")
    values = list(values)
    if len(values) != count:
        raise ValueError(f"{count} {per} but {len(values)} {what}")
    return values


async def publish_records(
    publisher: Publisher, records_of: Callable[..., list[GenerationRecord]], *args: Any, **kwargs: Any
) -> int:
    """Every record ``records_of(*args, **kwargs)`` makes, in the publisher's run and as its
    producer's (the engine adapters' ``publish_*``), published in order; returns how many."""
    records = records_of(*args, producer_id=publisher.settings.producer_id, run_id=publisher.settings.run_id, **kwargs)
    for record in records:
        await publisher.publish(record)
    return len(records)
