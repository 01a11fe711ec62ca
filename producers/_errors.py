"""Errors the producer library raises; each says what happened and what to do."""

from __future__ import annotations

__all__ = [
    "PublisherError",
    "QueueFullError",
    "PublisherClosedError",
    "PublisherNotStartedError",
    "BrokerUnavailableError",
    "TopicMissingError",
]


class PublisherError(Exception):
    """Base class of every error the publisher raises."""

    retriable = False


class QueueFullError(PublisherError):
    """The bounded queue stayed full for the whole timeout: nothing was accepted.

    Usually the broker is unreachable or slower than the fleet. Operator action:
    check the broker; raise ``max_queued_records`` or ``queue_full_timeout_s`` if
    bursts are expected. The record was NOT queued; publish it again later.
    """

    retriable = True


class BrokerUnavailableError(PublisherError):
    """``start()`` reached no broker at the bootstrap address; nothing was left open."""

    retriable = True


class TopicMissingError(PublisherError):
    """The records topic does not exist. The publisher never creates it: the broker's
    default partition count would not be the worker's (``specmeter worker
    --partitions N`` creates it, or create it with your tools first)."""


class PublisherClosedError(PublisherError):
    """publish() after stop(): the publisher no longer accepts records."""


class PublisherNotStartedError(PublisherError):
    """publish() before start(): call ``await publisher.start()`` (or use ``async with``)."""
