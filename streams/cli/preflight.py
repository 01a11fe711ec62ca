"""Checks the command-line tools run before they start anything.

A broker that is not there, a web port in use or a records topic of another
shape would otherwise surface as a traceback from deep inside aiokafka or Faust,
after a progress bar or a worker banner was already on the screen. These checks
raise small typed errors instead; the command line turns each into one line that says
what is wrong and what to set.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

from specmeter.producers import KafkaSecurity
from specmeter.producers._kafka_logs import quiet_kafka_logs

from ..errors import SpecmeterError
from ..settings import WorkerSettings
from ..worker.topics import TopicMismatch, TopicPlan, TopicSpec, check_partials_not_shared, unauthorized_topics

__all__ = [
    "BadSecurity",
    "BrokerUnreachable",
    "PortInUse",
    "TopicMismatch",
    "WebHostInvalid",
    "check_broker",
    "check_security",
    "check_web_port",
    "quiet_kafka_logs",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: what KafkaSecurity can drive: username and password (aiokafka's GSSAPI and
#: OAUTHBEARER need a Kerberos setup or a token provider it does not pass)
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class BadSecurity(SpecmeterError, ValueError):
    """The KAFKA_* security environment cannot work; the message names the variable."""


class BrokerUnreachable(SpecmeterError, ConnectionError):
    """No broker at ``broker`` completed a connection; ``reasons`` are aiokafka's, per address."""

    retriable = True

    def __init__(self, broker: str, reasons: list[str]) -> None:
        super().__init__(f"no Kafka broker answers at {broker}")
        self.broker = broker
        self.reasons = reasons

    @property
    def authentication_failed(self) -> bool:
        return _mentions(self.reasons, ("Authentication", "authentication", "SASL"))

    @property
    def tls_failed(self) -> bool:
        return _mentions(self.reasons, ("SSL", "certificate", "TLS"))


def _mentions(reasons: list[str], words: tuple[str, ...]) -> bool:
    """Whether one of aiokafka's reasons names one of ``words`` (how it says what failed)."""
    return any(word in reason for reason in reasons for word in words)


class PortInUse(SpecmeterError, OSError):
    """The worker's web port is taken by another process."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(f"web port {port} on {host} is in use")
        self.host, self.port = host, port


class WebHostInvalid(SpecmeterError, OSError):
    """The worker's web host is no address of this machine."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"cannot bind the web server to {host!r}: {reason}")
        self.host = host


def check_security(security: KafkaSecurity) -> None:
    """Raise ``BadSecurity`` for settings aiokafka would reject (or silently misuse)."""
    _check_protocol(security)
    _check_credentials(security)


def _check_protocol(security: KafkaSecurity) -> None:
    """The protocol and the SASL mechanism: known, and a mechanism only with a SASL protocol."""
    if security.protocol not in PROTOCOLS:
        raise BadSecurity(
            f"KAFKA_SECURITY_PROTOCOL={security.protocol!r} is not a protocol: set it to "
            f"{', '.join(PROTOCOLS[:-1])} or {PROTOCOLS[-1]}"
        )
    if security.sasl_mechanism is not None:
        _check_mechanism(security.sasl_mechanism, security.protocol)


def _check_mechanism(mechanism: str, protocol: str) -> None:
    """A SASL mechanism KafkaSecurity can drive, set with a protocol that uses SASL."""
    if mechanism.upper() not in MECHANISMS:
        raise BadSecurity(
            f"KAFKA_SASL_MECHANISM={mechanism!r} is not supported: set it to "
            f"{', '.join(MECHANISMS[:-1])} or {MECHANISMS[-1]}"
        )
    if "SASL" not in protocol:
        raise BadSecurity(
            f"KAFKA_SASL_MECHANISM={mechanism} is set but KAFKA_SECURITY_PROTOCOL={protocol} "
            "uses no SASL: set KAFKA_SECURITY_PROTOCOL=SASL_SSL (or SASL_PLAINTEXT), or unset "
            "KAFKA_SASL_MECHANISM"
        )


def _check_credentials(security: KafkaSecurity) -> None:
    """What the protocol needs besides: a readable CA bundle, a SASL user and password."""
    if security.ssl_cafile is not None:
        _check_cafile(security.ssl_cafile)
    if "SASL" in security.protocol:
        _check_login(security)


def _check_cafile(cafile: str) -> None:
    """The CA bundle KAFKA_SSL_CAFILE names, a file that can be read."""
    if not os.access(cafile, os.R_OK):
        raise BadSecurity(
            f"KAFKA_SSL_CAFILE={cafile}: no such readable file: point it at the PEM CA bundle that verifies the brokers"
        )


def _check_login(security: KafkaSecurity) -> None:
    """A SASL protocol's username and password, both given."""
    if not security.username or not security.password:
        raise BadSecurity(
            f"KAFKA_SECURITY_PROTOCOL={security.protocol} needs KAFKA_SASL_USERNAME and "
            "KAFKA_SASL_PASSWORD (or KAFKA_SASL_USERNAME_FILE / KAFKA_SASL_PASSWORD_FILE)"
        )


