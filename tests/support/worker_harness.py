"""Running real ``specmeter worker`` processes and feeding them, for integration tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import BatchMetrics, decode_dead_letter, decode_metrics, decode_records_message
from specmeter.streams import OfflineAggregator
from specmeter.streams.fleet.publish import publish_fleet
from specmeter.streams.fleet.synthetic import FleetEvent, FleetSpec, synthetic_fleet
from specmeter.streams.settings import TopicNames

from .kafka_helpers import delete_topics, read_topic

#: foreign bytes on the records topic: not msgpack, a bare array, an unknown tag
JUNK = [b"\xc1\xc1 not msgpack", b"\x93\x01\x02", b"\x81\xa4type\xa7nonsuch"]


def fleet_events(seed: int, batches: int = 4, sessions: int = 24, template_pool: int = 2048) -> list[FleetEvent]:
    """A small seeded fleet with every kind of trouble (redeliveries, conflicts, unknowns,
    invalid, histograms that contradict their counters), of three tasks (``template_pool``:
    the counters drawn from; fewer draw faster)."""
    return list(
        synthetic_fleet(
            FleetSpec(
                batches=batches,
                sessions_per_batch=sessions,
                producers=3,
                seed=seed,
                redelivery_rate=0.25,
                conflict_rate=0.02,
                missing_rate=0.1,
                invalid_rate=0.02,
                inconsistent_rate=0.05,
                batch_prefix=f"s{seed}-b",
                template_pool=template_pool,
            )
        )
    )


def batch_slices(events: list[FleetEvent], n: int) -> list[list[FleetEvent]]:
    """The events in ``n`` parts (the last may be shorter), each of whole batches in order:
    a stream published part by part, as a paced fleet would."""
    batches: dict[str, list[FleetEvent]] = {}
    for e in events:
        batches.setdefault(e.batch_id, []).append(e)
    groups = list(batches.values())
    size = -(-len(groups) // n)
    return [[e for group in groups[i : i + size] for e in group] for i in range(0, len(groups), size)]


def produced_records(events: list[FleetEvent]) -> int:
    return sum(1 for e in events if e.kind != "marker")


def _die_with_parent() -> None:
    """In a worker about to start: SIGKILL when the test process that started it ends, however
    it ends (Linux's parent-death signal; elsewhere nothing), so a killed test run leaves no
    worker behind. Its own session still keeps a terminal's Ctrl-C away from it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Deployment:
    """One isolated specmeter deployment: its own app id and topics."""

    bootstrap: str
    partitions: int = 4
    batch_timeout_s: float = 10.0
    grace_s: float = 30.0
    session_timeout_s: float = 6.0
    name: str = field(default_factory=lambda: f"it-{uuid.uuid4().hex[:8]}")
    workers: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    #: each worker's --data-dir, deleted with the deployment (its logs are kept)
    data_dirs: list[Path] = field(default_factory=list)
    #: another deployment's records topic to read (two deployments of one stream)
    records_topic: str | None = None
    #: pass --partials-topic; False: the worker names it from its app id, as a user's does
    partials_flag: bool = True

    @property
    def topics(self) -> TopicNames:
        return TopicNames(
            records=self.records_topic or f"{self.name}.records",
            partials=f"{self.name}.partials",
            metrics=f"{self.name}.metrics",
            deadletter=f"{self.name}.deadletter",
        )

    def start_worker(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        t = self.topics
        log = Path(tempfile.mkstemp(prefix=f"{self.name}-worker-", suffix=".log")[1])
        data_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-data-"))
        self.data_dirs.append(data_dir)
        args = [
            sys.executable,
            "-m",
            "specmeter.streams.cli",
            "worker",
            "--broker",
            self.bootstrap,
            "--app-id",
            self.name,
            "--records-topic",
            t.records,
            *(("--partials-topic", t.partials) if self.partials_flag else ()),
            "--metrics-topic",
            t.metrics,
            "--deadletter-topic",
            t.deadletter,
            "--partitions",
            str(self.partitions),
            "--batch-timeout",
            str(self.batch_timeout_s),
            "--grace",
            str(self.grace_s),
            "--session-timeout",
            str(self.session_timeout_s),
            *(() if "--web-port" in extra else ("--no-web",)),
            "--data-dir",
            str(data_dir),
            *extra,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                preexec_fn=_die_with_parent,
            )
        self.workers.append(proc)
        self.logs.append(log)
        return proc

    def wait_ready(self, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
        """Until the worker logs that it is ready (it then owns partitions or waits for some)."""
        log = self.logs[self.workers.index(proc)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if "Worker ready" in log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready in {timeout_s}s:\n{log.read_text()[-3000:]}")

    def kill(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(proc)

    def close(self) -> None:
        """Kill the workers and delete the deployment's topics and data directories: a broker
        that serves a whole session (or many) holds a few files per partition, and a suite
        that leaves every topic behind runs into the broker's open-file limit. The logs stay
        (a failed test prints them after this)."""
        for proc in self.workers:
            if proc.poll() is None:
                self.kill(proc)
        for data_dir in self.data_dirs:
            shutil.rmtree(data_dir, ignore_errors=True)
        asyncio.run(delete_topics(self.bootstrap, self.topic_names()))

    def topic_names(self) -> list[str]:
        from specmeter.streams.core.layout import changelog_topics

        t = self.topics
        records = [] if self.records_topic else [t.records]  # the other deployment's to delete
        return [*records, t.partials, t.metrics, t.deadletter, *changelog_topics(self.name)]

    def log_tail(self, chars: int = 4000) -> str:
        return "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-chars:]}" for p in self.logs)

    # -- reading results ------------------------------------------------------------
    def metrics(self, *, until=None, timeout_s: float = 60.0, idle_s: float | None = None) -> list[BatchMetrics]:
        messages = asyncio.run(
            read_topic(
                self.bootstrap,
                self.topics.metrics,
                until=until and (lambda ms: until([decode_metrics(m.value) for m in ms])),
                timeout_s=timeout_s,
                idle_s=idle_s,
            )
        )
        return [decode_metrics(m.value) for m in messages]

    def dead_letters(self, *, idle_s: float = 2.0, timeout_s: float = 20.0) -> list:
        messages = asyncio.run(read_topic(self.bootstrap, self.topics.deadletter, idle_s=idle_s, timeout_s=timeout_s))
        return [decode_dead_letter(m.value) for m in messages]


def wait_complete(deployment: Deployment, batches: set[str], *, timeout_s: float = 90.0) -> list[BatchMetrics]:
    """Until every batch has a complete publication (a timeout may publish an
    incomplete revision first, e.g. while partitions move; a later one corrects it)."""

    def done(published):
        latest = latest_by_batch(published)
        return batches <= set(latest) and all(latest[b].complete for b in batches)

    published = deployment.metrics(until=done, timeout_s=timeout_s)
    assert batches <= {m.batch_id for m in published}, (
        f"missing batches {sorted(batches - {m.batch_id for m in published})}\n{deployment.log_tail()}"
    )
    return published


def assert_matches_offline(published: list[BatchMetrics], events: list[FleetEvent], partitions: int = 4) -> None:
    """The latest revision of every batch equals ``specmeter aggregate``'s result, complete."""
    latest = latest_by_batch(published)
    assert_each_batch_matches(latest, events, partitions)
    assert_positions_match_reference(latest, events)
    assert_duplicates_identical(published)


def assert_each_batch_matches(
    latest: dict[str, BatchMetrics],
    events: list[FleetEvent],
    partitions: int,
    expected: dict[str, BatchMetrics] | None = None,
) -> None:
    """Each batch's latest revision equals the offline core's result for ``events``
    (``expected``, when the caller computed it once for many checks), complete."""
    from .golden_cases import assert_metrics_equal

    expected = expected_metrics(events) if expected is None else expected
    assert set(latest) == set(expected)
    for batch_id, want in expected.items():
        got = latest[batch_id]
        assert got.speculative == want.speculative, batch_id
        assert got.accept_histogram == want.accept_histogram, batch_id
        assert_metrics_equal(got.metrics, want.metrics, batch_id)
        assert got.record_count == want.record_count, batch_id
        assert got.invalid_record_count == want.invalid_record_count, batch_id
        assert got.complete and got.close_reason == "markers" and got.missing_record_count == 0, got
        assert got.partitions_reported == got.partitions_expected == partitions
        assert got.run_id == want.run_id and got.by_weight_version == want.by_weight_version, batch_id
        assert got.accept_rate_by_position == want.accept_rate_by_position, batch_id
        assert got.tokens_per_verify_by_budget == want.tokens_per_verify_by_budget, batch_id
        assert got.by_task == want.by_task, batch_id


def assert_positions_match_reference(latest: dict[str, BatchMetrics], events: list[FleetEvent]) -> None:
    """Each batch's ``accept_rate_by_position`` and ``tokens_per_verify_by_budget``, each
    weight version's, its ``by_task`` and its inconsistent count equal the naive reading of
    docs/contract.md §3.3-§3.5 (tests/support/reference.py) over the batch's valid records
    (the worker must not only agree with the offline core, which shares its code)."""
    from .golden_cases import assert_by_task_equal, assert_positions_equal
    from .reference import (
        reference_accept_rate_by_position,
        reference_by_task,
        reference_by_weight_version,
        reference_histogram,
        reference_metrics,
        reference_tokens_per_verify_by_budget,
    )

    records: dict[str, list[dict]] = {}
    algorithms: dict[str, str | None] = {}
    for e in events:
        if e.kind == "record":
            records.setdefault(e.batch_id, []).append(msgspec.structs.asdict(e.payload))
        elif e.kind == "marker" and e.payload.speculative_algorithm:
            algorithms[e.batch_id] = e.payload.speculative_algorithm
    for batch_id, dicts in records.items():
        got = latest[batch_id]
        histogram = reference_histogram(dicts, algorithms.get(batch_id))
        assert got.accept_histogram == histogram, batch_id
        assert_positions_equal(got.accept_rate_by_position, reference_accept_rate_by_position(histogram), batch_id)
        versions = reference_by_weight_version(dicts, algorithms.get(batch_id)) or []
        assert [e.weight_version for e in got.by_weight_version or ()] == [v["weight_version"] for v in versions]
        for entry, want in zip(got.by_weight_version or (), versions, strict=True):
            where = f"{batch_id}/{entry.weight_version}"
            assert_positions_equal(entry.accept_rate_by_position, want["accept_rate_by_position"], where)
        budget = reference_tokens_per_verify_by_budget(histogram)
        assert_positions_equal(got.tokens_per_verify_by_budget, budget, batch_id, name="tokens_per_verify_by_budget")
        algorithm = algorithms.get(batch_id)
        assert_by_task_equal(msgspec.to_builtins(got.by_task), reference_by_task(dicts, algorithm), batch_id)
        inconsistent = reference_metrics(dicts, algorithm, 0).get("spec/inconsistent_generation_count")
        assert got.metrics.get("spec/inconsistent_generation_count") == inconsistent, batch_id
    assert any(latest[b].accept_rate_by_position for b in records), "the stream had per-position rates to check"
    assert any(latest[b].by_task for b in records), "the stream had tasks to check"
    assert any(latest[b].metrics.get("spec/inconsistent_generation_count") for b in records), "and inconsistencies"


def latest_by_batch(published: list[BatchMetrics]) -> dict[str, BatchMetrics]:
    latest: dict[str, BatchMetrics] = {}
    for m in published:
        if m.batch_id not in latest or m.revision > latest[m.batch_id].revision:
            latest[m.batch_id] = m
    return latest


def assert_duplicates_identical(published: list[BatchMetrics]) -> None:
    """Output may repeat after a crash, but one (batch_id, revision) has one content."""
    seen: dict[tuple[str, int], bytes] = {}
    for m in published:
        body = msgspec.json.encode(m)
        key = (m.batch_id, m.revision)
        assert seen.setdefault(key, body) == body, f"two different messages for {key}"


def assert_conserved(produced: int, published: list[BatchMetrics], letters: list) -> dict[str, int]:
    """Every produced record is counted once: in its batch's final ``record_count``
    (aggregated, redelivered, late within grace, invalid with a batch id) or in a
    dead letter outside any batch count (undecodable, invalid without a batch id, an
    invalid marker, late after grace, overflow). Dead letters repeated after a crash
    count once.

    Returns the breakdown, for messages."""
    unique = {}
    for letter in letters:
        unique.setdefault((letter.source_partition, letter.source_offset, letter.reason, letter.raw), letter)
    in_batches = sum(m.record_count for m in latest_by_batch(published).values())
    outside = {"unbatched": 0, "invalid_markers": 0, "late": 0, "overflow": 0}
    for letter in unique.values():
        if letter.reason in ("late", "overflow"):
            decoded = decode_records_message(letter.raw)
            outside[letter.reason] += len(decoded.records)  # 0 for a marker
        elif letter.batch_id is None:  # an invalid marker is counted in no batch, only here
            outside["invalid_markers" if _is_marker(letter.raw) else "unbatched"] += 1
    breakdown = {"produced": produced, "in_batches": in_batches, **outside}
    assert in_batches + sum(outside.values()) == produced, f"records not conserved: {breakdown}"
    return breakdown


def _is_marker(raw: bytes) -> bool:
    try:
        obj = msgspec.msgpack.decode(raw)
    except Exception:  # noqa: BLE001 - undecodable: not a marker
        return False
    return isinstance(obj, dict) and obj.get("type") == "marker"


def expected_metrics(events: list[FleetEvent], extra_invalid: list[dict] = ()) -> dict[str, BatchMetrics]:
    """What the offline core says for the same events."""
    aggregator = OfflineAggregator()
    for event in events:
        if event.kind == "record" or event.kind == "marker":
            aggregator.feed(event.payload)
        else:
            aggregator.feed_line(msgspec.json.encode(event.payload), 0)
    return {m.batch_id: m for m in aggregator.results()}


async def publish_events(bootstrap: str, topic: str, events: list[FleetEvent], *, junk: list[bytes] = ()) -> None:
    """Publish as the fleet would (``loadgen``'s own path: one publisher per producer,
    markers via close_batch), then any ``junk`` bytes as a foreign client might."""
    await publish_fleet(events, PublisherSettings(bootstrap_servers=bootstrap, topic=topic, linger_ms=5))
    if junk:
        async with Publisher(PublisherSettings(bootstrap_servers=bootstrap, topic=topic, producer_id="junk")) as pub:
            for data in junk:
                pub.publish_raw(data)
