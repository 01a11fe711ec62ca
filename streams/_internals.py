"""Faust and aiokafka internals, in one room: every private member specmeter relies on.

The rest of the code uses only public API (ruff's SLF001 keeps it so); each use
here says why no public way exists, and ``tests/test_faust_pins.py`` fails when
the pinned release changes what it relies on. ``check_pins`` runs when the worker
starts, so a worker on another release stops with one line saying what to update
instead of misbehaving.

What Faust does for the worker, and what it no longer does:

* it runs the consumer group (membership, the assignor, rebalances) and tells the
  worker about assignments through its public ``on_partitions_assigned`` /
  ``on_partitions_revoked`` signals; the app's lifecycle, its timers and its web
  server;
* it never delivers the input, nor fetches it: its consumer stays subscribed to the
  records and partials topics (that is how the group assigns them) but every assigned
  partition of theirs is paused in it, and in the aiokafka consumer under it, right
  after Faust resumes them (``TablelessManager``, ``stop_fetching`` below); each stage
  reads its input through its own route (``_routes``);
* it commits nothing of the input (it commits only what it delivered and someone
  acked); the worker's checkpoints are committed through ``commit_offsets`` below,
  the one committer, for the group's lag;
* it writes nothing: its producer is not started (``boot_strategy``); every state
  write and output goes through the worker's ordered producer (``_output``);
* its tables, table recovery, agents and ``/router/`` and ``/table/`` pages are not used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "FAUST_PINNED",
    "AIOKAFKA_PINNED",
    "boot_strategy",
    "check_pins",
    "commit_offsets",
    "message_appender",
    "metadata_without_auto_create",
    "stop_fetching",
    "set_fetch_wait",
    "table_manager",
]

log = logging.getLogger("specmeter.worker")

#: the faust-streaming release whose internals are used below (pyproject bounds it to 0.15.x)
FAUST_PINNED = "0.15.3"
#: the aiokafka release whose internals are used below (pyproject bounds it to 0.14.x)
AIOKAFKA_PINNED = "0.14.0"

#: private members of Faust's ``TableManager`` that ``TablelessManager.on_start`` calls
_TABLE_MANAGER_NEEDS = ("_update_channels", "recovery", "should_stop", "on_actives_ready")


def check_pins(table_manager_class: type | None = None) -> None:
    """Fail at start-up, saying what to update, when the installed Faust or aiokafka
    lacks a private member used here."""
    import faust
    from aiokafka.admin import AIOKafkaAdminClient
    from faust.tables import TableManager
    from faust.transport.consumer import Consumer

    manager = table_manager_class or TableManager
    missing = [f"TableManager.{name}" for name in _TABLE_MANAGER_NEEDS if not hasattr(manager, name)]
    if table_manager_class is None:
        if not hasattr(Consumer, "_commit"):
            missing.append("Consumer._commit")
        if not hasattr(AIOKafkaAdminClient, "_send_request"):
            missing.append("AIOKafkaAdminClient._send_request")
        if "self._fetch_max_wait_ms" not in _fetcher_source():
            missing.append("Fetcher._fetch_max_wait_ms")
        missing += _producer_missing()
        from faust.transport.consumer import ThreadDelegateConsumer
        from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

        if "_thread" not in ThreadDelegateConsumer.__annotations__:
            missing.append("ThreadDelegateConsumer._thread")
        if not hasattr(AIOKafkaConsumerThread, "_ensure_consumer"):
            missing.append("AIOKafkaConsumerThread._ensure_consumer")
    if missing:
        raise RuntimeError(
            f"faust-streaming {getattr(faust, '__version__', '?')}: {', '.join(missing)} missing; "
            f"specmeter's streams/_internals.py is written against faust-streaming {FAUST_PINNED} and "
            f"aiokafka {AIOKAFKA_PINNED} and must be updated for this release"
        )


def table_manager(on_streams_resumed: Callable[[], None]) -> type:
    """Faust's table manager without its start-up pause, calling ``on_streams_resumed``
    right after every rebalance's ``Recovery._resume_streams`` resumed the partitions.

    Why private: ``TableManager.on_start`` sleeps 1 s for tables to register before
    subscribing (no setting removes it); specmeter has no Faust tables, so the copy
    calls the private ``_update_channels`` at once. And ``on_actives_ready`` is the one
    hook Faust calls after it resumed the assigned partitions (the order of the private
    ``Recovery._resume_streams``): the first moment their delivery can be paused for good.
    """
    from faust.tables import TableManager

    check_pins(TableManager)

    class TablelessManager(TableManager):
        logger = logging.getLogger("faust.tables")  # its start-up lines are Faust's, quiet like them

        async def on_start(self) -> None:
            if not self.should_stop:
                await self._update_channels()
                await self.recovery.start()

        def on_actives_ready(self) -> None:
            super().on_actives_ready()
            try:
                on_streams_resumed()
            except Exception:  # inside Faust's recovery: never fail it
                log.exception("after a rebalance: pausing Faust's delivery of the input failed")

    return TablelessManager


def boot_strategy() -> type:
    """Faust's services less its producer (the worker writes through its own, ``_output``)
    and its sensors.
    Public API (``App.BootStrategy``, a documented customisation); here beside the rest
    of what tells Faust what not to do."""
    from faust.app.base import BootStrategy

    class WithoutProducer(BootStrategy):
        enable_kafka_producer = False
        enable_sensors = False  # Faust's monitor counts what Faust delivers: nothing

    return WithoutProducer


async def commit_offsets(app: Any, offsets: Mapping[tuple[str, int], int]) -> bool:
    """Commit ``offsets`` ((topic, partition) -> next offset to read) for the worker's
    consumer group, through the group member Faust runs.

    Why private: Faust's public ``Consumer.commit`` commits what its own delivery
    handed out and was acked; the worker reads its input itself, so it passes its
    checkpoints to the ``_commit`` behind it. Nothing else commits these topics."""
    consumer = app.consumer
    if consumer is None or not offsets:
        return False
    from faust.types import TP

    tps = {TP(topic, partition): offset for (topic, partition), offset in offsets.items()}
    return bool(await consumer._commit(tps))


async def metadata_without_auto_create(admin: Any, names: Iterable[str]) -> dict[str, Any]:
    """The metadata response for the named topics, asked so that a missing one is not
    created (``auto.create.topics.enable`` would, with the broker's default partitions).

    Why private: aiokafka's ``describe_topics`` sends a MetadataRequest that allows
    auto-creation; the request is built here and sent through ``_send_request``."""
    from aiokafka.protocol.metadata import MetadataRequest

    response = await admin._send_request(MetadataRequest(sorted(set(names)), allow_auto_topic_creation=False))
    return dict(response.to_object())


def message_appender(producer: Any) -> Callable[[Any, bytes | None, bytes | None], Awaitable[asyncio.Future]]:
    """``add(tp, key, value)``: put a message in ``producer``'s batch for ``tp``, as its
    ``send`` does once it has chosen the partition; awaiting it waits only while that
    batch is full. Returns the message's delivery future.

    Why private: ``AIOKafkaProducer.send`` builds a set of every partition of the topic for
    each message (twice when it is told the partition, three times when it picks one), so
    a message cost more the more partitions its topic has: at 64, that was most of the
    cost of a small changelog write. The accumulator behind ``send`` takes the message as
    ``send`` hands it over; the ordered producer picks partitions with aiokafka's public
    partitioner from partition lists it keeps, and checks the size ``send`` checks."""
    accumulator = producer._message_accumulator
    timeout_s = producer._request_timeout_ms / 1000

    def add(tp: Any, key: bytes | None, value: bytes | None) -> Awaitable[asyncio.Future]:
        return accumulator.add_message(tp, key, value, timeout_s)

    return add


def _producer_missing() -> list[str]:
    import inspect

    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer

    source = inspect.getsource(AIOKafkaProducer.__init__)
    missing = [
        f"AIOKafkaProducer.{name}"
        for name in ("_message_accumulator", "_request_timeout_ms")
        if f"self.{name} = " not in source
    ]
    parameters = list(inspect.signature(MessageAccumulator.add_message).parameters)
    if parameters[:5] != ["self", "tp", "key", "value", "timeout"]:
        missing.append("MessageAccumulator.add_message(tp, key, value, timeout)")
    return missing


def _fetcher_source() -> str:
    import inspect

    from aiokafka.consumer.fetcher import Fetcher

    return inspect.getsource(Fetcher)


def set_fetch_wait(consumer: Any, wait_ms: int) -> None:
    """Let the broker hold this consumer's next fetches up to ``wait_ms`` when nothing is new.

    Why private: aiokafka takes ``fetch_max_wait_ms`` once, when the consumer starts, and
    its fetcher reads ``_fetch_max_wait_ms`` for every request. A route's short wait
    keeps a busy partition from waiting behind a fetch for quiet ones, but an idle
    worker then sends a fetch listing every partition 20 times a second per route: its
    CPU grew with its partitions. An idle route waits longer; data ends a wait at once."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_max_wait_ms = wait_ms


async def stop_fetching(app: Any, partitions: Iterable[Any]) -> None:
    """Pause ``partitions`` in the aiokafka consumer under Faust's, in its own thread.

    Why private: Faust's public ``pause_partitions`` only stops handing the partitions'
    messages over; the aiokafka consumer in Faust's consumer thread still fetches every
    assigned partition (one prefetch each, and a long-poll of all of them every 1.5 s)
    and resets their offsets, for input the worker reads through its own routes. The
    pause holds until the next assignment, which Faust follows by resuming partitions:
    the worker pauses again after each (``table_manager``'s hook)."""
    from aiokafka.structs import TopicPartition

    thread = app.consumer._thread
    wanted = [TopicPartition(tp.topic, tp.partition) for tp in partitions]

    async def pause() -> None:
        consumer = thread._ensure_consumer()
        assigned = consumer.assignment()
        consumer.pause(*[tp for tp in wanted if tp in assigned])

    if wanted:
        await thread.call_thread(pause)
