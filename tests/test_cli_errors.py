"""What a person sees when a command cannot work: one or two lines on stderr that
say what is wrong and which flag and environment variable to set; never a
traceback or aiokafka's "Unclosed ..." warnings. Every case runs the real command
in a subprocess."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest

from specmeter.streams.settings import bootstrap_servers

from .support.tools import free_port
from .support.tools import run_specmeter as specmeter

REPO = Path(__file__).resolve().parents[1]
SAMPLE = str(REPO / "streams" / "data" / "sample_rollout.jsonl")
NOISE = ("Traceback", "Unclosed AIOKafkaProducer", "Unclosed AIOKafkaConsumer", "Unclosed AIOKafkaAdminClient")

#: each Kafka command, with the arguments that keep it short when it does reach a broker
COMMANDS = {
    "worker": ["worker", "--no-web"],
    "tail": ["tail", "--timeout", "5"],
    "replay": ["replay", SAMPLE, "--no-progress"],
    "loadgen": ["loadgen", "--batches", "1", "--sessions-per-batch", "2", "--no-progress"],
}


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    for noise in NOISE:
        assert noise not in output, output
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("scheme", ["", "kafka://"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_nothing_listening_at_the_broker_address(command, scheme):
    port = free_port()
    proc = specmeter(*COMMANDS[command], "--broker", f"{scheme}127.0.0.1:{port}")
    # the address as the clients use it (Faust's kafka:// form stripped), and what to set
    assert_one_line_error(
        proc,
        f"no Kafka broker answers at 127.0.0.1:{port}",
        "connection refused",
        "--broker",
        "KAFKA_BOOTSTRAP_SERVERS",
    )
    assert "kafka://" not in proc.stderr


def test_the_environment_address_is_read_too():
    port = free_port()
    proc = specmeter("tail", env={"KAFKA_BOOTSTRAP_SERVERS": f"kafka://127.0.0.1:{port}"})
    assert_one_line_error(proc, f"127.0.0.1:{port}", "KAFKA_BOOTSTRAP_SERVERS")


def test_worker_with_no_arguments_and_no_broker_at_the_default_address(tmp_path):
    if _listening(9092):
        pytest.skip("something listens on 127.0.0.1:9092, the default address")
    proc = specmeter("worker", cwd=tmp_path)
    assert_one_line_error(proc, "no Kafka broker answers at 127.0.0.1:9092", "--broker", "KAFKA_BOOTSTRAP_SERVERS")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("protocol", [None, "SASL_SSL"])
def test_a_bad_sasl_mechanism_is_named_before_anything_connects(command, protocol):
    env = {"KAFKA_SASL_MECHANISM": "BOGUS", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "hunter2-secret"}
    if protocol:
        env["KAFKA_SECURITY_PROTOCOL"] = protocol
    proc = specmeter(*COMMANDS[command], "--broker", f"127.0.0.1:{free_port()}", env=env)
    assert_one_line_error(proc, "KAFKA_SASL_MECHANISM", "'BOGUS'", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    assert "hunter2-secret" not in proc.stderr, "no secret in the message"


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, ("KAFKA_SECURITY_PROTOCOL='TLS'", "SASL_SSL")),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SSL_CAFILE": "/nonexistent",
            },
            ("KAFKA_SSL_CAFILE=/nonexistent",),
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN"},
            ("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"),
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD_FILE": "/nonexistent/password",
            },
            ("/nonexistent/password", "KAFKA_SASL_PASSWORD_FILE"),
        ),
    ],
)
def test_other_security_mistakes_are_one_line(env, needles):
    proc = specmeter("tail", "--broker", f"127.0.0.1:{free_port()}", env=env)
    assert_one_line_error(proc, *needles)


def test_a_scheme_other_than_kafka_is_a_usage_error():
    proc = specmeter("tail", "--broker", "http://127.0.0.1:9092")
    assert proc.returncode == 2 and "kafka://HOST:PORT" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://127.0.0.1:9092", "127.0.0.1:9092"),
        ("KAFKA://a:1, kafka://b:2/", "a:1,b:2"),
        (" a:1 ,b:2,", "a:1,b:2"),
    ],
)
def test_bootstrap_servers_accepts_fausts_form(value, expected):
    assert bootstrap_servers(value) == expected


@pytest.mark.parametrize("value", ["", " , ", "http://a:1", "kafka://"])
def test_bootstrap_servers_rejects_what_names_no_broker(value):
    with pytest.raises(ValueError, match="HOST:PORT"):
        bootstrap_servers(value)


# -- against the real broker ------------------------------------------------------


@pytest.mark.kafka
def test_web_port_in_use(kafka_bootstrap, unique_name):
    name = unique_name("webport")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the default --web-host (127.0.0.1) collides with the listener there
        proc = specmeter(
            "worker",
            "--broker",
            kafka_bootstrap,
            "--app-id",
            name,
            "--records-topic",
            f"{name}.records",
            "--web-port",
            str(port),
        )
    assert_one_line_error(proc, f"web port {port}", "in use", "--web-port", "SPECMETER_WORKER_WEB_PORT", "--no-web")


@pytest.mark.kafka
@pytest.mark.parametrize("scheme", ["", "kafka://"])
def test_records_topic_with_another_partition_count(kafka_bootstrap, new_topic, unique_name, scheme):
    from aiokafka.admin import AIOKafkaAdminClient

    records = new_topic(partitions=2, prefix="mismatch")
    partials = unique_name("mismatch-partials")
    proc = specmeter(
        "worker",
        "--broker",
        scheme + kafka_bootstrap,
        "--records-topic",
        records,
        "--partitions",
        "4",
        "--partials-topic",
        partials,
        "--app-id",
        unique_name("mismatch"),
        "--no-web",
    )
    assert_one_line_error(
        proc, f"{records!r} has 2 partitions", "--partitions 4", "--partitions 2", "SPECMETER_WORKER_PARTITIONS=2"
    )

    async def topics() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            return await admin.list_topics()
        finally:
            await admin.close()

    assert partials not in asyncio.run(topics()), "checked before any topic was created"


@pytest.mark.kafka
def test_kafka_scheme_is_accepted_by_the_publishing_and_reading_commands(kafka_bootstrap, new_topic):
    records = new_topic(partitions=2, prefix="scheme")
    for command in (
        ["loadgen", "--topic", records, "--batches", "1", "--sessions-per-batch", "3", "--no-progress"],
        ["replay", SAMPLE, "--topic", records, "--no-progress"],
        ["tail", "--topic", records, "--json", "--last", "0", "--timeout", "1"],
    ):
        proc = specmeter(*command, "--broker", f"kafka://{kafka_bootstrap}")
        assert proc.returncode == 0, proc.stderr
        assert not any(noise in proc.stderr for noise in NOISE), proc.stderr
    proc = specmeter(
        "loadgen",
        "--topic",
        records,
        "--batches",
        "1",
        "--sessions-per-batch",
        "3",
        "--no-progress",
        env={"KAFKA_BOOTSTRAP_SERVERS": f"kafka://{kafka_bootstrap}"},
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.kafka
@pytest.mark.parametrize("command", ["loadgen", "replay"])
def test_a_missing_records_topic_is_named_and_not_created(kafka_bootstrap, unique_name, tmp_path, command):
    topic = unique_name("absent")
    dump = tmp_path / "dump.jsonl"
    dump.write_text('{"batch_id": "b", "session_id": "s", "generation_id": "g", "accepted": 1, "proposed": 2}\n')
    args = ["--batches", "1"] if command == "loadgen" else [str(dump)]
    proc = specmeter(command, *args, "--broker", kafka_bootstrap, "--topic", topic)
    assert_one_line_error(proc, f"topic {topic!r} does not exist", "--topic NAME")
