"""specmeter's stream side: the pure aggregation core and (lazily) the Faust app.

Importing this package does not import Faust or aiokafka: the core is plain
Python, shared by the worker and the offline ``specmeter aggregate``. For a
trainer, ``consume_metrics`` (and ``consume_metrics_sync``) read each batch's
newest BatchMetrics from the metrics topic.
"""

from ._consume import consume_metrics, consume_metrics_sync, metrics_scalars
from ._exact import expansion_value, merge_expansions
from ._merge import batch_metrics_dict, build_batch_metrics, is_speculative, merge_partials, missing_records
from ._offline import LineError, OfflineAggregator
from ._state import BatchState, Outcome

__all__ = [
    "BatchState",
    "Outcome",
    "merge_partials",
    "batch_metrics_dict",
    "build_batch_metrics",
    "is_speculative",
    "missing_records",
    "merge_expansions",
    "expansion_value",
    "OfflineAggregator",
    "LineError",
    "consume_metrics",
    "consume_metrics_sync",
    "metrics_scalars",
]
