"""The worker's topics: every one checked before any is created (issue 24.2), created
at the cluster's replication factor unless told otherwise, and a warning when one
has fewer replicas than the cluster has brokers (issue 21.1)."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid

import msgspec
import pytest

from specmeter.streams.settings import TopicNames, WorkerSettings
from specmeter.streams.worker.topics import (
    CLEANUP_CONFIGS,
    ClusterView,
    TopicMismatch,
    TopicShape,
    cleanup_warning,
    deletes_by_retention,
    ensure_topics,
    plan_topics,
    replication_warning,
    topic_configs,
    worker_topics,
)

from .support.kafka_helpers import create_topic
from .support.tools import run_specmeter


def _settings(bootstrap: str = "127.0.0.1:9092", name: str | None = None, **kwargs) -> WorkerSettings:
    name = name or f"tp-{uuid.uuid4().hex[:8]}"
    topics = TopicNames(
        records=f"{name}.records",
        partials=f"{name}.partials",
        metrics=f"{name}.metrics",
        deadletter=f"{name}.deadletter",
    )
    return WorkerSettings(broker=bootstrap, app_id=name, topics=topics, **kwargs)


def _view(topics: dict[str, tuple[int, int]], brokers: int = 1) -> ClusterView:
    return ClusterView(
        brokers={i: f"127.0.0.1:{9091 + i}" for i in range(1, brokers + 1)},
        topics={name: TopicShape(p, r) for name, (p, r) in topics.items()},
    )


# -- the plan, without a broker ------------------------------------------------------


def test_nothing_exists_so_everything_is_created_with_the_workers_count():
    settings = _settings(partitions=6)
    specs = worker_topics(settings)
    plan = plan_topics(specs, _view({}), 6)
    assert [s.name for s in plan.create] == [s.name for s in specs]
    assert not plan.mismatched
    assert {s.name: s.partitions for s in plan.create}[settings.topics.partials] == 6
    assert {s.name: s.partitions for s in plan.create}[settings.topics.metrics] == 1


def test_one_mismatch_names_the_count_every_existing_topic_agrees_on():
    """Issue 24.2's case: partials has 8, the new records topic is missing."""
    settings = _settings(partitions=4)
    specs = worker_topics(settings)
    plan = plan_topics(specs, _view({settings.topics.partials: (8, 1)}), 4)
    assert plan.mismatched == {settings.topics.partials: 8} and plan.agreed == 8
    error = TopicMismatch(plan, specs)
    assert f"topic {settings.topics.partials!r} has 8 partitions" in str(error)
    assert "--partitions 4" in str(error) and "nothing was created" in str(error)
    assert "--partitions 8" in error.fix and "SPECMETER_WORKER_PARTITIONS=8" in error.fix
    assert "--partials-topic" in error.fix  # the other way out


def test_existing_topics_that_disagree_leave_no_partition_count_to_suggest():
    settings = _settings(partitions=8)
    t = settings.topics
    specs = worker_topics(settings)
    plan = plan_topics(specs, _view({t.records: (4, 1), t.partials: (8, 1), t.metrics: (3, 1)}), 8)
    assert plan.mismatched == {t.records: 4} and plan.agreed is None  # metrics: any count is fine
    error = TopicMismatch(plan, specs)
    assert "--partitions 4" not in error.fix and "no --partitions fits" in error.fix
    assert "--records-topic" in error.fix and "delete" in error.fix
    # every mismatching topic is named in the one line
    plan = plan_topics(specs, _view({t.records: (4, 1), t.partials: (2, 1)}), 8)
    error = TopicMismatch(plan, specs)
    assert f"{t.records!r} has 4" in str(error) and f"{t.partials!r} has 2" in str(error)
    assert "--records-topic" in error.fix and "--partials-topic" in error.fix


@pytest.mark.parametrize(
    ("brokers", "replicas", "warned"),
    [
        (1, 1, False),  # a single node cannot hold more
        (2, 1, True),
        (2, 2, False),
        (3, 2, True),
        (3, 3, False),
        (5, 3, False),  # three is enough on a larger cluster
        (5, 2, True),
    ],
)
def test_replication_warning_compares_replicas_with_brokers_up_to_three(brokers, replicas, warned):
    settings = _settings()
    specs = worker_topics(settings)
    view = _view({s.name: (s.partitions, replicas) for s in specs}, brokers=brokers)
    warning = replication_warning(view, specs)
    assert (warning is not None) == warned, warning
    if warned:
        assert "\n" not in warning
        assert f"{settings.app_id}-stage1-state-changelog ({replicas})" in warning
        # state topics are named first
        assert warning.index("stage1-state-changelog") < warning.index(settings.topics.records)


