"""The synthetic fleet's policy drift: several weight versions per batch, acceptance
falling as the policy moves away from the draft model's version, back up at
each draft refresh; seeded and deterministic; the bundled sample is its output."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import msgspec
import pytest

from specmeter.schemas import BatchMarker, GenerationRecord
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

REPO = Path(__file__).resolve().parents[1]


def _records(spec: FleetSpec) -> list[GenerationRecord]:
    return [e.payload for e in synthetic_fleet(spec) if isinstance(e.payload, GenerationRecord)]


def _accept_rates(records: list[GenerationRecord]) -> dict[tuple[str, str], float]:
    """accepted/proposed per (batch, weight_version) over distinct generations."""
    seen: dict[tuple[str, str], GenerationRecord] = {}
    for r in records:
        seen.setdefault((r.session_id, r.generation_id), r)
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in seen.values():
        if r.accepted is not None and r.proposed:
            s = sums[(r.batch_id, r.weight_version)]
            s[0] += r.accepted
            s[1] += r.proposed
    return {k: a / p for k, (a, p) in sums.items()}


def _batch_rate(records: list[GenerationRecord], batch_id: str) -> float:
    seen = {(r.session_id, r.generation_id): r for r in records if r.batch_id == batch_id}
    known = [r for r in seen.values() if r.accepted is not None and r.proposed]
    return sum(r.accepted for r in known) / sum(r.proposed for r in known)


def _number(version: str) -> int:
    return int(version[1:])


SPEC = FleetSpec(
    batches=16,
    sessions_per_batch=300,
    producers=2,
    seed=3,
    invalid_rate=0.0,
    conflict_rate=0.0,
    draft_refresh_batches=8,
    stale_versions=3,
    drift_per_version=0.08,
)


@pytest.fixture(scope="module")
def records() -> list[GenerationRecord]:
    return _records(SPEC)


def test_every_record_names_its_weight_version_and_batches_mix_a_few(records):
    by_batch: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        assert r.weight_version is not None and re.fullmatch(r"v\d+", r.weight_version), r.weight_version
        by_batch[r.batch_id][r.weight_version] += 1
    for b, (batch_id, versions) in enumerate(sorted(by_batch.items())):
        current = SPEC.policy_version(b)
        numbers = {_number(v) for v in versions}
        assert max(numbers) == current and min(numbers) >= current - SPEC.stale_versions, (batch_id, versions)
        assert len(numbers) >= 2, "a stale version or more in every batch"
        assert versions.most_common(1)[0][0] == f"v{current}", "the current policy generates the most"


def test_within_a_batch_newer_versions_accept_less(records):
    rates = _accept_rates(records)
    compared = 0
    for b in range(SPEC.batches):
        batch_id = f"step-{b:05d}"
        versions = sorted((v for (batch, v) in rates if batch == batch_id), key=_number)
        staleness = [SPEC.staleness(_number(v), b) for v in versions]
        if staleness[0] == staleness[-1]:
            continue  # right after a refresh every version is as close to the draft
        compared += 1
        assert rates[(batch_id, versions[-1])] < rates[(batch_id, versions[0])], (batch_id, versions)
    assert compared >= SPEC.batches // 2


def test_acceptance_trends_down_between_draft_refreshes_and_recovers_at_each(records):
    rates = [_batch_rate(records, f"step-{b:05d}") for b in range(SPEC.batches)]
    refresh = SPEC.draft_refresh_batches
    for start in range(0, SPEC.batches, refresh):
        cycle = rates[start : start + refresh]
        assert cycle[-1] < cycle[0] - 0.05, f"no downward trend in batches {start}..: {cycle}"
    assert rates[refresh] > rates[refresh - 1] + 0.05, f"no recovery at the refresh: {rates}"


def test_no_drift_without_stale_versions_or_decay():
    flat = _records(FleetSpec(batches=3, sessions_per_batch=20, stale_versions=0, drift_per_version=0.0, seed=1))
    assert {r.weight_version for r in flat if r.batch_id == "step-00001"} == {"v11"}


def test_same_seed_same_events_and_the_run_is_named_everywhere():
    spec = FleetSpec(batches=2, sessions_per_batch=12, seed=9, run_id="run-7")
    first, second = list(synthetic_fleet(spec)), list(synthetic_fleet(spec))
    assert first == second
    assert first != list(synthetic_fleet(FleetSpec(batches=2, sessions_per_batch=12, seed=10, run_id="run-7")))
    for event in first:
        payload = event.payload
        run = payload.get("run_id") if isinstance(payload, dict) else payload.run_id
        assert run == "run-7", event
    assert any(isinstance(e.payload, BatchMarker) for e in first)


@pytest.mark.parametrize(
    "bad",
    [
        {"stale_versions": -1},
        {"draft_refresh_batches": -1},
        {"drift_per_version": 1.0},
        {"run_id": ""},
        {"tasks": (("", 1.0),)},
        {"tasks": (("gsm8k", 0.0),)},
        {"tasks": (("x" * 1025, 1.0),)},
        {"inconsistent_rate": 1.5},
    ],
)
def test_bad_drift_settings_are_refused(bad):
    with pytest.raises(ValueError):
        FleetSpec(**bad)


def test_the_bundled_sample_is_what_its_generator_writes_and_shows_drift():
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_sample_rollout.py")],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert out == (REPO / "streams" / "data" / "sample_rollout.jsonl").read_bytes(), (
        "regenerate: python examples/make_sample_rollout.py > streams/data/sample_rollout.jsonl"
    )
    assert b'"weight_version":"v' in out
    assert b'"draft_lag":' in out  # revision 5: the demo's batches have a staleness curve


def test_sessions_name_their_task_and_the_draft_accepts_as_the_task_says(records):
    """Revision 4: each session's generations name one task; the draft accepts less on
    the tasks with a smaller factor (chat 0.9, gsm8k 1, swe-bench 0.8 by default); a
    share of generations contradicts its histogram (SPEC §3.5)."""
    from specmeter.streams.core.state import inconsistent

    by_session: dict[str, set] = defaultdict(set)
    for r in records:
        by_session[r.session_id].add(r.task)
    assert all(len(tasks) == 1 for tasks in by_session.values())
    assert {t for tasks in by_session.values() for t in tasks} == {name for name, _ in SPEC.tasks}
    seen = {(r.session_id, r.generation_id): r for r in records}
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in seen.values():
        if r.accepted is not None and r.proposed:
            sums[r.task][0] += r.accepted
            sums[r.task][1] += r.proposed
    rate = {task: a / p for task, (a, p) in sums.items()}
    assert rate["swe-bench"] < rate["chat"] < rate["gsm8k"], rate
    values: dict[tuple[str, str], set] = defaultdict(set)
    for r in records:
        values[(r.session_id, r.generation_id)].add((r.accepted, r.verify, tuple(r.accept_histogram or ())))
    contradicting = [k for k, v in values.items() if any(inconsistent(a, ver, h or None) for a, ver, h in v)]
    assert 0.002 < len(contradicting) / len(values) < 0.01  # inconsistent_rate 0.005 (of those with a histogram)


def test_a_fleet_without_tasks_names_none():
    spec = FleetSpec(batches=2, sessions_per_batch=20, seed=4, tasks=(), inconsistent_rate=0.0)
    assert all(r.task is None for r in _records(spec))


def test_records_name_their_draft_lag_and_acceptance_falls_with_it(records):
    """Revision 5: every record names how many versions its policy is ahead of the draft
    (the staleness its acceptance drifts by), one lag per session; acceptance falls as
    the lag grows (the staleness curve by_draft_lag shows). Without ``draft_lags`` no
    record names one, and the counters are the same draws."""
    assert all(r.draft_lag == SPEC.staleness(_number(r.weight_version), int(r.batch_id[5:])) for r in records)
    seen = {(r.session_id, r.generation_id): r for r in records}
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in seen.values():
        if r.accepted is not None and r.proposed:
            sums[r.draft_lag][0] += r.accepted
            sums[r.draft_lag][1] += r.proposed
    lags = sorted(sums)
    assert len(lags) >= 4
    rates = [sums[lag][0] / sums[lag][1] for lag in lags]
    assert rates == sorted(rates, reverse=True), dict(zip(lags, rates, strict=True))
    spec = FleetSpec(batches=2, sessions_per_batch=20, seed=4)
    without = _records(dataclasses.replace(spec, draft_lags=False))
    assert all(r.draft_lag is None for r in without)
    assert [msgspec.structs.replace(r, draft_lag=None) for r in _records(spec)] == without
