"""Readers never create a topic (issue 24, point 1): `specmeter tail`, `consume_metrics`
(and its sync twin) and the wandb/TensorBoard examples, given a mistyped topic on a
broker that auto-creates topics, end with one line that names the topic meant, and
the mistyped name does not exist on the broker afterwards."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from specmeter.streams import consume_metrics_sync

from .support.kafka_helpers import delete_topics, topic_names

REPO = Path(__file__).resolve().parents[1]
NOISE = ("Traceback", "Unclosed AIOKafka")

pytestmark = pytest.mark.kafka


def assert_not_created(bootstrap: str, topic: str) -> None:
    assert topic not in asyncio.run(topic_names(bootstrap)), f"a reader created {topic!r}"


@pytest.fixture
def metrics_topic_pair(kafka_bootstrap, unique_name):
    """An existing metrics topic (visible in the cluster's metadata: a reader sees only
    that) and a one-letter typo of its name; the topic is deleted afterwards."""
    from .support.kafka_helpers import create_topic

    topic = unique_name("readonly") + ".metrics"
    asyncio.run(create_topic(kafka_bootstrap, topic, 2))
    deadline = time.monotonic() + 30
    while topic not in asyncio.run(topic_names(kafka_bootstrap)):
        assert time.monotonic() < deadline, f"{topic} never showed in the metadata"
        time.sleep(0.2)
    yield topic, topic.replace(".metrics", ".metrcs")
    asyncio.run(delete_topics(kafka_bootstrap, [topic]))


def test_tail_with_a_mistyped_topic_names_the_real_one_and_creates_nothing(kafka_bootstrap, metrics_topic_pair):
    topic, typo = metrics_topic_pair
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "SPECMETER_"))}
    # no --timeout: a tail that waits for the topic never returns (the old behaviour, after creating it)
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "tail", "--broker", kafka_bootstrap, "--topic", typo],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not any(noise in proc.stderr for noise in NOISE), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert f"topic {typo!r} does not exist" in lines[0] and "never creates" in lines[0]
    assert f"did you mean --topic {topic}" in lines[1] and "SPECMETER_TAIL_TOPIC" in lines[1]
    assert proc.stdout == "", "no empty table for a topic that is not there"
    assert_not_created(kafka_bootstrap, typo)


def test_tail_with_no_similar_topic_says_what_to_pass(kafka_bootstrap, unique_name):
    absent = unique_name("zq")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "SPECMETER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "tail", "--broker", kafka_bootstrap, "--topic", absent],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"topic {absent!r} does not exist" in proc.stderr and "--topic" in proc.stderr
    assert_not_created(kafka_bootstrap, absent)


def test_consume_metrics_names_the_similar_topic_and_creates_nothing(kafka_bootstrap, metrics_topic_pair):
    topic, typo = metrics_topic_pair
    with pytest.raises(LookupError, match=f"{typo}.*does not exist.*did you mean topic='{topic}'") as info:
        list(consume_metrics_sync(kafka_bootstrap, topic=typo, topic_wait_s=0, stop_at_end=True))
    assert "\n" not in str(info.value)
    assert info.value.similar[0] == topic
    assert_not_created(kafka_bootstrap, typo)


def test_consume_metrics_says_at_once_why_it_waits(kafka_bootstrap, metrics_topic_pair, caplog):
    topic, typo = metrics_topic_pair
    with caplog.at_level(logging.WARNING, logger="specmeter.consume"), pytest.raises(LookupError):
        list(consume_metrics_sync(kafka_bootstrap, topic=typo, topic_wait_s=1.5, stop_at_end=True))
    waits = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert len(waits) == 1 and typo in waits[0] and topic in waits[0], caplog.text
    assert_not_created(kafka_bootstrap, typo)


def _example(name: str) -> types.ModuleType:
    path = REPO / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Recorder:
    """Stands in for a wandb run / a TensorBoard writer (not for Kafka)."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("example", ["wandb_metrics", "tensorboard_metrics"])
def test_the_examples_end_with_one_line_for_a_mistyped_topic(
    kafka_bootstrap, metrics_topic_pair, example, monkeypatch, capsys, tmp_path
):
    topic, typo = metrics_topic_pair
    module = _example(example)
    if example == "wandb_metrics":
        fake = types.SimpleNamespace(
            init=lambda **kwargs: _Recorder(), plot=types.SimpleNamespace(line_series=lambda **kwargs: kwargs)
        )
        monkeypatch.setitem(sys.modules, "wandb", fake)
        args = ["--project", "p"]
    else:
        monkeypatch.setattr(module, "_summary_writer", lambda logdir: _Recorder())
        args = ["--logdir", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        module.main(["--broker", kafka_bootstrap, "--topic", typo, *args])
    assert info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and typo in err and topic in err, err
    assert_not_created(kafka_bootstrap, typo)
