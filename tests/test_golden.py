"""Every golden aggregate case, through each core and through the offline CLI: revision
6's cases_r6.json, a superset of revision 5's cases_r5.json (draft lags, by_draft_lag,
the spread of tokens per verify step), itself a superset of cases.json. The older files
are kept as the team published them; a case whose records break a counter bound (SPEC
§3.5, revision 6) expects another inconsistent count there, so each case runs once, with
the expectations of the newest revision."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from specmeter.streams import OfflineAggregator

from .support.golden_cases import (
    GOLDEN,
    GOLDEN_R5,
    GOLDEN_R6,
    SHARED,
    SHARED_R5,
    SHARED_R6,
    aggregate_cases,
    assert_batch_equal,
    case_lines,
    expected_by_batch,
)

CASES = aggregate_cases(GOLDEN_R6)
IDS = [case["name"] for case in CASES]
INCONSISTENT = "spec/inconsistent_generation_count"


def test_golden_copy_matches_shared_when_present():
    """The repo keeps its own copy; it must not drift from the team's ../shared/."""
    if not SHARED.exists():
        pytest.skip("no ../shared/cases.json beside this clone")
    assert json.loads(GOLDEN.read_text()) == json.loads(SHARED.read_text()), (
        f"{GOLDEN} differs from {SHARED}: copy the shared file over and re-run"
    )


def test_golden_r5_copy_matches_shared_when_present():
    """Revision 5's cases too: the repo's copy is the team's ../shared/cases_r5.json."""
    if not SHARED_R5.exists():
        pytest.skip("no ../shared/cases_r5.json beside this clone")
    assert json.loads(GOLDEN_R5.read_text()) == json.loads(SHARED_R5.read_text()), (
        f"{GOLDEN_R5} differs from {SHARED_R5}: copy the shared file over and re-run"
    )


def test_golden_r6_copy_matches_shared_when_present():
    """Revision 6's cases too: the repo's copy is the team's ../shared/cases_r6.json."""
    if not SHARED_R6.exists():
        pytest.skip("no ../shared/cases_r6.json beside this clone")
    assert json.loads(GOLDEN_R6.read_text()) == json.loads(SHARED_R6.read_text()), (
        f"{GOLDEN_R6} differs from {SHARED_R6}: copy the shared file over and re-run"
    )


def _without_inconsistent(node: object) -> object:
    """The case with every inconsistent count left out (the one key revision 6 changes)."""
    if isinstance(node, dict):
        return {k: _without_inconsistent(v) for k, v in node.items() if k != INCONSISTENT}
    if isinstance(node, list):
        return [_without_inconsistent(v) for v in node]
    return node


def test_r6_cases_are_a_superset_that_changes_only_the_inconsistent_count():
    """Every case of cases_r5.json is in cases_r6.json with the same records and the same
    expectations but the inconsistent count; the new cases carry "revision": 6, and at
    least one older case now expects more inconsistent generations (so running only the
    newest file does check the bounds on old records)."""
    r5 = {case["name"]: case for case in aggregate_cases(GOLDEN_R5)}
    r6 = {case["name"]: case for case in CASES}
    assert set(r5) <= set(r6)
    for name, case in r5.items():
        assert _without_inconsistent(r6[name]) == _without_inconsistent(case), name
    assert [case for case in CASES if case.get("revision") == 6]
    assert [name for name in r5 if r6[name] != r5[name]]


def test_r5_cases_are_a_superset_that_checks_revision_5():
    """cases_r5.json holds every case of cases.json, and its revision-5 cases give the
    new fields (so the golden tests do check by_draft_lag and the spread)."""
    r5 = {case["name"] for case in aggregate_cases(GOLDEN_R5)}
    assert {case["name"] for case in aggregate_cases()} <= r5
    new = [case for case in aggregate_cases(GOLDEN_R5) if case.get("revision") == 5]
    assert new and all("by_draft_lag" in str(case) and "tokens_per_verify_distribution" in str(case) for case in new)


def _check(results: dict, case: dict) -> None:
    expected = expected_by_batch(case)
    assert set(results) == set(expected), f"batches: {sorted(results)} != {sorted(expected)}"
    for identity, want in expected.items():
        assert_batch_equal(results[identity], want, f"{case['name']}/{identity}")


class _CoreAggregator(OfflineAggregator):
    """The offline aggregator on a given core's BatchState."""

    def __init__(self, core) -> None:
        super().__init__()
        self._core = core

    def _state(self, run_id, batch_id):
        state = self.batches.get((run_id, batch_id))
        if state is None:
            state = self.batches[(run_id, batch_id)] = self._core.BatchState(batch_id, run_id)
            if self.speculative_algorithm:
                state.add_algorithm(self.speculative_algorithm)
        return state


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_case_through_core(core, case):
    aggregator = _CoreAggregator(core)
    aggregator.feed_lines(json.dumps(line) for line in case_lines(case))
    results = {(m.run_id, m.batch_id): msgspec.to_builtins(m) for m in aggregator.results()}
    _check(results, case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_case_through_cli(case, tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(json.dumps(line) + "\n" for line in case_lines(case)))
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "aggregate", str(dump)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    results = {}
    for line in proc.stdout.splitlines():
        message = json.loads(line)
        results[(message["run_id"], message["batch_id"])] = message
    _check(results, case)
