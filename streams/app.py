"""The Faust shell: topics, state tables, the two agents and the timer.

It decides nothing: it moves messages into ``PartitionProcessor`` (stage 1)
and ``BatchMerger`` (stage 2) and carries out the effects they return. State
lives in two compacted changelog topics written through the shell's own ordered
producer (``_output``) with explicit partitions (stage 1 writes one delta per
batch per chunk, never one write per record) and read back by ``_changelog``
when a worker takes a partition over; Faust's table recovery is not used (it
can hang on rebalances).

Input: Faust runs the consumer group (assignment, rebalances), the agents, the
timers and the web server, but under load each stage reads its owned partitions
through a consumer of its own (``tail_records``, ``tail_partials``): Faust's
fetch wait (1.5 s) and its per-message hand-over put seconds between a marker
and its batch's close. Faust's delivery of the records topic is paused while
the records tail runs and stays as the fallback.

Offsets: Faust's committed offsets are not trusted (see ``_gate``). Each
stage keeps a durable checkpoint of the last offset it applied; the shell
admits only the offsets that follow it, drops messages fetched in an older
consumer generation, and seeks back when the consumer resumed past a gap.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from typing import Any

from specmeter.schemas import decode_partial, encode_dead_letter, encode_metrics, encode_partial

from ._changelog import changelog_topics, read_changelog_partition, read_range
from ._counters import PublishedTotals, WorkerCounters
from ._faults import CrashPoints
from ._output import OrderedProducer
from ._stage1 import Effects, PartitionProcessor, shorten
from ._stage2 import BatchMerger, MergeEffects
from .settings import WorkerSettings, faust_security_kwargs

__all__ = ["build_app", "StreamShell"]

log = logging.getLogger("specmeter.worker")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _rss_bytes() -> int | None:
    """This process's resident memory now (Linux), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None




