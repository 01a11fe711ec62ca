"""Reading the metrics topic from a trainer: each batch's newest BatchMetrics, once.

The metrics topic holds one message per (batch, revision), and may repeat one
(a worker republishes after a crash or rebalance). A trainer logging to wandb or
TensorBoard at ``step = batch`` wants each batch when it is published and a
correction when a later revision arrives, never the same thing twice:

* a batch is yielded when first seen; a later, **newer** revision is yielded again
  as an update; a repeat or an older revision is never yielded;
* with ``from_beginning``, the backlog already in the topic is folded first: each
  batch in it is yielded once, at its newest revision there, in the order the
  batches first appeared; then new messages follow the rule above;
* ``run_id`` keeps one training run's batches (two runs may share batch ids).

The worker keeps the topic compacted on ``(run_id, batch_id)``: whatever the time
retention, the backlog holds the newest revision of every batch of every run, so a
trainer that restarts gets its whole run back with ``from_beginning``.

The consumer joins no consumer group and commits nothing: any number of
trainers can read the same topic. ``consume_metrics_sync`` closes it when the loop
over it ends or breaks; ``consume_metrics`` when the iteration ends or the task
running it is cancelled. To leave the async one with ``break``, iterate inside
``async with contextlib.aclosing(consume_metrics(...)) as metrics:``: an abandoned
async generator is closed only when it is garbage-collected, which under
``asyncio.run`` comes after the loop has stopped running its cleanup.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterator
from operator import attrgetter
from types import EllipsisType
from typing import Any, TypeGuard

from specmeter.schemas import (
    METRICS_TOPIC,
    BatchMetrics,
    DraftLagMetrics,
    TaskMetrics,
    WeightVersionMetrics,
    decode_metrics,
)

from .topic_lookup import TopicNotFound, subscribe_existing

__all__ = ["consume_metrics", "consume_metrics_sync", "metrics_scalars", "DEFAULT_METRICS_TOPIC", "TopicNotFound"]

log = logging.getLogger("specmeter.consume")

_revision = attrgetter("revision")

DEFAULT_METRICS_TOPIC = METRICS_TOPIC


class _Newest:
    """The newest revision yielded per (run_id, batch_id), for at most ``remember`` batches
    (least recently published forgotten first: a revision of a forgotten batch is new again)."""

    def __init__(self, remember: int) -> None:
        self.remember = remember
        self.revisions: OrderedDict[tuple[str | None, str], int] = OrderedDict()

    def is_new(self, m: BatchMetrics) -> bool:
        key = (m.run_id, m.batch_id)
        known = self.revisions.get(key)
        if known is not None and m.revision <= known:
            return False
        self.revisions[key] = m.revision
        self.revisions.move_to_end(key)
        self._forget_oldest()
        return True

    def _forget_oldest(self) -> None:
        """Forget the least recently published batches beyond ``remember``."""
        while len(self.revisions) > self.remember:
            self.revisions.popitem(last=False)


def _missing_topic_fix(topic: str) -> Callable[[list[str], list[str]], str]:
    def fix(similar: list[str], of_role: list[str]) -> str:
        start = (
            f"start a worker (`specmeter worker --metrics-topic {topic}`) or pass the topic it publishes to (topic=...)"
        )
        if similar:
            return f"did you mean topic={similar[0]!r}? (similar: {', '.join(similar)}); else {start}"
        return start + (f"; metrics topics there: {', '.join(of_role)}" if of_role else "")

    return fix


def _decode(message: Any) -> BatchMetrics | None:
    try:
        return decode_metrics(message.value)
    except Exception as exc:  # noqa: BLE001 - a foreign message must not stop the trainer
        log.warning("skipped metrics message partition=%s offset=%s: %s", message.partition, message.offset, exc)
        return None


async def consume_metrics(
    bootstrap_servers: str,
    *,
    run_id: str | EllipsisType | None = ...,
    topic: str = DEFAULT_METRICS_TOPIC,
    from_beginning: bool = False,
    stop_at_end: bool = False,
    idle_timeout_s: float | None = None,
    topic_wait_s: float = 30.0,
    remember: int = 100_000,
    kafka: dict[str, Any] | None = None,
) -> AsyncGenerator[BatchMetrics, None]:
    """Each batch's newest BatchMetrics from the metrics topic, once (see the module).

    Args:
        bootstrap_servers: ``host:port[,host:port...]`` of the Kafka cluster.
        run_id: only this run's batches; ``None`` keeps the default run (batches whose
            records named no run); omitted, every run.
        topic: the worker's ``--metrics-topic``.
        from_beginning: fold and yield what the topic already holds first; otherwise
            start with what is published from now on.
        stop_at_end: stop once the messages present at the start have been read
            (with ``from_beginning``: after the backlog; otherwise at once).
        idle_timeout_s: stop after this long without a new message (None: never).
        topic_wait_s: how long to wait for the topic to exist before raising (a
            warning is logged when the wait begins); the topic is never created.
        remember: how many batches' newest revisions are remembered.
        kafka: extra ``AIOKafkaConsumer`` arguments, e.g. security settings
            (``KafkaSecurity.from_env().aiokafka_kwargs()``).

    Yields:
        BatchMetrics, a batch's first publication or a newer revision of it.

    Raises:
        TopicNotFound (a LookupError): the topic does not exist after ``topic_wait_s``;
            its message and ``similar`` name existing topics with a similar name.
    """
    consumer = await _started_consumer(bootstrap_servers, from_beginning, kafka)
    try:
        reader = _Reader(consumer, run_id, remember)
        await reader.subscribe(topic, bootstrap_servers, topic_wait_s, from_beginning)
        for m in await reader.backlog():
            yield m
        if stop_at_end:
            return
        async for m in reader.live(idle_timeout_s):
            yield m
    finally:
        await consumer.stop()


async def _started_consumer(bootstrap_servers: str, from_beginning: bool, kafka: dict[str, Any] | None) -> Any:
    """A started consumer of no group that commits nothing: any number of trainers read alike."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **(kafka or {}),
    )
    await consumer.start()
    return consumer


