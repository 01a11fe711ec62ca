"""Every golden case through a real worker on a real broker: the stream publishes
what ``specmeter aggregate`` and the contract say, by_weight_version and runs included:
revision 6's cases (cases_r6.json, a superset of cases_r5.json and cases.json: draft
lags, by_draft_lag, the spread of tokens per verify step, counter bounds)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from specmeter.producers import partition_for_key

from .support.golden_cases import (
    GOLDEN_R6,
    aggregate_cases,
    assert_batch_equal,
    case_lines,
    expected_by_batch,
)
from .support.kafka_helpers import send_to_partitions

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _scoped(case: dict, batch_id: object) -> object:
    """The case's batch ids made unique per case (one worker serves them all)."""
    return f"{case['name']}/{batch_id}" if isinstance(batch_id, str) and batch_id else batch_id


def _messages(case: dict, partitions: int) -> list[tuple[int, bytes]]:
    out = []
    for line in case_lines(case):
        line = dict(line)
        if "batch_id" in line:
            line["batch_id"] = _scoped(case, line["batch_id"])
        if line.get("type") == "marker":
            line.setdefault("run_id", None)
            if line["run_id"] is None:
                del line["run_id"]
            out += [(p, msgspec.msgpack.encode(line)) for p in range(partitions)]
            continue
        line.setdefault("type", "record")
        session = line.get("session_id")
        partition = partition_for_key(session.encode(), partitions) if isinstance(session, str) and session else 0
        out.append((partition, msgspec.msgpack.encode(line)))
    return out


def test_every_golden_case_through_the_stream(kafka_bootstrap):
    from .support.kafka_helpers import create_topic
    from .support.worker_harness import Deployment

    d = Deployment(kafka_bootstrap, batch_timeout_s=3.0, grace_s=30.0)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        worker = d.start_worker()
        d.wait_ready(worker)
        # revision 6's cases: a superset of the older files, with the newest expectations
        cases = aggregate_cases(GOLDEN_R6)
        assert any(case.get("revision") == 5 for case in cases) and any(case.get("revision") == 6 for case in cases)
        expected = {}
        items: list[tuple[int, bytes]] = []
        for case in cases:
            items += _messages(case, d.partitions)
            for (run_id, batch_id), want in expected_by_batch(case).items():
                expected[(run_id, _scoped(case, batch_id))] = (case["name"], want)
        asyncio.run(send_to_partitions(kafka_bootstrap, d.topics.records, items))

        def latest(published):
            out = {}
            for m in published:
                key = (m.run_id, m.batch_id)
                if key not in out or m.revision > out[key].revision:
                    out[key] = m
            return out

        published = d.metrics(until=lambda ms: set(expected) <= set(latest(ms)), timeout_s=120)
        got = latest(published)
        assert set(got) == set(expected), sorted(set(expected) ^ set(got), key=str)
        for key, (name, want) in expected.items():
            assert_batch_equal(msgspec.to_builtins(got[key]), want, f"{name}/{key}")
        assert worker.poll() is None
    finally:
        d.close()
