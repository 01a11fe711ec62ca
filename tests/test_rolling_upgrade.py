"""A rolling upgrade under a stream (issue 47.4): two workers of the previous release
replaced one at a time by this checkout's, the way a Kubernetes Deployment rolls its pods,
while the rollout fleet goes on publishing; the first new pod crashes mid-upgrade, so the
old worker restores partitions a new one wrote. Every batch ends exact, every record counted
once, and one (batch, revision) never has two contents: the formats a worker writes
(takeover records, confirmations, keys, the assignor's userdata) stay readable by the
members it shares the group with until every member speaks the new one
(docs/operations.md, Upgrading)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from specmeter.streams.core.formats import FORMAT

from .support.kafka_helpers import create_topic
from .support.previous_release import NoPreviousRelease, export_previous_release, previous_release_env
from .support.worker_harness import (
    Deployment,
    assert_conserved,
    assert_duplicates_identical,
    assert_matches_offline,
    batch_slices,
    fleet_events,
    produced_records,
    publish_events,
    wait_complete,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> dict[str, str]:
    try:
        site = export_previous_release(tmp_path_factory.mktemp("previous-release"))
    except NoPreviousRelease as exc:
        pytest.fail(str(exc))
    env = previous_release_env(site)
    help_text = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout
    # the previous release's own --help (its partials topic had a fixed default), not this one's
    assert "<app-id>.partials" not in " ".join(help_text.split())
    return env


def _stream(deployment: Deployment, events, slices: int, pause_s: float) -> threading.Thread:
    """Publish the events batch by batch in ``slices`` parts, ``pause_s`` apart, in a thread."""

    def run() -> None:
        for part in batch_slices(events, slices):
            asyncio.run(publish_events(deployment.bootstrap, deployment.topics.records, part))
            time.sleep(pause_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _replace(deployment: Deployment, old, *, env=None):
    """Stop ``old`` as Kubernetes does (SIGTERM, then its grace), start its successor."""
    deployment.stop(old)
    new = deployment.start_worker(env=env)
    deployment.wait_ready(new)
    return new


@pytest.mark.timeout(600)
def test_two_workers_of_the_previous_release_replaced_one_at_a_time_under_a_stream(kafka_bootstrap, previous):
    deployment = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, deployment.topics.records, deployment.partitions))
    try:
        old = [deployment.start_worker(env=previous) for _ in range(2)]
        for worker in old:
            deployment.wait_ready(worker)
        events = fleet_events(seed=474, batches=14, sessions=10)
        feeder = _stream(deployment, events, slices=14, pause_s=3.0)
        time.sleep(8)
        crashed = _replace(deployment, old[0])  # a group of one old and one new worker
        time.sleep(8)
        # the new pod crashes mid-upgrade: the old worker restores what the new one wrote
        deployment.kill(crashed)
        time.sleep(8)
        first = deployment.start_worker()
        deployment.wait_ready(first)
        time.sleep(8)
        second = _replace(deployment, old[1])  # every member new
        feeder.join(timeout=180)
        assert not feeder.is_alive()
        published = wait_complete(deployment, {e.batch_id for e in events}, timeout_s=180)
        assert_matches_offline(published, events, partitions=deployment.partitions)
        assert_duplicates_identical(published)
        assert_conserved(produced_records(events), published, deployment.dead_letters())
        assert first.poll() is None and second.poll() is None, deployment.log_tail()
        # the new worker wrote the old format beside an old member, the new one once it left
        said = deployment.logs[deployment.workers.index(first)].read_text(errors="replace")
        formats = re.findall(r"the group writes format (\d+)", said)
        assert formats[:1] == ["0"] and formats[-1] == str(FORMAT), formats
    except BaseException:
        print(deployment.log_tail(6000))
        raise
    finally:
        deployment.close()
