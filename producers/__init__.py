"""specmeter's producer library, for inside rollout workers.

Import-light: no sglang, no Faust. ``meta_info`` parsing is pure; the publisher
owns its own asyncio task and bounded queue and never blocks the caller.
"""

from ._builders import record_from_attempts, record_from_counters, record_from_meta_info
from ._meta_info import SpecCounters, counters_from_meta_info, fold_attempts, normalize_counter

__all__ = [
    "SpecCounters",
    "counters_from_meta_info",
    "fold_attempts",
    "normalize_counter",
    "record_from_meta_info",
    "record_from_attempts",
    "record_from_counters",
]
