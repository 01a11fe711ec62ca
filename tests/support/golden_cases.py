"""Loading and comparing the golden cases (tests/golden/cases.json, revision 5's
superset of it, tests/golden/cases_r5.json, and revision 6's superset of that,
tests/golden/cases_r6.json; docs/contract.md §5)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cases.json"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "cases.json"
#: (revision 5) the public cases of revision 5: a superset of cases.json (draft lags,
#: by_draft_lag, the spread of tokens per verify step), kept beside it
GOLDEN_R5 = GOLDEN.with_name("cases_r5.json")
SHARED_R5 = SHARED.with_name("cases_r5.json")
#: (revision 6) a superset of cases_r5.json: counter bounds join the consistency rule, so
#: only ``spec/inconsistent_generation_count`` differs where a record breaks a bound
GOLDEN_R6 = GOLDEN.with_name("cases_r6.json")
SHARED_R6 = SHARED.with_name("cases_r6.json")
DEFAULT_BATCH = "batch-0"


def load_cases(path: Path = GOLDEN) -> dict[str, Any]:
    return json.loads(path.read_text())


def aggregate_cases(path: Path = GOLDEN) -> list[dict[str, Any]]:
    return load_cases(path)["aggregate_cases"]


def meta_info_cases() -> list[dict[str, Any]]:
    return load_cases()["meta_info_cases"]


BatchIdentity = tuple[Any, str]  # (run_id, batch_id)


def case_lines(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case as dump lines: records in delivery order, then one marker per batch
    that names an algorithm (single-batch records get batch_id = DEFAULT_BATCH);
    a multi-run case lists its markers itself."""
    lines = []
    multi = "markers" in case or isinstance(case.get("enabled"), dict)
    for record in case["records"]:
        record = dict(record)
        if not multi:
            record.setdefault("batch_id", DEFAULT_BATCH)
        lines.append(record)
    if "markers" in case:
        for marker in case["markers"]:
            if marker.get("speculative_algorithm") is not None:
                lines.append({"type": "marker", "producer_id": "golden", **marker})
        return lines
    enabled = case["enabled"] if multi else {DEFAULT_BATCH: case["enabled"]}
    for batch_id, algorithm in enabled.items():
        if algorithm is not None:
            lines.append(
                {"type": "marker", "batch_id": batch_id, "producer_id": "golden", "speculative_algorithm": algorithm}
            )
    return lines


#: the expected fields of a batch beside speculative, metrics and accept_histogram, and
#: where a single-batch case keeps them (revision 3: positions; revision 4: the budget
#: curve and by_task; revision 5: by_draft_lag and the spread); a case that lacks one
#: (older cases) leaves it unchecked
_OPTIONAL_FIELDS = (
    "by_weight_version",
    "accept_rate_by_position",
    "tokens_per_verify_by_budget",
    "by_task",
    "by_draft_lag",
    "tokens_per_verify_distribution",
)


def expected_by_batch(case: dict[str, Any]) -> dict[BatchIdentity, dict[str, Any]]:
    """Expected {speculative, metrics, accept_histogram, by_weight_version, ...} per (run_id, batch_id)."""
    if "expected_batches" in case:
        return {(b["run_id"], b["batch_id"]): b for b in case["expected_batches"]}
    if "expected_by_batch" in case:
        return {(None, batch_id): want for batch_id, want in case["expected_by_batch"].items()}
    return {
        (None, DEFAULT_BATCH): {
            "speculative": case["speculative"],
            "metrics": case["expected"],
            "accept_histogram": case["accept_histogram"],
            **{name: case[name] for name in _OPTIONAL_FIELDS if name in case},
        }
    }


