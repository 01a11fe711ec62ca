"""The worker's shell: Faust's app, the stages' hooks, the timers and the web pages.

It decides nothing: it carries messages into ``PartitionProcessor`` (stage 1) and
``BatchMerger`` (stage 2) and carries out the effects they return. Which input a
stage applies, and when, is ``_delivery``'s (the rules) and ``_routes``' (the I/O:
one route per stage). State lives in two compacted changelog topics, written through
the shell's own ordered producer (``_output``) and read back when a worker takes a
partition over.

Faust's part is narrow (``_internals`` says it in full): the consumer group and its
rebalances (reported through its public assignment signals), the app's lifecycle,
the timers and the web server. It delivers no input, commits none of it, writes
nothing, and its tables, agents and ``/router/``, ``/table/`` pages are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from specmeter.schemas import (
    BatchMetrics,
    decode_partial,
    encode_dead_letter,
    encode_metrics,
    encode_metrics_key,
    encode_partial,
)

from . import _internals
from ._counters import PublishedTotals, WorkerCounters
from ._dead_letters import DeadLetterLog
from ._faults import CrashPoints
from ._layout import changelog_topics
from ._outages import Outages
from ._output import OrderedProducer
from ._readiness import Readiness, decide
from ._routes import DeliveryDriver
from ._stage1 import Effects, PartitionProcessor, shorten
from ._stage2 import BatchMerger, MergeEffects
from ._waits import BatchWait, WaitReporter, merge_waits, stage1_waits
from .settings import WorkerSettings, faust_security_kwargs

__all__ = ["build_app", "StreamShell"]

log = logging.getLogger("specmeter.worker")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _rss_bytes() -> int | None:
    """This process's resident memory now (Linux), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class StreamShell:
    """The stages of one worker process, their state writes and outputs (the ``StageHooks``
    of the delivery driver)."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.counters = WorkerCounters()
        self.published = PublishedTotals(  # for /metrics
            forget_after_s=settings.grace_s + settings.batch_timeout_s, max_tasks=settings.max_exported_tasks
        )
        t = settings.topics
        self.stage1_log, self.stage2_log = changelog_topics(settings.app_id)
        self.last_published: BatchMetrics | None = None
        self.started_at = time.time()
        #: brokers and the group coordinator the worker cannot reach now (fed by worker.py's log filter)
        self.outages = Outages()
        #: dead letters in the log: the first of a reason, then one line a minute per reason
        self.dead_letter_log = DeadLetterLog()
        #: whether the group is rebalancing (Faust's app says; ``build_app`` tells it)
        self.rebalancing: Callable[[], bool] = lambda: False
        self.crash_points = CrashPoints.from_env()
        #: what is read and applied, restored and caught up (the rules in ``_delivery``)
        self.delivery = DeliveryDriver(settings, self)
        self._records = t.records
        s = settings
        self.output = OrderedProducer(
            on_failed=self._on_failed,
            bootstrap_servers=s.broker,
            client_id=f"{s.app_id}-output",
            acks="all",
            linger_ms=0,
            max_batch_size=1_048_576,
            max_request_size=max(s.max_message_bytes, 1_048_576) * 2,
            # retry through a broker restart rather than fail the worker
            request_timeout_ms=1_200_000,
            **s.security.aiokafka_kwargs(),
        )
        #: says once in the log what a batch (or a merge) waits for
        self.wait_reporter = WaitReporter(batch_timeout_ms=int(settings.batch_timeout_s * 1000))
        #: the first produce that failed after the producer's own retries: the worker
        #: stops on it (an output or state write must never be skipped)
        self.fatal: str | None = None

    # for /metrics and /specmeter/stats
    @property
    def processors(self) -> dict[int, PartitionProcessor]:
        """records partition -> its restored stage-1 state"""
        return self.delivery.ledger.following(self._records)

    @property
    def mergers(self) -> dict[int, BatchMerger]:
        """partials partition -> its restored stage-2 state"""
        return self.delivery.ledger.following(self.settings.topics.partials)

    @property
    def last_event_at(self) -> dict[int, float]:
        return self.delivery.last_event_at

    @property
    def input_offsets_missing(self) -> int:
        """offsets the input logs lacked after a checkpoint (retention, compaction)"""
        return self.delivery.ledger.gaps

    # -- the ordered producer ----------------------------------------------------------
    def _send(self, topic: str, key: bytes, value: bytes | None, partition: int | None = None) -> None:
        """Produce through the ordered producer (``_output``): in order per partition,
        flushed before a partition is given up, at crash points and at shutdown; a
        failure stops the worker."""
        self.output.send(topic, key, value, partition)

    def _send_metrics(self, metrics: BatchMetrics) -> None:
        """A BatchMetrics to the metrics topic, keyed by its batch's identity (compacted on it)."""
        key = encode_metrics_key(metrics.run_id, metrics.batch_id)
        self._send(self.settings.topics.metrics, key, encode_metrics(metrics))

    def _on_failed(self, topic: str, exc: BaseException) -> None:
        if self.fatal is not None:
            return
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
            await self.start_output()
            await self.output.flush()

    async def start_output(self) -> None:
        """Connect the ordered producer (sends before it are queued); retried by the
        next tick after a failure."""
        if self.output.started:
            return
        try:
            await self.output.start()
        except Exception as exc:
            log.warning("connecting the output producer failed (%r); retrying", exc)
            raise

    # -- the stages: restore and run (the delivery driver's hooks) ---------------------------
    def changelog_of(self, topic: str) -> str:
        return self.stage1_log if topic == self._records else self.stage2_log

    async def reached(self, point: str) -> None:
        await self.crash_points.reached(point, self.flush_output)

    def build(
        self, topic: str, partition: int, entries: list[tuple[bytes, bytes]]
    ) -> tuple[PartitionProcessor | BatchMerger, Callable[[], None]]:
        """A partition's stage state restored from its changelog entries, and what to send
        once it is installed (stage 1: the restore's effects; stage 2: its publications again)."""
        s = self.settings
        if topic == self._records:
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
            effects = processor.restore(entries, _now_ms())
            return processor, lambda: self._apply(effects, partition)
        merger = BatchMerger(
            partition,
            partitions_expected=s.partitions,
            batch_timeout_ms=int(s.batch_timeout_s * 1000),
            grace_ms=int(s.grace_s * 1000),
            counters=self.counters,
        )
        restored = merger.restore(entries)

        def installed() -> None:
            for key, value in restored.changelog:
                self._send(self.stage2_log, key, value, partition)
            self.published.seed(restored.published, time.time())  # for /metrics: counted by their first publisher
            for metrics in restored.published:  # identical repeats: a crash may have lost the original
                self._send_metrics(metrics)

        return merger, installed

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, bytes]]) -> None:
        """Apply admitted input; then wait while the producer is too far behind (``_output``)."""
        if topic == self._records:
            await self._run_stage1(state, partition, messages)
        else:
            await self._run_stage2(state, partition, messages)
        await self.output.room(self.settings.max_queued_output_bytes)

    async def _run_stage1(
        self, processor: PartitionProcessor, partition: int, messages: list[tuple[int, bytes]]
    ) -> None:
        effects = processor.process(messages, _now_ms())
        await self.reached("stage1-processed")
        self._apply_changelog(effects, partition)
        await self.reached("stage1-changelog")
        self._apply_outputs(effects)
        if effects.partials:
            await self.reached("stage1-partials")

    async def _run_stage2(self, merger: BatchMerger, partition: int, messages: list[tuple[int, bytes]]) -> None:
        effects = merger.process([(offset, decode_partial(value)) for offset, value in messages], _now_ms())
        await self.reached("stage2-merged")
        self._apply_merge(effects, partition)
        if effects.published:
            await self.reached("stage2-published")

    # -- effects ------------------------------------------------------------------
    def _apply(self, effects: Effects, partition: int) -> None:
        self._apply_changelog(effects, partition)
        self._apply_outputs(effects)

    def _apply_changelog(self, effects: Effects, partition: int) -> None:
        for key, value in effects.changelog:
            self._send(self.stage1_log, key, value, partition)

    def _apply_outputs(self, effects: Effects) -> None:
        t = self.settings.topics
        for partial in effects.partials:
            self._send(t.partials, partial.batch_id.encode(), encode_partial(partial))
        now = time.monotonic()
        for letter in effects.dead_letters:
            self._send(t.deadletter, (letter.batch_id or "").encode(), encode_dead_letter(letter))
            self.dead_letter_log.letter(letter, now)

    def _apply_merge(self, effects: MergeEffects, partition: int) -> None:
        for key, value in effects.changelog:
            self._send(self.stage2_log, key, value, partition)
        self._publish(effects)

    def _publish(self, effects: MergeEffects) -> None:
        for metrics in effects.published:
            self._send_metrics(metrics)
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

    # -- timers and signals --------------------------------------------------------------
    def start(self) -> None:
        """Start (or start again after an error) the output producer's connection, the
        routes and the restorer."""
        self.delivery.start(also=(("output", self._connect_output),))

    async def _connect_output(self) -> None:
        with contextlib.suppress(Exception):  # logged by start_output; the next tick retries
            await self.start_output()

    def on_tick(self) -> None:
        """Tick the stages' timers (of caught-up partitions), compact closed batches."""
        t = self.settings.topics
        ledger = self.delivery.ledger
        now_ms = _now_ms()
        processors = self.processors
        for partition, processor in sorted(processors.items()):
            if processor.has_timers and ledger.timers_run(t.records, partition):
                self._apply(processor.tick(now_ms), partition)
        for partition, merger in sorted(self.mergers.items()):
            if merger.entries and ledger.timers_run(t.partials, partition):
                self._apply_merge(merger.tick(now_ms), partition)
        _compact_closed(processors.values(), now_ms)
        self.dead_letter_log.tick(time.monotonic())
        mergers = self.mergers.values()
        for line in self.wait_reporter.lines(
            self._stage1_waits(now_ms), (w for m in mergers for w in m.waiting(now_ms))
        ):
            log.info("%s", line)

    def _stage1_waits(self, now_ms: int) -> list[BatchWait]:
        return stage1_waits((p, processor.waiting(now_ms)) for p, processor in sorted(self.processors.items()))

    def waits(self) -> dict[str, list[dict[str, Any]]]:
        """What every open batch and merge of this worker waits for (``/specmeter/stats``)."""
        now_ms = _now_ms()
        return {
            "batches": [b.as_dict() for b in self._stage1_waits(now_ms)],
            "merges": merge_waits(w for m in self.mergers.values() for w in m.waiting(now_ms)),
        }

    def ready(self) -> bool:
        """The state of every owned partition restored."""
        return self.delivery.ledger.ready()

    def readiness(self) -> Readiness:
        """Whether this worker can do its work now (``_readiness``): it serves its
        partitions and its writes go through, whatever one broker does."""
        return decide(
            serving=not self.rebalancing() and self.ready(),
            write_stalled_s=self.output.stalled_s(time.monotonic()),
            write_timeout_s=self.settings.ready_write_timeout_s,
            no_broker_answers=self.outages.no_broker_answers(),
            unreachable=self.outages.unreachable,
        )

    async def close(self) -> None:
        """Stop what the shell owns besides Faust (the routes, the restorer, the producer)."""
        await self.delivery.close()
        if self.output.started:
            await self.output.stop()
        self.dead_letter_log.flush(time.monotonic())


