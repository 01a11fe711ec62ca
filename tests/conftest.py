"""Session-wide fixtures: one real Kafka broker serves every ``kafka`` test."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from .support.kafka_broker import NoBroker, broker_log_tail, find_broker


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap address of a real broker (see tests/support/kafka_broker.py for the order)."""
    try:
        address, release = find_broker()
    except NoBroker as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no Kafka broker in CI: {exc}")
        pytest.skip(f"no Kafka broker: {exc}")
    yield address
    release()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory):
    """A local three-broker KRaft cluster (``deploy/kafka/broker cluster``), started
    once for the session; a test that stops a broker starts it again before it ends."""
    from .support.kafka_broker import KafkaCluster, local_broker_tools_missing

    missing = local_broker_tools_missing()
    if missing:
        pytest.skip(missing)
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        cluster.start()
    except NoBroker as exc:
        cluster.stop(purge=True)
        if os.environ.get("CI"):
            pytest.fail(f"no Kafka cluster in CI: {exc}")
        pytest.skip(f"no Kafka cluster: {exc}")
    yield cluster
    cluster.stop(purge=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the broker log tail to a failing Kafka test."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)  # fixtures can look at their test's outcome
    if report.failed and "kafka" in item.keywords:
        report.sections.append(("local broker log (tail)", broker_log_tail()))


@pytest.fixture
def said():
    """A logger of the test's own, and the (level, message) of every line it says."""
    from .support.log_lines import private_logger

    return private_logger()


@pytest.fixture
def unique_name():
    """Factory of unique topic/group names, so tests never share state."""

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def new_topic(kafka_bootstrap, unique_name):
    """Factory: create a fresh topic with N partitions and return its name (deleted afterwards)."""
    from .support.kafka_helpers import create_topic, delete_topics

    made: list[str] = []

    def make(partitions: int = 4, prefix: str = "test") -> str:
        name = unique_name(prefix)
        asyncio.run(create_topic(kafka_bootstrap, name, partitions))
        made.append(name)
        return name

    yield make
    asyncio.run(delete_topics(kafka_bootstrap, made))


@pytest.fixture
def private_broker(tmp_path):
    """A local broker of the test's own (not started): for tests that stop and restart it,
    which the shared one must never be."""
    from .support.kafka_broker import PrivateBroker, local_broker_tools_missing

    missing = local_broker_tools_missing()
    if missing:
        pytest.skip(missing)
    broker = PrivateBroker(tmp_path / "broker")
    yield broker
    broker.stop(purge=True)


@pytest.fixture
def deployment(kafka_bootstrap, request):
    """A fresh specmeter deployment (own app id and topics, records topic with 4
    partitions); its workers are killed afterwards, their logs shown on failure."""
    from .support.kafka_helpers import create_topic
    from .support.worker_harness import Deployment

    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    yield d
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(d.log_tail())  # shown with the failure
    d.close()


def _cores():
    """The stage-1 cores to run a test on: the Python reference, and the native one
    (skipped where it is not built or SPECMETER_NO_NATIVE=1 switched it off)."""
    from specmeter.streams.core import cores

    native_missing = (
        "switched off by SPECMETER_NO_NATIVE" if cores.NATIVE_DISABLED else f"not built ({cores.NATIVE_IMPORT_ERROR})"
    )
    return [
        pytest.param(cores.PYTHON, id="python"),
        pytest.param(
            cores.NATIVE,
            id="native",
            marks=pytest.mark.skipif(cores.NATIVE is None, reason=f"native core {native_missing}"),
        ),
    ]


@pytest.fixture(scope="module", params=_cores())
def core(request):
    """A stage-1 core (``specmeter.streams.core.cores.Core``): run the test on each one."""
    return request.param
