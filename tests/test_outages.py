"""Outages read like outages (issue 21.3): while a broker or the group coordinator is
away the worker says so once, reminds at most every minute, says when it is back,
and shows it on /specmeter/stats and readiness; aiokafka's thousands of error lines
are folded, and nothing of the input or output is skipped."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time

import msgspec
import pytest

from specmeter.streams.report.outages import COORDINATOR, OutageLogFilter, Outages, classify

from .support.tools import free_port, get_json

# -- which lines are outage lines (the texts aiokafka 0.14 logs) ----------------------

OUTAGE_LINES = [
    (
        "Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', 40313)",
        ("broker 1", "127.0.0.1:40313"),
    ),
    ("Unable to update metadata from [1]", ("broker 1", None)),
    (
        "Failed fetch messages from 2: NodeNotReadyError: Attempt to send a request to node which is not ready "
        "(node id 2).",
        ("broker 2", None),
    ),
    ("Failed fetch messages from 3: KafkaConnectionError: Connection at 127.0.0.1:5000 closed", ("broker 3", None)),
    ("Marking the coordinator dead (node 1)for group it-1.", (COORDINATOR, None)),
    (
        "Group Coordinator Request failed: NodeNotReadyError: Attempt to send a request to node which is not "
        "ready (node id 1).",
        ("broker 1", None),
    ),
    ("Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError", (COORDINATOR, None)),
    ("Heartbeat session expired - marking coordinator dead", (COORDINATOR, None)),
    (
        "Heartbeat failed for group g-stage1: coordinator (node 2) is either not started or not valid",
        (COORDINATOR, None),
    ),
    (
        "Unable to request metadata from node with id 1: KafkaConnectionError('Connection at 127.0.0.1:4 closed')",
        ("broker 1", "127.0.0.1:4"),
    ),
    (
        'Unable to request metadata from "10.0.0.7:9092": KafkaConnectionError: Connect call failed',
        ("broker at 10.0.0.7:9092", "10.0.0.7:9092"),
    ),
    (
        "Got error produce response: NodeNotReadyError: Attempt to send a request to node which is not ready "
        "(node id 3).",
        ("broker 3", None),
    ),
]

OTHER_LINES = [
    "Heartbeat failed for group g because it is rebalancing",
    "Topic t not found in cluster metadata",
    "Got error produce response: MessageSizeTooLargeError",
    "OffsetCommit failed before join, ignoring: RebalanceInProgressError",
    # a broker back from a restart answers metadata that does not list the others yet: they
    # serve all along (three brokers "unreachable" at once took readiness down for 3.5 s)
    "Unable connect to node with id 2: StaleMetadata: Broker id 2 not in current metadata",
]


@pytest.mark.parametrize(("line", "kind"), OUTAGE_LINES)
def test_outage_lines_name_their_broker(line, kind):
    target, address = classify(line)
    assert target == kind[0]
    if kind[1] is not None:
        assert address == kind[1]


@pytest.mark.parametrize("line", OTHER_LINES)
def test_other_lines_are_not_outages(line):
    assert classify(line) is None


# -- the decisions, on a clock the test moves ---------------------------------------------


def test_one_warning_then_a_reminder_a_minute_then_back(said):
    logger, lines = said
    outages = Outages(logger=logger, repeat_s=60, quiet_s=5, wall=lambda: 1000.0)
    first = "Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', 40313)"
    for i in range(1000):  # ten a second for 100 s
        outages.error("broker 1", first if i == 0 else "Failed fetch messages from 1", i / 10, "127.0.0.1:40313")
        outages.tick(i / 10)
    warnings = [text for level, text in lines if level == logging.WARNING]
    assert len(warnings) == 2, warnings  # the first, and one reminder after 60 s
    assert "Kafka broker 1 (127.0.0.1:40313) unreachable" in warnings[0] and first in warnings[0]
    assert "still unreachable after 60 s: 600 errors folded" in warnings[1], warnings[1]
    assert outages.unreachable == ("broker 1",)
    stats = outages.as_dict(now=100.0)
    assert stats["unreachable"][0]["errors_folded"] == 1000 and stats["unreachable"][0]["first_error"] == first
    assert stats["unreachable"][0]["for_s"] == 100.0 and stats["outages_total"] == 1

    # silent, but its address refuses: not back (aiokafka stops asking a broker that left)
    outages.tick(120.0, reachable=())
    assert outages.unreachable == ("broker 1",)
    assert outages.to_probe(120.0) == {"broker 1": "127.0.0.1:40313"}
    assert "still unreachable after 120 s: 399 errors folded" in lines[-1][1], lines[-1]
    # a silent outage is still reminded of, once a minute
    outages.tick(160.0)
    assert len(lines) == 3
    outages.tick(180.0)
    assert "still unreachable after 180 s: 0 errors folded" in lines[-1][1], lines[-1]
    outages.tick(181.0, reachable=["broker 1"])
    assert lines[-1][0] == logging.INFO and "Kafka broker 1 (127.0.0.1:40313) is back after 181 s" in lines[-1][1]
    assert outages.unreachable == () and outages.as_dict(now=181.0)["unreachable"] == []


def test_a_broker_nothing_asks_for_any_more_stops_being_an_outage(said):
    """A broker taken out of the cluster refuses connections for ever: once nothing
    has asked for it for five minutes it no longer holds readiness down."""
    logger, lines = said
    outages = Outages(logger=logger, forget_silent_s=300)
    outages.error("broker 3", "Unable connect to node with id 3", 0.0, "127.0.0.1:1")
    outages.tick(299.0)
    assert outages.unreachable == ("broker 3",)
    outages.tick(300.0)
    assert outages.unreachable == ()
    assert lines[-1][0] == logging.INFO and "nothing has asked for it for 300 s" in lines[-1][1]


def test_a_broker_still_failing_is_not_back_though_its_port_answers(said):
    logger, _ = said
    outages = Outages(logger=logger, quiet_s=5)
    outages.error("broker 1", "x", 0.0, "127.0.0.1:1")
    outages.error("broker 1", "x", 3.0)
    outages.tick(4.0, reachable=["broker 1"])
    assert outages.unreachable == ("broker 1",)
    assert outages.to_probe(4.0) == {}
    outages.tick(8.5, reachable=["broker 1"])
    assert outages.unreachable == ()


def test_the_coordinator_is_back_when_one_is_discovered(said, caplog):
    logger, lines = said
    outages = Outages(logger=logger, coordinator_quiet_s=30, coordinator_grace_s=5)
    clock = [10.0]
    folding = OutageLogFilter(outages, clock=lambda: clock[0])
    aiokafka = logging.getLogger("aiokafka.consumer.group_coordinator")
    error = aiokafka.makeRecord(
        aiokafka.name,
        logging.ERROR,
        __file__,
        1,
        "Group Coordinator Request failed: %s",
        ("[Error 15] GroupCoordinatorNotAvailableError",),
        None,
    )
    assert folding.filter(error) is False  # folded
    assert outages.unreachable == (COORDINATOR,)
    assert outages.to_probe(100.0) == {}  # no address to try
    outages.tick(16.0)  # it lasts: said
    assert lines == [
        (
            logging.WARNING,
            "Kafka group coordinator unavailable: Group Coordinator Request failed: [Error 15] "
            "GroupCoordinatorNotAvailableError; the worker keeps retrying, and further errors about it are "
            "folded into one line a minute until it is back",
        )
    ]
    clock[0] = 17.0
    found = aiokafka.makeRecord(
        aiokafka.name, logging.INFO, __file__, 1, "Discovered coordinator %s for group %s", (2, "g"), None
    )
    caplog.set_level(logging.WARNING, logger="aiokafka")  # the worker's default: aiokafka's INFO hidden
    assert folding.filter(found) is False  # hidden as before, and it closes the outage
    assert outages.unreachable == ()
    caplog.set_level(logging.INFO, logger="aiokafka")  # --log-level debug shows aiokafka's INFO lines
    assert folding.filter(found) is True
    assert lines[-1] == (logging.INFO, "Kafka group coordinator is back (broker 2) after 7 s (1 errors folded)")


def test_a_line_naming_only_an_address_is_the_broker_at_that_address(said):
    logger, lines = said
    outages = Outages(logger=logger)
    outages.learn_brokers({1: "127.0.0.1:9092", 2: "127.0.0.1:9093"})
    target, address = classify('Unable connect to "127.0.0.1:9093": [Errno 111] Connect call failed')
    assert target == "broker at 127.0.0.1:9093"
    outages.error(target, "Unable connect", 0.0, address)
    outages.error("broker 2", "Failed fetch messages from 2", 0.1)
    assert outages.unreachable == ("broker 2",)
    assert len(lines) == 1 and lines[0][1].startswith("Kafka broker 2 (127.0.0.1:9093) unreachable: Unable connect")


def test_a_coordinator_found_again_within_seconds_is_not_logged(said):
    """At start (and when a coordinator moves) the group's coordinator is briefly
    unavailable: stats show it, the log does not."""
    logger, lines = said
    outages = Outages(logger=logger, coordinator_grace_s=5)
    outages.error(COORDINATOR, "GroupCoordinatorNotAvailableError", 0.0)
    outages.tick(1.0)
    assert outages.unreachable == (COORDINATOR,) and lines == []
    outages.found_coordinator("1", 1.5)
    assert outages.unreachable == () and lines == []
    # and it is no outage: a healthy worker on a fresh cluster starts with none (issue 33)
    assert outages.as_dict(now=2.0)["outages_total"] == 0
    # one that lasts is said, once, and so is its end
    outages.error(COORDINATOR, "GroupCoordinatorNotAvailableError", 10.0)
    for t in range(11, 20):
        outages.error(COORDINATOR, "GroupCoordinatorNotAvailableError", float(t))
        outages.tick(float(t))
    assert [level for level, _ in lines] == [logging.WARNING]
    assert lines[0][1].startswith("Kafka group coordinator unavailable: GroupCoordinatorNotAvailableError")
    outages.found_coordinator("3", 21.0)
    assert lines[-1] == (logging.INFO, "Kafka group coordinator is back (broker 3) after 11 s (10 errors folded)")
    assert outages.as_dict(now=22.0)["outages_total"] == 1


def test_the_coordinator_on_a_broker_that_is_away_is_that_brokers_outage(said):
    logger, lines = said
    outages = Outages(logger=logger, coordinator_grace_s=5)
    outages.error(COORDINATOR, "Marking the coordinator dead (node 1)for group g.", 0.0)
    outages.error("broker 1", "Unable connect to node with id 1", 0.1, "127.0.0.1:9092")
    for t in range(1, 20):
        outages.error("broker 1", "Failed fetch messages from 1", float(t))
        outages.tick(float(t))
    assert set(outages.unreachable) == {COORDINATOR, "broker 1"}  # both on stats
    assert len(lines) == 1 and lines[0][1].startswith("Kafka broker 1 (127.0.0.1:9092) unreachable:")
    outages.tick(30.0, reachable=["broker 1"])
    outages.found_coordinator("1", 31.0)
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]


def test_the_workers_own_retry_lines_are_folded_and_nothing_else_of_it():
    from specmeter.streams.report.outages import WORKER_RETRIES

    outages = Outages()
    folding = OutageLogFilter(outages, retries=WORKER_RETRIES)
    logger = logging.getLogger("specmeter.worker")
    from aiokafka.errors import KafkaConnectionError

    unreachable = KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 45379, <AddressFamily.AF_INET: 2>)]")
    retry = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1,
        "committing the offsets of %s failed (%r); retried", ("t.records", unreachable), None,
    )  # fmt: skip
    assert folding.filter(retry) is False and outages.unreachable == ("broker at 127.0.0.1:45379",)
    stopped = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "route of %s: reading failed (%s); trying again every %.0f s",
        ("specmeter.records", unreachable, 5.0),
        None,
    )
    assert folding.filter(stopped) is True  # the worker's once-per-outage lines are its own


def test_other_lines_pass_the_filter_unchanged():
    outages = Outages()
    folding = OutageLogFilter(outages)
    logger = logging.getLogger("aiokafka.cluster")
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "Topic %s not found", ("t",), None)
    assert folding.filter(record) is True and outages.unreachable == ()


def test_lines_from_many_threads_are_counted_once_each(said):
    logger, lines = said
    outages = Outages(logger=logger)

    def flood() -> None:
        for _ in range(2000):
            outages.error("broker 1", "Failed fetch messages from 1", time.monotonic())

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outages.as_dict()["unreachable"][0]["errors_folded"] == 8000
    assert len([1 for level, _ in lines if level == logging.WARNING]) == 1


# -- readiness: serving and writing, whatever one broker does (issue 33) ------------------


def test_one_broker_of_three_away_is_no_reason_to_be_unready_all_of_them_is():
    outages = Outages(logger=logging.getLogger("test-outages-quiet"))
    outages.learn_brokers({1: "127.0.0.1:9091", 2: "127.0.0.1:9092", 3: "127.0.0.1:9093"})
    assert not outages.no_broker_answers()
    outages.error("broker 2", "Unable connect to node with id 2", 0.0)
    outages.error(COORDINATOR, "Group Coordinator Request failed: GroupCoordinatorNotAvailableError", 0.0)
    assert not outages.no_broker_answers(), "two brokers serve"
    outages.error("broker 1", "Unable connect to node with id 1", 0.0)
    outages.error("broker at 127.0.0.1:9093", "Unable connect", 0.0, "127.0.0.1:9093")
    assert outages.no_broker_answers(), "none answers"
    outages.tick(10.0, reachable=["broker 1"])
    assert not outages.no_broker_answers(), "broker 1 is back"


def test_a_broker_taken_out_of_the_cluster_is_not_waited_for():
    outages = Outages(logger=logging.getLogger("test-outages-quiet"), forget_silent_s=300)
    outages.learn_brokers({1: "127.0.0.1:9091", 2: "127.0.0.1:9092"})
    outages.error("broker 2", "Unable connect to node with id 2", 0.0)
    outages.tick(300.0)  # nothing asked for it for five minutes: it left the cluster
    outages.error("broker 1", "Unable connect to node with id 1", 301.0)
    assert outages.no_broker_answers()


@pytest.mark.parametrize(
    ("serving", "stalled_s", "no_broker", "ready", "reason"),
    [
        (True, 0.0, False, True, None),
        (True, 29.9, False, True, None),  # a leader's loss stalls its partitions' writes for seconds
        (True, 30.0, False, False, "writes unacknowledged for 30 s"),
        (True, 0.0, True, False, "no Kafka broker answers"),
        (False, 0.0, False, False, "partitions being assigned or their state restored"),
    ],
)
def test_readiness_is_serving_and_writing(serving, stalled_s, no_broker, ready, reason):
    from specmeter.streams.report.readiness import decide

    answer = decide(
        serving=serving,
        write_stalled_s=stalled_s,
        write_timeout_s=30.0,
        no_broker_answers=no_broker,
        unreachable=("broker 2",),
    )
    assert answer.ready is ready
    assert (answer.reason or "").startswith(reason or ""), answer.reason
    body = answer.as_dict()
    assert body["unreachable"] == ["broker 2"], "what is away is said, ready or not"
    assert decide(serving=True, write_stalled_s=0, write_timeout_s=30, no_broker_answers=False).as_dict() == {
        "ready": True
    }


# -- a real worker, a broker stopped for a while -----------------------------------------


async def _publish_around(events, settings, pause_at: int, outage) -> None:
    """Publish as ``publish_fleet`` does (one publisher per producer, markers via
    ``close_batch``), everything accepted acknowledged before ``outage`` runs at event
    ``pause_at``: the batch open there spans the outage. (A publisher sending while
    the broker is down, then restarted, can stall on OutOfOrderSequence: a producer
    library matter, kept out of this test of the worker.)"""
    from specmeter.producers import Publisher
    from specmeter.schemas import GenerationRecord

    publishers: dict[str, Publisher] = {}
    try:
        for i, event in enumerate(events):
            if i == pause_at:
                for publisher in publishers.values():
                    await publisher.flush()
                await outage()
            publisher = publishers.get(event.producer_id)
            if publisher is None:
                publisher = publishers[event.producer_id] = Publisher(
                    msgspec.structs.replace(settings, producer_id=event.producer_id)
                )
                await publisher.start()
            payload = event.payload
            if isinstance(payload, GenerationRecord):
                await publisher.publish(payload)
            elif event.kind == "marker":
                await publisher.close_batch(payload.batch_id, payload.speculative_algorithm, payload.expected_producers)
            else:
                publisher.publish_raw(
                    msgspec.msgpack.encode(payload),
                    session_id=payload.get("session_id"),
                    batch_id=payload.get("batch_id"),
                )
            await asyncio.sleep(0.003)
    finally:
        for publisher in publishers.values():
            await publisher.stop()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_broker_is_one_warning_in_the_log_and_on_stats_and_nothing_is_skipped(private_broker, request):
    from specmeter.producers import PublisherSettings

    from .support.kafka_helpers import create_topic
    from .support.worker_harness import (
        Deployment,
        assert_conserved,
        assert_matches_offline,
        fleet_events,
        produced_records,
        wait_complete,
    )

    bootstrap = private_broker.start()
    d = Deployment(bootstrap, batch_timeout_s=90.0)
    asyncio.run(create_topic(bootstrap, d.topics.records, d.partitions))
    events = fleet_events(seed=213, batches=6, sessions=12)
    # the outage comes in the middle of batch 3: its records before, its markers after
    batch3 = [i for i, e in enumerate(events) if e.batch_id == sorted({e.batch_id for e in events})[3]]
    first_marker = next(i for i in batch3 if events[i].kind == "marker")
    pause_at = (batch3[0] + first_marker) // 2
    port = free_port()
    worker = d.start_worker("--web-port", str(port), "--web-host", "127.0.0.1")
    seen: dict[str, object] = {}
    try:
        d.wait_ready(worker)

        async def outage() -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, private_broker.stop)
            await asyncio.sleep(6.0)
            seen["stats"] = await loop.run_in_executor(None, get_json, port, "/specmeter/stats")
            seen["ready"] = await loop.run_in_executor(None, get_json, port, "/specmeter/readyz")
            await asyncio.sleep(6.0)
            await loop.run_in_executor(None, private_broker.start)

        settings = PublisherSettings(bootstrap_servers=bootstrap, topic=d.topics.records, linger_ms=5)
        asyncio.run(_publish_around(events, settings, pause_at, outage))
        published = wait_complete(d, {e.batch_id for e in events}, timeout_s=180)
        assert worker.poll() is None, "the worker was not supposed to need a restart"
        assert_matches_offline(published, events)  # no input or output skipped
        assert_conserved(produced_records(events), published, d.dead_letters())

        # while it was away: stats and readiness said so
        status, stats = seen["stats"]
        assert status == 200
        (outage_seen,) = [o for o in stats["outages"]["unreachable"] if o["target"] == "broker 1"]
        assert outage_seen["errors_folded"] > 10 and outage_seen["for_s"] >= 3, outage_seen
        assert outage_seen["address"] == bootstrap
        status, ready = seen["ready"]
        # its only broker away: no broker answers, so not ready (one of three away leaves
        # it ready: tests/test_cluster.py)
        assert status == 503 and "broker 1" in ready["unreachable"], ready
        assert ready["reason"] == "no Kafka broker answers", ready

        # the log: one warning for the broker, none of aiokafka's error lines, and a line when it was back
        back = re.compile(r"\] INFO [\w.]+: Kafka broker 1 \(.*\) is back after \d+ s \(\d+ errors folded\)")
        deadline = time.monotonic() + 30
        while not back.search(d.logs[0].read_text(errors="replace")) and time.monotonic() < deadline:
            time.sleep(0.5)
        log = d.logs[0].read_text(errors="replace")
        seen["after"] = get_json(port, "/specmeter/stats")[1]["outages"]
        warnings = re.findall(r"\] WARNING [\w.]+: (Kafka .*)", log)  # the worker's one log format
        assert [w for w in warnings if w.startswith("Kafka broker 1 (")] and len(warnings) <= 3, warnings
        assert sum("unreachable" in w and "still" not in w for w in warnings) == 1, warnings
        errors = [line for line in log.splitlines() if re.match(r"\[[^\]]*\] ERROR ", line)]
        assert not errors, errors[:20]
        assert back.search(log), seen
        assert seen["after"]["unreachable"] == [] and seen["after"]["errors_folded_total"] > 10, seen
        assert get_json(port, "/specmeter/readyz")[0] == 200
    finally:
        d.close()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(d.log_tail(), private_broker.log_tail())


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_command_folds_an_outage_as_the_worker_does(private_broker, tmp_path):
    """Issue 30: `specmeter loadgen` printed a line per aiokafka retry while its broker was
    away (replay: 2,652 lines in 88 s). Now the outage is one line, a reminder a minute and
    one when it is back, and every record still arrives."""
    from specmeter.schemas import decode_records_message

    from .support.kafka_helpers import create_topic, read_topic
    from .support.tools import start_specmeter

    bootstrap = private_broker.start()
    topic = "fold-outage.records"
    asyncio.run(create_topic(bootstrap, topic, 2))
    loadgen = start_specmeter(
        "loadgen",
        "--broker",
        bootstrap,
        "--topic",
        topic,
        "--batches",
        "30",
        "--sessions-per-batch",
        "10",
        "--rate",
        "150",
        "--no-progress",
    )

    def outage() -> None:
        time.sleep(4)
        private_broker.stop()
        time.sleep(15)
        private_broker.start()

    away = threading.Thread(target=outage)
    away.start()
    try:
        _, stderr = loadgen.communicate(timeout=240)
    finally:
        away.join()
    assert loadgen.returncode == 0, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if "unreachable" in line or "is back" in line]
    assert said and any("keeps retrying" in line for line in said), stderr[-3000:]
    assert len(lines) < 15, "\n".join(lines[:40])  # not a line per retry
    valid, invalid = map(int, re.search(r"loadgen: (\d+) records, (\d+) invalid", stderr).groups())
    messages = [decode_records_message(m.value) for m in asyncio.run(read_topic(bootstrap, topic, idle_s=3))]
    assert sum(len(d.records) for d in messages) == valid  # every record arrived, once (idempotent)
    assert sum(len(d.invalid) for d in messages) == invalid


def test_the_worker_folds_its_producers_retries_of_refused_writes():
    """Two brokers of three away: every partition has too few in-sync replicas and aiokafka's
    sender logs each retry of each partition (558 lines in 40 s in one worker's log); the
    worker folds them as an outage of the cluster, as the commands do."""
    from specmeter.streams.report.outages import CLUSTER, fold_outage_logs

    outages = Outages()
    folding = fold_outage_logs(outages)
    sender = logging.getLogger("aiokafka.producer.sender")
    worker = logging.getLogger("specmeter.worker")
    try:
        retry = sender.makeRecord(
            sender.name, logging.WARNING, __file__, 1,
            "Got error produce response on topic-partition %s, retrying. Error: %s",
            ("TopicPartition(topic='a-stage1-state-changelog', partition=3)", "NotEnoughReplicasError"), None,
        )  # fmt: skip
        assert sender.filter(retry) is False and outages.unreachable == (CLUSTER,)
    finally:
        for logger in _loggers_with(folding):
            logger.removeFilter(folding)
        for f in [f for f in worker.filters if isinstance(f, OutageLogFilter)]:
            worker.removeFilter(f)


def _loggers_with(log_filter: logging.Filter) -> list[logging.Logger]:
    return [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and log_filter in logger.filters
    ]


def test_a_stale_metadata_error_is_info_and_no_outage():
    """aiokafka logs it at ERROR; it says the client's metadata is behind, not that a broker is away."""
    outages = Outages()
    folding = OutageLogFilter(outages)
    logger = logging.getLogger("aiokafka")
    record = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1, "Unable connect to node with id %s: %s",
        (2, "StaleMetadata: Broker id 2 not in current metadata"), None,
    )  # fmt: skip
    folding.filter(record)
    assert record.levelno == logging.INFO and outages.unreachable == ()
