"""Readers never create a topic: they look it up first and say which ones exist.

aiokafka asks for a subscribed topic's metadata with auto-creation on, so a reader
subscribed to a mistyped name creates that topic, with the broker's default
partition count, wherever ``auto.create.topics.enable`` is true (Kafka's default).
``tail``, ``consume_metrics`` and the examples therefore look the name up in the
cluster's topic list first (a metadata request for every topic creates none) and
subscribe only to a topic that exists. What is left: a topic deleted while a reader
follows it is asked for again by aiokafka's periodic refresh, which may create it.
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import SpecmeterError

__all__ = ["TopicNotFound", "similar_topics", "subscribe_existing", "topics_of_role"]


def similar_topics(topic: str, existing: Iterable[str], limit: int = 3) -> list[str]:
    """Topics a person may have meant: the existing names closest to ``topic``."""
    return difflib.get_close_matches(topic, sorted(_named_by_people(existing)), n=limit, cutoff=0.6)


def topics_of_role(existing: Iterable[str], role: str = "metrics", limit: int = 3) -> list[str]:
    """Existing topics named like one of this role (``specmeter.metrics``, ``demo-ab12.metrics``)."""
    return sorted(t for t in _named_by_people(existing) if t.endswith(role))[:limit]


def _named_by_people(existing: Iterable[str]) -> list[str]:
    """The topics a person may name: Kafka's internal ones (``__consumer_offsets``, ``_schemas``) left out."""
    return [t for t in existing if not t.startswith("_")]


class TopicNotFound(SpecmeterError, LookupError):
    """The topic a reader was given does not exist; nothing was created.

    ``similar``: existing topics with a name like it; ``of_role``: other existing
    topics named like one of its ``role`` (metrics, records; either may be empty)."""

    def __init__(
        self,
        topic: str,
        broker: str,
        existing: Iterable[str],
        waited_s: float,
        fix: Callable[..., str],
        role: str = "metrics",
    ) -> None:
        names = set(existing)
        self.topic, self.broker, self.waited_s, self.role = topic, broker, waited_s, role
        self.similar = similar_topics(topic, names)
        self.of_role = [t for t in topics_of_role(names, role) if t not in self.similar]
        waited = f" after {waited_s:.0f}s" if waited_s >= 1 else ""
        super().__init__(
            f"topic {topic!r} does not exist at {broker}{waited} (a reader never creates it): "
            f"{fix(self.similar, self.of_role)}"
        )


async def subscribe_existing(
    consumer: Any,
    topic: str,
    broker: str,
    *,
    wait_s: float = 0.0,
    fix: Callable[[list[str], list[str]], str],
    on_wait: Callable[[list[str]], None] | None = None,
) -> list[Any]:
    """Subscribe a started, group-less consumer to ``topic`` once it exists (waiting up
    to ``wait_s``; never creating it) and return its partitions, all assigned.

    Args:
        fix: the end of the error's line (what to pass instead), given the similar
            topics and the other metrics topics (``TopicNotFound.similar``, ``of_role``).
        on_wait: called once, with the similar topics, when the topic is missing and
            the wait begins (say why nothing happens yet).

    Raises:
        TopicNotFound: the topic still does not exist after ``wait_s``.
    """
    deadline = await _await_topic(consumer, topic, broker, wait_s, fix, on_wait)
    consumer.subscribe([topic])
    await _await_assignment(consumer, topic, deadline + 30)
    return sorted(consumer.assignment())


async def _await_topic(
    consumer: Any,
    topic: str,
    broker: str,
    wait_s: float,
    fix: Callable[[list[str], list[str]], str],
    on_wait: Callable[[list[str]], None] | None,
) -> float:
    """Wait for ``topic`` to be listed, up to ``wait_s`` from the first answer (a slow lookup
    is not a wait); return that deadline."""
    names = await consumer.topics()
    deadline = time.monotonic() + wait_s
    while topic not in names:
        if time.monotonic() >= deadline:
            raise TopicNotFound(topic, broker, names, wait_s, fix)
        if on_wait is not None:  # once, when the wait begins
            on_wait(similar_topics(topic, names))
            on_wait = None
        await asyncio.sleep(0.5)
        names = await consumer.topics()
    return deadline


async def _await_assignment(consumer: Any, topic: str, give_up_at: float) -> None:
    """Wait for the partitions to be assigned: without a group, all of them once metadata arrives."""
    while not consumer.assignment():
        if time.monotonic() >= give_up_at:
            raise TimeoutError(f"no partition of {topic!r} was assigned in time: check the broker's metadata")
        await asyncio.sleep(0.05)
