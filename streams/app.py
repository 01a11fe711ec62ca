"""The Faust shell: topics, state tables, the two agents and the timer.

It decides nothing: it moves messages into ``PartitionProcessor`` (stage 1)
and ``BatchMerger`` (stage 2) and carries out the effects they return. State
lives in two Faust tables used as changelogs with explicit partitions (stage 1
writes one delta per batch per chunk, never one write per record).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from specmeter.schemas import decode_partial, encode_dead_letter, encode_metrics, encode_partial

from ._counters import WorkerCounters
from ._stage1 import Effects, PartitionProcessor, state_key_prefix
from ._stage2 import BatchMerger, MergeEffects
from .settings import WorkerSettings

__all__ = ["build_app", "StreamShell"]

log = logging.getLogger("specmeter.worker")


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamShell:
    """Glue between Faust and the pure stage classes of this worker process."""

    def __init__(self, app: Any, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.counters = WorkerCounters()
        t = settings.topics
        self.records_topic = app.topic(t.records, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                                       key_serializer="raw", value_serializer="raw")
        self.partials_topic = app.topic(t.partials, partitions=settings.partitions, key_type=bytes,
                                        value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.metrics_topic = app.topic(t.metrics, key_serializer="raw", value_serializer="raw")
        self.deadletter_topic = app.topic(t.deadletter, key_serializer="raw", value_serializer="raw")
        # key/value serializers are the app's ("raw"): values are our own msgpack structs
        self.stage1_table = app.Table("stage1-state", partitions=settings.partitions, key_type=bytes,
                                      value_type=bytes)
        self.stage2_table = app.Table("stage2-state", partitions=settings.partitions, key_type=bytes,
                                      value_type=bytes)
        self.processors: dict[int, PartitionProcessor] = {}
        self.mergers: dict[int, BatchMerger] = {}
        self.last_event_at: dict[int, float] = {}
        self.last_published: Any = None

    # -- state per partition ------------------------------------------------------
    def _entries(self, table: Any, partition: int) -> list[tuple[bytes, bytes]]:
        prefix = state_key_prefix(partition)
        data = table.data
        entries = [(k, v) for k, v in list(data.items()) if k.startswith(prefix)]
        for key, _ in entries:  # the in-memory state is the truth from here on
            data.pop(key, None)
        return entries

    def processor(self, partition: int) -> PartitionProcessor:
        processor = self.processors.get(partition)
        if processor is None:
            s = self.settings
            processor = PartitionProcessor(partition, source_topic=s.topics.records,
                                           batch_timeout_ms=int(s.batch_timeout_s * 1000),
                                           grace_ms=int(s.grace_s * 1000), max_message_bytes=s.max_message_bytes,
                                           counters=self.counters)
            effects = processor.restore(self._entries(self.stage1_table, partition), _now_ms())
            self.processors[partition] = processor
            self._apply(effects, partition)
        return processor

    def merger(self, partition: int) -> BatchMerger:
        merger = self.mergers.get(partition)
        if merger is None:
            s = self.settings
            merger = BatchMerger(partition, partitions_expected=s.partitions,
                                 batch_timeout_ms=int(s.batch_timeout_s * 1000), grace_ms=int(s.grace_s * 1000),
                                 counters=self.counters)
            merger.restore(self._entries(self.stage2_table, partition))
            self.mergers[partition] = merger
        return merger

    def forget(self, topic_partitions: Any) -> None:
        """Drop in-memory state of revoked partitions; the next owner rebuilds it."""
        for tp in topic_partitions:
            if tp.topic == self.settings.topics.records:
                self.processors.pop(tp.partition, None)
            elif tp.topic == self.settings.topics.partials:
                self.mergers.pop(tp.partition, None)

    # -- effects ------------------------------------------------------------------
    def _apply(self, effects: Effects, partition: int) -> None:
        for key, value in effects.changelog:
            self.stage1_table.send_changelog(partition, key, value)
        for partial in effects.partials:
            self.partials_topic.send_soon(key=partial.batch_id.encode(), value=encode_partial(partial))
        for letter in effects.dead_letters:
            self.deadletter_topic.send_soon(key=(letter.batch_id or "").encode(), value=encode_dead_letter(letter))
            log.warning("dead-lettered reason=%s partition=%s offset=%s batch=%s detail=%s", letter.reason,
                        letter.source_partition, letter.source_offset, letter.batch_id, letter.detail)

    def _apply_merge(self, effects: MergeEffects, partition: int) -> None:
        for key, value in effects.changelog:
            self.stage2_table.send_changelog(partition, key, value)
        for metrics in effects.published:
            self.metrics_topic.send_soon(key=metrics.batch_id.encode(), value=encode_metrics(metrics))
            self.last_published = metrics
            m = metrics.metrics
            log.info("published batch=%s revision=%d reason=%s complete=%s records=%d accept_rate=%s "
                     "tokens_per_verify=%s", metrics.batch_id, metrics.revision, metrics.close_reason,
                     metrics.complete, metrics.record_count, m.get("spec/accept_rate"),
                     m.get("spec/tokens_per_verify"))

    # -- the agents and the timer -------------------------------------------------------
    def on_records(self, events: list) -> None:
        now = _now_ms()
        by_partition: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        for event in events:
            message = event.message
            by_partition[message.partition].append((message.offset, event.value))
        for partition, messages in by_partition.items():
            self.last_event_at[partition] = time.time()
            self._apply(self.processor(partition).process(messages, now), partition)

    def on_partial(self, event: Any) -> None:
        partial = decode_partial(event.value)
        partition = event.message.partition
        self._apply_merge(self.merger(partition).on_partial(partial, _now_ms()), partition)

    def ready(self) -> bool:
        app = self.app
        return bool(app.consumer is not None and not app.rebalancing and not getattr(app, "in_recovery", False)
                    and app.tables.recovery.completed.is_set())

    def on_tick(self) -> None:
        if not self.ready():
            return
        now = _now_ms()
        for tp in self.app.consumer.assignment():
            if tp.topic == self.settings.topics.records:
                self._apply(self.processor(tp.partition).tick(now), tp.partition)
            elif tp.topic == self.settings.topics.partials:
                self._apply_merge(self.merger(tp.partition).tick(now), tp.partition)


def build_app(settings: WorkerSettings) -> tuple[Any, StreamShell]:
    """A configured Faust app and its shell; nothing runs until a Worker starts it."""
    import faust

    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{b.strip()}" for b in settings.broker.split(",")],
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
        broker_commit_interval=settings.commit_interval_s,
        producer_acks=-1,
        producer_max_request_size=max(settings.max_message_bytes, 1_048_576) * 2,
        consumer_max_fetch_size=max(settings.max_message_bytes, 4_194_304),
        web_enabled=settings.web_enabled,
        web_host=settings.web_host,
        web_port=settings.web_port,
        datadir=settings.data_dir,
        autodiscover=False,
        **settings.kafka,
    )
    shell = StreamShell(app, settings)

    @app.agent(shell.records_topic, name="specmeter-stage1")
    async def stage1(stream: Any) -> None:
        async for events in stream.take_events(settings.chunk_messages, within=settings.chunk_wait_s):
            shell.on_records(events)

    @app.agent(shell.partials_topic, name="specmeter-stage2")
    async def stage2(stream: Any) -> None:
        async for event in stream.events():
            shell.on_partial(event)

    @app.timer(settings.tick_s)
    async def tick() -> None:
        shell.on_tick()

    @app.on_partitions_revoked.connect
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        shell.forget(revoked)

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json({"counters": shell.counters.as_dict(),
                          "open_generations": sum(p.open_generations for p in shell.processors.values()),
                          "partitions": sorted(shell.processors)})

    return app, shell
