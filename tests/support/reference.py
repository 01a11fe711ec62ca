"""A deliberately naive, slow implementation of the metrics (docs/contract.md §3,
§3.1, §3.3 - §3.7), written from the text alone, to check the core against on
random inputs.

A value is the tuple (state_hash, accepted, proposed, verify, completion, histogram,
weight_version, task, draft_lag)."""

from __future__ import annotations

import math
from typing import Any


def _values_by_key(records: list[dict[str, Any]]) -> dict[tuple[str, str], set[tuple]]:
    """Every distinct value reported for each (session, generation) key."""
    keys: dict[tuple[str, str], set[tuple]] = {}
    for r in records:
        keys.setdefault((r["session_id"], r["generation_id"]), set()).add(
            (
                r["state_hash"],
                r["accepted"],
                r["proposed"],
                r["verify"],
                r["completion"],
                tuple(r["accept_histogram"]) if r["accept_histogram"] is not None else None,
                r.get("weight_version"),
                r.get("task"),
                r.get("draft_lag"),
            )
        )
    return keys


def _speculative(records: list[dict[str, Any]], marker_algorithm: str | None) -> bool:
    return bool(marker_algorithm) or any(
        r["accepted"] is not None or r["proposed"] is not None or r["verify"] is not None for r in records
    )


def reference_metrics(records: list[dict[str, Any]], marker_algorithm: str | None, invalid: int) -> dict:
    keys = _values_by_key(records)
    G = set(keys)
    C = {k for k, values in keys.items() if len(values) > 1}
    clean = {k: next(iter(keys[k])) for k in G - C}
    if not _speculative(records, marker_algorithm):
        return {}

    def sample_of(r):
        return (
            ("s", r["session_id"], r["sample_id"])
            if r["sample_id"] is not None
            else ("g", r["session_id"], r["generation_id"])
        )

    occurrences = {(sample_of(r), r["generation_id"]) for r in records}
    samples = {o[0] for o in occurrences}
    out = {
        "spec/record_occurrence_count": len(occurrences),
        "spec/conflicting_generation_count": len(C),
        "spec/inconsistent_generation_count": sum(_inconsistent(v) for v in clean.values()),
        "spec/invalid_record_count": invalid,
        "spec/sample_count": len(samples),
        # the sums run over G \ C; the generation count and the coverages over G
        **_sums(list(clean.values()), generations=len(G)),
    }
    if samples and not C and not invalid:
        folds = {}
        for sample, gen in occurrences:
            session = sample[1]
            v = clean[(session, gen)]
            folds.setdefault(sample, []).append(v)

        def fold(values, i):
            return None if any(v[i] is None for v in values) else sum(v[i] for v in values)

        acc = [(fold(vs, 1), fold(vs, 2)) for vs in folds.values()]
        ln = [(fold(vs, 4), fold(vs, 3)) for vs in folds.values()]
        if all(a is not None and p for a, p in acc):
            out["spec_accept_rate"] = math.fsum(a / p for a, p in acc) / len(acc)
        if all(c is not None and v for c, v in ln):
            out["spec_accept_length"] = math.fsum(c / v for c, v in ln) / len(ln)
    return out


def _inconsistent(value: tuple) -> bool:
    """§3.5: the histogram is known, and verify is known and differs from the number of
    steps it counts, or accepted is known and differs from the drafts they accepted; or
    (revision 6) two known counters break a bound: accepted > proposed, verify >
    completion, accepted > completion."""
    _, accepted, proposed, verify, completion, histogram, *_ = value
    bounds = [(accepted, proposed), (verify, completion), (accepted, completion)]
    if any(a is not None and b is not None and a > b for a, b in bounds):
        return True
    if histogram is None:
        return False
    steps = [i for i, count in enumerate(histogram) for _ in range(count)]
    return (verify is not None and verify != len(steps)) or (accepted is not None and accepted != sum(steps))


def _sums(values: list[tuple], generations: int | None = None) -> dict:
    """The totals, paired sums, coverages and ratios over clean ``values``;
    ``generations`` (default: their number) is the count the coverages divide by."""
    generations = len(values) if generations is None else generations

    def total(i: int) -> int:
        return sum(v[i] for v in values if v[i] is not None)

    acc_pairs = [v for v in values if v[1] is not None and v[2] is not None]
    ver_pairs = [v for v in values if v[4] is not None and v[3] is not None]
    out = {
        "spec/unique_generation_count": generations,
        "spec/accepted_total": total(1),
        "spec/proposed_total": total(2),
        "spec/verify_total": total(3),
        "spec/completion_total": total(4),
        "spec/paired_accepted_total": sum(v[1] for v in acc_pairs),
        "spec/paired_proposed_total": sum(v[2] for v in acc_pairs),
        "spec/accept_covered_count": len(acc_pairs),
        "spec/paired_completion_total": sum(v[4] for v in ver_pairs),
        "spec/paired_verify_total": sum(v[3] for v in ver_pairs),
        "spec/verify_covered_count": len(ver_pairs),
    }
    if generations:
        out["spec/accept_count_coverage"] = len(acc_pairs) / generations
        out["spec/verify_count_coverage"] = len(ver_pairs) / generations
    if out["spec/paired_proposed_total"] > 0:
        out["spec/accept_rate"] = out["spec/paired_accepted_total"] / out["spec/paired_proposed_total"]
    if out["spec/paired_verify_total"] > 0:
        out["spec/tokens_per_verify"] = out["spec/paired_completion_total"] / out["spec/paired_verify_total"]
    return out


