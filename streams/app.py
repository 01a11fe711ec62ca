"""The Faust shell: topics, state tables, the two agents and the timer.

It decides nothing: it moves messages into ``PartitionProcessor`` (stage 1)
and ``BatchMerger`` (stage 2) and carries out the effects they return. State
lives in two Faust tables used as changelogs with explicit partitions (stage 1
writes one delta per batch per chunk, never one write per record).

Offsets: Faust's committed offsets are not trusted (see ``_gate``). Each
stage keeps a durable checkpoint of the last offset it applied; the shell
admits only the offsets that follow it, drops messages fetched in an older
consumer generation, and seeks back when the consumer resumed past a gap.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from specmeter.schemas import decode_partial, encode_dead_letter, encode_metrics, encode_partial

from ._counters import WorkerCounters
from ._gate import OffsetGate
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
        self.gates = {t.records: OffsetGate(), t.partials: OffsetGate()}
        self.last_event_at: dict[int, float] = {}
        self.last_published: Any = None
        self.started_at = time.time()
        self.seeks = 0
        #: bumped on every revocation; work that awaited across one is discarded
        self.epoch = 0

    # -- state per partition ------------------------------------------------------
    @staticmethod
    def _entries(table: Any, partition: int) -> list[tuple[bytes, bytes]]:
        prefix = state_key_prefix(partition)
        return [(k, v) for k, v in list(table.data.items()) if k.startswith(prefix)]

    @staticmethod
    def _write(table: Any, partition: int, key: bytes, value: bytes | None) -> None:
        """Write to the changelog and mirror it in the table's store, so the store
        always equals the changelog however Faust recovers it (fully or from an offset)."""
        table.send_changelog(partition, key, value)
        if value is None:
            table.data.pop(key, None)
        else:
            table.data[key] = value

    def _owned(self, epoch: int, topic: str, partition: int) -> bool:
        return epoch == self.epoch and partition in self._assigned(topic)

    def processor(self, partition: int) -> PartitionProcessor:
        """This partition's stage-1 state, restored from the changelog on first use.

        Synchronous on purpose: nothing here awaits the broker, so a rebalance can
        never find the agent stuck half-way (a fresh state expects offset 0; the
        gate accepts a log that starts later after a few seeks).
        """
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
        """This partition's stage-2 state (see ``processor``)."""
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
        self.epoch += 1
        for tp in topic_partitions:
            if tp.topic == self.settings.topics.records:
                self.processors.pop(tp.partition, None)
            elif tp.topic == self.settings.topics.partials:
                self.mergers.pop(tp.partition, None)
            gate = self.gates.get(tp.topic)
            if gate is not None:
                gate.forget(tp.partition)

    # -- effects ------------------------------------------------------------------
    def _apply(self, effects: Effects, partition: int) -> None:
        for key, value in effects.changelog:
            self._write(self.stage1_table, partition, key, value)
        for partial in effects.partials:
            self.partials_topic.send_soon(key=partial.batch_id.encode(), value=encode_partial(partial))
        for letter in effects.dead_letters:
            self.deadletter_topic.send_soon(key=(letter.batch_id or "").encode(), value=encode_dead_letter(letter))
            log.warning("dead-lettered reason=%s partition=%s offset=%s batch=%s detail=%s", letter.reason,
                        letter.source_partition, letter.source_offset, letter.batch_id, letter.detail)

    def _apply_merge(self, effects: MergeEffects, partition: int) -> None:
        for key, value in effects.changelog:
            self._write(self.stage2_table, partition, key, value)
        for metrics in effects.published:
            self.metrics_topic.send_soon(key=metrics.batch_id.encode(), value=encode_metrics(metrics))
            self.last_published = metrics
            if metrics.revision == 0:
                self.counters.observe_close_latency(max(0.0, time.time() - metrics.closed_at))
            m = metrics.metrics
            log.info("published batch=%s revision=%d reason=%s complete=%s records=%d accept_rate=%s "
                     "tokens_per_verify=%s", metrics.batch_id, metrics.revision, metrics.close_reason,
                     metrics.complete, metrics.record_count, m.get("spec/accept_rate"),
                     m.get("spec/tokens_per_verify"))

    # -- the agents and the timer -------------------------------------------------------
    def _assigned(self, topic: str) -> set[int]:
        consumer = self.app.consumer
        return {tp.partition for tp in consumer.assignment() if tp.topic == topic} if consumer is not None else set()

    def _group(self, topic: str, events: list) -> dict[int, list[tuple[int, Any]]]:
        """Events by partition, in offset order, without those that are not ours now:
        fetched in an older consumer generation, or of a partition revoked since
        (their owner reads them again; Faust never commits revoked partitions)."""
        generation = getattr(self.app, "consumer_generation_id", None)
        assigned = self._assigned(topic)
        grouped: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        stale = 0
        for event in events:
            message = event.message
            if message.partition not in assigned or (
                    generation is not None and getattr(message, "generation_id", generation) != generation):
                stale += 1
                continue
            grouped[message.partition].append((message.offset, event.value))
        if stale:
            log.info("dropped %d message(s) fetched before a rebalance (topic=%s)", stale, topic)
        for messages in grouped.values():
            messages.sort(key=lambda m: m[0])
        return grouped

    async def _seek(self, topic: str, partition: int, offset: int, epoch: int) -> None:
        import asyncio

        from faust.types import TP

        if not self._owned(epoch, topic, partition):
            return
        self.seeks += 1
        try:
            await asyncio.wait_for(self.app.consumer.seek(TP(topic, partition), offset), 10.0)
        except Exception as exc:  # noqa: BLE001 - the gate asks again if the gap persists
            log.warning("seek topic=%s partition=%d offset=%d failed: %r", topic, partition, offset, exc)

    async def on_records(self, events: list) -> None:
        topic = self.settings.topics.records
        gate = self.gates[topic]
        epoch = self.epoch
        seeks = []
        for partition, messages in self._group(topic, events).items():
            processor = self.processor(partition)
            admitted, seek_to = gate.admit(partition, processor.checkpoint, messages, time.monotonic())
            if admitted:
                self.last_event_at[partition] = time.time()
                self._apply(processor.process(admitted, _now_ms()), partition)
            if seek_to is not None:
                seeks.append((partition, seek_to))
        for partition, offset in seeks:
            await self._seek(topic, partition, offset, epoch)

    async def on_partials(self, events: list) -> None:
        topic = self.settings.topics.partials
        gate = self.gates[topic]
        epoch = self.epoch
        seeks = []
        for partition, messages in self._group(topic, events).items():
            merger = self.merger(partition)
            admitted, seek_to = gate.admit(partition, merger.checkpoint, messages, time.monotonic())
            if admitted:
                decoded = [(offset, decode_partial(value)) for offset, value in admitted]
                self._apply_merge(merger.process(decoded, _now_ms()), partition)
            if seek_to is not None:
                seeks.append((partition, seek_to))
        for partition, offset in seeks:
            await self._seek(topic, partition, offset, epoch)

    def ready(self) -> bool:
        app = self.app
        return bool(app.consumer is not None and not app.rebalancing and not getattr(app, "in_recovery", False)
                    and app.tables.recovery.completed.is_set())

    def on_tick(self) -> None:
        # Restoring needs the changelog recovered: the timer checks, while agents
        # get a partition's events only after Faust recovered it.
        if not self.ready():
            return
        t = self.settings.topics
        for partition in sorted(self._assigned(t.records)):
            self._apply(self.processor(partition).tick(_now_ms()), partition)
        for partition in sorted(self._assigned(t.partials)):
            self._apply_merge(self.merger(partition).tick(_now_ms()), partition)


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
        **(settings.kafka["__security__"].faust_kwargs() if "__security__" in settings.kafka else {}),
    )
    shell = StreamShell(app, settings)

    @app.agent(shell.records_topic, name="specmeter-stage1")
    async def stage1(stream: Any) -> None:
        async for events in stream.take_events(settings.chunk_messages, within=settings.chunk_wait_s):
            await shell.on_records(events)

    @app.agent(shell.partials_topic, name="specmeter-stage2")
    async def stage2(stream: Any) -> None:
        async for events in stream.take_events(100, within=0.01):
            await shell.on_partials(events)

    @app.timer(settings.tick_s)
    async def tick() -> None:
        shell.on_tick()

    @app.on_partitions_revoked.connect
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        shell.forget(revoked)

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json({"counters": shell.counters.as_dict(), "seeks": shell.seeks,
                          "open_generations": sum(p.open_generations for p in shell.processors.values()),
                          "partitions": sorted(shell.processors)})

    @app.page("/metrics")
    async def prometheus(self: Any, request: Any) -> Any:
        from ._prometheus import render

        return self.bytes(render(shell), content_type="text/plain; version=0.0.4")

    @app.page("/specmeter/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        """Liveness: the web server answers while the event loop runs."""
        return self.json({"status": "alive"})

    @app.page("/specmeter/readyz")
    async def readyz(self: Any, request: Any) -> Any:
        """Readiness: partitions assigned and their state recovered."""
        ready = shell.ready()
        return self.json({"ready": ready}, status=200 if ready else 503)

    return app, shell
