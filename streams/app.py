"""The Faust shell: topics, the stages' hooks, the agents, the timers and the web pages.

It decides nothing: it moves messages into ``PartitionProcessor`` (stage 1)
and ``BatchMerger`` (stage 2) and carries out the effects they return. State
lives in two compacted changelog topics written through the shell's own ordered
producer (``_output``) with explicit partitions (stage 1 writes one delta per
batch per chunk, never one write per record) and read back when a worker takes
a partition over; Faust's table recovery is not used (it can hang on rebalances).

Faust runs the consumer group (assignment, rebalances), the agents, the timers
and the web server. What of its delivery is applied is not Faust's to decide:
the rules (a durable checkpoint per stage and partition, contiguity, stale
generations, gap fills, restore and catch-up, idle catch-up) are the sans-IO
``_delivery.Ledger``'s, carried out by ``_reader.DeliveryDriver``, which also
runs each stage's own tail of its input (Faust's fetch wait, 1.5 s, and its
per-message hand-over put seconds between a marker and its batch's close) and
commits stage 1's offsets for the group's lag.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from specmeter.schemas import decode_partial, encode_dead_letter, encode_metrics, encode_partial

from ._changelog import changelog_topics
from ._counters import PublishedTotals, WorkerCounters
from ._faults import CrashPoints
from ._output import OrderedProducer
from ._reader import DeliveryDriver, split_chunk
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
        raw = {"key_serializer": "raw", "value_serializer": "raw"}  # bytes in, bytes out: msgspec decodes
        inputs = {"partitions": settings.partitions, "key_type": bytes, "value_type": bytes, **raw}
        self.records_topic = app.topic(t.records, **inputs)
        self.partials_topic = app.topic(t.partials, **inputs)
        self.metrics_topic = app.topic(t.metrics, **raw)
        self.deadletter_topic = app.topic(t.deadletter, **raw)
        stage1_log, stage2_log = changelog_topics(settings.app_id)
        self.stage1_log = app.topic(
            stage1_log, partitions=settings.partitions, key_serializer="raw", value_serializer="raw"
        )
        self.stage2_log = app.topic(
            stage2_log, partitions=settings.partitions, key_serializer="raw", value_serializer="raw"
        )
        self.last_published: Any = None
        self.started_at = time.time()
        self.crash_points = CrashPoints.from_env()
        #: what is read and applied, restored and caught up (the rules in ``_delivery``)
        self.delivery = DeliveryDriver(
            app,
            settings,
            run=self._run,
            build=self._build,
            changelog_of=self._changelog_of,
            crash_points=self.crash_points,
        )
        states = self.delivery.ledger.states
        #: partition -> the restored stage state of each owned partition
        self.processors: dict[int, PartitionProcessor] = states[t.records]
        self.mergers: dict[int, BatchMerger] = states[t.partials]
        s = settings
        self.output = OrderedProducer(
            on_failed=self._on_failed,
            bootstrap_servers=s.broker,
            client_id=f"{s.app_id}-output",
            acks="all",
            linger_ms=0,
            max_batch_size=1_048_576,
            max_request_size=max(s.max_message_bytes, 1_048_576) * 2,
            # as Faust's producer: retry through a broker restart rather than fail the worker
            request_timeout_ms=1_200_000,
            **s.security.aiokafka_kwargs(),
        )
        self._output_starting: Any = None
        #: the first produce that failed after the producer's own retries: the worker
        #: stops on it (an output or state write must never be skipped)
        self.fatal: str | None = None

    # for /metrics and /specmeter/stats
    @property
    def last_event_at(self) -> dict[int, float]:
        return self.delivery.last_event_at

    @property
    def gap_fills(self) -> int:
        return self.delivery.gap_fills

    @property
    def idle_catch_ups(self) -> int:
        return self.delivery.idle_catch_ups

    # -- the ordered producer ----------------------------------------------------------
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

        self.fatal = (
            f"producing to {topic} failed after the producer's retries "
            f"({type(exc).__name__}: {shorten(str(exc), 200)}); the worker stops rather than skip an "
            f"output. Operator action: check the broker (message.max.bytes, ACLs, disk) and restart; "
            f"state and outputs are restored from the changelog"
        )
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
        except Exception as exc:
            log.warning("connecting the output producer failed (%r); retrying", exc)
            raise

    async def _flush(self) -> None:
        await self.start_output()
        await self.output.flush()

    def _write(self, log_topic: Any, partition: int, key: bytes, value: bytes | None) -> None:
        """Append to a state changelog."""
        self._send(log_topic, key, value, partition)

    # -- the stages: restore and run (called by the delivery driver) -----------------------
    def _changelog_of(self, topic: str) -> str:
        log_topic = self.stage1_log if topic == self.settings.topics.records else self.stage2_log
        return log_topic.get_topic_name()

    def _build(self, topic: str, partition: int, entries: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
        """A partition's stage state restored from its changelog entries, and what to send
        once it is installed (stage 1: the restore's effects; stage 2: its publications again)."""
        s = self.settings
        if topic == s.topics.records:
            processor = PartitionProcessor(
                partition,
                source_topic=s.topics.records,
                batch_timeout_ms=int(s.batch_timeout_s * 1000),
                grace_ms=int(s.grace_s * 1000),
                max_message_bytes=s.max_message_bytes,
                max_open_generations=s.max_open_generations,
                counters=self.counters,
                expired_retention_ms=int(s.expired_retention_s * 1000),
            )
            restored = processor.restore(entries, _now_ms())
            return processor, lambda: self._apply(restored, partition)
        merger = BatchMerger(
            partition,
            partitions_expected=s.partitions,
            batch_timeout_ms=int(s.batch_timeout_s * 1000),
            grace_ms=int(s.grace_s * 1000),
            counters=self.counters,
        )
        republish = merger.restore(entries)

        def installed() -> None:
            self.published.seed(republish, time.time())  # for /metrics: counted by whoever published them first
            for metrics in republish:  # identical repeats: a crash may have lost the original
                self._send(self.metrics_topic, metrics.batch_id.encode(), encode_metrics(metrics))

        return merger, installed

    async def _run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, Any]]) -> None:
        if topic == self.settings.topics.records:
            await self._run_stage1(state, partition, messages)
        else:
            await self._run_stage2(state, partition, messages)
        await self.output.room(self.settings.max_queued_output_bytes)  # back-pressure (``_output``)

    async def _run_stage1(
        self, processor: PartitionProcessor, partition: int, messages: list[tuple[int, bytes]]
    ) -> None:
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
            log.warning(
                "dead-lettered reason=%s partition=%s offset=%s batch=%s run=%s detail=%s",
                letter.reason,
                letter.source_partition,
                letter.source_offset,
                shorten(letter.batch_id),
                shorten(letter.run_id),
                shorten(letter.detail, 300),
            )

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
            log.info(
                "published batch=%s run=%s revision=%d reason=%s complete=%s records=%d accept_rate=%s "
                "tokens_per_verify=%s",
                shorten(metrics.batch_id),
                shorten(metrics.run_id),
                metrics.revision,
                metrics.close_reason,
                metrics.complete,
                metrics.record_count,
                m.get("spec/accept_rate"),
                m.get("spec/tokens_per_verify"),
            )

    # -- the agents, timers and signals ---------------------------------------------------
    async def on_records(self, events: list) -> None:
        await self.delivery.on_delivered(self.settings.topics.records, events)

    async def on_partials(self, events: list) -> None:
        await self.delivery.on_delivered(self.settings.topics.partials, events)

    async def catch_up_idle(self, idle_s: float = 1.0) -> None:
        await self.delivery.catch_up_idle(idle_s)

    async def commit_records(self) -> None:
        await self.delivery.commit_records()

    def forget(self, topic_partitions: Any) -> None:
        """Drop in-memory state of revoked partitions; the next owner rebuilds it."""
        self.delivery.forget(topic_partitions)

    def start_tails(self) -> None:
        """Start (or restart after an error) the output producer's connection and the tails."""
        self.delivery.start_tails(also=(("output", self._connect_output),))

    def on_streams_resumed(self) -> None:
        """A rebalance ended (Faust resumed its partitions): start the tails, take the records
        partitions from Faust's delivery and restore what is assigned, now rather than at the
        next tick."""
        self.start_tails()
        self.delivery.steer_records_delivery(resumed=True)
        self.delivery.restore_assigned(self.delivery.membership())

    def on_tick(self) -> None:
        """Restore what is assigned without state, tick the stages, compact closed batches."""
        membership = self.delivery.membership()
        if not membership.settled:
            return
        t = self.settings.topics
        self.delivery.steer_records_delivery()
        self.delivery.restore_assigned(membership)  # an idle partition is restored too
        ledger = self.delivery.ledger
        for partition in sorted(membership.assigned.get(t.records, ())):
            processor = self.processors.get(partition)
            if processor is not None and ledger.timers_run(t.records, partition):
                self._apply(processor.tick(_now_ms()), partition)
        for partition in sorted(membership.assigned.get(t.partials, ())):
            merger = self.mergers.get(partition)
            if merger is not None and ledger.timers_run(t.partials, partition):
                self._apply_merge(merger.tick(_now_ms()), partition)
        _compact_closed(self.processors.values(), _now_ms())

    def ready(self) -> bool:
        """Partitions assigned, not rebalancing, and the state of every owned partition restored."""
        membership = self.delivery.membership()
        t = self.settings.topics
        return (
            membership.settled
            and not self.delivery.ledger.to_restore(t.records, membership)
            and not self.delivery.ledger.to_restore(t.partials, membership)
        )

    async def close(self) -> None:
        """Stop what the shell owns besides Faust (the tails, restores, direct reader, producer)."""
        await self.delivery.close()
        if self.output.started:
            await self.output.stop()


