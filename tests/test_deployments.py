"""Two deployments on one cluster (issue 47.1): an app id is a namespace.

What a deployment writes for itself (its partials topic, its changelogs, its groups) is
named from its app id; the records and metrics topics are the user's. Two deployments of
different app ids reading one records topic each publish complete, exact metrics to their
own metrics topic, and neither says a word about the other's partials; a deployment told
to read another's partials topic refuses to start with one line that says what to do.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from specmeter.streams.settings import TopicNames, WorkerSettings, partials_topic_of

from .support.kafka_helpers import create_topic
from .support.worker_harness import (
    Deployment,
    assert_matches_offline,
    fleet_events,
    publish_events,
    wait_complete,
)

#: what stage 2 says when a partial of a batch arrives again with other content: the
#: signature of two deployments merging each other's partials
CROSS_TALK = "arrived again with other content"


def test_the_partials_topic_is_named_from_the_app_id():
    assert WorkerSettings().topics.partials == "specmeter.partials"  # the default app id: as before
    assert WorkerSettings(app_id="staging").topics.partials == "staging.partials" == partials_topic_of("staging")
    chosen = WorkerSettings(app_id="staging", topics=TopicNames(partials="mine"))
    assert chosen.topics.partials == "mine"


def test_worker_help_says_the_partials_topic_follows_the_app_id():
    out = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "<app-id>.partials" in " ".join(out.split())


@pytest.mark.kafka
def test_two_deployments_on_one_records_topic_each_publish_exact_metrics(kafka_bootstrap):
    first = Deployment(kafka_bootstrap, partials_flag=False)
    second = Deployment(kafka_bootstrap, partials_flag=False, records_topic=first.topics.records)
    asyncio.run(create_topic(kafka_bootstrap, first.topics.records, first.partitions))
    try:
        workers = [(d, d.start_worker()) for d in (first, second)]
        for d, worker in workers:
            d.wait_ready(worker)
        events = fleet_events(seed=471, batches=4, sessions=16)
        asyncio.run(publish_events(kafka_bootstrap, first.topics.records, events))
        batches = {e.batch_id for e in events}
        for d, worker in workers:
            published = wait_complete(d, batches)
            assert_matches_offline(published, events, partitions=d.partitions)
            assert worker.poll() is None, d.log_tail()
        for d, _ in workers:
            said = "\n".join(p.read_text(errors="replace") for p in d.logs)
            assert CROSS_TALK not in said, d.log_tail()
        assert first.topics.partials != second.topics.partials
    finally:
        second.close()
        first.close()


@pytest.mark.kafka
def test_a_worker_refuses_a_partials_topic_another_deployment_reads(kafka_bootstrap):
    first = Deployment(kafka_bootstrap)
    second = Deployment(kafka_bootstrap, records_topic=first.topics.records)
    asyncio.run(create_topic(kafka_bootstrap, first.topics.records, first.partitions))
    try:
        worker = first.start_worker()
        first.wait_ready(worker)
        events = fleet_events(seed=472, batches=1, sessions=8)
        asyncio.run(publish_events(kafka_bootstrap, first.topics.records, events))
        wait_complete(first, {e.batch_id for e in events})  # its stage 2 has read (and committed) partials
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "specmeter.streams.cli",
                "worker",
                "--broker",
                kafka_bootstrap,
                "--app-id",
                second.name,
                "--records-topic",
                first.topics.records,
                "--partials-topic",
                first.topics.partials,
                "--partitions",
                str(first.partitions),
                "--no-web",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) <= 3, proc.stderr
        assert first.topics.partials in lines[0] and repr(first.name) in lines[0], proc.stderr
        assert "--partials-topic" in proc.stderr
        assert worker.poll() is None
    finally:
        second.close()
        first.close()
