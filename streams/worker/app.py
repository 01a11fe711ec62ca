"""The worker's shell: Faust's app, the stages' hooks, the timers and the web pages.

It decides nothing: it carries messages into ``PartitionProcessor`` (stage 1) and
``BatchMerger`` (stage 2) and carries out the effects they return. Which input a
stage applies, and when, is ``delivery.ledger``'s (the rules) and ``delivery.routes``' (the I/O:
one route per stage, each a member of its stage's consumer group). State lives in two
compacted changelog topics, written through the shell's own ordered producer
(``delivery.output``) as write groups whose outputs wait for their state (``delivery.writes``), and read
back when a worker takes a partition over (``core.ownership``).

Faust's part is narrow: the app's lifecycle (start, signals, stop), the timers and the
web server. It runs no Kafka client of its own: no consumer, no group, no producer, no
tables (``boot_strategy``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

from specmeter.producers import KafkaSecurity
from specmeter.schemas import (
    BatchMetrics,
    decode_partial,
    encode_dead_letter,
    encode_metrics,
    encode_metrics_key,
    encode_partial,
)

from ..core.counts import WorkerCounters
from ..core.formats import FormatRefused
from ..core.layout import changelog_topics
from ..core.ownership import ValidState
from ..core.stage1 import Effects, PartitionProcessor, shorten
from ..core.stage2 import BatchMerger, MergeEffects
from ..delivery.output import OrderedProducer
from ..delivery.routes import DeliveryDriver, Restored
from ..report.counters import PublishedTotals
from ..report.dead_letters import DeadLetterLog
from ..report.outages import Outages
from ..report.readiness import Readiness, decide
from ..report.status_page import RecentBatches, render_page
from ..report.waits import BatchWait, WaitReporter, merge_waits, stage1_waits
from ..settings import WorkerSettings
from .faults import CrashPoints, WriteFaults, write_kind

if TYPE_CHECKING:
    import faust

__all__ = ["build_app", "StreamShell", "listening_hosts", "web_address"]

log = logging.getLogger("specmeter.worker")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _exit_now(fatal: str) -> None:
    """End the process at once (a stop after a failed write that did not end in time)."""
    print(f"specmeter worker: {fatal}", file=sys.stderr, flush=True)
    os._exit(1)


def _stop_process(fatal: str, limit_s: float) -> None:
    """Stop this process after a fatal write: a stop that leaves the groups (the other
    workers take the partitions at once; run_worker exits non-zero), and should it not end
    within ``limit_s`` (a broker away), the process ends anyway."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = threading.Timer(limit_s, _exit_now, args=(fatal,))
    deadline.daemon = True  # a stop that ends in time is not held up by it
    deadline.start()


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

    #: after a write failed for good, the graceful stop's limit: the process then ends
    FATAL_STOP_S = 20.0

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        new_consumer: Callable[..., Any] | None = None,
        new_producer: Callable[..., Any] | None = None,
    ) -> None:
        self.settings = settings
        #: the wall clock of the stages (ms), and how a fatal write stops the process: the
        #: seams a simulation (``tests/support/delivery_sim.py``) gives each worker its own
        #: clock and its own stop through, as it gives its Kafka clients (the factories)
        self.now_ms: Callable[[], int] = _now_ms
        self.stop_process: Callable[[str, float], None] = _stop_process
        self.counters = WorkerCounters()
        self.published = PublishedTotals(  # for /metrics
            forget_after_s=settings.grace_s + settings.batch_timeout_s, max_tasks=settings.max_exported_tasks
        )
        t = settings.topics
        self.stage1_log, self.stage2_log = changelog_topics(settings.app_id)
        self.last_published: BatchMetrics | None = None
        #: the newest revision of the last batches published, for the status page (/specmeter/)
        self.recent = RecentBatches()
        self.started_at = time.time()
        #: brokers and the group coordinator the worker cannot reach now (fed by worker.py's log filter)
        self.outages = Outages()
        #: dead letters in the log: the first of a reason, then one line a minute per reason
        self.dead_letter_log = DeadLetterLog()
        self.crash_points = CrashPoints.from_env()
        self.write_faults = WriteFaults.from_env()
        self._records = t.records
        self._output_kinds = {t.partials: "partial", t.deadletter: "dead_letter", t.metrics: "metrics"}
        s = settings
        self.output = OrderedProducer(
            on_failed=self._on_failed,
            new_producer=new_producer,
            bootstrap_servers=s.broker,
            client_id=f"{s.app_id}-output",
            acks="all",
            # a refused write fails the writes after it in its partition too (their sequence
            # numbers no longer follow): none of them can land after a lost one; and a
            # retry never lands twice (``delivery.writes`` reads any offsets skipped)
            enable_idempotence=True,
            linger_ms=0,
            max_batch_size=1_048_576,
            max_request_size=max(s.max_message_bytes, 1_048_576) * 2,
            # retry through a broker restart; past it, the worker stops (fail fast)
            request_timeout_ms=int(s.delivery_timeout_s * 1000),
            **s.security.aiokafka_kwargs(),
        )
        #: what is read and applied, taken over, restored and caught up (the rules in ``delivery.ledger``)
        self.delivery = DeliveryDriver(settings, self, output=self.output, new_consumer=new_consumer)
        #: the changelog writes of owned partitions, and the outputs that wait for them
        self.writes = self.delivery.writes
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
        """Produce through the ordered producer (``delivery.output``): in order per partition,
        flushed before a partition is given up, at crash points and at shutdown; a
        failure stops the worker."""
        if self.write_faults.kind is not None:
            value = self.write_faults.apply(self._output_kinds.get(topic), value)
        self.output.send(topic, key, value, partition)

    def _send_metrics(self, metrics: BatchMetrics) -> None:
        """A BatchMetrics to the metrics topic, keyed by its batch's identity (compacted on it)."""
        key = encode_metrics_key(metrics.run_id, metrics.batch_id)
        self._send(self.settings.topics.metrics, key, encode_metrics(metrics))

    def _on_failed(self, topic: str, exc: BaseException) -> None:
        """The first write Kafka refused: the producer hands nothing more over (``delivery.output``),
        and the worker stops without flushing; its successor resumes from what is whole."""
        if self.fatal is not None:
            return
        self.fatal = (
            f"{topic}: {exc}"  # a refusal of the worker's own (a group format it cannot write) says why itself
            if isinstance(exc, FormatRefused)
            else f"producing to {topic} failed after the producer's retries "
            f"({type(exc).__name__}: {shorten(str(exc), 200)}); the worker stops, writing nothing more, "
            f"rather than skip an output or a state write. Operator action: check the broker "
            f"(message.max.bytes, ACLs, disk, an outage longer than --delivery-timeout) and restart; "
            f"state and outputs are restored from the changelog"
        )
        log.critical("%s", self.fatal)
        self.stop_process(self.fatal, self.FATAL_STOP_S)  # nothing is written meanwhile

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

    def restorer(
        self, topic: str, partition: int, valid: ValidState, epoch: int | None
    ) -> Generator[None, None, Restored]:
        """A partition's stage state restored from its changelog's valid entries, in steps,
        and what to write once it is installed: the stage's restore effects, then the
        deletion of what does not count (``core.ownership``), as one write group whose outputs
        (stage 1: partials again; stage 2: publications again) follow it."""
        if topic == self._records:
            return (yield from self._restore_stage1(partition, valid, epoch))
        return (yield from self._restore_stage2(partition, valid, epoch))

    def _restore_stage1(self, partition: int, valid: ValidState, epoch: int | None) -> Generator[None, None, Restored]:
        """A records partition's processor restored (``restorer``); once installed, its
        restore's write group (partials again after it)."""
        s = self.settings
        processor = PartitionProcessor(
            partition,
            source_topic=s.topics.records,
            batch_timeout_ms=int(s.batch_timeout_s * 1000),
            grace_ms=int(s.grace_s * 1000),
            max_message_bytes=s.max_message_bytes,
            max_open_generations=s.max_open_generations,
            counters=self.counters,
            expired_retention_ms=int(s.expired_retention_s * 1000),
            owner_epoch=epoch,
        )
        effects = yield from processor.restoring(valid.entries, self.now_ms())
        effects.changelog.extend(valid.pins)  # the takeovers it counted after, held where they landed
        effects.changelog.extend((key, None) for key in valid.deletions)
        return processor, lambda: self._submit_stage1(partition, effects, restore=True)

    def _restore_stage2(self, partition: int, valid: ValidState, epoch: int | None) -> Generator[None, None, Restored]:
        """A partials partition's merger restored (``restorer``); once installed, its
        publications seeded into /metrics and its restore's write group (publications again)."""
        s = self.settings
        merger = BatchMerger(
            partition,
            partitions_expected=s.partitions,
            batch_timeout_ms=int(s.batch_timeout_s * 1000),
            grace_ms=int(s.grace_s * 1000),
            counters=self.counters,
            owner_epoch=epoch,
        )
        restored = yield from merger.restoring(valid.entries)
        restored.changelog.extend(valid.pins)
        restored.changelog.extend((key, None) for key in valid.deletions)

        def installed() -> None:
            self.published.seed(restored.published, time.time())  # for /metrics: counted by their first publisher
            self._submit_stage2(partition, restored, repeat=True, restore=True)

        return merger, installed

    async def run(self, topic: str, state: Any, partition: int, messages: list[tuple[int, bytes]]) -> None:
        """Apply admitted input; then wait while the producer is too far behind (``delivery.output``)."""
        if topic == self._records:
            await self._run_stage1(state, partition, messages)
        else:
            await self._run_stage2(state, partition, messages)
        await self.output.room(self.settings.max_queued_output_bytes)

    async def _run_stage1(
        self, processor: PartitionProcessor, partition: int, messages: list[tuple[int, bytes]]
    ) -> None:
        effects = processor.process(messages, self.now_ms())
        await self.reached("stage1-processed")
        self._submit_stage1(partition, effects)

    async def _run_stage2(self, merger: BatchMerger, partition: int, messages: list[tuple[int, bytes]]) -> None:
        effects = merger.process([(offset, decode_partial(value)) for offset, value in messages], self.now_ms())
        await self.reached("stage2-merged")
        self._submit_stage2(partition, effects)

    # -- effects: a write group each (``delivery.writes``) --------------------------------------------
    def _submit_stage1(self, partition: int, effects: Effects, *, restore: bool = False) -> None:
        """Stage 1's write group: its changelog, then its partials and dead letters sent."""

        async def release() -> None:
            await self.reached("stage1-changelog")
            self._apply_outputs(effects)
            if effects.partials:
                await self.reached("stage1-partials")

        self._submit(self.stage1_log, partition, effects, release, restore)

    def _submit_stage2(
        self, partition: int, effects: MergeEffects, *, repeat: bool = False, restore: bool = False
    ) -> None:
        """Stage 2's write group: its changelog, then its metrics published."""

        async def release() -> None:
            self._publish(effects, repeat=repeat)
            if effects.published and not repeat:
                await self.reached("stage2-published")

        self._submit(self.stage2_log, partition, effects, release, restore)

    def _submit(
        self,
        topic: str,
        partition: int,
        effects: Effects | MergeEffects,
        release: Callable[[], Awaitable[None]],
        restore: bool,
    ) -> None:
        """One stage's write group, the same for both (a restore's: a barrier,
        ``OwnedWrites.submit``): the effects' changelog (armed where a test asked), their
        verified deletions, and ``release``: what the writes let out once durable."""
        self.writes.submit(
            topic, partition, self._armed(effects.changelog), release, effects.verified_deletions, barrier=restore
        )

    def _armed(self, writes: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
        """Changelog writes, one of them padded to be refused when a test armed it (``faults``)."""
        if self.write_faults.kind is None:
            return writes
        return [(key, self.write_faults.apply(write_kind(key), value)) for key, value in writes]

    def _apply_outputs(self, effects: Effects) -> None:
        t = self.settings.topics
        for partial in effects.partials:
            self._send(t.partials, partial.batch_id.encode(), encode_partial(partial))
        now = time.monotonic()
        for letter in effects.dead_letters:
            self._send(t.deadletter, (letter.batch_id or "").encode(), encode_dead_letter(letter))
            self.dead_letter_log.letter(letter, now)

    def _publish(self, effects: MergeEffects, *, repeat: bool = False) -> None:
        for metrics in effects.published:
            self._send_metrics(metrics)
            if not repeat:  # identical repeats after a takeover: a crash may have lost the original
                self._observe_published(metrics)

    def _observe_published(self, metrics: BatchMetrics) -> None:
        """A publication (not a repeat) counted where the worker shows it: the close
        latency (a first revision), /metrics, the status page, and one log line."""
        self.last_published = metrics
        if metrics.revision == 0:
            self.counters.observe_close_latency(max(0.0, time.time() - metrics.closed_at))
        self.published.observe(metrics, time.time())  # for /metrics
        self.recent.observe(metrics)
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
        """Tick the stages' timers (of caught-up partitions), compact closed batches; stop
        when a write has waited for Kafka past the delivery timeout."""
        if self._delivery_timed_out():
            return
        now_ms = self.now_ms()
        self._tick_timers(now_ms)
        _compact_closed(self.processors.values(), now_ms)
        self.dead_letter_log.tick(time.monotonic())
        self._log_waits(now_ms)

    def _delivery_timed_out(self) -> bool:
        """Fail the output when a write has waited for Kafka past the delivery timeout."""
        waited_s = self.output.unacked_for_s()
        if waited_s > self.settings.delivery_timeout_s:
            self.output.fail(
                "Kafka", TimeoutError(f"a write waited {waited_s:.0f} s for Kafka, past --delivery-timeout")
            )
            return True
        return False

    def _tick_timers(self, now_ms: int) -> None:
        """Tick each stage's timers, of the partitions whose timers run (caught up)."""
        self._tick_stage1(now_ms)
        self._tick_stage2(now_ms)

    def _tick_stage1(self, now_ms: int) -> None:
        """Stage 1's timers (batch timeouts, grace), of the records partitions caught up
        that have any running."""
        records = self.settings.topics.records
        for partition, processor in sorted(self.processors.items()):
            if processor.has_timers and self.delivery.ledger.timers_run(records, partition):
                self._submit_stage1(partition, processor.tick(now_ms))

    def _tick_stage2(self, now_ms: int) -> None:
        """Stage 2's timers (merge timeouts, grace), of the partials partitions caught up
        that hold a merge."""
        partials = self.settings.topics.partials
        for partition, merger in sorted(self.mergers.items()):
            if merger.entries and self.delivery.ledger.timers_run(partials, partition):
                self._submit_stage2(partition, merger.tick(now_ms))

    def _log_waits(self, now_ms: int) -> None:
        """The lines of the wait reporter, when it has any to say."""
        mergers = self.mergers.values()
        for line in self.wait_reporter.lines(
            self._stage1_waits(now_ms), (w for m in mergers for w in m.waiting(now_ms))
        ):
            log.info("%s", line)

    def _stage1_waits(self, now_ms: int) -> list[BatchWait]:
        return stage1_waits((p, processor.waiting(now_ms)) for p, processor in sorted(self.processors.items()))

    def waits(self) -> dict[str, list[dict[str, Any]]]:
        """What every open batch and merge of this worker waits for (``/specmeter/stats``)."""
        now_ms = self.now_ms()
        return {
            "batches": [b.as_dict() for b in self._stage1_waits(now_ms)],
            "merges": merge_waits(w for m in self.mergers.values() for w in m.waiting(now_ms)),
        }

    def delivery_stats(self) -> dict[str, Any]:
        d = self.delivery
        return {
            "restored": d.restored,
            "kept": d.kept,
            "longest_restore_step_ms": round(d.longest_restore_step_s * 1000, 1),
            "longest_stall_restoring_ms": round(d.longest_stall_restoring_s * 1000, 1),
            **self.writes.stats(),
        }

    def ready(self) -> bool:
        """The state of every partition the groups assigned restored."""
        return self.delivery.ledger.ready()

    def readiness(self) -> Readiness:
        """Whether this worker can do its work now (``report.readiness``): it serves its
        partitions and its writes go through, whatever one broker does."""
        return decide(
            serving=not self.delivery.rebalancing and self.ready(),
            write_stalled_s=self.output.stalled_s(time.monotonic()),
            write_timeout_s=self.settings.ready_write_timeout_s,
            no_broker_answers=self.outages.no_broker_answers(),
            unreachable=self.outages.unreachable,
        )

    async def close(self) -> None:
        """Stop what the shell owns besides Faust (the routes, the restorer, the producer)."""
        await self.delivery.close()
        log.info("left its consumer groups %s", ", ".join(self.settings.consumer_groups))
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
    waiting = _compactable(processors, now_ms, min_age_ms, min_generations)
    started = time.perf_counter()
    done = 0
    for _, _, batch in waiting:
        if done and time.perf_counter() - started >= budget_s:
            break
        batch.state.compact()
        done += 1
    return done


def _compactable(
    processors: Iterable[PartitionProcessor], now_ms: int, min_age_ms: int, min_generations: int
) -> list[tuple[int, int, Any]]:
    """The closed batches old and large enough to compact, not compacted yet, oldest first."""
    return sorted(
        (batch.closed_at_ms, id(batch), batch)
        for processor in processors
        for batch in processor.batches.values()
        if _worth_compacting(batch, now_ms, min_age_ms, min_generations)
    )


def _worth_compacting(batch: Any, now_ms: int, min_age_ms: int, min_generations: int) -> bool:
    """A batch closed ``min_age_ms`` ago or more (its partials and publication out),
    not compacted yet, holding ``min_generations`` or more (a small one saves too little)."""
    return (
        batch.closed
        and not batch.state.compacted
        and now_ms - batch.closed_at_ms >= min_age_ms
        and batch.state.generation_count >= min_generations
    )


def faust_security_kwargs(security: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for faust.App (``broker_credentials``) from the KAFKA_* security:
    kept with the app, so neither the settings nor the producer library imports Faust."""
    if security.protocol == "PLAINTEXT":
        return {}
    import faust

    ssl_context = security.ssl_context()
    if "SASL" in security.protocol:
        return {
            "broker_credentials": faust.SASLCredentials(
                username=security.username,
                password=security.password,
                mechanism=security.sasl_mechanism or "PLAIN",
                ssl_context=ssl_context,
            )
        }
    return {"broker_credentials": ssl_context}


def listening_hosts(port: int) -> list[str]:
    """The addresses this process accepts TCP connections on at ``port``, read from its own
    listening sockets, as ``ss -ltn`` shows them: what the settings say is not where a
    server listens (Faust bound every interface while the settings said 127.0.0.1, issue
    47.0). Empty where the process's descriptors cannot be listed (no /dev/fd)."""
    try:
        descriptors = os.listdir("/dev/fd")
    except OSError:
        return []
    hosts = (_listening_host(int(fd), port) for fd in descriptors if fd.isdigit())
    return sorted({host for host in hosts if host is not None})


def _listening_host(fd: int, port: int) -> str | None:
    """The host a listening TCP socket at ``fd`` is bound to at ``port``; None for any other
    descriptor (a file, a connection, another port, one closed meanwhile)."""
    import socket
    import stat

    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: the server's own stays open
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if not listening or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            host, bound_port = sock.getsockname()[:2]
    except OSError:
        return None
    return str(host) if bound_port == port else None


def web_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def boot_strategy() -> type:
    """Faust's services less every Kafka client of its own (consumer, producer, tables) and
    its sensors: the app's lifecycle, timers and web server are what the worker uses.
    Public API (``App.BootStrategy``, a documented customisation)."""
    from faust.app.base import BootStrategy

    class LifecycleTimersWeb(BootStrategy):
        enable_kafka_consumer = False
        enable_kafka_producer = False
        enable_sensors = False  # Faust's monitor counts what Faust delivers: nothing

    return LifecycleTimersWeb


def add_timer(
    app: Any,
    interval_s: float,
    tick: Callable[[], Awaitable[None]],
    name: str,
    *,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Run ``tick`` every ``interval_s`` while ``app`` runs (and ``on_started`` as it
    starts): a mode ``Service`` (what Faust's app is built on) added to the app, which
    starts it with itself. Its ticks follow the app's own timer (``app.itertimer``), as an
    ``@app.timer``'s do: they end as soon as the app begins to stop, before the shell
    closes (a child service is stopped only after its parent's ``on_stop``: a tick of its
    own would start the routes again behind the shell's close). Not ``@app.timer``
    itself: Faust registers each through venusian, which reads the caller's source; the
    first resolved the path of every module loaded (0.12 s of the worker's start-up)."""
    import mode

    class Periodic(mode.Service):
        #: mode's "Starting..." lines among mode's own (the worker shows them at debug only)
        logger = logging.getLogger("mode.specmeter")

        async def on_started(self) -> None:
            if on_started is not None:
                on_started()

        @mode.Service.task
        async def _ticks(self) -> None:
            async for _ in app.itertimer(interval_s, name=name):
                await tick()

    app.add_dependency(Periodic())


def build_app(settings: WorkerSettings, shell: StreamShell) -> Any:
    """A configured Faust app around ``shell``; nothing of it runs until a Worker starts it
    (the shell may run already: ``run.run_worker`` starts it while Faust is imported)."""
    app = _faust_app(settings)

    async def tick() -> None:
        shell.start()  # the routes and takeovers again, after an error: tasks of the running app's loop
        shell.on_tick()

    # the routes and takeovers start as the app starts, not at the first tick (tick_s later)
    add_timer(app, settings.tick_s, tick, "specmeter.tick", on_started=shell.start)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **kwargs: Any) -> None:
        await shell.close()

    if settings.web_enabled:  # off, nothing serves the pages: Faust's web (aiohttp's server) is never built
        _add_pages(app, shell, settings)
    return app


def _faust_app(settings: WorkerSettings) -> faust.App:
    """The Faust app of ``settings``: its brokers and security, its web server where it
    binds, none of Faust's own pages, tables or topic declarations; the worker's boot."""
    import faust

    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{b.strip()}" for b in settings.broker.split(",")],
        store="memory://",
        web_enabled=settings.web_enabled,
        web_host=settings.web_host,
        # the address the server binds: Faust's own default (web_bind) is every interface,
        # whatever web_host says (issue 47.0: it logged 127.0.0.1 and listened on 0.0.0.0)
        web_bind=settings.web_host or "0.0.0.0",
        # off, the port is never bound: 0 ("any free port") would fail Faust's range check
        web_port=settings.web_port if settings.web_enabled else WorkerSettings().web_port,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        datadir=settings.data_dir,
        autodiscover=False,
        topic_allow_declare=False,
        **faust_security_kwargs(settings.security),
    )
    app.boot_strategy = boot_strategy()(app)
    return app


def _stats(shell: StreamShell, settings: WorkerSettings) -> dict[str, Any]:
    """What ``/specmeter/stats`` answers: the shell's counters, partitions, waits,
    outages, readiness, delivery and the process's resources, as of now."""
    return {
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
        # rebalances: partitions restored from their changelog or kept, the longest a
        # restore held the event loop, skipped offsets checked and fencings
        "delivery": shell.delivery_stats(),
        # where the web server listens, read from its listening sockets (not the settings)
        "web_listening": [web_address(h, settings.web_port) for h in listening_hosts(settings.web_port)],
    }


def _add_pages(app: faust.App, shell: StreamShell, settings: WorkerSettings) -> None:
    """The worker's web pages on ``app``: its stats, /metrics, the status page (and its
    address without the slash), liveness and readiness."""

    @app.page("/specmeter/stats")
    async def stats(self: Any, request: Any) -> Any:
        return self.json(_stats(shell, settings))

    @app.page("/metrics")
    async def prometheus(self: Any, request: Any) -> Any:
        from ..report.prometheus import render

        return self.bytes(render(shell), content_type="text/plain; version=0.0.4")

    @app.page("/specmeter/")
    async def status_page(self: Any, request: Any) -> Any:
        """The recent batches drawn (``report.status_page``): a page to look at, no Grafana."""
        return self.html(render_page(shell.recent.batches(), worker=settings.app_id))

    @app.page("/specmeter")
    async def status_page_redirect(self: Any, request: Any) -> Any:
        """The page's address without its slash (issue 47.6: a 404): a permanent redirect to it."""
        return self.text("/specmeter/\n", status=301, headers={"Location": "/specmeter/"})

    @app.page("/specmeter/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        """Liveness: the web server answers while the event loop runs."""
        return self.json({"status": "alive"})

    @app.page("/specmeter/readyz")
    async def readyz(self: Any, request: Any) -> Any:
        """Readiness: it serves its partitions and can write (``report.readiness``); one broker
        away while the others serve is no reason to take the pod out."""
        readiness = shell.readiness()
        return self.json(readiness.as_dict(), status=200 if readiness.ready else 503)
