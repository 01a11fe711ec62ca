"""Where settings come from (issue 24, point 8): every flag reads SPECMETER_<COMMAND>_<FLAG>
(or a documented shared variable), a bad value from the environment is blamed on the
variable, a broker address without a port says which port it dials, and the producer
library reads KAFKA_BOOTSTRAP_SERVERS only where it says it does."""

from __future__ import annotations

import asyncio
import functools
import socket

import click
import pytest
from click.core import ParameterSource

from specmeter.producers import BrokerUnavailableError, KafkaSecurity, Publisher, PublisherSettings
from specmeter.streams.cli import SHARED_ENVVARS, main

from .support.tools import run_specmeter

NOISE = ("Traceback", "Unclosed AIOKafka")


specmeter = functools.partial(run_specmeter, timeout=60)


def _options():
    for name, command in sorted(main.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option):
                yield pytest.param(name, param, id=f"{name}{param.opts[0]}")


@pytest.mark.parametrize(("command", "option"), list(_options()))
def test_every_flag_reads_the_variable_of_the_rule(command, option, tmp_path, monkeypatch):
    """Named by the rule, shown in --help, and really read: the value's source is the environment."""
    flag = next(o for o in option.opts if o.startswith("--"))
    rule = f"SPECMETER_{command}_{flag[2:]}".upper().replace("-", "_")
    assert option.envvar == rule or option.envvar in SHARED_ENVVARS, (option.envvar, rule)
    assert option.show_envvar
    variable = option.envvar
    monkeypatch.setenv(variable, _valid_value(option, tmp_path))
    (tmp_path / "in.jsonl").write_text("")
    takes_file = any(isinstance(p, click.Argument) for p in main.commands[command].params)
    arguments = [str(tmp_path / "in.jsonl")] if takes_file else []
    parent = click.Context(main, info_name="specmeter")
    with main.commands[command].make_context(command, arguments, parent=parent) as ctx:  # closes FILE
        assert ctx.get_parameter_source(option.name) is ParameterSource.ENVIRONMENT, variable


def _valid_value(option: click.Option, tmp_path) -> str:
    if option.is_flag:
        return "1"
    kind = option.type
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, click.File):
        return str(tmp_path / "out")
    if isinstance(kind, click.IntRange) or getattr(kind, "integer", False):  # streams.cli.base.Number
        return str(max(1, kind.min or 0))
    if isinstance(kind, click.FloatRange):
        return str((kind.min or 0) + 0.5)
    if option.name == "broker":
        return "127.0.0.1:9"
    return str(option.default) if option.default is not None else "x"


@pytest.mark.parametrize(
    ("command", "variable", "value", "flag"),
    [
        (["worker", "--no-web"], "SPECMETER_WORKER_PARTITIONS", "abc", "--partitions"),
        (["tail"], "SPECMETER_TAIL_JSON", "maybe", "--json"),
        (["tail"], "SPECMETER_TAIL_LAST", "-1", "--last"),
        (["aggregate", "-"], "SPECMETER_AGGREGATE_FORMAT", "xml", "--format"),
        (["loadgen", "--dump", "-"], "SPECMETER_LOADGEN_DRIFT", "2", "--drift"),
    ],
)
def test_a_bad_environment_value_is_blamed_on_the_variable(command, variable, value, flag):
    proc = specmeter(*command, env={variable: value})
    assert proc.returncode == 2, proc.stderr
    assert not any(noise in proc.stderr for noise in NOISE), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"specmeter {command[0]}: {variable}={value!r} is not a valid value for {flag}")
    assert f"Invalid value for '{flag}'" not in proc.stderr
    assert variable in lines[1]


def test_a_bad_flag_value_is_still_blamed_on_the_flag():
    proc = specmeter("worker", "--partitions", "abc")
    assert proc.returncode == 2 and "Invalid value for '--partitions'" in proc.stderr, proc.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("source", ["flag", "env"])
