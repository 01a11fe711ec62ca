"""The worker's one settings object; the CLI and the environment map onto it."""

from __future__ import annotations

import msgspec

from specmeter.producers import KafkaSecurity
from specmeter.producers import plain_bootstrap as bootstrap_servers
from specmeter.schemas import DEADLETTER_TOPIC, METRICS_TOPIC, RECORDS_TOPIC

__all__ = ["WorkerSettings", "TopicNames", "bootstrap_servers", "partials_topic_of"]


def partials_topic_of(app_id: str) -> str:
    """The partials topic a deployment names from its app id (``specmeter.partials`` for
    the default app id): stage 2 merges whatever arrives there, so two deployments that
    shared it would republish each other's batches (docs/operations.md, Deployments)."""
    return f"{app_id}.partials"


class TopicNames(msgspec.Struct, frozen=True, kw_only=True):
    """Topic names (defaults of docs/contract.md §4). ``records``, ``metrics`` and
    ``deadletter`` are the user's to name; ``partials`` is the deployment's own: left
    empty, a worker's settings name it from the app id (``partials_topic_of``)."""

    records: str = RECORDS_TOPIC
    partials: str = ""
    metrics: str = METRICS_TOPIC
    deadletter: str = DEADLETTER_TOPIC

    def for_app(self, app_id: str) -> TopicNames:
        """These names with the partials topic named from ``app_id`` where it was left empty."""
        return self if self.partials else msgspec.structs.replace(self, partials=partials_topic_of(app_id))


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a specmeter worker runs.

    Attributes:
        broker: Kafka bootstrap address(es), comma-separated.
        app_id: the deployment's name: its consumer groups (``<app-id>-stage1``,
            ``<app-id>-stage2``), the prefix of its changelog topics and, unless
            ``topics.partials`` names one, its partials topic (``<app-id>.partials``):
            deployments of different app ids on one cluster never share state.
        topics: topic names.
        partitions: partitions of the records topic (and of every state topic).
        replication_factor: replicas of each topic the worker creates; None: the
            cluster's ``default.replication.factor`` (a production cluster sets 3).
            Topics that exist keep theirs.
        batch_timeout_s: close a batch this long after its last input if its
            markers never complete (close_reason ``timeout``).
        grace_s: keep a closed batch this long: late records within it give a
            new revision; after it they are dead-lettered as ``late``.
        expired_retention_s: remember a batch this long after its grace ended (or
            after it overflowed): its records and markers are dead-lettered, never
            opening it again (SPEC §4). 8-16 bytes of memory per batch (docs/state.md).
        chunk_bytes: input bytes a stage's route applies (and checkpoints) together at
            most, per partition: a marker waits behind at most one such chunk of each
            partition (1 MiB: about 60 ms of work).
        fetch_wait_ms: how long the routes let the broker hold a fetch that finds
            nothing new (a fetch that finds data returns at once).
        max_queued_output_bytes: the stages wait after a chunk while more than this
            is queued for the producer and not yet handed to it (back-pressure: a
            backlog's changelog is sent as it is read, not held in memory).
        tick_s: how often timeouts and grace are checked.
        max_message_bytes: larger input messages are dead-lettered as ``too_large``.
        max_open_generations: distinct generations one records partition may hold
            (all its batches); the batch whose input crosses it is closed early
            as ``incomplete`` and its later input dead-lettered as ``overflow``.
            About 300 bytes of worker memory each with the native core (85-130 of
            them dedup state, bench/memory.py), twice that with the Python one
            (docs/operations.md, Memory).
        session_timeout_s: how long a silent worker keeps its partitions (its group
            coordinator hears no heartbeat for this long: the group rebalances).
        ready_write_timeout_s: readiness (``/specmeter/readyz``) drops when the worker's
            writes have waited this long with none acknowledged (``report.readiness``); a
            broker that leads some partitions and goes away stalls writes for about
            the cluster's broker session timeout (9 s by default), well below it.
        max_poll_interval_s: how long a stage's route may go without asking for input
            before it leaves its group (its partitions move to the other workers): the
            bound on a worker that is alive but stuck.
        delivery_timeout_s: how long a write is retried through an outage before the
            worker gives up: it then stops without flushing, and its successor resumes
            from the last state that is whole. Below ``max_poll_interval_s``: a route
            blocked on output room must not leave its group holding unacknowledged writes.
        commit_interval_s: how often consumed offsets are committed.
        web_enabled / web_host / web_port: the worker's HTTP server (health, stats, metrics);
            on the loopback address by default (a container or a scraper on another host
            needs ``--web-host 0.0.0.0``, as deploy/ passes it).
        max_exported_tasks: task names that get Prometheus counters of their own, per
            (algorithm, run_id), first come; later tasks are summed under
            ``task="(other)"`` (docs/prometheus.md). Each costs 8 series per pair.
        data_dir: Faust's local data folder (created readable by its owner alone, 0700).
        log_level: worker log level.
        security: Kafka client security (SASL, TLS), for Faust and aiokafka alike;
            the CLI reads it from the environment (``KafkaSecurity.from_env``).
    """

    broker: str = "127.0.0.1:9092"
    app_id: str = "specmeter"
    topics: TopicNames = TopicNames()
    partitions: int = 8
    replication_factor: int | None = None
    batch_timeout_s: float = 60.0
    grace_s: float = 300.0
    expired_retention_s: float = 7 * 24 * 3600.0
    chunk_bytes: int = 1_048_576
    fetch_wait_ms: int = 50
    max_queued_output_bytes: int = 8 * 1024 * 1024
    tick_s: float = 0.25
    max_message_bytes: int = 8 * 1024 * 1024
    max_open_generations: int = 1_000_000
    session_timeout_s: float = 30.0
    ready_write_timeout_s: float = 30.0
    max_poll_interval_s: float = 300.0
    delivery_timeout_s: float = 240.0
    commit_interval_s: float = 1.0
    web_enabled: bool = True
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    max_exported_tasks: int = 16
    data_dir: str = "/tmp/specmeter-worker"
    log_level: str = "info"
    security: KafkaSecurity = KafkaSecurity()

    def __post_init__(self) -> None:
        # the deployment's own topic, named once here so every reader of the settings agrees
        msgspec.structs.force_setattr(self, "topics", self.topics.for_app(self.app_id))
        if not self.delivery_timeout_s < self.max_poll_interval_s:
            raise ValueError(
                f"the delivery timeout ({self.delivery_timeout_s:g} s) must stay below the max poll interval "
                f"({self.max_poll_interval_s:g} s): a worker blocked on writes would leave its group holding them"
            )

    @property
    def consumer_groups(self) -> tuple[str, str]:
        """The consumer groups of stage 1 (the records topic) and stage 2 (the partials topic)."""
        return f"{self.app_id}-stage1", f"{self.app_id}-stage2"
