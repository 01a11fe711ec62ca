"""specmeter's producer library, for inside rollout workers.

Import-light: no sglang, no Faust. ``meta_info`` parsing is pure; the publisher
owns its own asyncio task and bounded queue and never blocks the caller.

    async with Publisher(PublisherSettings(bootstrap_servers=..., run_id=...)) as pub:
        pub.publish_nowait(record_from_meta_info(out["meta_info"], batch_id=..., session_id=...))
        await pub.close_batch(batch_id, speculative_algorithm="EAGLE3", expected_producers=8)

A record's ``weight_version`` comes from ``meta_info["weight_version"]``; its producer
and run are the publisher's (``PublisherSettings.producer_id``/``run_id``), so the
records need neither.
"""

from ._builders import record_from_attempts, record_from_counters, record_from_meta_info
from ._errors import (
    BrokerUnavailableError,
    PublisherClosedError,
    PublisherError,
    PublisherNotStartedError,
    QueueFullError,
    TopicMissingError,
)
from ._meta_info import (
    SpecCounters,
    counters_from_meta_info,
    fold_attempts,
    normalize_counter,
    normalize_weight_version,
)
from ._publisher import Publisher, partition_for_key
from ._security import KafkaSecurity
from ._settings import PublisherSettings, default_producer_id, plain_bootstrap
from ._sync import SyncPublisher

__all__ = [
    "SpecCounters",
    "counters_from_meta_info",
    "fold_attempts",
    "normalize_counter",
    "normalize_weight_version",
    "record_from_meta_info",
    "record_from_attempts",
    "record_from_counters",
    "Publisher",
    "SyncPublisher",
    "PublisherSettings",
    "KafkaSecurity",
    "default_producer_id",
    "plain_bootstrap",
    "partition_for_key",
    "PublisherError",
    "QueueFullError",
    "PublisherClosedError",
    "PublisherNotStartedError",
    "BrokerUnavailableError",
    "TopicMissingError",
]