def _compact_closed(processors: Any, now_ms: int, *, min_age_ms: int = 1_000, budget_s: float = 0.02) -> int:
    """Compact closed batches (``BatchState.compact``): in grace they hold a sixth of the
    memory and nothing for the garbage collector to walk; a late record thaws one.

    Here, on the tick, never in the chunk that closes a batch; only batches closed at
    least ``min_age_ms`` ago (their partials and publication are out), oldest first,
    and no more than ``budget_s`` of work per tick (one partition's batch of 6k
    generations takes ~15 ms): a marker never waits behind a whole batch's compaction.
    Returns how many were compacted."""
    waiting = sorted(
        (batch.closed_at_ms, id(batch), batch)
        for processor in processors
        for batch in processor.batches.values()
        if batch.closed and not batch.state.compacted and now_ms - batch.closed_at_ms >= min_age_ms
    )
    started = time.perf_counter()
    done = 0
    for _, _, batch in waiting:
        if done and time.perf_counter() - started >= budget_s:
            break
        batch.state.compact()
        done += 1
    return done


#: for tests and callers of the old name
_split_chunk = split_chunk


#: the faust-streaming release ``TablelessManager`` is written against: its ``on_start`` is that
#: release's ``TableManager.on_start`` less the 1 s sleep, and calls the private ``_update_channels``
#: (no setting or public hook removes the sleep); tests/test_faust_pins.py fails when either changes
FAUST_TABLE_MANAGER_VERSION = "0.15.3"
#: what of ``TableManager`` the copy uses (checked when the app is built)
_TABLE_MANAGER_NEEDS = ("_update_channels", "recovery", "should_stop", "on_actives_ready")


