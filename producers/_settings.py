"""The publisher's one settings object (environment and CLI flags map onto it)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import msgspec

from specmeter.schemas import RECORDS_TOPIC

from ._security import KafkaSecurity

__all__ = [
    "PublisherSettings",
    "default_producer_id",
    "plain_bootstrap",
    "split_bootstrap",
    "with_port",
    "unavailable_message",
    "BOOTSTRAP_ENV",
    "DEFAULT_BOOTSTRAP",
]

#: the environment variable every command and ``PublisherSettings.from_env`` read the address from
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: Kafka's own default port, assumed for an address that names none (as Kafka's tools do)
DEFAULT_PORT = 9092


def default_producer_id() -> str:
    """``<hostname>-<pid>``: unique per rollout worker process."""
    return f"{socket.gethostname()}-{os.getpid()}"


def plain_bootstrap(servers: str) -> str:
    """``HOST:PORT[,HOST:PORT...]`` from what a person types: Faust's ``kafka://HOST:PORT``
    form is accepted (every tool takes the address the worker's config uses), and a
    host without a port gets Kafka's default port 9092.

    Raises:
        ValueError: an empty address, a scheme other than ``kafka://``, a bad port.
    """
    return ",".join(address for address, _ in split_bootstrap(servers))


def split_bootstrap(servers: str) -> list[tuple[str, bool]]:
    """``plain_bootstrap``'s addresses, each with whether its port was assumed.

    Raises:
        ValueError: as ``plain_bootstrap``.
    """
    out = []
    for entry in servers.split(","):
        entry = entry.strip()
        scheme, sep, rest = entry.partition("://")
        if sep:
            if scheme.lower() != "kafka":
                raise ValueError(
                    f"{entry!r}: give HOST:PORT or kafka://HOST:PORT, not {scheme}:// "
                    f"(bootstrap_servers / {BOOTSTRAP_ENV})"
                )
            entry = rest.strip().rstrip("/")
        if entry:
            out.append(with_port(entry))
    if not out:
        raise ValueError(
            f"{servers!r} names no broker: give HOST:PORT (or kafka://HOST:PORT), comma-separated "
            f"(bootstrap_servers / {BOOTSTRAP_ENV})"
        )
    return out


def with_port(address: str) -> tuple[str, bool]:
    """``(HOST:PORT, whether the port was assumed)``: Kafka's default port 9092 for a
    host that names none, so every message shows the address really dialled.

    Raises:
        ValueError: a port that is not a number from 1 to 65535.
    """
    if address.startswith("["):  # [IPv6]:PORT
        host, sep, port = address.rpartition("]:")
        if not sep:
            return f"{address}:{DEFAULT_PORT}", True
        host += "]"
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    elif ":" not in address:
        return f"{address}:{DEFAULT_PORT}", True
    else:  # a bare IPv6 address: no port can be told apart
        return address, False
    if not (port.isdigit() and 0 < int(port) < 65536) or not host:
        raise ValueError(
            f"{address!r}: give HOST:PORT with a port from 1 to 65535 (bootstrap_servers / {BOOTSTRAP_ENV})"
        )
    return address, False


def unavailable_message(bootstrap: str, reason: str, env: Mapping[str, str] | None = None) -> str:
    """``BrokerUnavailableError``'s line: the address dialled, and where an address is set.

    ``KAFKA_BOOTSTRAP_SERVERS`` is read by ``PublisherSettings.from_env()`` only; when it
    is set to another address than the one dialled, the line says so (the usual cause:
    ``PublisherSettings()`` used where ``from_env()`` was meant)."""
    env = os.environ if env is None else env
    text = (
        f"no Kafka broker answers at {bootstrap} ({reason}): check PublisherSettings.bootstrap_servers "
        "and that the broker runs"
    )
    named = env.get(BOOTSTRAP_ENV, "").strip()
    try:
        same = bool(named) and plain_bootstrap(named) == bootstrap
    except ValueError:
        same = False
    if named and not same:
        return (
            f"{text}; {BOOTSTRAP_ENV}={named} is set but PublisherSettings() reads no environment: "
            "use PublisherSettings.from_env() or pass bootstrap_servers"
        )
    return f"{text} (PublisherSettings.from_env() reads {BOOTSTRAP_ENV})"


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

    ``PublisherSettings()`` reads no environment (a library that read it behind
    its caller's back would publish a test, or a second cluster's fleet, to
    whatever the process inherited); ``PublisherSettings.from_env()`` reads what
    the command line reads.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **fields: Any) -> PublisherSettings:
        """Settings from the environment the ``specmeter`` commands read: the address
        from ``KAFKA_BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``) and SASL/TLS from
        the ``KAFKA_*`` security variables (``KafkaSecurity.from_env``). ``fields``
        set everything else and win over the environment:
        ``PublisherSettings.from_env(run_id=run, producer_id=name)``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {"security": KafkaSecurity.from_env(dict(env))}
        if env.get(BOOTSTRAP_ENV, "").strip():
            values["bootstrap_servers"] = env[BOOTSTRAP_ENV]
        values.update(fields)
        return cls(**values)
