"""The worker against a real broker: exact metrics, crashes, rebalances, timeouts,
late records and the accounting of every input message."""

from __future__ import annotations

import asyncio
import time

import pytest

from .support.golden_cases import assert_metrics_equal
from .support.kafka_helpers import create_topic
from .support.worker_harness import (
    JUNK,
    Deployment,
    assert_conserved,
    assert_matches_offline,
    fleet_events,
    latest_by_batch,
    produced_records,
    publish_events,
    wait_complete,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_random_streams_match_offline_aggregate(deployment):
    events = fleet_events(seed=11)
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events, junk=JUNK))
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert_matches_offline(published, events)
    # every input message is accounted for
    letters = deployment.dead_letters()
    assert_conserved(produced_records(events) + len(JUNK), published, letters)
    unbatched = [d for d in letters if d.batch_id is None]
    assert {d.reason for d in unbatched} <= {"invalid", "undecodable"} and len(unbatched) == len(JUNK)
    assert len(letters) == sum(1 for e in events if e.kind == "invalid") + len(JUNK)


def test_sigkill_mid_batch_then_restart_changes_nothing(deployment):
    events = fleet_events(seed=12)
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    half = len(events) // 2
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[:half]))
    time.sleep(1.5)  # let it process (and checkpoint) part of the stream
    deployment.kill(worker)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[half:]))
    worker = deployment.start_worker()
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert_matches_offline(published, events)
    assert_conserved(produced_records(events), published, deployment.dead_letters())


def test_second_worker_joins_mid_stream(deployment):
    events = fleet_events(seed=13)
    first = deployment.start_worker()
    deployment.wait_ready(first)
    third = len(events) // 3
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[:third]))
    second = deployment.start_worker()
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[third : 2 * third]))
    deployment.wait_ready(second)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[2 * third :]))
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert_matches_offline(published, events)
    assert_conserved(produced_records(events), published, deployment.dead_letters())


def test_stopping_one_of_two_workers(deployment):
    events = fleet_events(seed=14)
    first, second = deployment.start_worker(), deployment.start_worker()
    deployment.wait_ready(first)
    deployment.wait_ready(second)
    half = len(events) // 2
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[:half]))
    time.sleep(1.0)
    deployment.stop(second)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[half:]))
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert_matches_offline(published, events)
    assert_conserved(produced_records(events), published, deployment.dead_letters())


def test_timeout_then_late_within_grace_then_after_grace(kafka_bootstrap):
    from specmeter.schemas import GenerationRecord
    from specmeter.streams import OfflineAggregator

    d = Deployment(kafka_bootstrap, batch_timeout_s=2.0, grace_s=8.0)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        worker = d.start_worker()
        d.wait_ready(worker)

        def record(session: str, generation: str, accepted: int) -> GenerationRecord:
            return GenerationRecord(
                batch_id="lonely",
                session_id=session,
                generation_id=generation,
                accepted=accepted,
                proposed=10,
                verify=4,
                completion=accepted + 4,
                producer_id="p0",
            )

        from specmeter.streams.fleet.synthetic import FleetEvent

        first = [FleetEvent("record", "p0", "lonely", record(f"s{i}", "g", i)) for i in range(6)]
        asyncio.run(publish_events(kafka_bootstrap, d.topics.records, first))  # no marker: never completes
        published = d.metrics(until=lambda ms: any(m.batch_id == "lonely" for m in ms), timeout_s=60)
        (first_pub,) = [m for m in published if m.batch_id == "lonely"]
        assert first_pub.revision == 0 and first_pub.close_reason == "timeout" and not first_pub.complete
        assert first_pub.partitions_reported < first_pub.partitions_expected == 4
        offline = OfflineAggregator()
        for e in first:
            offline.feed(e.payload)
        assert_metrics_equal(first_pub.metrics, offline.results()[0].metrics, "revision 0")

        # a late record within grace: revision 1, corrected numbers
        late = FleetEvent("record", "p0", "lonely", record("s0", "g-late", 9))
        asyncio.run(publish_events(kafka_bootstrap, d.topics.records, [late]))
        published = d.metrics(until=lambda ms: any(m.batch_id == "lonely" and m.revision == 1 for m in ms))
        second = latest_by_batch(published)["lonely"]
        assert second.revision == 1 and second.late_record_count == 1
        offline.feed(late.payload)
        assert_metrics_equal(second.metrics, offline.results()[0].metrics, "revision 1")
        assert second.metrics["spec/unique_generation_count"] == first_pub.metrics["spec/unique_generation_count"] + 1

        # after grace: dead-lettered as late, nothing republished
        time.sleep(9.0)
        too_late = FleetEvent("record", "p0", "lonely", record("s0", "g-too-late", 3))
        asyncio.run(publish_events(kafka_bootstrap, d.topics.records, [too_late]))
        letters = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not letters:
            letters = [x for x in d.dead_letters(idle_s=1.0) if x.reason == "late"]
        assert len(letters) == 1 and letters[0].batch_id == "lonely"
        assert letters[0].source_topic == d.topics.records and letters[0].source_offset is not None
        assert latest_by_batch(d.metrics(idle_s=1.0))["lonely"].revision == 1
    finally:
        d.close()


