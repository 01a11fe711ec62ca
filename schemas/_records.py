"""Input messages on the records topic: a tagged union dispatched on ``type``.

Append-only contract: new fields get defaults and go last; never retype or reorder.
"""

from __future__ import annotations

import msgspec

from ._types import Counter, Histogram, NonEmptyStr, PositiveInt

__all__ = ["GenerationRecord", "RecordBatch", "BatchMarker", "RecordsMessage"]


class GenerationRecord(msgspec.Struct, tag="record", tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    """One committed backend generation, as carried by one exported sample.

    ``None`` means unknown and is never the same as 0.
    """

    batch_id: NonEmptyStr
    session_id: NonEmptyStr
    generation_id: NonEmptyStr
    sample_id: NonEmptyStr | None = None
    state_hash: NonEmptyStr | None = None
    accepted: Counter | None = None
    proposed: Counter | None = None
    verify: Counter | None = None
    completion: Counter | None = None
    accept_histogram: Histogram | None = None
    producer_id: NonEmptyStr | None = None
    #: the policy weights that generated it (SGLang's ``meta_info["weight_version"]``)
    weight_version: NonEmptyStr | None = None
    #: the training run (attempt) the batch belongs to; None is the default run.
    #: Inside a ``RecordBatch`` that names a run, None means the envelope's run.
    run_id: NonEmptyStr | None = None
    #: (revision 4) the prompt's dataset or task family (``gsm8k``, ``swe-bench``, ``chat``),
    #: set by the producer; part of the generation's value (two tasks for one key conflict)
    task: NonEmptyStr | None = None
    #: (revision 5) how many policy weight updates the draft model is behind (0: refreshed
    #: or trained for the policy that generated this); set by the producer, who knows both
    #: versions. Part of the generation's value (two lags for one key conflict)
    draft_lag: Counter | None = None

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the generation: ``(session_id, generation_id)``."""
        return (self.session_id, self.generation_id)


class RecordBatch(msgspec.Struct, tag="batch", tag_field="type", frozen=True, kw_only=True):
    """Many records packed into one Kafka message.

    Every record maps to the partition the batch is sent to (same murmur2 of its
    session_id). Packing amortizes the per-message cost of Kafka and Faust.
    """

    records: list[GenerationRecord]
    producer_id: NonEmptyStr | None = None
    #: the run of every record inside (a record naming another run is invalid)
    run_id: NonEmptyStr | None = None


class BatchMarker(msgspec.Struct, tag="marker", tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    """A producer's word that it has sent everything for ``(run_id, batch_id)``.

    Sent to every partition of the records topic after the producer's records
    for the batch are acknowledged; ``records_sent`` counts what this producer
    sent to the partition the marker lands on.
    """

    batch_id: NonEmptyStr
    producer_id: NonEmptyStr
    records_sent: Counter = 0
    speculative_algorithm: NonEmptyStr | None = None
    expected_producers: PositiveInt = 1
    #: closes only this run's batch (None: the default run)
    run_id: NonEmptyStr | None = None


RecordsMessage = GenerationRecord | RecordBatch | BatchMarker
