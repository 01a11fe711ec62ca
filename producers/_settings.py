"""The publisher's one settings object (environment and CLI flags map onto it)."""

from __future__ import annotations

import os
import socket

import msgspec

from specmeter.schemas import RECORDS_TOPIC

from ._security import KafkaSecurity

__all__ = ["PublisherSettings", "default_producer_id", "plain_bootstrap"]


def default_producer_id() -> str:
    """``<hostname>-<pid>``: unique per rollout worker process."""
    return f"{socket.gethostname()}-{os.getpid()}"


def plain_bootstrap(servers: str) -> str:
    """``HOST:PORT[,HOST:PORT...]`` from what a person types: Faust's ``kafka://HOST:PORT``
    form is accepted (every tool takes the address the worker's config uses).

    Raises:
        ValueError: an empty address, or a scheme other than ``kafka://``.
    """
    out = []
    for entry in servers.split(","):
        entry = entry.strip()
        scheme, sep, rest = entry.partition("://")
        if sep:
            if scheme.lower() != "kafka":
                raise ValueError(
                    f"{entry!r}: give HOST:PORT or kafka://HOST:PORT, not {scheme}:// "
                    "(bootstrap_servers / KAFKA_BOOTSTRAP_SERVERS)"
                )
            entry = rest.strip().rstrip("/")
        if entry:
            out.append(entry)
    if not out:
        raise ValueError(
            f"{servers!r} names no broker: give HOST:PORT (or kafka://HOST:PORT), comma-separated "
            "(bootstrap_servers / KAFKA_BOOTSTRAP_SERVERS)"
        )
    return ",".join(out)


class PublisherSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a rollout worker publishes to Kafka.

    Attributes:
        bootstrap_servers: Kafka bootstrap address(es), comma-separated
            (``kafka://host:port`` accepted).
        topic: the records topic.
        producer_id: this worker's identity in markers; defaults to host-pid.
        run_id: the training run (attempt) every record and marker belongs to;
            None is the default run. A job restarted from a checkpoint gets a new
            one, so its ``step-N`` never merges into the old attempt's.
        pack: pack records bound for one partition into one ``RecordBatch``
            message (default). ``False`` sends one keyed message per record.
        max_message_bytes: upper bound of one packed message.
        linger_ms: how long a partition's records may wait to be packed.
        max_queued_records: records accepted but not yet acknowledged by Kafka;
            past it ``publish`` waits (``queue_full_timeout_s``), then raises
            ``QueueFullError``. Nothing accepted is ever dropped.
        queue_full_timeout_s: how long ``publish`` waits for room.
        compression_type: Kafka compression (lz4, zstd, gzip, snappy or None).
        request_timeout_ms: aiokafka's per-request timeout.
        retry_backoff_ms: pause before re-sending a message that failed.
        security: SASL and TLS for the connection (``KafkaSecurity.from_env()``
            reads ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_*``, ``KAFKA_SSL_CAFILE``).
        kafka: extra keyword arguments for ``AIOKafkaProducer``.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = RECORDS_TOPIC
    producer_id: str = msgspec.field(default_factory=default_producer_id)
    run_id: str | None = None
    pack: bool = True
    max_message_bytes: int = 512 * 1024
    linger_ms: int = 20
    max_queued_records: int = 200_000
    queue_full_timeout_s: float = 10.0
    compression_type: str | None = "lz4"
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 250
    security: KafkaSecurity = KafkaSecurity()
    kafka: dict = {}