@pytest.mark.parametrize(
    ("configs", "deletes"),
    [
        ({"cleanup.policy": "compact", "retention.ms": "86400000", "retention.bytes": "-1"}, False),
        ({"cleanup.policy": "delete", "retention.ms": "604800000", "retention.bytes": "-1"}, True),
        ({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}, True),
        ({"cleanup.policy": "compact,delete", "retention.ms": "604800000", "retention.bytes": "-1"}, True),
        ({"cleanup.policy": "delete,compact", "retention.ms": "-1", "retention.bytes": "-1"}, False),
        ({"cleanup.policy": "compact, delete", "retention.ms": "-1", "retention.bytes": "1073741824"}, True),
    ],
)
def test_what_deletes_by_retention(configs, deletes):
    assert deletes_by_retention(configs) is deletes


def test_the_metrics_topic_is_kept_compacted_and_a_deleting_one_is_one_line_saying_what_to_set():
    """Issue 33: the metrics topic kept the broker's default retention, and nothing said so."""
    settings = _settings()
    specs = worker_topics(settings)
    assert {s.name for s in specs if s.compacted} == {
        settings.topics.metrics,
        f"{settings.app_id}-stage1-state-changelog",
        f"{settings.app_id}-stage2-state-changelog",
    }
    compact = {"cleanup.policy": "compact", "retention.ms": "604800000", "retention.bytes": "-1"}
    configs = {s.name: compact for s in specs if s.compacted}
    assert cleanup_warning(specs, configs) is None
    configs[settings.topics.metrics] = {"cleanup.policy": "delete", "retention.ms": "86400000", "retention.bytes": "-1"}
    warning = cleanup_warning(specs, configs)
    assert warning is not None and "\n" not in warning
    assert f"{settings.topics.metrics} (cleanup.policy=delete, retention.ms=86400000)" in warning, warning
    assert warning.startswith("1 of the worker's topics delete messages by retention")
    assert "--add-config cleanup.policy=compact" in warning and "consume_metrics(from_beginning=True)" in warning


def test_replication_factor_defaults_to_the_clusters():
    assert WorkerSettings().replication_factor is None