class StreamShell:
    """Glue between Faust and the pure stage classes of this worker process."""

    def __init__(self, app: Any, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.counters = WorkerCounters()
        self.published = PublishedTotals(forget_after_s=settings.grace_s + settings.batch_timeout_s)  # for /metrics
        t = settings.topics
        self.records_topic = app.topic(t.records, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                                       key_serializer="raw", value_serializer="raw")
        self.partials_topic = app.topic(t.partials, partitions=settings.partitions, key_type=bytes,
                                        value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.metrics_topic = app.topic(t.metrics, key_serializer="raw", value_serializer="raw")
        self.deadletter_topic = app.topic(t.deadletter, key_serializer="raw", value_serializer="raw")
        stage1_log, stage2_log = changelog_topics(settings.app_id)
        self.stage1_log = app.topic(stage1_log, partitions=settings.partitions, key_serializer="raw",
                                    value_serializer="raw")
        self.stage2_log = app.topic(stage2_log, partitions=settings.partitions, key_serializer="raw",
                                    value_serializer="raw")
        self._restoring: dict[tuple[str, int], Any] = {}
        self._last_progress: dict[tuple[str, int], float] = {}
        self.processors: dict[int, PartitionProcessor] = {}
        self.mergers: dict[int, BatchMerger] = {}
        self.last_event_at: dict[int, float] = {}
        self.last_published: Any = None
        self.started_at = time.time()
        self.gap_fills = 0
        self.idle_catch_ups = 0
        self._end_offsets: Any = None  # a standalone consumer for log-end queries
        #: the tasks of ``tail_records`` and ``tail_partials`` and when each started
        self._tails: dict[str, tuple[Any, float]] = {}
        #: bumped on every revocation; work that awaited across one is discarded
        self.epoch = 0
        self.crash_points = CrashPoints.from_env()
        s = settings
        self.output = OrderedProducer(
            on_failed=self._on_failed, bootstrap_servers=s.broker, client_id=f"{s.app_id}-output", acks="all",
            linger_ms=0, max_batch_size=1_048_576, max_request_size=max(s.max_message_bytes, 1_048_576) * 2,
            # as Faust's producer: retry through a broker restart rather than fail the worker
            request_timeout_ms=1_200_000, **s.security.aiokafka_kwargs())
        self._output_starting: Any = None
        #: the first produce that failed after the producer's own retries: the worker
        #: stops on it (an output or state write must never be skipped)
        self.fatal: str | None = None

    # -- state per partition ------------------------------------------------------
    def _send(self, topic: Any, key: bytes, value: bytes | None, partition: int | None = None) -> None:
        """Produce through the shell's own ordered producer (``_output``): in order per
        partition, flushed before a partition is given up, at crash points and at
        shutdown; a failure stops the worker."""
        self.output.send(topic.get_topic_name(), key, value, partition)

    def _on_failed(self, topic: str, exc: BaseException) -> None:
        if self.fatal is not None:
            return
        import os
        import signal

        self.fatal = (f"producing to {topic} failed after the producer's retries "
                      f"({type(exc).__name__}: {shorten(str(exc), 200)}); the worker stops rather than skip an "
                      f"output. Operator action: check the broker (message.max.bytes, ACLs, disk) and restart; "
                      f"state and outputs are restored from the changelog")
        log.critical("%s", self.fatal)
        os.kill(os.getpid(), signal.SIGTERM)  # a graceful stop; run_worker exits non-zero

    async def flush_output(self) -> None:
        """Wait for every write sent so far (nothing to wait for before the producer started)."""
        if self.output.started or self.output.pending:
            await self._flush()

    async def _connect_output(self) -> None:
        with contextlib.suppress(Exception):  # logged by start_output; the next tick retries
            await self.start_output()

    async def start_output(self) -> None:
        """Connect the ordered producer (once; sends before it are queued)."""
        if self.output.started:
            return
        import asyncio

        if self._output_starting is None or (self._output_starting.done() and not self.output.started):
            self._output_starting = asyncio.ensure_future(self.output.start())  # (again, after a failed start)
        try:
            await asyncio.shield(self._output_starting)
        except Exception as exc:  # noqa: BLE001 - the next tick tries again
            log.warning("connecting the output producer failed (%r); retrying", exc)
            raise

    def _write(self, log_topic: Any, partition: int, key: bytes, value: bytes | None) -> None:
        """Append to a state changelog."""
        self._send(log_topic, key, value, partition)

    def _state_of(self, topic: str, partition: int) -> Any:
        """The restored stage state of a records or partials partition (None: not yet)."""
        states = self.processors if topic == self.settings.topics.records else self.mergers
        return states.get(partition)

    def _owned(self, epoch: int, topic: str, partition: int) -> bool:
        return epoch == self.epoch and partition in self._assigned(topic)

    def _ensure_restore(self, topic: str, partition: int) -> None:
        """Start restoring a partition's state in the background (once per epoch)."""
        import asyncio

        task = self._restoring.get((topic, partition))
        if task is not None and not task.done():
            return
        self._restoring[(topic, partition)] = asyncio.get_running_loop().create_task(
            self._restore(topic, partition, self.epoch), name=f"restore-{topic}-{partition}")

    async def _restore(self, topic: str, partition: int, epoch: int) -> None:
        """Read the partition's changelog, install its state, then seek the input to
        the checkpoint: whatever arrived meanwhile was dropped and is read again."""
        s = self.settings
        stage1 = topic == s.topics.records
        log_topic = self.stage1_log if stage1 else self.stage2_log
        try:
            entries = await read_changelog_partition(s.broker, log_topic.get_topic_name(), partition,
                                                     kafka=self._client_kwargs())
        except Exception as exc:  # noqa: BLE001 - retried by the next tick
            log.warning("restoring topic=%s partition=%d failed (%r): retrying", topic, partition, exc)
            return
        if not self._owned(epoch, topic, partition):
            return
        await self.crash_points.reached("restore")
        now = _now_ms()
        if stage1:
            state: Any = PartitionProcessor(partition, source_topic=s.topics.records,
                                            batch_timeout_ms=int(s.batch_timeout_s * 1000),
                                            grace_ms=int(s.grace_s * 1000), max_message_bytes=s.max_message_bytes,
                                            max_open_generations=s.max_open_generations,
                                            counters=self.counters)
            restored = state.restore(entries, now)
        else:
            state = BatchMerger(partition, partitions_expected=s.partitions,
                                batch_timeout_ms=int(s.batch_timeout_s * 1000), grace_ms=int(s.grace_s * 1000),
                                counters=self.counters)
            republish = state.restore(entries)
        if not self._owned(epoch, topic, partition):
            return
        if stage1:
            self.processors[partition] = state
            self._apply(restored, partition)
        else:
            self.mergers[partition] = state
            self.published.seed(republish, time.time())  # for /metrics: counted by whoever published them first
            for metrics in republish:  # identical repeats: a crash may have lost the original
                self._send(self.metrics_topic, metrics.batch_id.encode(), encode_metrics(metrics))
        # Catch up from the checkpoint to the log end ourselves: Faust's consumer may
        # have resumed anywhere (it commits past offsets it considers gaps).
        try:
            caught = await self._read_and_apply(topic, partition, state, None, epoch)
        except Exception as exc:  # noqa: BLE001 - the watchdog retries
            log.warning("catching up topic=%s partition=%d failed (%r)", topic, partition, exc)
            return
        if caught:
            log.info("topic=%s partition=%d caught up %d message(s) after the checkpoint", topic, partition, caught)

    async def _read_and_apply(self, topic: str, partition: int, state: Any, end: int | None, epoch: int,
                              chunk: int = 2000) -> int:
        """Read [checkpoint+1, end) of a partition directly and apply it, ``chunk``
        messages at a time (bounded memory); stops when the partition is not ours."""
        import asyncio

        done = 0
        stage1 = topic == self.settings.topics.records

        def still_ours() -> bool:
            return self._owned(epoch, topic, partition) and self._state_of(topic, partition) is state

        while True:
            start = state.checkpoint + 1
            messages, upto = await read_range(self.settings.broker, topic, partition, start, end,
                                              kafka=self._client_kwargs(), max_messages=chunk)
            if not still_ours():
                return done
            # applied a chunk at a time, yielding between chunks: the producer sends
            # each chunk's changelog while the next is processed
            step = self.settings.chunk_messages
            for i in range(0, len(messages), step):
                piece = messages[i:i + step]
                if stage1:
                    await self._run_stage1(state, partition, piece)
                else:
                    await self._run_stage2(state, partition, piece)
                done += len(piece)
                self._last_progress[(topic, partition)] = time.monotonic()
                await asyncio.sleep(0)
                if not still_ours():
                    return done
            self._last_progress[(topic, partition)] = time.monotonic()
            if end is None:
                end = upto if len(messages) < chunk else None
            if not messages or (end is not None and state.checkpoint + 1 >= end) or len(messages) < chunk:
                return done

    async def _run_stage1(self, processor: PartitionProcessor, partition: int,
                          messages: list[tuple[int, bytes]]) -> None:
        """Process admitted input and carry out the effects (delivered or read directly)."""
        effects = processor.process(messages, _now_ms())
        crash = self.crash_points
        await crash.reached("stage1-processed")
        self._apply_changelog(effects, partition)
        await crash.reached("stage1-changelog", self._flush)
        self._apply_outputs(effects)
        if effects.partials:
            await crash.reached("stage1-partials", self._flush)

    async def _run_stage2(self, merger: BatchMerger, partition: int, messages: list[tuple[int, bytes]]) -> None:
        effects = merger.process([(offset, decode_partial(value)) for offset, value in messages], _now_ms())
        await self.crash_points.reached("stage2-merged")
        self._apply_merge(effects, partition)
        if effects.published:
            await self.crash_points.reached("stage2-published", self._flush)

    async def _flush(self) -> None:
        await self.start_output()
        await self.output.flush()

    def _client_kwargs(self) -> dict[str, Any]:
        return self.settings.security.aiokafka_kwargs()

    def forget(self, topic_partitions: Any) -> None:
        """Drop in-memory state of revoked partitions; the next owner rebuilds it."""
        self.epoch += 1
        for tp in topic_partitions:
            task = self._restoring.pop((tp.topic, tp.partition), None)
            if task is not None:
                task.cancel()
            if tp.topic == self.settings.topics.records:
                self.processors.pop(tp.partition, None)
            elif tp.topic == self.settings.topics.partials:
                self.mergers.pop(tp.partition, None)

    # -- effects ------------------------------------------------------------------
    def _apply(self, effects: Effects, partition: int) -> None:
        self._apply_changelog(effects, partition)
        self._apply_outputs(effects)

    def _apply_changelog(self, effects: Effects, partition: int) -> None:
        for key, value in effects.changelog:
            self._write(self.stage1_log, partition, key, value)

    def _apply_outputs(self, effects: Effects) -> None:
        for partial in effects.partials:
            self._send(self.partials_topic, partial.batch_id.encode(), encode_partial(partial))
        for letter in effects.dead_letters:
            self._send(self.deadletter_topic, (letter.batch_id or "").encode(), encode_dead_letter(letter))
            log.warning("dead-lettered reason=%s partition=%s offset=%s batch=%s run=%s detail=%s", letter.reason,
                        letter.source_partition, letter.source_offset, shorten(letter.batch_id),
                        shorten(letter.run_id), shorten(letter.detail, 300))

    def _apply_merge(self, effects: MergeEffects, partition: int) -> None:
        for key, value in effects.changelog:
            self._write(self.stage2_log, partition, key, value)
        self._publish(effects)

    def _publish(self, effects: MergeEffects) -> None:
        for metrics in effects.published:
            self._send(self.metrics_topic, metrics.batch_id.encode(), encode_metrics(metrics))
            self.last_published = metrics
            if metrics.revision == 0:
                self.counters.observe_close_latency(max(0.0, time.time() - metrics.closed_at))
            self.published.observe(metrics, time.time())  # for /metrics
            m = metrics.metrics
            log.info("published batch=%s run=%s revision=%d reason=%s complete=%s records=%d accept_rate=%s "
                     "tokens_per_verify=%s", shorten(metrics.batch_id), shorten(metrics.run_id), metrics.revision, metrics.close_reason,
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

    async def _fill(self, topic: str, partition: int, checkpoint: int, messages: list[tuple[int, Any]],
                    epoch: int) -> list[tuple[int, Any]] | None:
        """The messages after ``checkpoint``, with whatever the consumer skipped read in
        directly; None when the partition stopped being ours meanwhile."""
        fresh = [m for m in messages if m[0] > checkpoint]
        if fresh and fresh[0][0] == checkpoint + 1 and all(
                b[0] == a[0] + 1 for a, b in zip(fresh, fresh[1:])):
            return fresh  # the usual case: contiguous
        if not fresh:
            return []
        self.gap_fills += 1
        state = self._state_of(topic, partition)
        read = await self._read_and_apply(topic, partition, state, fresh[-1][0] + 1, epoch)
        log.warning("partition=%d of %s skipped offsets after %d: read %d message(s) directly", partition, topic,
                    checkpoint, read)
        if not self._owned(epoch, topic, partition):
            return None
        return []  # everything up to the last delivered offset is applied now

    async def on_records(self, events: list) -> None:
        topic = self.settings.topics.records
        epoch = self.epoch
        for partition, messages in self._group(topic, events).items():
            processor = self.processors.get(partition)
            if processor is None:  # not restored yet: the restore's catch-up reads these
                self._ensure_restore(topic, partition)
                continue
            admitted = await self._fill(topic, partition, processor.checkpoint, messages, epoch)
            if admitted is None or self.processors.get(partition) is not processor:
                continue
            if admitted:
                self.last_event_at[partition] = time.time()
                self._last_progress[(topic, partition)] = time.monotonic()
                await self._run_stage1(processor, partition, admitted)

    async def on_partials(self, events: list) -> None:
        topic = self.settings.topics.partials
        epoch = self.epoch
        for partition, messages in self._group(topic, events).items():
            merger = self.mergers.get(partition)
            if merger is None:
                self._ensure_restore(topic, partition)
                continue
            admitted = await self._fill(topic, partition, merger.checkpoint, messages, epoch)
            if admitted is None or self.mergers.get(partition) is not merger:
                continue
            if admitted:
                self._last_progress[(topic, partition)] = time.monotonic()
                await self._run_stage2(merger, partition, admitted)

    async def catch_up_idle(self, idle_s: float = 1.0) -> None:
        """Progress that does not depend on Faust's delivery: for every owned partition
        whose log end is past its checkpoint while nothing arrived for ``idle_s``,
        read the rest directly (Faust can stall or skip after a rebalance)."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition

        app = self.app
        if app.consumer is None or app.rebalancing:
            return
        t = self.settings.topics
        owned = [(t.records, p, s) for p, s in self.processors.items() if p in self._assigned(t.records)]
        owned += [(t.partials, p, s) for p, s in self.mergers.items() if p in self._assigned(t.partials)]
        now = time.monotonic()
        owned = [(topic, p, state) for topic, p, state in owned
                 if now - self._last_progress.get((topic, p), 0.0) >= idle_s]
        if not owned:
            return
        if self._end_offsets is None:
            self._end_offsets = AIOKafkaConsumer(bootstrap_servers=self.settings.broker, group_id=None,
                                                 enable_auto_commit=False, **self._client_kwargs())
            await self._end_offsets.start()
        epoch = self.epoch
        ends = await self._end_offsets.end_offsets([TopicPartition(topic, p) for topic, p, _ in owned])
        for topic, partition, state in owned:
            end = ends.get(TopicPartition(topic, partition), 0)
            if end - 1 <= state.checkpoint:
                self._last_progress[(topic, partition)] = time.monotonic()
                continue
            read = await self._read_and_apply(topic, partition, state, end, epoch)
            if not self._owned(epoch, topic, partition):
                return
            self.idle_catch_ups += 1
            log.info("topic=%s partition=%d: nothing delivered for %.0fs, read %d message(s) directly",
                     topic, partition, idle_s, read)

    async def tail_partials(self) -> None:
        """Feed stage 2 from a consumer of its own, beside Faust's.

        Faust's one consumer serves both topics, and aiokafka sends no new fetch to a
        broker while fetched records younger than ``prefetch_backoff`` (100 ms) wait
        there: under load every partial queued behind the records topic, for up to
        100 ms per fetch. This consumer follows only the owned partials partitions,
        from each merger's checkpoint; whichever path delivers first applies, the
        other finds the offsets at or below the checkpoint and skips them.
        """
        import asyncio

        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition

        topic = self.settings.topics.partials
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.broker, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=self.settings.fetch_wait_ms, **self._client_kwargs())
        await consumer.start()
        following: dict[int, Any] = {}  # partition -> the merger its position was set for
        try:
            while True:
                app = self.app
                owned = {} if app.consumer is None or app.rebalancing else {
                    p: m for p, m in self.mergers.items() if p in self._assigned(topic)}
                if owned.keys() != following.keys() or any(following[p] is not m for p, m in owned.items()):
                    consumer.assign([TopicPartition(topic, p) for p in owned])
                    for p, merger in owned.items():
                        consumer.seek(TopicPartition(topic, p), merger.checkpoint + 1)
                    following = dict(owned)
                if not following:
                    await asyncio.sleep(0.1)
                    continue
                epoch = self.epoch
                fetched = await consumer.getmany(timeout_ms=200, max_records=500)
                for tp, messages in fetched.items():
                    merger = following.get(tp.partition)
                    if merger is None or self.mergers.get(tp.partition) is not merger or epoch != self.epoch:
                        continue
                    fresh = [(m.offset, m.value) for m in messages if m.offset > merger.checkpoint]
                    if not fresh:
                        continue
                    if fresh[0][0] != merger.checkpoint + 1:  # a gap: read from the checkpoint again
                        consumer.seek(tp, merger.checkpoint + 1)
                        continue
                    self._last_progress[(topic, tp.partition)] = time.monotonic()
                    await self._run_stage2(merger, tp.partition, fresh)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Faust's own delivery still feeds stage 2
            log.warning("partials tail stopped (%r); stage 2 is fed by Faust's consumer alone until restart", exc)
        finally:
            await consumer.stop()

    async def tail_records(self) -> None:
        """Feed stage 1 from a consumer of its own, beside Faust's: the main path under load.

        Faust's consumer fetches with ``fetch_max_wait_ms`` fixed at 1500 ms, and aiokafka
        sends a new fetch only for the partitions holding no untaken records while the
        others wait for that fetch to return: under sustained load a partition's next
        messages (a batch's marker among them) waited up to 1.5 s behind a fetch for
        quiet partitions, and Faust then handed them over a few messages at a time,
        each hand-over costing a changelog delta and a checkpoint. This consumer follows
        every owned, restored records partition from its checkpoint with a short fetch
        wait (``fetch_wait_ms``), takes everything fetched at once, and applies it in
        chunks of at most ``chunk_bytes`` per partition, round robin between partitions:
        a fetched marker waits behind at most one chunk of each partition, never behind
        a fetch. Whichever path delivers first applies; the other finds the offsets at
        or below the checkpoint and skips them (Faust's still acks and commits).
        """
        import asyncio

        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition

        s = self.settings
        topic = s.topics.records
        consumer = AIOKafkaConsumer(bootstrap_servers=s.broker, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=s.fetch_wait_ms,
                                    max_partition_fetch_bytes=max(s.chunk_bytes, 1_048_576), **self._client_kwargs())
        following: dict[int, PartitionProcessor] = {}  # partition -> the processor its position was set for
        try:
            await consumer.start()
            while True:
                owned = self._tail_owned(topic, self.processors)
                if owned.keys() != following.keys() or any(following[p] is not q for p, q in owned.items()):
                    consumer.assign([TopicPartition(topic, p) for p in owned])
                    for p, processor in owned.items():
                        consumer.seek(TopicPartition(topic, p), processor.checkpoint + 1)
                    following = dict(owned)
                if not following:
                    await asyncio.sleep(0.1)
                    continue
                epoch = self.epoch
                fetched = await consumer.getmany(timeout_ms=200)
                pending = {tp.partition: [(m.offset, m.value) for m in messages]
                           for tp, messages in fetched.items() if messages}
                while pending:
                    for partition in list(pending):
                        processor = following.get(partition)
                        if (processor is None or self.processors.get(partition) is not processor
                                or epoch != self.epoch or self.app.rebalancing):
                            del pending[partition]  # read again from the checkpoint once ours
                            continue
                        fresh = [m for m in pending.pop(partition) if m[0] > processor.checkpoint]
                        if not fresh:
                            continue
                        if fresh[0][0] != processor.checkpoint + 1:  # a gap: read from the checkpoint again
                            consumer.seek(TopicPartition(topic, partition), processor.checkpoint + 1)
                            continue
                        chunk, rest = _split_chunk(fresh, s.chunk_bytes)
                        if rest:
                            pending[partition] = rest
                        self.last_event_at[partition] = time.time()
                        self._last_progress[(topic, partition)] = time.monotonic()
                        await self._run_stage1(processor, partition, chunk)
                    await asyncio.sleep(0)  # stage 2 and the producer between rounds
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Faust's own delivery still feeds stage 1
            log.warning("records tail stopped (%r); stage 1 is fed by Faust's consumer alone until restart", exc)
        finally:
            await consumer.stop()

    def _tail_owned(self, topic: str, states: dict[int, Any]) -> dict[int, Any]:
        """The partitions a tail follows: owned, restored, not being caught up by their restore."""
        app = self.app
        if app.consumer is None or app.rebalancing:
            return {}
        assigned = self._assigned(topic)
        owned = {}
        for p, state in states.items():
            restoring = self._restoring.get((topic, p))
            if p in assigned and (restoring is None or restoring.done()):
                owned[p] = state
        return owned

    def start_tails(self) -> None:
        """Start the records and partials tails, or restart one at most every 5 s after
        it stopped on an error."""
        import asyncio

        for name, run in (("output", self._connect_output), ("records-tail", self.tail_records),
                          ("partials-tail", self.tail_partials)):
            task, started = self._tails.get(name, (None, 0.0))
            if task is not None and (not task.done() or time.monotonic() - started < 5.0):
                continue
            self._tails[name] = (asyncio.get_running_loop().create_task(run(), name=name), time.monotonic())

    async def close(self) -> None:
        """Stop what the shell owns besides Faust (restore tasks, the log-end consumer)."""
        for task, _ in self._tails.values():
            task.cancel()
        if self.output.started:
            await self.output.stop()
        for task in self._restoring.values():
            task.cancel()
        if self._end_offsets is not None:
            await self._end_offsets.stop()
            self._end_offsets = None

    def ready(self) -> bool:
        """Partitions assigned, not rebalancing, and the state of every owned partition restored."""
        app = self.app
        if app.consumer is None or app.rebalancing:
            return False
        t = self.settings.topics
        return self._assigned(t.records) <= set(self.processors) and self._assigned(t.partials) <= set(self.mergers)

    def steer_records_delivery(self) -> None:
        """Pause Faust's delivery of the records partitions while the records tail runs
        (one reader: on 2 cores a second fetch, decompression and Faust's per-message
        hand-over of the same input cost a fifth of the worker's CPU), and resume it
        when the tail has stopped. Faust resumes its partitions after every rebalance;
        this runs every tick."""
        consumer = self.app.consumer
        if consumer is None or self.app.rebalancing:
            return
        topic = self.settings.topics.records
        tps = {tp for tp in consumer.assignment() if tp.topic == topic}
        paused = getattr(consumer, "_paused_partitions", set())
        task, _ = self._tails.get("records-tail", (None, 0.0))
        if task is not None and not task.done():
            if tps - paused:
                consumer.pause_partitions(tps - paused)
        elif tps & paused:
            consumer.resume_partitions(tps & paused)

    async def commit_records(self) -> None:
        """Commit the records offsets stage 1 has applied (checkpoint + 1) for the consumer
        group, every ``commit_interval_s``: Faust commits only what it delivered, and while
        the records tail reads the input the group's lag (what operators watch) would
        otherwise never move. Recovery never reads these offsets (see ``_restore``)."""
        app = self.app
        consumer = app.consumer
        commit = getattr(consumer, "_commit", None)
        if consumer is None or commit is None or app.rebalancing:
            return
        from faust.types import TP

        topic = self.settings.topics.records
        assigned = self._assigned(topic)
        offsets = {TP(topic, p): q.checkpoint + 1 for p, q in self.processors.items()
                   if p in assigned and q.checkpoint >= 0}
        if offsets:
            await commit(offsets)

    def on_tick(self) -> None:
        app = self.app
        if app.consumer is None or app.rebalancing:
            return
        t = self.settings.topics
        self.steer_records_delivery()
        for partition in sorted(self._assigned(t.records)):
            processor = self.processors.get(partition)
            if processor is None:
                self._ensure_restore(t.records, partition)  # an idle partition is restored too
            else:
                self._apply(processor.tick(_now_ms()), partition)
        for partition in sorted(self._assigned(t.partials)):
            merger = self.mergers.get(partition)
            if merger is None:
                self._ensure_restore(t.partials, partition)
            else:
                self._apply_merge(merger.tick(_now_ms()), partition)
        _compact_closed(self.processors.values(), _now_ms())


def _compact_closed(processors: Any, now_ms: int, *, min_age_ms: int = 1_000, budget_s: float = 0.02) -> int:
    """Compact closed batches (``BatchState.compact``): in grace they hold a sixth of the
    memory and nothing for the garbage collector to walk; a late record thaws one.

    Here, on the tick, never in the chunk that closes a batch; only batches closed at
    least ``min_age_ms`` ago (their partials and publication are out), oldest first,
    and no more than ``budget_s`` of work per tick (one partition's batch of 6k
    generations takes ~15 ms): a marker never waits behind a whole batch's compaction.
    Returns how many were compacted."""
    waiting = sorted((batch.closed_at_ms, id(batch), batch) for processor in processors
                     for batch in processor.batches.values()
                     if batch.closed and not batch.state.compacted and now_ms - batch.closed_at_ms >= min_age_ms)
    started = time.perf_counter()
    done = 0
    for _, _, batch in waiting:
        if done and time.perf_counter() - started >= budget_s:
            break
        batch.state.compact()
        done += 1
    return done


def _split_chunk(messages: list[tuple[int, bytes]], max_bytes: int) -> tuple[list, list]:
    """The first messages up to ``max_bytes`` of values (at least one), and the rest."""
    size = 0
    for i, (_, value) in enumerate(messages):
        size += len(value)
        if size >= max_bytes:
            return messages[:i + 1], messages[i + 1:]
    return messages, []


def _table_manager() -> type:
    """Faust's table manager without its start-up pause.

    It sleeps 1 s before subscribing, for tables to register; specmeter keeps its
    state outside Faust tables and registers its agents before the worker starts,
    so the pause only delays the first rebalance (a tenth of a 1M-record run).
    """
    from faust.tables import TableManager

    class TablelessManager(TableManager):
        async def on_start(self) -> None:
            if not self.should_stop:
                await self._update_channels()
                await self.recovery.start()

    return TablelessManager


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
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
        broker_commit_interval=settings.commit_interval_s,
        producer_acks=-1,
        producer_max_request_size=max(settings.max_message_bytes, 1_048_576) * 2,
        # one batch per partition per request: at Faust's 16 KiB default every delta
        # went to the broker alone, one round trip each, with partials and
        # publications queued behind them
        producer_max_batch_size=1_048_576,
        consumer_max_fetch_size=max(settings.max_message_bytes, 4_194_304),
        web_enabled=settings.web_enabled,
        web_host=settings.web_host,
        web_port=settings.web_port,
        datadir=settings.data_dir,
        autodiscover=False,
        topic_allow_declare=False,  # ensure_topics creates only what is missing (no Create right needed)
        TableManager=_table_manager(),
        **faust_security_kwargs(settings.security),
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
        shell.start_tails()  # (re)started here: tasks of the running app's loop
        shell.on_tick()

    @app.timer(1.0)
    async def watchdog() -> None:
        try:
            await shell.catch_up_idle()
        except Exception as exc:  # noqa: BLE001 - retried next second
            log.warning("catch-up failed: %r", exc)

    @app.timer(settings.commit_interval_s)
    async def commit() -> None:
        try:
            await shell.commit_records()
        except Exception as exc:  # noqa: BLE001 - retried at the next interval
            log.warning("committing records offsets failed: %r", exc)

    @app.on_partitions_revoked.connect
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        shell.forget(revoked)
        await shell.flush_output()  # the next owner must find everything written for these partitions

    @app.on_before_shutdown.connect
    async def on_shutdown(app: Any, **kwargs: Any) -> None:
        await shell.close()

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json({"counters": shell.counters.as_dict(), "gap_fills": shell.gap_fills,
                          "open_generations": sum(p.open_generations for p in shell.processors.values()),
                          "partitions": sorted(shell.processors),
                          # for lag (log end - checkpoint - 1) and resource figures over time
                          "checkpoints": {str(p): s.checkpoint for p, s in sorted(shell.processors.items())},
                          "rss_bytes": _rss_bytes(), "cpu_seconds": time.process_time(),
                          "producer_pending": shell.output.pending})

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
