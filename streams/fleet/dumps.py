"""Reading rollout dumps (JSON lines) the same way for ``aggregate`` and ``replay``.

A line is a record (docs/contract.md §1 fields), a marker (``"type": "marker"``),
or an SGLang output: ``{"meta_info": {...}, "batch_id", "session_id", "sample_id"?,
"state_hash"?, "producer_id"?, "generation_id"?, "weight_version"?, "run_id"?, "task"?,
"draft_lag"?}``,
turned into a record with the rules of docs/contract.md §2 (``"attempts":
[meta_info, ...]`` for a resumed generation).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from specmeter.producers import record_from_attempts, record_from_meta_info
from specmeter.schemas import MAX_ID, BatchMarker, GenerationRecord, InvalidRecord, decode_json_line

from ..errors import SpecmeterError

__all__ = ["parse_dump_line", "dump_lines", "DumpEncodingError"]

#: what Windows tools (Notepad, PowerShell's Out-File -Encoding utf8) write before UTF-8 text
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


class DumpEncodingError(SpecmeterError, ValueError):
    """The dump is not UTF-8 text (PowerShell 5's ``>`` writes UTF-16)."""


def dump_lines(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a dump, a UTF-8 byte-order mark removed (at the start of any line:
    files joined with ``cat`` keep theirs), so a file reads the same with or without one.

    Raises:
        DumpEncodingError: the first line starts with a UTF-16 byte-order mark.
    """
    for number, line in enumerate(lines):
        if number == 0 and line.startswith(UTF16_BOMS):
            raise DumpEncodingError("it is UTF-16 text, not UTF-8 (PowerShell's `>` writes UTF-16)")
        yield line.removeprefix(UTF8_BOM)


_decoder = msgspec.json.Decoder()
_IDENTITY = (
    "batch_id",
    "session_id",
    "sample_id",
    "state_hash",
    "producer_id",
    "generation_id",
    "weight_version",
    "run_id",
    "task",
)


#: what an SGLang output line says beside its identity: the draft's lag (revision 5)
_OTHERS = ("draft_lag",)


def _id_or_none(obj: dict, key: str) -> Any:
    value = obj.get(key)
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID else None


def parse_dump_line(line: bytes | str) -> GenerationRecord | BatchMarker | InvalidRecord:
    """One dump line as a record, a marker, or an invalid line with its reason."""
    raw = line.encode() if isinstance(line, str) else bytes(line)
    output = _sglang_output(raw)
    if output is None:
        return decode_json_line(raw)
    if isinstance(output, InvalidRecord):
        return output
    return _record_from_output(output, raw)


def _sglang_output(raw: bytes) -> dict | InvalidRecord | None:
    """The line's object where it is an SGLang output, an invalid record where it does not
    decode, None where it is a record or a marker (a line naming neither key is not decoded twice)."""
    if b'"meta_info"' not in raw and b'"attempts"' not in raw:
        return None
    try:
        obj = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return InvalidRecord(reason="undecodable", detail=str(exc), raw=raw)
    return obj if _is_output(obj) else None


def _is_output(obj: Any) -> bool:
    """An object with ``meta_info`` or ``attempts``: the keys were not only in a string."""
    return isinstance(obj, dict) and ("meta_info" in obj or "attempts" in obj)


def _record_from_output(obj: dict, raw: bytes) -> GenerationRecord | InvalidRecord:
    """An SGLang output turned into a record by the rules of docs/contract.md §2."""
    identity: dict[str, Any] = {k: obj.get(k) for k in _IDENTITY + _OTHERS}
    try:
        if "attempts" in obj:
            return record_from_attempts(obj["attempts"], **identity)
        meta_info = obj["meta_info"]
        if not isinstance(meta_info, dict):
            raise ValueError("`meta_info` must be an object")
        return record_from_meta_info(meta_info, **identity)
    except (msgspec.ValidationError, ValueError, TypeError, AttributeError) as exc:
        return _invalid_output(obj, raw, exc)


def _invalid_output(obj: dict, raw: bytes, exc: Exception) -> InvalidRecord:
    """An output that makes no record, counted in its batch where its identity reads."""
    batch_id = _readable_batch(obj)
    return InvalidRecord(
        reason="invalid",
        detail=f"SGLang output: {exc}",
        raw=raw,
        batch_id=batch_id,
        producer_id=_id_or_none(obj, "producer_id"),
        run_id=_id_or_none(obj, "run_id") if batch_id is not None else None,
    )


def _readable_batch(obj: dict) -> str | None:
    """The output's batch id, where its identity reads: a run_id present must be valid."""
    run_readable = obj.get("run_id") is None or _id_or_none(obj, "run_id") is not None
    return _id_or_none(obj, "batch_id") if run_readable else None