def assert_batch_equal(got: dict[str, Any], want: dict[str, Any], where: str = "") -> None:
    """One published batch (``msgspec.to_builtins`` of a BatchMetrics) against its expected
    {speculative, metrics, accept_histogram} and whichever of by_weight_version,
    accept_rate_by_position, tokens_per_verify_by_budget, by_task, by_draft_lag and
    tokens_per_verify_distribution it gives."""
    assert got["speculative"] is want["speculative"], where
    assert got["accept_histogram"] == want["accept_histogram"], f"{where}: histogram"
    assert_metrics_equal(got["metrics"], want["metrics"], where)
    _assert_curves_equal(got, want, where)
    if "by_weight_version" in want:
        assert_by_weight_version_equal(got["by_weight_version"], want["by_weight_version"], where)
    if "by_task" in want:
        assert_by_task_equal(got["by_task"], want["by_task"], where)
    if "by_draft_lag" in want:
        assert_by_draft_lag_equal(got.get("by_draft_lag"), want["by_draft_lag"], where)
    if "tokens_per_verify_distribution" in want:
        got_spread = got.get("tokens_per_verify_distribution")
        assert got_spread == want["tokens_per_verify_distribution"], f"{where}: tokens_per_verify_distribution"


def _assert_curves_equal(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """The per-position curves a batch or a breakdown entry carries, where ``want`` gives them."""
    for name in ("accept_rate_by_position", "tokens_per_verify_by_budget"):
        if name in want:
            assert_positions_equal(got.get(name), want[name], where, name=name)


def assert_positions_equal(
    actual: list[float] | None,
    expected: list[float] | None,
    where: str = "",
    *,
    name: str = "accept_rate_by_position",
) -> None:
    """A per-position curve (``accept_rate_by_position``, ``tokens_per_verify_by_budget``):
    null alike, else the same length and floats within rel 1e-12."""
    if expected is None or actual is None:
        assert actual == expected, f"{where}: {name} {actual!r} != {expected!r}"
        return
    assert len(actual) == len(expected), f"{where}: {name} {actual!r} != {expected!r}"
    for k, (got, want) in enumerate(zip(actual, expected, strict=True), start=1):
        assert type(got) is float and math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0), (
            f"{where}: {name} at k = {k}: {got!r} != {want!r}"
        )


def assert_breakdown_equal(
    actual: list[dict[str, Any]] | None, expected: list[dict[str, Any]] | None, key: str, where: str = ""
) -> None:
    """A breakdown (``by_weight_version``, ``by_task``, ``by_draft_lag``; ``key`` names its entries' field):
    same entries in the same order; each entry's metrics compare like metrics, its
    histogram exactly, its curves like the batch's."""
    if expected is None or actual is None:
        assert actual == expected, f"{where}: by {key} {actual!r} != {expected!r}"
        return
    got_keys = [e[key] for e in actual]
    want_keys = [e[key] for e in expected]
    assert got_keys == want_keys, f"{where}: {key} {got_keys} != {want_keys}"
    for got, want in zip(actual, expected, strict=True):
        entry = f"{where}/{key}={want[key]}"
        assert got["accept_histogram"] == want["accept_histogram"], f"{entry}: histogram"
        assert_metrics_equal(got["metrics"], want["metrics"], entry)
        _assert_curves_equal(got, want, entry)


def assert_by_weight_version_equal(
    actual: list[dict[str, Any]] | None, expected: list[dict[str, Any]] | None, where: str = ""
) -> None:
    assert_breakdown_equal(actual, expected, "weight_version", where)


def assert_by_task_equal(
    actual: list[dict[str, Any]] | None, expected: list[dict[str, Any]] | None, where: str = ""
) -> None:
    assert_breakdown_equal(actual, expected, "task", where)


def assert_by_draft_lag_equal(
    actual: list[dict[str, Any]] | None, expected: list[dict[str, Any]] | None, where: str = ""
) -> None:
    assert_breakdown_equal(actual, expected, "draft_lag", where)


def assert_metrics_equal(actual: dict[str, Any], expected: dict[str, Any], where: str = "") -> None:
    """Same key set; ints exactly and as ints; floats within rel 1e-12 (docs/contract.md §5)."""
    assert set(actual) == set(expected), (
        f"{where}: keys differ: missing {sorted(set(expected) - set(actual))}, "
        f"extra {sorted(set(actual) - set(expected))}"
    )
    for key, want in expected.items():
        got = actual[key]
        if isinstance(want, bool) or not isinstance(want, (int, float)):
            assert got == want, f"{where}: {key}: {got!r} != {want!r}"
        elif isinstance(want, int):
            assert type(got) is int and got == want, f"{where}: {key}: {got!r} != {want!r} (int)"
        else:
            assert type(got) is float and math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0), (
                f"{where}: {key}: {got!r} != {want!r} (float)"
            )