def test_readme_main_job(kafka_bootstrap):
    """`deploy/dev demo` runs this module: worker, sample replay, metrics equal to offline."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.demo", "--json", "--timeout", "120"],
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    batches = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [b["batch_id"] for b in batches] == ["step-00000", "step-00001", "step-00002"]
    assert all(b["complete"] and b["speculative"] for b in batches)
    assert "every batch matches `specmeter aggregate`" in proc.stderr


def test_asking_for_named_topics_neither_lists_the_cluster_nor_creates_a_missing_one(kafka_bootstrap, monkeypatch):
    from aiokafka.admin import AIOKafkaAdminClient

    from specmeter.streams.worker.topics import existing_partitions

    name = f"named-{time.time_ns()}"
    asyncio.run(create_topic(kafka_bootstrap, f"{name}.present", 3))

    def refuse(*args, **kwargs):
        raise AssertionError("list_topics fetches every topic of the cluster")

    monkeypatch.setattr(AIOKafkaAdminClient, "list_topics", refuse)

    async def ask() -> tuple[dict[str, int], dict[str, int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            first = await existing_partitions(admin, [f"{name}.present", f"{name}.missing"])
            return first, await existing_partitions(admin, [f"{name}.missing"])
        finally:
            await admin.close()

    first, again = asyncio.run(ask())
    assert first == {f"{name}.present": 3}
    assert again == {}  # asking did not create it


def test_topics_are_created_with_the_workers_partition_count(kafka_bootstrap):
    """Not the broker's default (4 here): describing a missing topic must not auto-create it."""
    from specmeter.streams.core.layout import changelog_topics
    from specmeter.streams.settings import TopicNames, WorkerSettings
    from specmeter.streams.worker.topics import TopicMismatch, ensure_topics

    name = f"topics-{time.time_ns()}"
    topics = TopicNames(
        records=f"{name}.records",
        partials=f"{name}.partials",
        metrics=f"{name}.metrics",
        deadletter=f"{name}.deadletter",
    )
    settings = WorkerSettings(broker=kafka_bootstrap, app_id=name, topics=topics, partitions=6)
    made = asyncio.run(ensure_topics(settings))
    for topic in (topics.records, topics.partials, *changelog_topics(name)):
        assert made.topics[topic].partitions == 6, (topic, made.topics[topic])
    import msgspec

    with pytest.raises(TopicMismatch, match=r"--partitions 3 but topics .* have 6 partitions") as refused:
        asyncio.run(ensure_topics(msgspec.structs.replace(settings, partitions=3)))
    assert "--partitions 6" in refused.value.fix