def _check_table_manager(manager: type) -> None:
    """Fail at start-up, and say why, when Faust's ``TableManager`` lost what the copy calls."""
    missing = [name for name in _TABLE_MANAGER_NEEDS if not hasattr(manager, name)]
    if missing:
        import faust

        raise RuntimeError(
            f"faust-streaming {getattr(faust, '__version__', '?')}: TableManager has no {', '.join(missing)}; "
            f"specmeter's TablelessManager (streams/app.py) copies TableManager.on_start of faust-streaming "
            f"{FAUST_TABLE_MANAGER_VERSION} and must be updated for this release"
        )


def _table_manager(on_streams_resumed: Callable[[], None] | None = None) -> type:
    """Faust's table manager without its start-up pause, calling ``on_streams_resumed``
    when a rebalance has ended.

    It sleeps 1 s before subscribing, for tables to register; specmeter keeps its
    state outside Faust tables and registers its agents before the worker starts,
    so the pause only delays the first rebalance (a tenth of a 1M-record run).
    Pinned to ``FAUST_TABLE_MANAGER_VERSION``; checked by ``_check_table_manager``.
    """
    from faust.tables import TableManager

    _check_table_manager(TableManager)

    class TablelessManager(TableManager):
        async def on_start(self) -> None:
            if not self.should_stop:
                await self._update_channels()
                await self.recovery.start()

        def on_actives_ready(self) -> None:
            """Faust's recovery calls this right after it resumed the assigned partitions: the
            first moment the worker may restore them and take the records partitions back from
            Faust's delivery (the tick came up to ``tick_s`` later; meanwhile Faust's consumer
            fetched and decoded records only to have them dropped)."""
            super().on_actives_ready()
            if on_streams_resumed is not None:
                try:
                    on_streams_resumed()
                except Exception:  # inside Faust's recovery: never fail it; the next tick does the same
                    log.exception("starting the restores after a rebalance failed; the next tick retries")

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
        TableManager=_table_manager(on_streams_resumed=lambda: shell.on_streams_resumed()),
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

    # mode types a handler with NamedArg("BaseSignalT"), a forward reference mypy
    # cannot match against any function: the two handlers below are ignored for it alone
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        shell.forget(revoked)
        await shell.flush_output()  # the next owner must find everything written for these partitions

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **kwargs: Any) -> None:
        await shell.close()

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json(
            {
                "counters": shell.counters.as_dict(),
                "gap_fills": shell.gap_fills,
                "open_generations": sum(p.open_generations for p in shell.processors.values()),
                "partitions": sorted(shell.processors),
                # for lag (log end - checkpoint - 1) and resource figures over time
                "checkpoints": {str(p): s.checkpoint for p, s in sorted(shell.processors.items())},
                "rss_bytes": _rss_bytes(),
                "cpu_seconds": time.process_time(),
                "producer_pending": shell.output.pending,
            }
        )

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