def _waiting(topic: str, bootstrap_servers: str, topic_wait_s: float) -> Callable[[list[str]], None]:
    """What is logged once when the topic is missing: why nothing comes yet."""

    def waiting(similar: list[str]) -> None:
        log.warning(
            "metrics topic %r does not exist at %s yet: waiting up to %.0fs for a worker to create it%s",
            topic,
            bootstrap_servers,
            topic_wait_s,
            f" (existing topics with a similar name: {', '.join(similar)})" if similar else "",
        )

    return waiting


class _Reader:
    """One reading of the metrics topic: the backlog up to the end offsets at the start,
    folded, then what is published from there on."""

    def __init__(self, consumer: Any, run_id: str | EllipsisType | None, remember: int) -> None:
        self.consumer = consumer
        self.run_id = run_id
        self.newest = _Newest(remember)
        self.partitions: list[Any] = []
        self.end: dict[Any, int] = {}

    async def subscribe(self, topic: str, bootstrap_servers: str, topic_wait_s: float, from_beginning: bool) -> None:
        """Subscribe once the topic exists, seek to where reading starts and note the end offsets."""
        self.partitions = await subscribe_existing(
            self.consumer,
            topic,
            bootstrap_servers,
            wait_s=topic_wait_s,
            fix=_missing_topic_fix(topic),
            on_wait=_waiting(topic, bootstrap_servers, topic_wait_s),
        )
        seek = self.consumer.seek_to_beginning if from_beginning else self.consumer.seek_to_end
        await seek(*self.partitions)
        self.end = await self.consumer.end_offsets(self.partitions)

    def wanted(self, m: BatchMetrics | None) -> TypeGuard[BatchMetrics]:
        """A message that decoded, of the run asked for."""
        return m is not None and (self.run_id is ... or m.run_id == self.run_id)

    async def backlog(self) -> list[BatchMetrics]:
        """What the topic held at the start, repeats and revisions folded: each batch once,
        at its newest revision there, in the order the batches first appeared."""
        folded: dict[tuple[str | None, str], BatchMetrics] = {}
        while await _behind(self.consumer, self.end):
            self._fold(folded, await self.consumer.getmany(timeout_ms=500))
            await self._rewind()
        return [m for m in folded.values() if self.newest.is_new(m)]

    def _fold(self, folded: dict[tuple[str | None, str], BatchMetrics], fetched: dict[Any, list[Any]]) -> None:
        """Fold the fetched messages published before the start into each batch's newest."""
        for tp, messages in fetched.items():
            for message in messages:
                if message.offset >= self.end[tp]:
                    continue  # published after the start: read again live
                m = _decode(message)
                if self.wanted(m):
                    _keep_newest(folded, m)

    async def _rewind(self) -> None:
        """Messages past the end offsets were fetched too: live reading starts at the end."""
        for tp in self.partitions:
            if await self.consumer.position(tp) > self.end[tp]:
                self.consumer.seek(tp, self.end[tp])

    async def live(self, idle_timeout_s: float | None) -> AsyncGenerator[BatchMetrics, None]:
        """What is published from the start on, each batch and each newer revision once,
        until ``idle_timeout_s`` passes without a message."""
        last_new = time.monotonic()
        while idle_timeout_s is None or time.monotonic() - last_new < idle_timeout_s:
            for messages in (await self.consumer.getmany(timeout_ms=250)).values():
                last_new = time.monotonic()
                for m in self._unseen(messages):
                    yield m

    def _unseen(self, messages: list[Any]) -> Iterator[BatchMetrics]:
        """The wanted messages not yielded before (a new batch or a newer revision)."""
        for message in messages:
            m = _decode(message)
            if self.wanted(m) and self.newest.is_new(m):
                yield m


