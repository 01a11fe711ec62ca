"""A publisher's stop is prompt and exact (issue 47.2): stopped by a cancellation, Ctrl-C or
SIGTERM, it sends what it accepted and waits for the acknowledgements, and returns in about
the time that takes. It waited out its 30 s stop timeout and lost records with a healthy
broker: cancelling the task that awaited its deliveries cancelled the deliveries too."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter

import pytest

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import GenerationRecord, decode_records_message

from .support.kafka_helpers import create_topic, read_topic

#: the records topic's partitions in these tests
PARTITIONS = 4


def _record(batch_id: str, session: int, generation: int) -> GenerationRecord:
    return GenerationRecord(
        batch_id=batch_id, session_id=f"s{session}", generation_id=f"g{generation}", accepted=1, proposed=2
    )


async def _produce(publisher: Publisher, prefix: str, accepted: Counter, rng: random.Random) -> None:
    """Batches of records, each closed with its markers, yielding to the loop now and then
    (a rollout worker awaits its engine between records); ``accepted`` counts per batch what
    ``publish`` took."""
    for batch in range(50):
        batch_id = f"{prefix}-b{batch}"
        for n in range(rng.randint(20, 80)):
            await publisher.publish(_record(batch_id, n % 7, n))
            accepted[batch_id] += 1
            if rng.random() < 0.2:
                await asyncio.sleep(rng.choice((0, 0.001, 0.005)))
        await publisher.close_batch(batch_id, expected_producers=1)


async def _cancelled_round(settings: PublisherSettings, prefix: str, rng: random.Random) -> tuple[Counter, float]:
    """One producer task cancelled at a random moment: (records accepted per batch, seconds
    from the cancellation to the task's end, its publisher's stop included)."""
    accepted: Counter = Counter()

    async def producer() -> None:
        async with Publisher(settings) as publisher:
            await _produce(publisher, prefix, accepted, rng)

    task = asyncio.create_task(producer())
    await asyncio.sleep(rng.uniform(0.05, 0.6))
    cancelled = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return accepted, time.monotonic() - cancelled


def _on_broker(messages: list) -> Counter:
    """Records per batch on the topic (packed messages counted by their records)."""
    found: Counter = Counter()
    for message in messages:
        for record in decode_records_message(message.value).records:
            found[record.batch_id] += 1
    return found


@pytest.mark.kafka
def test_a_cancelled_producer_delivers_every_record_it_accepted_promptly(kafka_bootstrap, unique_name):
    topic = unique_name("stop-records")
    rng = random.Random(4702)

    async def run() -> tuple[Counter, list[float], Counter]:
        await create_topic(kafka_bootstrap, topic, 4)
        settings = PublisherSettings(bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="p-stop")
        accepted: Counter = Counter()
        stops = []
        for round_ in range(20):
            got, seconds = await _cancelled_round(settings, f"r{round_}", rng)
            accepted.update(got)
            stops.append(seconds)
        total = sum(accepted.values())
        messages = await read_topic(
            kafka_bootstrap, topic, until=lambda m: sum(_on_broker(m).values()) > total, idle_s=3.0, timeout_s=60
        )
        return accepted, stops, _on_broker(messages)

    accepted, stops, on_broker = asyncio.run(run())
    assert sum(accepted.values()) > 0
    assert on_broker == accepted, {b: (accepted[b], on_broker[b]) for b in accepted if accepted[b] != on_broker[b]}
    assert max(stops) < 2.0, stops


def _records_on(messages: list) -> int:
    """Records in the messages, invalid ones (dead letters to be) included."""
    total = 0
    for message in messages:
        decoded = decode_records_message(message.value)
        total += len(decoded.records) + len(decoded.invalid)
    return total


async def _messages(bootstrap: str, topic: str) -> int:
    """Messages on ``topic`` now (the sum of its ``PARTITIONS`` partitions' end offsets)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def _grown(bootstrap: str, topic: str, before: int, timeout_s: float = 60.0) -> None:
    """Until ``topic`` holds more than ``before`` messages."""
    deadline = time.monotonic() + timeout_s
    while await _messages(bootstrap, topic) <= before:
        assert time.monotonic() < deadline, f"no message on {topic} in {timeout_s}s"
        await asyncio.sleep(0.1)


def _interrupted_loadgen(bootstrap: str, topic: str, run: int, signum: int, delay_s: float) -> tuple[int, float, str]:
    """`specmeter loadgen` sent ``signum`` after ``delay_s``: (records it says it sent, seconds
    from the signal to its exit, its stderr)."""
    import signal

    from .support.tools import start_specmeter

    before = asyncio.run(_messages(bootstrap, topic))
    proc = start_specmeter(
        "loadgen", "--broker", bootstrap, "--topic", topic, "--batches", "500", "--sessions-per-batch", "10",
        "--run-id", f"stop-{run}", "--seed", str(run), "--no-progress",
    )  # fmt: skip
    try:
        asyncio.run(_grown(bootstrap, topic, before))  # publishing: the moment is mid-stream
        time.sleep(delay_s)
        signalled = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.Signals(signum), (proc.returncode, err)
    said = re.search(r"(\d+) records, (\d+) invalid, \d+ markers sent", err)
    assert said, err
    return int(said.group(1)) + int(said.group(2)), seconds, err


@pytest.mark.kafka
@pytest.mark.slow
def test_an_interrupted_loadgen_stops_at_once_and_the_broker_holds_every_record_it_sent(kafka_bootstrap, unique_name):
    """Ctrl-C and SIGTERM at random moments: each run ends within 2 s (it took 32 s) and the
    broker holds exactly the records the runs say they sent; no run says it lost any."""
    import signal

    topic = unique_name("stop-loadgen")
    asyncio.run(create_topic(kafka_bootstrap, topic, PARTITIONS))
    rng = random.Random(4722)
    runs = [
        _interrupted_loadgen(kafka_bootstrap, topic, run, signum, rng.uniform(0.0, 1.5))
        for run, signum in enumerate([signal.SIGINT, signal.SIGTERM] * 4)
    ]
    sent = sum(n for n, _, _ in runs)
    messages = asyncio.run(
        read_topic(kafka_bootstrap, topic, until=lambda m: _records_on(m) > sent, idle_s=3.0, timeout_s=60)
    )
    assert _records_on(messages) == sent, runs
    assert max(seconds for _, seconds, _ in runs) < 2.0, runs
    assert not any("lost unless re-published" in err for _, _, err in runs), runs


@pytest.mark.kafka
@pytest.mark.slow
def test_only_a_broker_that_does_not_answer_loses_records_and_the_line_names_them(private_broker, unique_name, caplog):
    """A broker gone after the records were accepted: ``stop`` gives up after its timeout
    with one line that names each batch left and its count, and returns (aiokafka's
    idempotent producer, stopped, retried without end: it never returned)."""
    import logging

    topic = unique_name("stop-away")

    async def run() -> float:
        address = await asyncio.to_thread(private_broker.start)
        await create_topic(address, topic, 2)
        settings = PublisherSettings(
            bootstrap_servers=address, topic=topic, producer_id="p-away", request_timeout_ms=2000, retry_backoff_ms=200
        )
        publisher = Publisher(settings)
        await publisher.start()
        for n in range(10):
            publisher.publish_nowait(_record("kept", n, n))
        await publisher.close_batch("kept")  # acknowledged: never named
        await asyncio.to_thread(private_broker.stop)
        for n in range(30):
            publisher.publish_nowait(_record("away-1", n, n))
        for n in range(12):
            publisher.publish_nowait(_record("away-2", n, n))
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="specmeter.producers"):
            await publisher.stop(timeout_s=1.5)
        return time.monotonic() - started

    seconds = asyncio.run(run())
    lost = [r.getMessage() for r in caplog.records if "lost unless re-published" in r.getMessage()]
    assert len(lost) == 1, caplog.text
    assert "acknowledged nothing more within 1.5s: 42 record(s) are lost unless re-published" in lost[0], lost
    assert lost[0].endswith(": batch away-1 (30), batch away-2 (12)"), lost
    assert seconds < 1.5 + 2.0, seconds  # its timeout, then it closes at once (it waited forever)


