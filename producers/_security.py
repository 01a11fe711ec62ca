"""Kafka client security from the environment, for the publisher, the worker
(Faust and aiokafka) and every CLI command alike.

Credentials come from the environment or files (never flags, so they never
show in ``ps``, ``--help`` or logs):

    KAFKA_SECURITY_PROTOCOL   PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL
    KAFKA_SASL_MECHANISM      PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    KAFKA_SASL_USERNAME       or KAFKA_SASL_USERNAME_FILE
    KAFKA_SASL_PASSWORD       or KAFKA_SASL_PASSWORD_FILE
    KAFKA_SSL_CAFILE          CA bundle to verify the brokers (SSL, SASL_SSL)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["KafkaSecurity"]


def _secret(env: dict[str, str], name: str) -> str | None:
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    return Path(path).read_text().strip() if path else None


class KafkaSecurity(msgspec.Struct, frozen=True, kw_only=True):
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = msgspec.field(default=None)
    ssl_cafile: str | None = None

    def __repr__(self) -> str:  # never print the password
        return (
            f"KafkaSecurity(protocol={self.protocol!r}, sasl_mechanism={self.sasl_mechanism!r}, "
            f"username={self.username!r})"
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KafkaSecurity:
        env = dict(os.environ if env is None else env)
        return cls(
            protocol=env.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper(),
            sasl_mechanism=env.get("KAFKA_SASL_MECHANISM") or None,
            username=_secret(env, "KAFKA_SASL_USERNAME"),
            password=_secret(env, "KAFKA_SASL_PASSWORD"),
            ssl_cafile=env.get("KAFKA_SSL_CAFILE") or None,
        )

    def ssl_context(self) -> Any:
        if "SSL" not in self.protocol:
            return None
        from aiokafka.helpers import create_ssl_context

        return create_ssl_context(cafile=self.ssl_cafile)

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaProducer/Consumer/AdminClient."""
        if self.protocol == "PLAINTEXT":
            return {}
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if "SASL" in self.protocol:
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism or "PLAIN",
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        ssl_context = self.ssl_context()
        if ssl_context is not None:
            kwargs["ssl_context"] = ssl_context
        return kwargs