def _reference_breakdown(records: list[dict[str, Any]], marker_algorithm: str | None, field: str) -> list | None:
    """A breakdown read naively: one entry per distinct ``field`` (weight_version: §3.1,
    task: §3.4, draft_lag: §3.6, in numeric order) over G \\ C, sorted with the unknown
    one last; null when not speculative, when no key of G \\ C knows it, or past 64
    known ones."""
    index = {"weight_version": 6, "task": 7, "draft_lag": 8}[field]
    clean = [next(iter(v)) for v in _values_by_key(records).values() if len(v) == 1]
    speculative = _speculative(records, marker_algorithm)
    known = {v[index] for v in clean if v[index] is not None}
    if not speculative or not known or len(known) > 64:
        return None
    out = []
    for name in sorted(known) + ([None] if any(v[index] is None for v in clean) else []):
        values = [v for v in clean if v[index] == name]
        histograms = [v[5] for v in values if v[5] is not None]
        histogram = None
        if histograms:
            histogram = [sum(h[i] for h in histograms if i < len(h)) for i in range(max(map(len, histograms)))]
        out.append(
            {
                field: name,
                "metrics": _sums(values),
                "accept_histogram": histogram,
                "accept_rate_by_position": reference_accept_rate_by_position(histogram),
                "tokens_per_verify_by_budget": reference_tokens_per_verify_by_budget(histogram),
            }
        )
    return out


def reference_by_weight_version(records: list[dict[str, Any]], marker_algorithm: str | None) -> list | None:
    return _reference_breakdown(records, marker_algorithm, "weight_version")


def reference_by_task(records: list[dict[str, Any]], marker_algorithm: str | None) -> list | None:
    return _reference_breakdown(records, marker_algorithm, "task")


def reference_by_draft_lag(records: list[dict[str, Any]], marker_algorithm: str | None) -> list | None:
    return _reference_breakdown(records, marker_algorithm, "draft_lag")


def reference_tokens_per_verify_distribution(
    records: list[dict[str, Any]], marker_algorithm: str | None
) -> list[int] | None:
    """§3.7 read literally: each key of G \\ C with completion and verify known and verify
    > 0 counted in bucket b when its tokens per verify step is in [1 + b/4, 1 + (b+1)/4),
    bucket 0 also below and bucket 63 also above; exact fractions, no integer formula."""
    from fractions import Fraction

    if not _speculative(records, marker_algorithm):
        return None
    clean = [next(iter(vs)) for vs in _values_by_key(records).values() if len(vs) == 1]
    counts = [0] * 64
    qualified = False
    for v in clean:
        verify, completion = v[3], v[4]
        if verify is None or completion is None or verify == 0:
            continue
        qualified = True
        ratio = Fraction(completion, verify)
        bucket = next((b for b in range(63) if ratio < 1 + Fraction(b + 1, 4)), 63)
        counts[bucket] += 1
    return counts if qualified else None


def reference_histogram(records: list[dict[str, Any]], marker_algorithm: str | None) -> list[int] | None:
    """The batch's ``accept_histogram``: the element-wise sum over G \\ C of the known
    histograms (shorter ones padded with zeros); null when none is known or the batch
    is not speculative."""
    if not _speculative(records, marker_algorithm):
        return None
    known = [v[5] for v in (next(iter(vs)) for vs in _values_by_key(records).values() if len(vs) == 1)]
    known = [h for h in known if h is not None]
    if not known:
        return None
    return [sum(h[i] if i < len(h) else 0 for h in known) for i in range(max(len(h) for h in known))]


def reference_accept_rate_by_position(histogram: list[int] | None) -> list[float] | None:
    """§3.3 read literally: bin i counts the verify steps that accepted exactly i drafts,
    a step accepted its k-th draft when it accepted at least k; the rate at position k
    is the share of steps (of those that reported a histogram) that did. One step at a
    time: every step of every bin is asked, for every position, whether it got there."""
    if histogram is None or len(histogram) < 2:
        return None
    steps = [accepted for accepted, count in enumerate(histogram) for _ in range(count)]
    if not steps:
        return None
    return [sum(1 for accepted in steps if accepted >= k) / len(steps) for k in range(1, len(histogram))]


def reference_tokens_per_verify_by_budget(histogram: list[int] | None) -> list[float] | None:
    """§3.5 read literally: with a budget of k draft tokens a step that accepted i drafts
    would have accepted min(i, k), and every step yields one token besides its accepted
    drafts; the curve is the tokens per step for k = 1 .. n-1, one step at a time. Null
    exactly when acceptance by position is."""
    if reference_accept_rate_by_position(histogram) is None:
        return None
    assert histogram is not None
    steps = [accepted for accepted, count in enumerate(histogram) for _ in range(count)]
    return [sum(1 + min(accepted, k) for accepted in steps) / len(steps) for k in range(1, len(histogram))]
