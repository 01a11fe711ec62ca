"""aiokafka's internals, in one room: every private member specmeter relies on.

The rest of the code uses only public API (ruff's SLF001 keeps it so); each use
here says why no public way exists, and ``tests/test_faust_pins.py`` fails when
the pinned release changes what it relies on. ``check_pins`` runs when the worker
starts, so a worker on another release stops with one line saying what to update
instead of misbehaving.

Faust runs no Kafka client of the worker's (``worker.app.boot_strategy``, public API):
every client is aiokafka's, in this folder: each stage's route is a member of its own
consumer group (``routes``) and every state write and output goes through the worker's
ordered producer (``output``). No private member of Faust is used, and nothing here
imports Faust: the release it was written against is pinned here beside aiokafka's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

__all__ = [
    "FAUST_PINNED",
    "AIOKAFKA_PINNED",
    "check_pins",
    "message_appender",
    "metadata_without_auto_create",
    "set_fetch_wait",
    "group_generation",
    "stop_without_sending",
    "delete_consumer_group",
]

log = logging.getLogger("specmeter.worker")

#: the faust-streaming release whose internals are used below (pyproject bounds it to 0.15.x)
FAUST_PINNED = "0.15.3"
#: the aiokafka release whose internals are used below (pyproject bounds it to 0.14.x)
AIOKAFKA_PINNED = "0.14.0"


def check_pins() -> None:
    """Fail at start-up, saying what to update, when the installed aiokafka lacks a
    private member used here."""
    from importlib.metadata import version

    missing = _client_missing() + _producer_missing()
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} missing; specmeter's streams/delivery/internals.py is written against "
            f"aiokafka {AIOKAFKA_PINNED} (and faust-streaming {FAUST_PINNED}, {version('faust-streaming')} "
            f"installed) and must be updated for this release"
        )


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


async def stop_without_sending(producer: Any) -> None:
    """Close an aiokafka producer without sending what it still holds.

    Why private: ``AIOKafkaProducer.stop`` first waits for its accumulator to drain (and an
    idempotent producer retries without end while Kafka is away); after a refused write
    the worker must send nothing more (``output``: fail fast). Its sender task, cancelled
    first (``Sender.close``), leaves ``stop`` nothing that could send: it closes the
    connections and marks the producer closed."""
    await producer._sender.close()
    await producer.stop()


async def delete_consumer_group(admin: Any, group: str) -> int:
    """Ask ``group``'s coordinator to delete it (the demo's ``--clean``); the error code of
    its answer: 0 deleted, 68 GROUP_NOT_EMPTY (its members are still leaving), 69
    GROUP_ID_NOT_FOUND.

    Why private: aiokafka has no call that deletes a consumer group; its own DeleteGroups
    request (``aiokafka.protocol.admin``) goes to the group's coordinator
    (``find_coordinator``, public) through ``_send_request_to_node``, as the admin
    client's own group calls send theirs."""
    from aiokafka.protocol.admin import DeleteGroupsRequest

    node = await admin.find_coordinator(group)
    response = await admin._send_request_to_node(node, DeleteGroupsRequest([group]))
    return int(dict(response.results).get(group, 0))


def _client_missing() -> list[str]:
    """The private members of the admin client and the fetcher used here that are missing."""
    from aiokafka.admin import AIOKafkaAdminClient

    missing = []
    missing += [
        f"AIOKafkaAdminClient.{name}"
        for name in ("_send_request", "_send_request_to_node")
        if not hasattr(AIOKafkaAdminClient, name)
    ]
    if "self._fetch_max_wait_ms" not in _fetcher_source():
        missing.append("Fetcher._fetch_max_wait_ms")
    return missing


def _producer_missing() -> list[str]:
    import inspect

    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer

    stored = _attributes_stored(AIOKafkaProducer.__init__)
    missing = [
        f"AIOKafkaProducer.{name}"
        for name in ("_message_accumulator", "_request_timeout_ms", "_sender")
        if name not in stored
    ]
    parameters = list(inspect.signature(MessageAccumulator.add_message).parameters)
    if parameters[:5] != ["self", "tp", "key", "value", "timeout"]:
        missing.append("MessageAccumulator.add_message(tp, key, value, timeout)")
    return missing


def _attributes_stored(function: Any) -> set[str]:
    """The attributes ``function`` assigns (``self.NAME = ...``), read from its bytecode: its
    source took ``inspect`` a tokenizer, 0.02-0.03 s of the worker's start."""
    import dis

    return {op.argval for op in dis.get_instructions(function) if op.opname == "STORE_ATTR"}


def _fetcher_source() -> str:
    """``self.NAME`` for each attribute the fetcher's ``__init__`` (which keeps the wait) and
    ``_get_actions_per_node`` (which reads it for every request) use, read from their
    bytecode: the class's source took ``inspect`` an ``ast.parse`` of its module and a walk of
    every imported module, 0.07-0.12 s of the worker's start."""
    from aiokafka.consumer.fetcher import Fetcher

    methods = (Fetcher.__init__, Fetcher._get_actions_per_node)
    return " ".join(f"self.{name}" for method in methods for name in method.__code__.co_names)


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


def group_member(consumer: Any) -> str:
    """The member id this consumer joined its group as ("": none known).

    Why private: aiokafka keeps it in its group coordinator with no public getter. A
    takeover record carries it beside the generation (``core.ownership.counts_after``):
    two takeovers of one generation number by different members come from two
    incarnations of the group."""
    member = getattr(getattr(consumer, "_coordinator", None), "member_id", "")
    return member if isinstance(member, str) else ""


def group_generation(consumer: Any) -> int:
    """The consumer group generation this member is in (-1: none known).

    Why private: aiokafka keeps the generation of the last join in its group coordinator
    and has no public getter. A takeover record carries it (``core.ownership``), so that a
    record appended late by a member that was stale when it wrote it fences nobody."""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", -1)
    return generation if isinstance(generation, int) and generation >= 0 else -1