@pytest.mark.parametrize(
    ("args", "env", "want"),
    [
        ([], {}, None),
        (["--replication-factor", "2"], {}, 2),
        ([], {"SPECMETER_WORKER_REPLICATION_FACTOR": "3"}, 3),
    ],
)
def test_the_replication_factor_flag_and_its_variable_reach_the_settings(monkeypatch, args, env, want):
    from click.testing import CliRunner

    import specmeter.streams.cli as cli
    import specmeter.streams.cli.preflight as preflight
    import specmeter.streams.worker.run as worker_module

    seen: list[WorkerSettings] = []
    monkeypatch.setattr(preflight, "check_before_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(worker_module, "run_worker", seen.append)
    result = CliRunner().invoke(cli.main, ["worker", "--no-web", "--broker", "127.0.0.1:1", *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen[0].replication_factor == want
    help_text = CliRunner().invoke(cli.main, ["worker", "--help"], terminal_width=200).output
    assert "SPECMETER_WORKER_REPLICATION_FACTOR" in help_text and "default.replication.factor" in help_text


# -- against a real broker ------------------------------------------------------------


_specmeter = functools.partial(run_specmeter, timeout=120)


async def _existing(bootstrap: str, names: list[str]) -> dict[str, tuple[int, int]]:
    from aiokafka.admin import AIOKafkaAdminClient

    from specmeter.streams.worker.topics import describe_cluster

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        view = await describe_cluster(admin, names)
    finally:
        await admin.close()
    return {name: (shape.partitions, shape.replicas) for name, shape in view.topics.items()}


def _visible(bootstrap: str, names: list[str], timeout_s: float = 15.0) -> dict[str, tuple[int, int]]:
    """``_existing`` once every one of ``names`` shows: a broker learns of a topic
    another broker's controller just created a moment later."""
    import time

    deadline = time.monotonic() + timeout_s
    found = asyncio.run(_existing(bootstrap, names))
    while len(found) < len(names) and time.monotonic() < deadline:
        time.sleep(0.2)
        found = asyncio.run(_existing(bootstrap, names))
    return found


def _worker_args(settings: WorkerSettings, *extra: str) -> list[str]:
    t = settings.topics
    return [
        "worker",
        "--broker",
        settings.broker,
        "--app-id",
        settings.app_id,
        "--records-topic",
        t.records,
        "--partials-topic",
        t.partials,
        "--metrics-topic",
        t.metrics,
        "--deadletter-topic",
        t.deadletter,
        "--no-web",
        *extra,
    ]


@pytest.mark.kafka
def test_a_partition_mismatch_creates_nothing_and_names_the_way_out(kafka_bootstrap):
    """Issue 24.2: ``--partitions 4 --records-topic other.records`` where partials has 8
    created other.records with 4 partitions, then refused; asked for 8 it refused again."""
    settings = _settings(kafka_bootstrap, partitions=4)
    asyncio.run(create_topic(kafka_bootstrap, settings.topics.partials, 8))
    names = [s.name for s in worker_topics(settings)]

    proc = _specmeter(*_worker_args(settings, "--partitions", "4"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"topic {settings.topics.partials!r} has 8 partitions" in lines[0]
    assert "--partitions 8" in lines[1] and "SPECMETER_WORKER_PARTITIONS=8" in lines[1]
    assert asyncio.run(_existing(kafka_bootstrap, names)) == {settings.topics.partials: (8, 1)}, "nothing created"

    # the way it names works: every topic is made with 8, none refused
    made = asyncio.run(ensure_topics(msgspec.structs.replace(settings, partitions=8)))
    assert made.topics[settings.topics.records].partitions == 8


@pytest.mark.kafka
def test_topics_that_disagree_are_all_named_and_nothing_is_created(kafka_bootstrap):
    settings = _settings(kafka_bootstrap, partitions=8)
    asyncio.run(create_topic(kafka_bootstrap, settings.topics.records, 4))
    asyncio.run(create_topic(kafka_bootstrap, settings.topics.partials, 8))
    names = [s.name for s in worker_topics(settings)]
    for partitions, other in (("8", "4"), ("4", "8")):
        proc = _specmeter(*_worker_args(settings, "--partitions", partitions))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 2, proc.stderr
        assert f"has {other} partitions" in lines[0] and "no --partitions fits" in lines[1], lines
        assert "--records-topic" in lines[1] or "--partials-topic" in lines[1], lines
    assert set(asyncio.run(_existing(kafka_bootstrap, names))) == {settings.topics.records, settings.topics.partials}
    with pytest.raises(TopicMismatch):  # the library refuses before creating, too
        asyncio.run(ensure_topics(settings))
    assert set(asyncio.run(_existing(kafka_bootstrap, names))) == {settings.topics.records, settings.topics.partials}


def _configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    from aiokafka.admin import AIOKafkaAdminClient

    async def read() -> dict[str, dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await topic_configs(admin, names, CLEANUP_CONFIGS)
        finally:
            await admin.close()

    return asyncio.run(read())


@pytest.mark.kafka
def test_the_metrics_topic_is_created_compacted_and_an_existing_deleting_one_is_warned_about(kafka_bootstrap, caplog):
    settings = _settings(kafka_bootstrap, partitions=2)
    with caplog.at_level(logging.WARNING, logger="specmeter.topics"):
        asyncio.run(ensure_topics(settings))
    assert _configs(kafka_bootstrap, [settings.topics.metrics])[settings.topics.metrics]["cleanup.policy"] == "compact"
    assert not [r for r in caplog.records if r.name == "specmeter.topics"], caplog.text

    # a metrics topic that an administrator (or a worker before issue 33) made with the default policy
    other = _settings(kafka_bootstrap, partitions=2)
    asyncio.run(create_topic(kafka_bootstrap, other.topics.metrics, 1))
    assert _visible(kafka_bootstrap, [other.topics.metrics]), "the broker knows the topic before the worker looks"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specmeter.topics"):
        asyncio.run(ensure_topics(other))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "specmeter.topics"]
    assert warning.startswith("1 of the worker's topics delete messages by retention where they must keep"), warning
    assert f"{other.topics.metrics} (cleanup.policy=delete, retention.ms=" in warning
    assert "--add-config cleanup.policy=compact" in warning


@pytest.mark.kafka
def test_a_state_changelog_that_deletes_by_retention_refuses_the_start(kafka_bootstrap):
    """Issue 37.5: with ``compact,delete`` retention removes old takeover records while
    their owners' records remain, which then stop counting: the worker used to warn and
    run on; it now refuses to start, saying which topic and how to fix it."""
    from specmeter.streams.core.layout import changelog_topics
    from specmeter.streams.worker.topics import ChangelogDeletes

    settings = _settings(kafka_bootstrap, partitions=2)
    stage1_log, _ = changelog_topics(settings.app_id)
    deleting = {"cleanup.policy": "compact,delete", "retention.ms": "604800000"}
    asyncio.run(create_topic(kafka_bootstrap, stage1_log, 2, topic_configs=deleting))
    assert _visible(kafka_bootstrap, [stage1_log])
    with pytest.raises(ChangelogDeletes) as refused:
        asyncio.run(ensure_topics(settings))
    assert f"{stage1_log} (cleanup.policy=compact,delete)" in str(refused.value)
    assert "--add-config cleanup.policy=compact" in (refused.value.fix or "")


# -- against a three-broker cluster ---------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_topics_get_the_clusters_replication_factor(kafka_cluster, caplog):
    settings = _settings(kafka_cluster.bootstrap, partitions=3)
    names = [s.name for s in worker_topics(settings)]
    with caplog.at_level(logging.WARNING, logger="specmeter.topics"):
        asyncio.run(ensure_topics(settings))
    assert _visible(kafka_cluster.bootstrap, names) == {s.name: (s.partitions, 3) for s in worker_topics(settings)}
    assert not [r for r in caplog.records if r.name == "specmeter.topics"], caplog.text


@pytest.mark.kafka
@pytest.mark.slow
def test_a_replication_factor_below_the_clusters_is_warned_about(kafka_cluster, caplog):
    settings = _settings(kafka_cluster.bootstrap, partitions=2, replication_factor=1)
    with caplog.at_level(logging.WARNING, logger="specmeter.topics"):
        asyncio.run(ensure_topics(settings))
    (warning,) = [r for r in caplog.records if r.name == "specmeter.topics" and r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert "6 of the worker's topics have fewer replicas than the cluster's 3 brokers" in text, text
    assert f"{settings.app_id}-stage1-state-changelog (1)" in text and "give them 3 replicas" in text
    names = [s.name for s in worker_topics(settings)]
    found = _visible(kafka_cluster.bootstrap, names)
    assert len(found) == len(names) and {r for _, r in found.values()} == {1}


@pytest.mark.kafka
@pytest.mark.slow
def test_a_replication_factor_the_cluster_cannot_hold_is_one_line(kafka_cluster):
    settings = _settings(kafka_cluster.bootstrap, partitions=2)
    proc = _specmeter(*_worker_args(settings, "--partitions", "2", "--replication-factor", "5"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 2, proc.stderr
    assert "InvalidReplicationFactorError" in lines[0] and "--replication-factor" in lines[1], lines
    names = [s.name for s in worker_topics(settings)]
    assert asyncio.run(_existing(kafka_cluster.bootstrap, names)) == {}


def test_a_created_topic_is_settled_once_each_of_its_partitions_has_a_leader():
    """The worker's consumers ask offsets as soon as the topics are checked (before Faust is
    imported, ``worker.early``): a partition just created whose leader the metadata does not
    name yet would fail that, logged as a broker away. Existing topics are not waited for (a
    broker away at start is the outage watch's to say)."""
    from specmeter.streams.worker.topics import _settled

    shape = TopicShape(4, 1)
    view = ClusterView(brokers={1: "b:9092"}, topics={"a": shape, "b": shape}, leaderless=frozenset({"a"}))
    assert not _settled(view, ["a", "b"], created={"a"})
    assert _settled(view, ["a", "b"], created={"b"})  # "a" existed: not waited for
    assert not _settled(msgspec.structs.replace(view, topics={"b": shape}, leaderless=frozenset()), ["a", "b"], set())
    assert _settled(msgspec.structs.replace(view, leaderless=frozenset()), ["a", "b"], created={"a", "b"})