def _keep_newest(folded: dict[tuple[str | None, str], BatchMetrics], m: BatchMetrics) -> None:
    """Keep ``m`` where it is its batch's first or a newer revision than the one kept."""
    key = (m.run_id, m.batch_id)
    folded[key] = max(folded.get(key, m), m, key=_revision)


async def _behind(consumer: Any, end: dict[Any, int]) -> bool:
    """Whether any partition's position is still before its end offset."""
    for tp, offset in end.items():
        if await consumer.position(tp) < offset:
            return True
    return False


def consume_metrics_sync(bootstrap_servers: str, **kwargs: Any) -> Iterator[BatchMetrics]:
    """``consume_metrics`` for synchronous code (a training loop, a logging thread).

    Runs its own event loop in the calling thread, so call it where no loop runs.
    Same arguments and semantics; the consumer is closed when the loop over it ends,
    on ``break`` or when the generator is closed (``contextlib.closing``).
    """
    loop = asyncio.new_event_loop()
    stream = consume_metrics(bootstrap_servers, **kwargs)
    try:
        while True:
            try:
                m = loop.run_until_complete(stream.__anext__())
            except StopAsyncIteration:
                return
            yield m
    finally:
        try:
            loop.run_until_complete(stream.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def metrics_scalars(m: BatchMetrics, prefix: str = "specmeter/") -> dict[str, float]:
    """A batch's numbers as flat scalars for a logger (wandb, TensorBoard):
    every ``metrics`` key (``spec/`` prefix dropped), the envelope counts, the
    acceptance by draft position as ``accept_rate_by_position/<k>`` (k = 1, 2, ...: the
    share of verify steps that accepted their k-th draft, docs/contract.md §3.3), the
    tokens per verify step with a budget of k draft tokens as
    ``tokens_per_verify_by_budget/<k>`` (§3.5), and each policy version's and each task's
    accept rate, tokens per verify, generation count and both curves under
    ``by_weight_version/<version>/`` and ``by_task/<task>/`` (``unknown`` for the null
    version or task); (revision 5) each draft lag's under ``by_draft_lag/<lag>/`` (the
    staleness curve), and the spread of tokens per verify step as
    ``tokens_per_verify_distribution/<b>``, the generations in quarter-token bucket b
    (§3.7)."""
    out = _envelope_scalars(m, prefix)
    out.update(_curves(m, prefix))
    out.update(_weight_version_scalars(m, prefix))
    out.update(_task_scalars(m, prefix))
    out.update(_draft_lag_scalars(m, prefix))
    out.update(_distribution_scalars(m, prefix))
    return out


def _envelope_scalars(m: BatchMetrics, prefix: str) -> dict[str, float]:
    """The batch's ``metrics`` (``spec/`` prefix dropped), its envelope counts and whether it is complete."""
    out = {prefix + key.removeprefix("spec/"): float(value) for key, value in m.metrics.items()}
    for name in ("record_count", "invalid_record_count", "missing_record_count", "late_record_count", "revision"):
        out[prefix + name] = float(getattr(m, name))
    out[prefix + "complete"] = float(m.complete)
    return out


def _weight_version_scalars(m: BatchMetrics, prefix: str) -> dict[str, float]:
    """Each policy version's scalars under ``by_weight_version/<version>/``."""
    out: dict[str, float] = {}
    for entry in m.by_weight_version or ():
        out.update(_entry_scalars(entry, f"{prefix}by_weight_version/{entry.weight_version or 'unknown'}/"))
    return out


def _task_scalars(m: BatchMetrics, prefix: str) -> dict[str, float]:
    """Each task's scalars under ``by_task/<task>/``."""
    out: dict[str, float] = {}
    for entry in m.by_task or ():
        out.update(_entry_scalars(entry, f"{prefix}by_task/{entry.task or 'unknown'}/"))
    return out


def _draft_lag_scalars(m: BatchMetrics, prefix: str) -> dict[str, float]:
    """Each draft lag's scalars under ``by_draft_lag/<lag>/``."""
    out: dict[str, float] = {}
    for entry in m.by_draft_lag or ():
        lag = "unknown" if entry.draft_lag is None else str(entry.draft_lag)
        out.update(_entry_scalars(entry, f"{prefix}by_draft_lag/{lag}/"))
    return out


def _distribution_scalars(m: BatchMetrics, prefix: str) -> dict[str, float]:
    """The spread of tokens per verify step: the generations in quarter-token bucket b (from 0)."""
    counts = m.tokens_per_verify_distribution or ()
    return {f"{prefix}tokens_per_verify_distribution/{b}": float(n) for b, n in enumerate(counts)}


def _entry_scalars(entry: WeightVersionMetrics | TaskMetrics | DraftLagMetrics, prefix: str) -> dict[str, float]:
    """One breakdown entry's scalars under ``prefix`` (a weight version's, a task's, a lag's)."""
    out = {
        f"{prefix}{key.removeprefix('spec/')}": float(entry.metrics[key])
        for key in ("spec/accept_rate", "spec/tokens_per_verify", "spec/unique_generation_count")
        if key in entry.metrics
    }
    return out | _curves(entry, prefix)


def _curves(m: BatchMetrics | WeightVersionMetrics | TaskMetrics | DraftLagMetrics, prefix: str) -> dict[str, float]:
    """A batch's or an entry's two per-position curves as ``<name>/<k>`` scalars."""
    return _positions(m.accept_rate_by_position, f"{prefix}accept_rate_by_position/") | _positions(
        m.tokens_per_verify_by_budget, f"{prefix}tokens_per_verify_by_budget/"
    )


def _positions(rates: list[float] | None, prefix: str) -> dict[str, float]:
    """``<prefix><k>`` for each draft position (or budget) k (1-based, as the engines number them)."""
    return {f"{prefix}{k}": float(rate) for k, rate in enumerate(rates or (), start=1)}
