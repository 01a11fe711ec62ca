"""Revision 2 on a real broker and a real worker: a restarted run never merges into
its old batches, limits hold at ingress, no output is dropped for its size, an
invalid marker is counted nowhere."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from specmeter.producers import partition_for_key
from specmeter.schemas import MAX_ID, BatchMarker, GenerationRecord, RecordBatch, encode_records_message

from .support.kafka_helpers import send_to_partitions

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _records_of(
    run_id: str | None,
    batch_id: str,
    sessions: int,
    accepted: int,
    partitions: int,
    producer: str = "trainer-0",
    extra_sent: dict[int, int] | None = None,
) -> list[tuple[int, bytes]]:
    """One packed message per partition, as the publisher sends them, and a marker to each."""
    by_partition: dict[int, list[GenerationRecord]] = {}
    for i in range(sessions):
        session = f"sess-{i}"
        record = GenerationRecord(
            batch_id=batch_id,
            session_id=session,
            generation_id="g",
            accepted=accepted,
            proposed=4,
            verify=1,
            completion=5,
            weight_version=f"v{i % 2}",
        )
        by_partition.setdefault(partition_for_key(session.encode(), partitions), []).append(record)
    items = [
        (p, encode_records_message(RecordBatch(records=rs, producer_id=producer, run_id=run_id)))
        for p, rs in by_partition.items()
    ]
    items += [
        (
            p,
            encode_records_message(
                BatchMarker(
                    batch_id=batch_id,
                    producer_id=producer,
                    run_id=run_id,
                    records_sent=len(by_partition.get(p, [])) + (extra_sent or {}).get(p, 0),
                    speculative_algorithm="EAGLE",
                )
            ),
        )
        for p in range(partitions)
    ]
    return items


def _latest(published) -> dict:
    latest = {}
    for m in published:
        key = (m.run_id, m.batch_id)
        if key not in latest or m.revision > latest[key].revision:
            latest[key] = m
    return latest


def test_a_restarted_run_gets_its_own_batches(deployment):
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    parts = deployment.partitions
    asyncio.run(
        send_to_partitions(
            deployment.bootstrap,
            deployment.topics.records,
            _records_of("attempt-1", "step-1", 12, accepted=1, partitions=parts),
        )
    )

    def has(*keys):
        return lambda ms: set(keys) <= {(m.run_id, m.batch_id) for m in ms if m.complete}

    deployment.metrics(until=has(("attempt-1", "step-1")), timeout_s=60)
    # the job restarts from a checkpoint and regenerates step-1 (and a default-run step-1 too)
    asyncio.run(
        send_to_partitions(
            deployment.bootstrap,
            deployment.topics.records,
            _records_of("attempt-2", "step-1", 8, accepted=3, partitions=parts)
            + _records_of(None, "step-1", 4, accepted=2, partitions=parts),
        )
    )
    published = deployment.metrics(
        until=has(("attempt-1", "step-1"), ("attempt-2", "step-1"), (None, "step-1")), timeout_s=60
    )
    latest = _latest(published)
    one, two, default = latest[("attempt-1", "step-1")], latest[("attempt-2", "step-1")], latest[(None, "step-1")]
    assert one.revision == 0 and one.late_record_count == 0  # never touched by the new attempt
    assert (one.metrics["spec/accepted_total"], one.record_count) == (12, 12)
    assert (two.metrics["spec/accepted_total"], two.record_count) == (24, 8)
    assert (default.metrics["spec/accepted_total"], default.record_count) == (8, 4)
    assert all(m.complete and m.missing_record_count == 0 for m in (one, two, default))
    assert [e.weight_version for e in two.by_weight_version] == ["v0", "v1"]
    assert sum(e.metrics["spec/accepted_total"] for e in two.by_weight_version) == 24
    assert not [d for d in deployment.dead_letters(idle_s=1.0) if d.reason == "late"]
    assert worker.poll() is None


def test_limits_hold_at_ingress_and_every_output_is_bounded(deployment):
    """A 1,000,000-character batch_id, counters near 2^63 and an oversized marker id:
    each is dead-lettered (bounded), nothing is published or logged at its size,
    nothing jams, and the ordinary batch after them is exact."""
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    parts = deployment.partitions
    huge = {
        "type": "record",
        "batch_id": "b" * 1_000_000,
        "session_id": "s",
        "generation_id": "g",
        "accepted": 1,
        "proposed": 2,
    }
    near_max = [
        {
            "type": "record",
            "batch_id": "step-2",
            "session_id": "sess-0",
            "generation_id": f"x{i}",
            "accepted": 2**63 - 1,
            "proposed": 2**63 - 1,
            "verify": 2**63 - 1,
            "completion": 2**63 - 1,
            "producer_id": "trainer-0",
        }
        for i in range(3)
    ]
    bad_marker = {"type": "marker", "batch_id": "step-2" + "x" * MAX_ID, "producer_id": "trainer-0"}
    session_partition = partition_for_key(b"sess-0", parts)
    hostile = [(0, msgspec.msgpack.encode(huge))]
    hostile += [(session_partition, msgspec.msgpack.encode(r)) for r in near_max]
    hostile += [(p, msgspec.msgpack.encode(bad_marker)) for p in range(parts)]
    # the three invalid records count in the producer's marker: it sent them
    ordinary = _records_of(None, "step-2", 12, accepted=1, partitions=parts, extra_sent={session_partition: 3})
    asyncio.run(send_to_partitions(deployment.bootstrap, deployment.topics.records, hostile + ordinary))
    published = deployment.metrics(
        until=lambda ms: any(m.batch_id == "step-2" and m.complete for m in ms), timeout_s=60
    )
    (step2,) = [m for m in _latest(published).values() if m.batch_id == "step-2"]
    assert step2.record_count == 12 + 3 and step2.invalid_record_count == 3  # the markers count nowhere
    assert step2.metrics["spec/accepted_total"] == 12 and step2.missing_record_count == 0
    assert all(len(m.batch_id) <= MAX_ID for m in published)
    letters = deployment.dead_letters(idle_s=2.0)
    assert sorted((d.reason, str(d.batch_id)) for d in letters) == sorted(
        [("invalid", "None")] * (1 + parts) + [("invalid", "step-2")] * 3
    )
    assert all(len(d.raw) <= 256 * 1024 for d in letters)
    assert worker.poll() is None
    log = deployment.log_tail(chars=10_000_000)
    assert "MessageSizeTooLarge" not in log and "Traceback" not in log
    assert len(log) < 200_000, f"the worker logged {len(log)} characters"


def test_an_output_the_broker_refuses_stops_the_worker_with_a_clear_error(deployment):
    """Never logged and skipped: the worker exits non-zero and says what to do."""
    import subprocess

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def tiny_metrics_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(
                        deployment.topics.metrics,
                        num_partitions=1,
                        replication_factor=1,
                        topic_configs={"max.message.bytes": "200"},
                    )
                ]
            )
        finally:
            await admin.close()

    asyncio.run(tiny_metrics_topic())
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    asyncio.run(
        send_to_partitions(
            deployment.bootstrap,
            deployment.topics.records,
            _records_of(None, "step-1", 4, accepted=1, partitions=deployment.partitions),
        )
    )
    try:
        code = worker.wait(90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker kept running after a refused output:\n{deployment.log_tail()}")
    log = deployment.log_tail()
    assert code != 0, log
    assert "specmeter worker: producing to" in log and "MessageSizeTooLarge" in log and "Operator action" in log


def test_the_topics_the_worker_writes_accept_its_largest_outputs(deployment):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from specmeter.streams.core.layout import changelog_topics

    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    t = deployment.topics
    written = [t.partials, t.metrics, t.deadletter, *changelog_topics(deployment.name)]

    async def limits() -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap)
        await admin.start()
        try:
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, {"max.message.bytes": None}) for name in written]
            )
        finally:
            await admin.close()
        out = {}
        for response in responses:
            for _, _, _, topic, configs in response.resources:
                out.update((topic, value) for key, value, *_rest in configs if key == "max.message.bytes")
        return out

    assert asyncio.run(limits()) == {name: str(16 * 1024 * 1024) for name in written}
