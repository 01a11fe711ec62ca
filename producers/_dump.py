"""Reading rollout dumps (JSON lines) the same way for ``aggregate`` and ``replay``.

A line is a record (SPEC §2 fields), a marker (``"type": "marker"``), or an
SGLang output: ``{"meta_info": {...}, "batch_id", "session_id", "sample_id"?,
"state_hash"?, "producer_id"?, "generation_id"?}``, turned into a record with
the SPEC §2.1 rules (``"attempts": [meta_info, ...]`` for a resumed generation).
"""

from __future__ import annotations

from typing import Any

import msgspec

from specmeter.schemas import BatchMarker, GenerationRecord, InvalidRecord, decode_json_line

from ._builders import record_from_attempts, record_from_meta_info

__all__ = ["parse_dump_line"]

_decoder = msgspec.json.Decoder()
_IDENTITY = ("batch_id", "session_id", "sample_id", "state_hash", "producer_id", "generation_id")


def _str_or_none(obj: dict, key: str) -> Any:
    value = obj.get(key)
    return value if isinstance(value, str) and value else None


def parse_dump_line(line: bytes | str) -> GenerationRecord | BatchMarker | InvalidRecord:
    """One dump line as a record, a marker, or an invalid line with its reason."""
    raw = line.encode() if isinstance(line, str) else bytes(line)
    if b'"meta_info"' not in raw and b'"attempts"' not in raw:
        return decode_json_line(raw)
    try:
        obj = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return InvalidRecord(reason="undecodable", detail=str(exc), raw=raw)
    if not isinstance(obj, dict) or not ("meta_info" in obj or "attempts" in obj):
        return decode_json_line(raw)
    identity = {k: obj.get(k) for k in _IDENTITY}
    try:
        if "attempts" in obj:
            return record_from_attempts(obj["attempts"], **identity)
        meta_info = obj["meta_info"]
        if not isinstance(meta_info, dict):
            raise ValueError("`meta_info` must be an object")
        return record_from_meta_info(meta_info, **identity)
    except (msgspec.ValidationError, ValueError, TypeError, AttributeError) as exc:
        return InvalidRecord(reason="invalid", detail=f"SGLang output: {exc}", raw=raw,
                             batch_id=_str_or_none(obj, "batch_id"), producer_id=_str_or_none(obj, "producer_id"))
