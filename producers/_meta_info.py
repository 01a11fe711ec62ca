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
    "measured_proposed",
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
    number = _counter_number(value)
    return number if number is not None and 0 <= number <= MAX_COUNTER else None


def _counter_number(value: Any) -> int | None:
    """The integer a counter value spells (not yet held to 0 .. ``MAX_COUNTER``), or None."""
    if isinstance(value, float):
        return _float_counter(value)
    if isinstance(value, str):
        return _digits_counter(value)
    if not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _float_counter(value: float) -> int | None:
    """An integral float in range (5.0 -> 5); NaN and inf fail ``is_integer``."""
    if not value.is_integer() or value < 0 or value > MAX_COUNTER:
        return None
    return int(value)


def _digits_counter(value: str) -> int | None:
    """A string of ASCII digits ("07" -> 7), at most ``_MAX_DIGITS`` of them past leading zeros."""
    if not value or not value.isascii() or not value.isdigit() or len(value.lstrip("0")) > _MAX_DIGITS:
        return None
    return int(value)


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


def measured_proposed(meta_info: Mapping[str, Any]) -> int | None:
    """The drafts SGLang measured as proposed, where it says: the sum of
    ``spec_num_proposed_drafts_by_position`` (drafts proposed at each position), else
    sum_i i * ``spec_proposed_drafts_histogram[i]`` (verify steps that drafted i tokens).

    These keys come with decoupled speculative decoding (SGLang's
    test/registered/spec/test_speculative_response_metrics.py builds them from
    ``TokenizerManager._calculate_spec_decoding_metrics``); without them
    ``spec_num_proposed_drafts`` is nominal, verify steps × (num_draft_tokens − 1),
    even where fewer were drafted. An empty list, a malformed one or none: None.
    """
    by_position = _normalize_histogram(meta_info.get("spec_num_proposed_drafts_by_position"))
    if by_position:
        return normalize_counter(sum(by_position))
    by_length = _normalize_histogram(meta_info.get("spec_proposed_drafts_histogram"))
    if by_length:
        return normalize_counter(sum(length * steps for length, steps in enumerate(by_length)))
    return None


def _accept_pair(meta_info: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """accepted/proposed from the first alias pair with *both* keys present, else the first
    with one; pairs are never mixed."""
    pair = next((p for p in ACCEPT_PAIRS if p[0] in meta_info and p[1] in meta_info), None)
    if pair is None:
        pair = next((p for p in ACCEPT_PAIRS if p[0] in meta_info or p[1] in meta_info), None)
    if pair is None:
        return None, None
    return normalize_counter(meta_info.get(pair[0])), normalize_counter(meta_info.get(pair[1]))


def _nothing_verified(meta_info: Mapping[str, Any]) -> bool:
    """No accept-pair key, and ``spec_verify_ct`` absent or 0: what SGLang writes for a
    request that had no verify step (its ``fill_spec_decoding_meta`` sets every spec key
    only when ``spec_verify_ct > 0``; 0.5.4-0.5.10 wrote ``spec_verify_ct`` 0 alone)."""
    if any(key in meta_info for pair in ACCEPT_PAIRS for key in pair):
        return False
    return "spec_verify_ct" not in meta_info or normalize_counter(meta_info["spec_verify_ct"]) == 0


def counters_from_meta_info(meta_info: Mapping[str, Any], *, speculative: bool = False) -> SpecCounters:
    """The counters read from one SGLang ``meta_info`` dict (docs/contract.md).

    accepted/proposed come from the first alias pair with *both* keys present
    (even if a value is null or invalid); failing that, the first pair with one
    key present, the other half unknown. Pairs are never mixed. Where SGLang
    measured its proposals (``measured_proposed``), proposed is the measured count,
    not the nominal one. SGLang's own per-request ``spec_accept_rate``/
    ``spec_accept_length`` are ignored.

    ``speculative``: the caller knows the server runs speculative decoding. SGLang
    writes no spec key for a request with no verify step, the same meta_info a server
    without speculative decoding gives; by default such a generation's counters stay
    unknown, with ``speculative=True`` they are the observed 0 drafts accepted, 0
    proposed, 0 verify steps.
    """
    accepted, proposed = _accept_pair(meta_info)
    measured = measured_proposed(meta_info)
    if measured is not None:
        proposed = measured
    verify = normalize_counter(meta_info.get("spec_verify_ct"))
    if speculative and _nothing_verified(meta_info):
        accepted, proposed, verify = 0, 0, 0
    if "spec_correct_drafts_histogram" in meta_info:
        histogram = _normalize_histogram(meta_info["spec_correct_drafts_histogram"])
    elif "spec_accept_histogram" in meta_info:
        histogram = _normalize_histogram(meta_info["spec_accept_histogram"])
    else:
        histogram = None
    return SpecCounters(
        accepted=accepted,
        proposed=proposed,
        verify=verify,
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
    versions = {a.weight_version for a in attempts}
    return SpecCounters(
        accepted=_fold([a.accepted for a in attempts]),
        proposed=_fold([a.proposed for a in attempts]),
        verify=_fold([a.verify for a in attempts]),
        completion=_fold([a.completion for a in attempts]),
        accept_histogram=_fold_histograms([a.accept_histogram for a in attempts]),
        weight_version=versions.pop() if len(versions) == 1 else None,
    )


def _fold_histograms(histograms: list[list[int] | None]) -> list[int] | None:
    """The attempts' histograms added element-wise (shorter ones padded with zeros); unknown
    if an attempt reported none or a bin passes ``MAX_COUNTER``."""
    if any(h is None for h in histograms):
        return None
    histogram = [0] * max(len(h) for h in histograms)  # type: ignore[arg-type]
    for h in histograms:
        for i, count in enumerate(h):  # type: ignore[arg-type]
            histogram[i] += count
    return None if any(count > MAX_COUNTER for count in histogram) else histogram
