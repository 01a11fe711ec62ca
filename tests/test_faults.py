"""Faults against a real broker: the worker killed at seeded crash points, the
broker stopped under a running fleet, hostile bytes and floods at a running
worker. Every test ends with exact results and every record accounted for."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time

import msgspec
import pytest

from specmeter.streams.worker.faults import CRASH_POINTS

from .support.worker_harness import (
    assert_conserved,
    assert_matches_offline,
    fleet_events,
    latest_by_batch,
    produced_records,
    publish_events,
    wait_complete,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: the crash plan's seed; set SPECMETER_CRASH_SEED to explore other plans
CRASH_SEED = int(os.environ.get("SPECMETER_CRASH_SEED", "20261202"))


def _crash_plan(seed: int, kills: int) -> list[tuple[str, int]]:
    """Every crash point at least once, the rest drawn at random; each armed for
    its n-th pass (n small enough that the slice of input it sees reaches it)."""
    rnd = random.Random(seed)
    points = list(CRASH_POINTS) + rnd.choices(CRASH_POINTS, k=kills - len(CRASH_POINTS))
    rnd.shuffle(points)
    return [
        (
            p,
            rnd.randint(1, 3)
            if p in ("stage1-processed", "stage1-changelog")
            else rnd.randint(1, 2)
            if p == "stage1-partials"
            else 1,
        )
        for p in points
    ]


@pytest.mark.timeout(900)
def test_sigkill_at_seeded_crash_points_changes_nothing(deployment):
    """Ten kills, one per batch of input: each worker arms one crash point
    (SPECMETER_CRASH_AT) and is SIGKILLed there, the next one starts from the
    durable state. The final metrics equal the offline result, repeated output
    is identical per (batch, revision), and no record is lost or counted twice."""
    plan = _crash_plan(CRASH_SEED, kills=10)
    events = fleet_events(seed=31, batches=len(plan), sessions=12)
    slices: dict[str, list] = {}
    for event in events:
        slices.setdefault(event.batch_id, []).append(event)
    reached = []
    for (point, n), part in zip(plan, slices.values(), strict=False):
        started = time.monotonic()
        worker = deployment.start_worker(env={"SPECMETER_CRASH_AT": f"{point}:{n}"})
        asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, part))
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            deployment.kill(worker)  # not reached in time: still a kill at a random point
        else:
            assert worker.returncode == -9, deployment.log_tail()
        hit = f"crash point {point} reached" in deployment.logs[-1].read_text(errors="replace")
        if hit:
            reached.append(point)
        print(
            f"{point}:{n} {'reached' if hit else 'not reached, killed from outside'} "
            f"after {time.monotonic() - started:.1f}s"
        )
    assert set(reached) == set(CRASH_POINTS), f"points never reached: {set(CRASH_POINTS) - set(reached)}"
    assert len(reached) >= 8, f"only {len(reached)} of {len(plan)} crash points reached: {reached}"
    deployment.start_worker()
    published = wait_complete(deployment, set(slices), timeout_s=120)
    assert_matches_offline(published, events)
    assert_conserved(produced_records(events), published, deployment.dead_letters())


def hostile_messages(seed: int) -> list[bytes]:
    """Seeded hostile records-topic messages, each rejected whole: random bytes,
    truncated msgpack, a huge string, deep nesting, wrong types, negative and huge
    counters, unknown tags, a broken marker."""
    rnd = random.Random(seed)
    good = msgspec.msgpack.encode(
        {
            "type": "record",
            "batch_id": "hostile",
            "session_id": "s",
            "generation_id": "g",
            "accepted": 3,
            "proposed": 8,
            "verify": 3,
            "completion": 6,
            "producer_id": "evil",
        }
    )
    out = [rnd.randbytes(rnd.randint(1, 400)) for _ in range(40)]
    out += [good[: rnd.randint(1, len(good) - 1)] for _ in range(20)]
    out.append(
        msgspec.msgpack.encode(
            {"type": "record", "batch_id": "hostile", "session_id": "s" * 300_000, "generation_id": "g"}
        )
    )  # over --max-message-bytes
    out.append(b"\x91" * 50_000 + b"\xc0")  # 50k nested arrays
    out.append(b"\x81\xa1a" * 20_000 + b"\xc0")  # 20k nested maps
    for field, value in (
        ("session_id", 7),
        ("accepted", -5),
        ("proposed", 2**64 - 1),
        ("verify", "three"),
        ("accept_histogram", [1, -1]),
        ("completion", 1.5),
        ("generation_id", None),
    ):
        out.append(
            msgspec.msgpack.encode(
                {"type": "record", "batch_id": "hostile", "session_id": "s", "generation_id": "g", field: value}
            )
        )
    out.append(msgspec.msgpack.encode({"type": "nonsuch", "batch_id": "hostile"}))
    out.append(
        msgspec.msgpack.encode(
            {"type": "marker", "batch_id": "hostile", "producer_id": "evil", "expected_producers": "all"}
        )
    )
    out.append(msgspec.msgpack.encode([1, 2, 3]))
    return out


def test_hostile_input_at_a_running_worker_is_dead_lettered_and_nothing_else_changes(deployment):
    """The worker survives every hostile message, dead-letters each with a reason
    (and a bounded copy of its bytes), and still gets the good batches exact."""
    hostile = hostile_messages(seed=7)
    events = fleet_events(seed=41, batches=2, sessions=12)
    worker = deployment.start_worker("--max-message-bytes", "65536")
    deployment.wait_ready(worker)
    half = len(events) // 2
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[:half], junk=hostile))
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, events[half:]))
    published = wait_complete(deployment, {e.batch_id for e in events})
    assert worker.poll() is None, "the worker died on input"
    good = [m for m in published if m.batch_id != "hostile"]
    assert_matches_offline(good, events)
    letters = [d for d in deployment.dead_letters() if d.batch_id != "s41-b00000" and d.batch_id != "s41-b00001"]
    assert len(letters) == len(hostile), sorted(d.reason for d in letters)
    assert all(d.reason in {"undecodable", "invalid", "too_large"} and d.detail for d in letters)
    by_raw = {d.raw: d for d in letters}
    for message in hostile:
        if len(message) > 65536:
            (big,) = [d for d in letters if d.reason == "too_large"]
            assert message.startswith(big.raw) and "offset" in big.detail
        else:
            assert message in by_raw, message[:60]
    # the invalid records that named batch "hostile" are counted there (it closes on timeout)
    hostile_batch = [
        m
        for m in deployment.metrics(until=lambda ms: any(m.batch_id == "hostile" for m in ms), timeout_s=60)
        if m.batch_id == "hostile"
    ]
    assert hostile_batch and hostile_batch[-1].close_reason == "timeout"
    assert_conserved(produced_records(events) + len(hostile), published + hostile_batch, deployment.dead_letters())


def test_a_flood_of_unique_keys_is_cut_at_the_open_generation_limit(deployment):
    """One batch floods 40k unique generations past a 5k limit and never closes;
    it is published early as incomplete, its later records are dead-lettered as
    overflow, a normal batch beside it is exact, and every record is accounted for."""
    from specmeter.schemas import GenerationRecord
    from specmeter.streams.fleet.synthetic import FleetEvent

    flood = [
        FleetEvent(
            "record",
            "p-flood",
            "flood",
            GenerationRecord(
                batch_id="flood",
                session_id=f"s{i}",
                generation_id="g",
                accepted=i % 5,
                proposed=8,
                verify=3,
                completion=(i % 5) + 3,
                producer_id="p-flood",
            ),
        )
        for i in range(40_000)
    ]
    events = fleet_events(seed=42, batches=1, sessions=12)
    worker = deployment.start_worker("--max-open-generations", "5000")
    deployment.wait_ready(worker)
    asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, flood + events))
    published = wait_complete(deployment, {e.batch_id for e in events})
    flooded = deployment.metrics(
        until=lambda ms: any(m.batch_id == "flood" and m.partitions_reported == 4 for m in ms), timeout_s=60
    )
    latest = latest_by_batch(flooded)["flood"]
    assert latest.close_reason == "incomplete" and not latest.complete, latest
    assert latest.record_count <= 4 * 5000  # each partition cut at its limit
    assert_matches_offline([m for m in published if m.batch_id != "flood"], events)
    letters = deployment.dead_letters()
    overflow = [d for d in letters if d.reason == "overflow"]
    assert overflow and all(d.batch_id == "flood" and "--max-open-generations" in d.detail for d in overflow)
    breakdown = assert_conserved(produced_records(events) + len(flood), flooded, letters)
    assert breakdown["overflow"] == len(flood) - latest.record_count
    assert worker.poll() is None


@pytest.mark.timeout(600)
def test_broker_stopped_and_restarted_mid_stream(private_broker, request):
    """The broker goes away for several seconds while producers publish and the
    worker consumes; neither is restarted. Producers keep accepting up to their
    queue bound, then refuse at once (publish_nowait) or wait (publish); nothing
    accepted is lost and the metrics are exact."""
    from specmeter.producers import Publisher, PublisherSettings, QueueFullError
    from specmeter.schemas import GenerationRecord, decode_records_message
    from specmeter.streams.fleet.publish import publish_fleet

    from .support.kafka_helpers import create_topic, read_topic
    from .support.worker_harness import Deployment

    bootstrap = private_broker.start()
    d = Deployment(bootstrap)
    asyncio.run(create_topic(bootstrap, d.topics.records, d.partitions))
    probe_topic = f"{d.name}.probe"
    asyncio.run(create_topic(bootstrap, probe_topic, 1))
    events = fleet_events(seed=51, batches=6, sessions=12)
    worker = d.start_worker()
    outage: dict[str, float] = {}
    try:
        d.wait_ready(worker)

        async def outage_then_back() -> None:
            await asyncio.sleep(1.5)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, private_broker.stop)
            outage["down"] = time.monotonic()
            await asyncio.sleep(4.0)
            await loop.run_in_executor(None, private_broker.start)
            outage["up"] = time.monotonic()

        async def probe() -> dict[str, int]:
            """publish_nowait during the outage: accepted up to the bound, then refused at once."""
            counts = {"accepted": 0, "refused": 0, "slowest_ms": 0}
            settings = PublisherSettings(
                bootstrap_servers=bootstrap, topic=probe_topic, producer_id="probe", max_queued_records=50, linger_ms=5
            )
            async with Publisher(settings) as pub:
                while "down" not in outage:
                    await asyncio.sleep(0.05)
                for i in range(200):
                    t = time.perf_counter()
                    try:
                        pub.publish_nowait(
                            GenerationRecord(
                                batch_id="probe",
                                session_id=f"s{i}",
                                generation_id="g",
                                completion=1,
                                producer_id="probe",
                            )
                        )
                        counts["accepted"] += 1
                    except QueueFullError:
                        counts["refused"] += 1
                    counts["slowest_ms"] = max(counts["slowest_ms"], int((time.perf_counter() - t) * 1000))
                    await asyncio.sleep(0.005)
                while "up" not in outage:
                    await asyncio.sleep(0.1)
                await pub.flush()
            return counts

        async def run() -> dict[str, int]:
            fleet = publish_fleet(
                events,
                PublisherSettings(
                    bootstrap_servers=bootstrap,
                    topic=d.topics.records,
                    max_queued_records=300,
                    queue_full_timeout_s=120,
                    linger_ms=5,
                ),
                rate=300,
            )
            _, counts, _ = await asyncio.gather(outage_then_back(), probe(), fleet)
            return counts

        counts = asyncio.run(run())
        assert outage["up"] - outage["down"] >= 4.0
        assert counts["accepted"] == 50 and counts["refused"] == 150, counts  # the bound, then refusals
        assert counts["slowest_ms"] < 50, counts  # refusing never blocks the caller
        probe_messages = asyncio.run(read_topic(bootstrap, probe_topic, idle_s=2.0, timeout_s=60))
        arrived = sum(len(decode_records_message(m.value).records) for m in probe_messages)
        assert arrived == counts["accepted"]  # everything accepted arrived once the broker was back

        published = wait_complete(d, {e.batch_id for e in events}, timeout_s=180)
        assert worker.poll() is None, "the worker was not supposed to need a restart"
        assert_matches_offline(published, events)
        assert_conserved(produced_records(events), published, d.dead_letters())
    finally:
        d.close()
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(d.log_tail(), private_broker.log_tail())


@pytest.mark.timeout(600)
def test_an_outage_past_the_delivery_timeout_stops_cleanly_and_resumes_exactly(private_broker, request):
    """Issue 30: the broker stays away longer than --delivery-timeout while the worker has
    writes to make; it stops with one line saying so, having handed nothing more to Kafka,
    and a worker started once the broker is back resumes exactly."""
    from .support.kafka_helpers import create_topic
    from .support.worker_harness import Deployment

    bootstrap = private_broker.start()
    d = Deployment(bootstrap)
    asyncio.run(create_topic(bootstrap, d.topics.records, d.partitions))
    events = fleet_events(seed=52, batches=6, sessions=12)
    half = len(events) // 2
    worker = d.start_worker("--delivery-timeout", "8")
    try:
        d.wait_ready(worker)
        asyncio.run(publish_events(bootstrap, d.topics.records, events[:half]))
        time.sleep(0.5)  # mid-stream: chunks applied, their writes on their way
        private_broker.stop()
        try:
            worker.wait(timeout=120)
        finally:
            private_broker.start()
        log = d.logs[0].read_text(errors="replace")
        assert worker.returncode == 1, log[-3000:]
        assert "past --delivery-timeout" in log and "the worker stops, writing nothing more" in log
        asyncio.run(publish_events(bootstrap, d.topics.records, events[half:]))
        d.start_worker()
        published = wait_complete(d, {e.batch_id for e in events}, timeout_s=180)
        assert_matches_offline(published, events)
        assert_conserved(produced_records(events), published, d.dead_letters())
    finally:
        d.close()
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(d.log_tail(), private_broker.log_tail())
