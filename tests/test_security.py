"""SASL (PLAIN, SCRAM-SHA-256/512) over TLS against a real broker with an
authorizer: producer, worker and `tail` each run with only the rights docs/operations.md
lists for them, and no password shows in their output, logs or ``--help``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specmeter.schemas import decode_metrics

from .support.kafka_broker import PrivateBroker, local_broker_tools_missing
from .support.kafka_helpers import create_topic
from .support.tools import free_port
from .support.worker_harness import Deployment, latest_by_batch

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PASSWORDS = {
    "admin": "admin-Secret-1",
    "worker": "worker-Secret-2",
    "producer": "producer-Secret-3",
    "reader": "reader-Secret-4",
}


def _make_certs(folder: Path) -> None:
    """A throw-away CA and a broker certificate for 127.0.0.1 / localhost (PEM)."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=specmeter-test-ca",
    )
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=localhost")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl(
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "broker.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    )
    ssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.pk8")
    (folder / "broker.pem").write_text((folder / "broker.pk8").read_text() + (folder / "broker.crt").read_text())


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    missing = local_broker_tools_missing()
    if missing:
        pytest.skip(missing)
    folder = tmp_path_factory.mktemp("secure-broker")
    _make_certs(folder)
    port = free_port()
    users = " ".join(f'user_{name}="{password}"' for name, password in PASSWORDS.items())
    config = folder / "secure.properties"
    config.write_text(
        "\n".join(
            [
                "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.sasl_ssl.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
                "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={folder / 'broker.pem'}",
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # the PLAINTEXT listener (controller, inter-broker, this test's admin) is ANONYMOUS
                "super.users=User:ANONYMOUS;User:admin",
                "allow.everyone.if.no.acl.found=false",
            ]
        )
        + "\n"
    )
    scram = " ".join(
        f"--add-scram 'SCRAM-SHA-{bits}=[name={name},password={PASSWORDS[name]}]'"
        for name in ("worker", "reader")
        for bits in (256, 512)
    )
    broker = PrivateBroker(
        folder / "state",
        SPECMETER_KAFKA_EXTRA_LISTENER=f"SASL_SSL://127.0.0.1:{port}",
        SPECMETER_KAFKA_CONFIG_FILE=str(config),
        SPECMETER_KAFKA_FORMAT_ARGS=scram,
    )
    plaintext = broker.start()
    try:
        yield {
            "plaintext": plaintext,
            "secure": f"127.0.0.1:{port}",
            "ca": str(folder / "ca.crt"),
            "folder": folder,
            "broker": broker,
        }
    finally:
        broker.stop(purge=True)


def _client_env(secure_broker, user: str, mechanism: str) -> dict[str, str]:
    """Credentials as a deployment passes them: username in the environment, password in a file."""
    secret = secure_broker["folder"] / f"{user}.password"
    secret.write_text(PASSWORDS[user] + "\n")
    secret.chmod(0o600)
    return {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": mechanism,
        "KAFKA_SASL_USERNAME": user,
        "KAFKA_SASL_PASSWORD_FILE": str(secret),
        "KAFKA_SSL_CAFILE": secure_broker["ca"],
    }


def _grant(secure_broker, principal: str, topics_ops: dict[str, tuple[str, ...]], groups: tuple[str, ...] = ()) -> None:
    broker = secure_broker["broker"]
    for topic, operations in topics_ops.items():
        broker.tool(
            "org.apache.kafka.tools.AclCommand",
            "--bootstrap-server",
            secure_broker["plaintext"],
            "--add",
            "--allow-principal",
            f"User:{principal}",
            *[a for op in operations for a in ("--operation", op)],
            "--topic",
            topic,
        )
    for group in groups:
        broker.tool(
            "org.apache.kafka.tools.AclCommand",
            "--bootstrap-server",
            secure_broker["plaintext"],
            "--add",
            "--allow-principal",
            f"User:{principal}",
            "--operation",
            "Read",
            "--group",
            group,
        )


def _specmeter(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=timeout,
    )


