"""specmeter's stream side: the pure aggregation core and (lazily) the Faust app.

Importing this package does not import Faust or aiokafka: the core is plain
Python, shared by the worker and the offline ``specmeter aggregate``. Its hot part
(stage 1's decoding, dedup and journal) also exists in Rust, ``core._native``, used when
built (``NATIVE_CORE``); ``SPECMETER_NO_NATIVE=1`` forces the Python reference. For a
trainer, ``consume_metrics`` (and ``consume_metrics_sync``) read each batch's
newest BatchMetrics from the metrics topic.
"""

from .core.cores import CORE, NATIVE_CORE
from .core.exact import expansion_value, merge_expansions
from .core.merge import batch_metrics_dict, build_batch_metrics, is_speculative, merge_partials, missing_records
from .core.offline import LineError, OfflineAggregator
from .core.state import Outcome
from .errors import SpecmeterError
from .readers.consume import consume_metrics, consume_metrics_sync, metrics_scalars

#: the loaded core's batch state (native when built; see ``core.cores``)
BatchState = CORE.BatchState

__all__ = [
    "BatchState",
    "NATIVE_CORE",
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
    "SpecmeterError",
]
