"""specmeter's wire contract: msgspec Structs shared by producers and streams.

This package is the only thing both sides import. A change here is a wire
format change: fields are only ever appended, with defaults.
"""

from ._aggregates import (
    DISTRIBUTION_BUCKETS,
    MAX_BREAKDOWN_KEYS,
    MAX_DRAFT_LAGS,
    MAX_TASKS,
    MAX_WEIGHT_VERSIONS,
    BreakdownSums,
    PartialAggregate,
)
from ._codec import (
    DecodedMessage,
    InvalidRecord,
    decode_dead_letter,
    decode_json_line,
    decode_metrics,
    decode_partial,
    decode_records_message,
    encode_dead_letter,
    encode_metrics,
    encode_metrics_key,
    encode_partial,
    encode_records_message,
    record_to_builtins,
)
from ._output import BatchMetrics, DeadLetter, DraftLagMetrics, TaskMetrics, WeightVersionMetrics
from ._records import BatchMarker, GenerationRecord, RecordBatch, RecordsMessage
from ._topics import DEADLETTER_TOPIC, METRICS_TOPIC, PARTIALS_TOPIC, RECORDS_TOPIC
from ._types import MAX_BINS, MAX_COUNTER, MAX_ID

#: Bumped on any incompatible change of the wire format (there has been none).
WIRE_VERSION = 1

__all__ = [
    "WIRE_VERSION",
    "MAX_COUNTER",
    "MAX_BINS",
    "MAX_ID",
    "MAX_WEIGHT_VERSIONS",
    "MAX_TASKS",
    "MAX_DRAFT_LAGS",
    "DISTRIBUTION_BUCKETS",
    "MAX_BREAKDOWN_KEYS",
    "RECORDS_TOPIC",
    "PARTIALS_TOPIC",
    "METRICS_TOPIC",
    "DEADLETTER_TOPIC",
    "BreakdownSums",
    "WeightVersionMetrics",
    "TaskMetrics",
    "DraftLagMetrics",
    "GenerationRecord",
    "RecordBatch",
    "BatchMarker",
    "RecordsMessage",
    "PartialAggregate",
    "BatchMetrics",
    "DeadLetter",
    "DecodedMessage",
    "InvalidRecord",
    "decode_records_message",
    "encode_records_message",
    "decode_json_line",
    "record_to_builtins",
    "encode_partial",
    "decode_partial",
    "encode_metrics",
    "encode_metrics_key",
    "decode_metrics",
    "encode_dead_letter",
    "decode_dead_letter",
]