def test_sasl_ssl_with_least_privilege_end_to_end(secure_broker, tmp_path):
    from specmeter.streams.core.layout import changelog_topics

    d = Deployment(secure_broker["secure"], batch_timeout_s=30.0)
    t = d.topics
    stage1_log, stage2_log = changelog_topics(d.name)
    # topics are created by an administrator (here: over the PLAINTEXT listener)
    for topic in (t.records, t.partials, stage1_log, stage2_log):
        asyncio.run(create_topic(secure_broker["plaintext"], topic, d.partitions))
    for topic in (t.metrics, t.deadletter):
        asyncio.run(create_topic(secure_broker["plaintext"], topic, 1))
    # each component gets exactly what docs/operations.md lists
    _grant(secure_broker, "producer", {t.records: ("Write",)})
    _grant(
        secure_broker,
        "worker",
        {
            t.records: ("Read",),
            t.partials: ("Read", "Write"),
            t.metrics: ("Write",),
            t.deadletter: ("Write",),
            stage1_log: ("Read", "Write"),
            stage2_log: ("Read", "Write"),
        },
        groups=(f"{d.name}-stage1", f"{d.name}-stage2"),
    )
    _grant(secure_broker, "reader", {t.metrics: ("Read",)})

    worker_env = _client_env(secure_broker, "worker", "SCRAM-SHA-256")
    worker = d.start_worker(env=worker_env)
    try:
        d.wait_ready(worker, timeout_s=90)
        expected = tmp_path / "expected.jsonl"
        loadgen = _specmeter(
            "loadgen",
            "--broker",
            secure_broker["secure"],
            "--topic",
            t.records,
            "--batches",
            "2",
            "--sessions-per-batch",
            "20",
            "--producers",
            "2",
            "--seed",
            "5",
            "--expect",
            str(expected),
            "--no-progress",
            env=_client_env(secure_broker, "producer", "PLAIN"),
        )
        assert loadgen.returncode == 0, loadgen.stderr[-3000:]
        tail = _specmeter(
            "tail",
            "--broker",
            secure_broker["secure"],
            "--topic",
            t.metrics,
            "--json",
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout",
            "120",
            env=_client_env(secure_broker, "reader", "SCRAM-SHA-512"),
        )
        assert tail.returncode == 0, tail.stderr[-3000:]
        got = latest_by_batch([decode_metrics(line.encode()) for line in tail.stdout.splitlines()])
        want = {m["batch_id"]: m for m in map(json.loads, expected.read_text().splitlines())}
        assert set(got) == set(want), (sorted(got), sorted(want), d.log_tail())
        for batch_id, m in got.items():
            assert m.complete and m.record_count == want[batch_id]["record_count"]
            for key, value in want[batch_id]["metrics"].items():
                assert m.metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (batch_id, key)
        # no password anywhere a person or a log collector would see it
        worker_log = d.logs[0].read_text(errors="replace")
        outputs = [worker_log, loadgen.stdout, loadgen.stderr, tail.stderr]
        for command in ((), ("worker",), ("loadgen",), ("replay",), ("tail",)):
            outputs.append(_specmeter(*command, "--help", env=worker_env).stdout)
        for password in PASSWORDS.values():
            assert not any(password in text for text in outputs), "a password leaked into output"
    finally:
        d.close()


def test_wrong_password_and_missing_rights_fail_clearly(secure_broker, tmp_path):
    name = f"deny-{os.getpid()}"
    asyncio.run(create_topic(secure_broker["plaintext"], f"{name}.metrics", 1))
    wrong = _client_env(secure_broker, "reader", "SCRAM-SHA-256")
    Path(wrong["KAFKA_SASL_PASSWORD_FILE"]).write_text("not-the-password\n")
    denied = _specmeter(
        "tail",
        "--broker",
        secure_broker["secure"],
        "--topic",
        f"{name}.metrics",
        "--json",
        "--max-messages",
        "1",
        "--timeout",
        "20",
        env=wrong,
        timeout=90,
    )
    assert denied.returncode != 0
    assert "Authentication" in denied.stderr or "authentication" in denied.stderr, denied.stderr[-2000:]
    assert "not-the-password" not in denied.stderr + denied.stdout
    # the producer principal may not write to a topic it was not granted
    blocked = _specmeter(
        "loadgen",
        "--broker",
        secure_broker["secure"],
        "--topic",
        f"{name}.metrics",
        "--batches",
        "1",
        "--sessions-per-batch",
        "2",
        "--producers",
        "1",
        "--no-progress",
        env=_client_env(secure_broker, "producer", "PLAIN"),
        timeout=120,
    )
    assert blocked.returncode != 0
    assert "Authorization" in blocked.stderr or "authorization" in blocked.stderr, blocked.stderr[-2000:]