#: a closed batch smaller than this (on one partition) is not compacted: it holds little,
#: and compacting thousands of them (many partitions, small batches) cost more than it saved
COMPACT_MIN_GENERATIONS = 512


def _compact_closed(
    processors: Iterable[PartitionProcessor],
    now_ms: int,
    *,
    min_age_ms: int = 1_000,
    budget_s: float = 0.02,
    min_generations: int = COMPACT_MIN_GENERATIONS,
) -> int:
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
        if batch.closed
        and not batch.state.compacted
        and now_ms - batch.closed_at_ms >= min_age_ms
        and batch.state.generation_count >= min_generations
    )
    started = time.perf_counter()
    done = 0
    for _, _, batch in waiting:
        if done and time.perf_counter() - started >= budget_s:
            break
        batch.state.compact()
        done += 1
    return done


#: for Faust's checks of a delivery it does not do: once a day at most, and never a warning
_FAUST_NEVER_S = 86_400.0


def _log_failure(what: str) -> Callable[[asyncio.Future], None]:
    def done(future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("%s failed: %r", what, future.exception())

    return done


def _input_partitions(app: Any, topics: tuple[str, ...]) -> set[Any]:
    consumer = app.consumer
    return {tp for tp in consumer.assignment() if tp.topic in topics} if consumer is not None else set()


def build_app(settings: WorkerSettings) -> tuple[Any, StreamShell]:
    """A configured Faust app and its shell; nothing runs until a Worker starts it."""
    import faust

    _internals.check_pins()
    shell = StreamShell(settings)
    t = settings.topics
    inputs = (t.records, t.partials)

    def keep_delivery_off() -> None:
        """Right after Faust resumed the assigned partitions: pause its delivery (and its
        aiokafka consumer's fetching) of the inputs again (the routes read them) and start
        the routes."""
        partitions = _input_partitions(app, inputs)
        app.consumer.pause_partitions(partitions)
        shell.start()
        task = asyncio.get_running_loop().create_task(_internals.stop_fetching(app, partitions))
        task.add_done_callback(_log_failure("pausing Faust's fetching of the input"))

    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{b.strip()}" for b in settings.broker.split(",")],
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 4),
        # Faust commits nothing of the input (``_internals.commit_offsets`` does, on its own
        # timer) and processes none of it: its commit loop, and the livelock check that walks
        # every assigned partition at 2.5 times its interval (and would report its paused
        # partitions as "not processing", or trip over a partition whose offset aiokafka is
        # resetting), have nothing to do
        broker_commit_interval=_FAUST_NEVER_S,
        broker_commit_livelock_soft_timeout=_FAUST_NEVER_S,
        stream_processing_timeout=_FAUST_NEVER_S,
        # Faust's consumer never hands the input over (its partitions stay paused), but
        # aiokafka under it prefetches one fetch per partition when they are resumed: keep it small
        consumer_max_fetch_size=65_536,
        web_enabled=settings.web_enabled,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        datadir=settings.data_dir,
        autodiscover=False,
        topic_allow_declare=False,  # ensure_topics creates only what is missing (no Create right needed)
        TableManager=_internals.table_manager(on_streams_resumed=keep_delivery_off),
        **faust_security_kwargs(settings.security),
    )
    app.boot_strategy = _internals.boot_strategy()(app)
    shell.rebalancing = lambda: bool(app.rebalancing)
    # the group assigns the topics its consumer subscribes to: the stages' inputs, read by the routes
    for name in inputs:
        app.topics.add(app.topic(name, partitions=settings.partitions, key_type=bytes, value_type=bytes))

    @app.timer(settings.tick_s)
    async def tick() -> None:
        shell.start()  # (again, after an error) tasks of the running app's loop
        shell.on_tick()

    @app.timer(settings.commit_interval_s)
    async def commit() -> None:
        offsets = shell.delivery.ledger.commit_offsets()
        if app.rebalancing or not offsets:
            return
        try:
            await _internals.commit_offsets(app, offsets)
        except Exception as exc:  # noqa: BLE001 - retried at the next interval
            log.warning("committing the input offsets failed: %r", exc)

    # mode types a handler with NamedArg("BaseSignalT"), a forward reference mypy
    # cannot match against any function: the two handlers below are ignored for it alone
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(app: Any, revoked: Any, **kwargs: Any) -> None:
        shell.delivery.revoke((tp.topic, tp.partition) for tp in revoked)
        await shell.flush_output()  # the next owner must find everything written for these partitions

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(app: Any, assigned: Any, **kwargs: Any) -> None:
        shell.delivery.assign((tp.topic, tp.partition) for tp in assigned)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **kwargs: Any) -> None:
        await shell.close()

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json(
            {
                "counters": shell.counters.as_dict(),
                "input_offsets_missing": shell.input_offsets_missing,
                "open_generations": sum(p.open_generations for p in shell.processors.values()),
                "partitions": sorted(shell.processors),
                # for lag (log end - checkpoint - 1) and resource figures over time
                "checkpoints": {str(p): s.checkpoint for p, s in sorted(shell.processors.items())},
                "rss_bytes": _rss_bytes(),
                "cpu_seconds": time.process_time(),
                "producer_pending": shell.output.pending,
                # open batches and merges, each with what it waits for
                "waiting": shell.waits(),
                "outages": shell.outages.as_dict(),
                # what /specmeter/readyz answers, and how long writes have waited unacknowledged
                "readiness": shell.readiness().as_dict(),
                "output_stalled_s": round(shell.output.stalled_s(time.monotonic()), 1),
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
        """Readiness: it serves its partitions and can write (``_readiness``); one broker
        away while the others serve is no reason to take the pod out."""
        readiness = shell.readiness()
        return self.json(readiness.as_dict(), status=200 if readiness.ready else 503)

    return app, shell