async def check_broker(
    broker: str,
    security: KafkaSecurity,
    *,
    settings: WorkerSettings | None = None,
    records_topic: str | None = None,
    timeout_ms: int = 15_000,
) -> None:
    """Connect once and close; with ``settings``, check every topic of that worker first;
    with ``records_topic``, that it exists (a command that publishes never creates it).

    Raises:
        BrokerUnreachable: no address of ``broker`` completed a connection
            (refused, unresolvable, TLS or SASL failure: see ``reasons``).
        TopicMismatch: existing topics of the worker have partition counts it
            cannot use (every such topic is named; nothing is created).
        TopicNotFound: ``records_topic`` does not exist (with the names like it there).
    """
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=broker, request_timeout_ms=timeout_ms, **security.aiokafka_kwargs())
    with quiet_kafka_logs() as messages:
        try:
            await _start_admin(admin, broker, messages)
            planned = None if settings is None else await _check_worker(admin, settings)
            existing = None if records_topic is None else await _topics_seen(admin, records_topic)
        finally:
            await admin.close()
    _raise_found(broker, planned, records_topic, existing)


def _raise_found(
    broker: str,
    planned: tuple[TopicPlan, list[TopicSpec]] | None,
    records_topic: str | None,
    existing: list[str] | None,
) -> None:
    """What ``check_broker`` found, raised once its client is closed: the worker's topics
    of a shape it cannot use, or a records topic that does not exist."""
    if planned is not None and planned[0].mismatched:
        raise TopicMismatch(*planned)
    if records_topic is not None and existing is not None and records_topic not in existing:
        from ..readers.topic_lookup import TopicNotFound

        raise TopicNotFound(records_topic, broker, existing, 0.0, _start_the_worker, role="records")


async def _topics_seen(admin: Any, records_topic: str) -> list[str] | None:
    """The topics listed, to find ``records_topic`` in; None where it is not listed because
    it is not ours to see: the producer then says the authorization error itself, which
    names the right that is missing."""
    existing = await admin.list_topics()
    if records_topic not in existing and records_topic in await unauthorized_topics(admin, [records_topic]):
        return None
    return existing


def _start_the_worker(similar: list[str], of_role: list[str]) -> str:
    """The end of a missing records topic's line (the command's own line says it as a flag)."""
    if similar:
        return f"did you mean {' or '.join(similar)}?"
    return "start `specmeter worker` first (it creates its records topic)"


async def _start_admin(admin: Any, broker: str, messages: list[str]) -> None:
    """Connect; ``BrokerUnreachable`` with aiokafka's lines on why no address answered."""
    from aiokafka.errors import KafkaConnectionError

    try:
        await admin.start()
    except KafkaConnectionError:
        raise BrokerUnreachable(broker, [m for m in messages if "Unable" in m] or messages[-3:]) from None


async def _check_worker(admin: Any, settings: WorkerSettings) -> tuple[TopicPlan, list[TopicSpec]]:
    """The worker's topic plan, once no other deployment reads its partials topic."""
    planned = await _worker_plan(admin, settings)
    await check_partials_not_shared(admin, settings)
    return planned


async def _worker_plan(admin: Any, settings: WorkerSettings) -> tuple[TopicPlan, list[TopicSpec]]:
    """The worker's topics as the cluster has them: the plan, and the topics it plans."""
    from ..worker.topics import describe_cluster, plan_topics, worker_topics

    specs = worker_topics(settings)
    view = await describe_cluster(admin, [s.name for s in specs])
    return plan_topics(specs, view, settings.partitions), specs


def check_web_port(host: str, port: int) -> None:
    """Raise ``PortInUse`` when (host, port) cannot be bound as aiohttp will bind it."""
    if port == 0:
        return
    for family, kind, proto, _, address in _addresses(host, port):
        _bind_once(host, port, family, kind, proto, address)


def _addresses(host: str, port: int) -> list[Any]:
    """The addresses aiohttp will bind (every interface for an empty host); ``WebHostInvalid``
    where the host does not resolve."""
    try:
        return socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise WebHostInvalid(host, exc.strerror or str(exc)) from None


def _bind_once(host: str, port: int, family: Any, kind: Any, proto: int, address: Any) -> None:
    """Bind one of the host's addresses and let it go: ``PortInUse`` where another process
    holds it, ``WebHostInvalid`` where the address is no address of this machine."""
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does on POSIX
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(host, port) from None
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise WebHostInvalid(host, exc.strerror or str(exc)) from None
            raise


def security_from_env() -> KafkaSecurity:
    """KAFKA_* security from the environment, checked before anything connects."""
    security = KafkaSecurity.from_env()
    check_security(security)
    security.aiokafka_kwargs()  # reads KAFKA_SSL_CAFILE now, not in the middle of a run
    return security


def check_before_start(
    broker: str, security: KafkaSecurity, settings: WorkerSettings | None = None, *, records_topic: str | None = None
) -> None:
    """``check_broker``, run to the end: what a command checks before it starts anything."""
    import asyncio

    asyncio.run(check_broker(broker, security, settings=settings, records_topic=records_topic))
