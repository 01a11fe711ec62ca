"""SGLang's OpenAI-compatible responses to speculative counters. Pure; no sglang import.

With ``"return_spec_tokens_details": true`` in the request, SGLang's
``/v1/chat/completions`` and ``/v1/completions`` carry each request's speculative
counters in ``sglext.spec_tokens_details`` (SGLang PR #33518;
python/sglang/srt/entrypoints/openai/utils.py ``spec_tokens_details_from_meta_info``,
serving_chat.py and serving_completions.py ``_build_*_response`` and the streaming
generators, sgl-project/sglang main after that PR). What those files do, and what this
module does with it:

* The object is the request's ``meta_info`` keys under their canonical (0.5.12+) names:
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``, ``spec_verify_ct``,
  ``spec_correct_drafts_histogram`` (and ratios and cap-length fields we ignore). So it
  is read by ``counters_from_meta_info``, exactly as the same generation's ``meta_info``.
* SGLang builds it with ``meta_info.get(key) or 0`` (``or []`` for histograms): a key the
  engine did not write arrives as 0 or []. It writes the counters only with
  ``spec_verify_ct > 0``, so ``spec_verify_ct`` 0 means the counters were not written:
  they are dropped (unknown), never taken as 0; an empty histogram is unknown too.
* It is absent (no ``sglext``, or none of its keys) when the request wrote no spec key at
  all (nothing was verified): the same "not reported" as ``meta_info`` without spec keys.
* One object when ``n == 1``; with ``n > 1`` a list of the choices that had one, in choice
  order, without an index: when the list is shorter than the choices, which choice it
  belongs to cannot be told and every choice's counters are unknown.
* Non-streaming it is on the response; streaming, on a chunk of its own (``choices: []``)
  after the last content chunk and before the usage chunk.
* ``usage.completion_tokens`` is the completion of a single choice; with several choices
  it is their sum, so a choice's completion is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from ._meta_info import SpecCounters, counters_from_meta_info, normalize_counter

__all__ = [
    "OpenAIChoice",
    "OpenAIResponse",
    "assemble_stream",
    "choice_counters",
    "parse_response",
    "sse_events",
]

#: the counter keys SGLang fills with 0 when it did not write them (``or 0``)
_PLACEHOLDER_COUNTERS = ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct")
_HISTOGRAMS = ("spec_correct_drafts_histogram", "spec_cap_lens_histogram")


class OpenAIChoice(msgspec.Struct, kw_only=True):
    """A choice, as much of it as is read (chat or completions, whole or streamed)."""

    index: int = 0
    #: the full meta_info where the server returns it on the choice (chat's return_meta_info)
    meta_info: dict[str, Any] | None = None


class OpenAIUsage(msgspec.Struct, kw_only=True):
    completion_tokens: Any = None


class SglExt(msgspec.Struct, kw_only=True):
    #: one object (n == 1) or a list of those that had one (n > 1)
    spec_tokens_details: dict[str, Any] | list[dict[str, Any]] | None = None


class OpenAIMetadata(msgspec.Struct, kw_only=True):
    weight_version: Any = None


class OpenAIResponse(msgspec.Struct, kw_only=True):
    """The view of one response (or of a stream's chunks put together) that is read."""

    id: str
    choices: list[OpenAIChoice] = msgspec.field(default_factory=list)
    usage: OpenAIUsage | None = None
    sglext: SglExt | None = None
    metadata: OpenAIMetadata | None = None


def parse_response(response: Mapping[str, Any]) -> OpenAIResponse:
    """The response's view; raises ``ValueError`` naming the engine and the path of what
    does not fit (msgspec's own message: ``Expected `str`, got `int` - at `$.id```)."""
    try:
        return msgspec.convert(response, type=OpenAIResponse, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not an SGLang OpenAI-compatible response: {exc}") from exc


def sse_events(body: bytes | str) -> list[dict[str, Any]]:
    """The JSON objects of a server-sent-event stream (``data: {...}`` lines; ``[DONE]``
    and comments skipped), as an HTTP client reads them from a streamed response."""
    text = body.decode() if isinstance(body, bytes) else body
    events = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data and data != "[DONE]":
            events.append(msgspec.json.decode(data))
    return events


def assemble_stream(chunks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One response from a stream's chunks: the id of the first, every choice index seen
    (in order), the ``sglext`` of the chunk that carries one and the usage of the last
    chunk that has it (the final usage chunk)."""
    chunks = list(chunks)
    if not chunks:
        raise ValueError("an SGLang stream with no chunk: nothing to read")
    indexes: dict[int, None] = {}
    assembled: dict[str, Any] = {"id": chunks[0].get("id")}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            indexes.setdefault(choice.get("index", 0) if isinstance(choice, Mapping) else 0)
        for key in ("sglext", "usage", "metadata"):
            if chunk.get(key) is not None:
                assembled[key] = chunk[key]
    assembled["choices"] = [{"index": index} for index in indexes] or [{"index": 0}]
    return assembled


def _as_meta_info(details: Mapping[str, Any]) -> dict[str, Any]:
    """``spec_tokens_details`` as the meta_info it was built from: SGLang's placeholder
    zeros (``spec_verify_ct`` 0: the counters were not written) and empty histograms
    dropped, so that they read as unknown."""
    meta = dict(details)
    if meta.get("spec_verify_ct") == 0:
        for key in _PLACEHOLDER_COUNTERS:
            meta.pop(key, None)
    for key in _HISTOGRAMS:
        if meta.get(key) == []:
            meta.pop(key)
    return meta


def _details_for(response: OpenAIResponse) -> list[Mapping[str, Any] | None] | None:
    """Each choice's ``spec_tokens_details`` in choice order (None: the choice had none);
    None when they cannot be attributed to choices (see the module docstring)."""
    count = max(len(response.choices), 1)
    details = response.sglext.spec_tokens_details if response.sglext is not None else None
    if details is None:
        return [None] * count
    if isinstance(details, dict):
        return [details] if count == 1 else None
    return list(details) if len(details) == count else None


def choice_counters(response: OpenAIResponse, *, speculative: bool = False) -> list[SpecCounters]:
    """One ``SpecCounters`` per choice, in order of ``choices``. A choice's own
    ``meta_info`` (where the server put one on it) is read first; otherwise its
    ``spec_tokens_details``, with the completion from ``usage`` when there is one choice.
    Details that cannot be attributed to choices leave every counter unknown, whatever
    ``speculative`` says (that is for a generation SGLang wrote no spec key for)."""
    choices = response.choices or [OpenAIChoice()]
    completion = response.usage.completion_tokens if response.usage is not None and len(choices) == 1 else None
    attributed = _details_for(response)
    counters = []
    for position, choice in enumerate(choices):
        if choice.meta_info is not None:
            counters.append(counters_from_meta_info(choice.meta_info, speculative=speculative))
        elif attributed is None:
            counters.append(SpecCounters(completion=normalize_counter(completion)))
        else:
            details = attributed[position]
            meta = _as_meta_info(details) if details is not None else {}
            meta["completion_tokens"] = completion
            counters.append(counters_from_meta_info(meta, speculative=speculative))
    return counters