def test_a_broker_without_a_port_says_which_port_it_dials(source):
    given = "127.0.0.1"
    args, env = (["--broker", given], {}) if source == "flag" else ([], {"KAFKA_BOOTSTRAP_SERVERS": given})
    proc = specmeter("tail", *args, "--timeout", "1", env=env)
    named = "--broker 127.0.0.1" if source == "flag" else "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1"
    assert f"{named} names no port: using 127.0.0.1:9092 (Kafka's default)" in proc.stderr, proc.stderr
    if proc.returncode != 0:  # nothing at 9092 here: the error names the address really dialled
        assert "no Kafka broker answers at 127.0.0.1:9092" in proc.stderr, proc.stderr


@pytest.mark.parametrize("given", ["127.0.0.1:0", "127.0.0.1:abc", "host:70000"])
def test_a_port_that_is_no_port_is_a_usage_error(given):
    proc = specmeter("tail", "--broker", given)
    assert proc.returncode == 2 and "port from 1 to 65535" in proc.stderr and "Traceback" not in proc.stderr


def test_max_open_generations_help_gives_the_measured_cost():
    """The flag's help and docs/operations.md (which sizes pods with it) state the same cost
    per open generation, and the measured size of the dedup state inside it."""
    import re
    from pathlib import Path

    option = next(p for p in main.commands["worker"].params if p.name == "max_open_generations")
    operations = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    memory = operations.split("* **Memory**", 1)[1].split("\n* **", 1)[0]
    (per_generation,) = set(re.findall(r"about \*\*(\d+) B\*\* per open generation", memory))
    assert f"about {per_generation} B of worker memory each" in option.help, option.help
    assert "85-130 B" in option.help and "130-300" not in option.help


# -- the producer library ------------------------------------------------------------


def test_publisher_settings_read_no_environment_but_from_env_does(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-a:9093")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "u")
    assert PublisherSettings().bootstrap_servers == "127.0.0.1:9092"
    assert PublisherSettings().security == KafkaSecurity()
    settings = PublisherSettings.from_env(run_id="attempt-2")
    assert settings.bootstrap_servers == "kafka-a:9093" and settings.run_id == "attempt-2"
    assert settings.security.protocol == "SASL_SSL" and settings.security.username == "u"
    assert PublisherSettings.from_env(bootstrap_servers="b:1").bootstrap_servers == "b:1", "fields win"
    assert PublisherSettings.from_env(env={}).bootstrap_servers == "127.0.0.1:9092"


def _unavailable(settings: PublisherSettings) -> str:
    async def start() -> str:
        publisher = Publisher(settings)
        with pytest.raises(BrokerUnavailableError) as info:
            await asyncio.wait_for(publisher.start(), 60)
        return str(info.value)

    return asyncio.run(start())


def test_the_unavailable_error_says_the_default_settings_ignored_the_variable(monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-elsewhere:9092")
    text = _unavailable(PublisherSettings(bootstrap_servers=f"127.0.0.1:{port}", topic="t", request_timeout_ms=2000))
    assert f"no Kafka broker answers at 127.0.0.1:{port}" in text
    assert "KAFKA_BOOTSTRAP_SERVERS=kafka-elsewhere:9092 is set but PublisherSettings() reads no environment" in text
    assert "PublisherSettings.from_env()" in text and "\n" not in text


def test_the_unavailable_error_names_from_env_when_it_was_used(monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{port}")
    text = _unavailable(PublisherSettings.from_env(topic="t", request_timeout_ms=2000))
    assert f"no Kafka broker answers at 127.0.0.1:{port}" in text
    assert "reads no environment" not in text and "PublisherSettings.from_env() reads KAFKA_BOOTSTRAP_SERVERS" in text


@pytest.mark.kafka
def test_from_env_publishes_to_the_broker_the_variable_names(kafka_bootstrap, new_topic, monkeypatch):
    topic = new_topic(partitions=1, prefix="from-env")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"kafka://{kafka_bootstrap}")

    async def run() -> int:
        async with Publisher(PublisherSettings.from_env(topic=topic)) as publisher:
            return publisher.partitions

    assert asyncio.run(run()) == 1
