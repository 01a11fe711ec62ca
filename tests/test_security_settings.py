"""Kafka security settings from the environment: parsed, passed on, never printed."""

from __future__ import annotations

from specmeter.producers import KafkaSecurity
from specmeter.streams.settings import WorkerSettings


def test_plaintext_by_default_adds_nothing():
    assert WorkerSettings().security.aiokafka_kwargs() == {}
    from specmeter.streams.worker.app import faust_security_kwargs

    assert faust_security_kwargs(KafkaSecurity.from_env({})) == {}


def test_sasl_from_env_and_files(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    security = KafkaSecurity.from_env(
        {
            "KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": "worker",
            "KAFKA_SASL_PASSWORD_FILE": str(secret),
        }
    )
    assert security.aiokafka_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "worker",
        "sasl_plain_password": "s3cret",
    }
    assert "s3cret" not in repr(security) and "s3cret" not in repr(WorkerSettings(security=security))
