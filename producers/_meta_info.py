"""SGLang ``meta_info`` to speculative counters (docs/contract.md §2). Pure; no sglang import.

SGLang renamed its counters across releases; the alias families are read in
precedence order, a pair is taken whole or not at all, and every value is
normalised so that a malformed one becomes *unknown*, never 0.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from specmeter.schemas import MAX_BINS, MAX_COUNTER, MAX_ID

__all__ = [
    "SpecCounters",
    "counters_from_meta_info",
    "fold_attempts",
    "normalize_counter",
    "normalize_weight_version",
    "ACCEPT_PAIRS",
]

#: (accepted key, proposed key), newest SGLang first.
ACCEPT_PAIRS: tuple[tuple[str, str], ...] = (
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),  # 0.5.12+
    ("spec_accepted_drafts", "spec_proposed_drafts"),  # 0.5.11
    ("spec_accept_token_num", "spec_draft_token_num"),  # 0.5.6 - 0.5.10
)
_MAX_DIGITS = len(str(MAX_COUNTER))
_MAX_VERSION_INT = 10**MAX_ID  # the smallest int whose decimal string is past MAX_ID characters


class SpecCounters(msgspec.Struct, frozen=True, kw_only=True):
    """The four counters, the histogram and the policy version of one generation;
    ``None`` = unknown."""

    accepted: int | None = None
    proposed: int | None = None
    verify: int | None = None
    completion: int | None = None
    accept_histogram: list[int] | None = None
    weight_version: str | None = None


def normalize_counter(value: Any) -> int | None:
    """An int >= 0, or None (unknown).

    Kept: ints (and numpy-style integers via ``__index__``), integral floats
    (5.0 -> 5), strings of ASCII digits ("07" -> 7). Unknown: bool, negative,
    fractional, non-finite, other strings, anything else, and values above
    ``MAX_COUNTER`` (2**32 - 1, the wire limit).
    """
    if value is None or isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, float):
        if not value.is_integer() or value < 0 or value > MAX_COUNTER:  # NaN/inf fail is_integer
            return None
        return int(value)
    if isinstance(value, str):
        if not value or not value.isascii() or not value.isdigit() or len(value.lstrip("0")) > _MAX_DIGITS:
            return None
        number = int(value)
    elif hasattr(type(value), "__index__"):
        try:
            number = operator.index(value)
        except TypeError:
            return None
    else:
        return None
    return number if 0 <= number <= MAX_COUNTER else None


def _normalize_histogram(value: Any) -> list[int] | None:
    if isinstance(value, (str, bytes)) or (not isinstance(value, Sequence) and not hasattr(value, "tolist")):
        return None
    if hasattr(value, "tolist") and not isinstance(value, Sequence):  # numpy arrays
        value = value.tolist()
    if len(value) > MAX_BINS:
        return None
    bins = [normalize_counter(v) for v in value]
    return None if any(b is None for b in bins) else bins  # type: ignore[return-value]


def normalize_weight_version(value: Any) -> str | None:
    """SGLang's ``weight_version``: a non-empty str of at most ``MAX_ID`` characters
    is kept, an int >= 0 (not a bool) of at most ``MAX_ID`` digits becomes its decimal
    string, anything else is None."""
    if isinstance(value, str):
        return value if 0 < len(value) <= MAX_ID else None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, int) or (hasattr(type(value), "__index__") and not isinstance(value, float)):
        try:
            number = operator.index(value)
        except TypeError:
            return None
        # an int too long to name a version (past MAX_ID digits) is unknown, never an error
        return str(number) if 0 <= number < _MAX_VERSION_INT else None
    return None


def counters_from_meta_info(meta_info: Mapping[str, Any]) -> SpecCounters:
    """The counters read from one SGLang ``meta_info`` dict (docs/contract.md).

    accepted/proposed come from the first alias pair with *both* keys present
    (even if a value is null or invalid); failing that, the first pair with one
    key present, the other half unknown. Pairs are never mixed. SGLang's own
    per-request ``spec_accept_rate``/``spec_accept_length`` are ignored.
    """
    pair = next((p for p in ACCEPT_PAIRS if p[0] in meta_info and p[1] in meta_info), None)
    if pair is None:
        pair = next((p for p in ACCEPT_PAIRS if p[0] in meta_info or p[1] in meta_info), None)
    accepted = proposed = None
    if pair is not None:
        accepted = normalize_counter(meta_info.get(pair[0]))
        proposed = normalize_counter(meta_info.get(pair[1]))
    if "spec_correct_drafts_histogram" in meta_info:
        histogram = _normalize_histogram(meta_info["spec_correct_drafts_histogram"])
    elif "spec_accept_histogram" in meta_info:
        histogram = _normalize_histogram(meta_info["spec_accept_histogram"])
    else:
        histogram = None
    return SpecCounters(
        accepted=accepted,
        proposed=proposed,
        verify=normalize_counter(meta_info.get("spec_verify_ct")),
        completion=normalize_counter(meta_info.get("completion_tokens")),
        accept_histogram=histogram,
        weight_version=normalize_weight_version(meta_info.get("weight_version")),
    )


def _fold(values: list[int | None]) -> int | None:
    """Known only if every attempt reported it; a sum past the limit is unknown too."""
    if any(v is None for v in values):
        return None
    total = sum(values)  # type: ignore[arg-type]
    return total if total <= MAX_COUNTER else None


def fold_attempts(attempts: Iterable[SpecCounters]) -> SpecCounters:
    """One generation resumed over several backend attempts (abort + resume).

    Field by field: known only if every attempt reported it, then the sum (unknown
    past ``MAX_COUNTER``); the histogram element-wise (shorter ones padded with
    zeros). The weight_version is kept when every attempt reports the same one: a
    generation resumed across a weight update has no single version.
    """
    attempts = list(attempts)
    if not attempts:
        return SpecCounters()
    histograms = [a.accept_histogram for a in attempts]
    histogram: list[int] | None = None
    if all(h is not None for h in histograms):
        histogram = [0] * max(len(h) for h in histograms)  # type: ignore[arg-type]
        for h in histograms:
            for i, count in enumerate(h):  # type: ignore[arg-type]
                histogram[i] += count
        if any(count > MAX_COUNTER for count in histogram):
            histogram = None
    versions = {a.weight_version for a in attempts}
    return SpecCounters(
        accepted=_fold([a.accepted for a in attempts]),
        proposed=_fold([a.proposed for a in attempts]),
        verify=_fold([a.verify for a in attempts]),
        completion=_fold([a.completion for a in attempts]),
        accept_histogram=histogram,
        weight_version=versions.pop() if len(versions) == 1 else None,
    )
