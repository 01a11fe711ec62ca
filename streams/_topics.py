"""Creating and checking the worker's topics with aiokafka's admin client."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .settings import WorkerSettings

__all__ = ["ensure_topics", "create_topic", "existing_partitions", "leader_topic", "TopicMismatch"]

log = logging.getLogger("specmeter.topics")


class TopicMismatch(RuntimeError):
    """A topic exists with a partition count the worker cannot use."""


async def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    kafka: dict | None = None,
    topic_configs: dict[str, str] | None = None,
) -> None:
    """Create one topic (for tools, tests and benchmarks; the worker uses ``ensure_topics``).

    ``topic_configs``: Kafka topic settings, e.g. ``{"message.timestamp.type": "LogAppendTime"}``.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(kafka or {}))
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=topic_configs or {},
                )
            ]
        )
    finally:
        await admin.close()


async def existing_partitions(admin: Any, names: Iterable[str]) -> dict[str, int]:
    """Partitions of each of ``names`` that exists, asked for those names alone.

    ``list_topics`` fetches the metadata of every topic of the cluster, decoded in
    Python: on a broker holding a few thousand topics that took a worker's start-up
    0.3 s per call. The metadata request for named topics must not create them
    (``auto.create.topics.enable`` would, with the broker's default partition
    count), which aiokafka's ``describe_topics`` does not ask for
    (``_internals.metadata_without_auto_create``; ``tests/test_stream_app.py`` checks
    it against a real broker).
    """
    from ._internals import metadata_without_auto_create

    wanted = sorted(set(names))
    if not wanted:
        return {}
    response = await metadata_without_auto_create(admin, wanted)
    return {
        t["topic"]: len(t["partitions"]) for t in response["topics"] if t.get("error_code", 0) == 0 and t["partitions"]
    }


def leader_topic(app_id: str) -> str:
    """Faust's partition-assignor topic (one partition); created here because the
    worker runs Faust with ``topic_allow_declare=False``: Faust would otherwise ask
    to create every topic at start, which needs the Create right even when it exists."""
    return f"{app_id}-__assignor-__leader"


async def ensure_topics(settings: WorkerSettings) -> dict[str, int]:
    """Create missing topics; return partitions per topic.

    Raises:
        TopicMismatch: the records topic exists with another partition count
            than ``settings.partitions`` (state topics must match it).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    from ._changelog import changelog_topics

    t = settings.topics
    stage1_log, stage2_log = changelog_topics(settings.app_id)
    wanted = {
        t.records: settings.partitions,
        t.partials: settings.partitions,
        t.metrics: 1,
        t.deadletter: 1,
        stage1_log: settings.partitions,
        stage2_log: settings.partitions,
        leader_topic(settings.app_id): 1,
    }
    compacted = {stage1_log, stage2_log}
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.broker, **settings.security.aiokafka_kwargs())
    await admin.start()
    try:
        have = await existing_partitions(admin, wanted)
        # the topics the worker writes take what its producer may send in one request: a
        # chunk's state delta, or a BatchMetrics with 64 weight versions' full histograms,
        # can pass the broker's 1 MiB default
        written = {"max.message.bytes": str(2 * max(settings.max_message_bytes, 1_048_576))}
        missing = [
            NewTopic(
                name,
                num_partitions=n,
                replication_factor=settings.replication_factor,
                topic_configs={
                    "cleanup.policy": "compact" if name in compacted else "delete",
                    **(written if name != t.records else {}),
                },
            )
            for name, n in wanted.items()
            if name not in have
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
            log.info("created topics: %s", ", ".join(f"{m.name}({m.num_partitions})" for m in missing))
        if missing:  # what we just created must be visible with the right shape
            created = await admin.describe_topics([m.name for m in missing])
            have.update({d["topic"]: len(d["partitions"]) for d in created if d["partitions"]})
        for name in (t.records, t.partials, stage1_log, stage2_log):
            if name in have and have[name] != settings.partitions:
                raise TopicMismatch(
                    f"topic {name!r} has {have[name]} partitions but the worker runs with partitions="
                    f"{settings.partitions}: start it with --partitions {have[name]} (state topics must match)"
                )
        return {name: have.get(name, n) for name, n in wanted.items()}
    finally:
        await admin.close()