def test_a_broker_that_does_not_answer_at_start_is_one_line_the_publishers(tmp_path):
    """aiokafka's raw `Unable connect to ...` printed beside the publisher's own error
    (issue 47.7): a program with logging on sees the one line that says what to do."""
    import subprocess
    import sys

    from .support.tools import free_port

    script = tmp_path / "start.py"
    script.write_text(
        "import asyncio, logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from specmeter.producers import BrokerUnavailableError, Publisher, PublisherSettings\n"
        "async def main():\n"
        f"    async with Publisher(PublisherSettings(bootstrap_servers='127.0.0.1:{free_port()}')):\n"
        "        pass\n"
        "try:\n"
        "    asyncio.run(main())\n"
        "except BrokerUnavailableError as exc:\n"
        "    logging.getLogger('rollout').error('%s', exc)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no Kafka broker answers at 127.0.0.1:" in lines[0] and "(connection refused)" in lines[0], lines


def _slow_fleet(drawn: list[int], seconds: float = 1.0):
    """Events drawn as slowly as a big synthetic batch: the CPU held, no await."""
    for n in range(10):
        time.sleep(seconds)  # a draw of ``seconds`` (it never gives the event loop a turn)
        drawn.append(n)
        yield n


def test_a_fleet_being_drawn_does_not_hold_off_a_stop():
    """A generator's events are drawn in a thread: cancelling the loop that publishes them
    lands at once, not when the draw ends (loadgen stopped up to 2 s after Ctrl-C)."""
    from specmeter.streams.fleet.publish import _drawn

    drawn: list[int] = []

    async def run() -> tuple[list[int], float]:
        seen: list[int] = []

        async def consume() -> None:
            async for n in _drawn(_slow_fleet(drawn, 0.3)):
                seen.append(n)

        task = asyncio.create_task(consume())
        await asyncio.sleep(1.0)  # mid-draw: three events drawn, the fourth being drawn
        cancelled = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return seen, time.monotonic() - cancelled

    seen, seconds = asyncio.run(run())
    assert seconds < 0.1, seconds
    assert seen == list(range(len(seen))) and 2 <= len(seen) <= 4, seen
    time.sleep(0.7)
    assert len(drawn) <= len(seen) + 2, (drawn, seen)  # the draw stopped too (at its next event)


def test_a_fleet_drawn_in_a_thread_is_every_event_in_order_and_its_error_raised():
    from specmeter.streams.fleet.publish import _drawn

    def failing():
        yield from range(5000)
        raise ValueError("drawn wrong")

    async def run() -> list[int]:
        got = []
        with pytest.raises(ValueError, match="drawn wrong"):
            async for n in _drawn(failing()):
                got.append(n)
        return got

    assert asyncio.run(run()) == list(range(5000))
