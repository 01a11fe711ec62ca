"""SGLang's outputs: ``meta_info`` as the tokenizer manager fills it, and the OpenAI-compatible
responses SGLang builds from the same ``meta_info``.

Sources (sgl-project/sglang, main after PR #33518, read for issue 44):

* python/sglang/srt/managers/tokenizer_manager_components/spec_decoding_meta.py
  ``fill_spec_decoding_meta`` (0.5.12+ names): every spec key, ``spec_verify_ct``
  included, is written only when ``spec_verify_ct > 0`` and the nominal proposals
  ``spec_verify_ct * (speculative_num_draft_tokens - 1)`` are > 0; the 0.5.11 names
  ``spec_accepted_drafts``/``spec_proposed_drafts``/``spec_accept_histogram`` are written
  beside them as aliases.
* test/registered/spec/test_speculative_response_metrics.py (decoupled speculative
  decoding): measured proposals ``spec_num_proposed_drafts`` 2 with
  ``spec_proposed_drafts_histogram`` [0, 2] and ``spec_num_*_drafts_by_position``, and the
  nominal fallback 6 = 2 × (4 − 1) where the engine did not measure.
* python/sglang/srt/entrypoints/openai/utils.py ``spec_tokens_details_from_meta_info``:
  the details are those keys, each ``meta_info.get(key) or 0`` (``or []``); None when no
  key is there. serving_completions.py / serving_chat.py: the object for n == 1, the list
  of the non-None ones for n > 1 (test/registered/openai_server/basic/
  test_serving_completions.py ``test_parallel_sampling_returns_spec_details_per_choice``);
  streamed on a chunk of its own with ``choices: []`` before the usage chunk.

``openai_response`` and ``openai_stream`` below do what those two files do, so that a
fixture's meta_info and its OpenAI answer are the same generation.
"""

from __future__ import annotations

import json
from typing import Any

#: fill_spec_decoding_meta with speculative_num_draft_tokens=4 (3 drafts per step): 5 verify
#: steps, 7 drafts accepted, histogram [1, 2, 1, 1] (sum 5 steps, sum i*H 7 drafts)
EAGLE_0_5_12 = {
    "id": "7d2c1f0e9a",
    "finish_reason": {"type": "stop", "matched": 151645},
    "prompt_tokens": 57,
    "completion_tokens": 13,
    "cached_tokens": 0,
    "weight_version": "step-000042",
    "spec_accept_rate": 7 / 15,
    "spec_accept_length": 13 / 5,
    "spec_num_correct_drafts": 7,
    "spec_num_proposed_drafts": 15,
    "spec_verify_ct": 5,
    "spec_accepted_drafts": 7,
    "spec_proposed_drafts": 15,
    "spec_correct_drafts_histogram": [1, 2, 1, 1],
    "spec_accept_histogram": [1, 2, 1, 1],
}
EAGLE_0_5_12_COUNTERS = (7, 15, 5, 13, [1, 2, 1, 1])

#: a request that never reached a verify step (one token from prefill, then EOS): no spec key
NOTHING_VERIFIED = {
    "id": "0b9e4d3c2a",
    "finish_reason": {"type": "stop", "matched": 151645},
    "prompt_tokens": 31,
    "completion_tokens": 1,
    "cached_tokens": 0,
    "weight_version": "step-000042",
}

#: test_decoupled_accept_rate_uses_actual_proposals: measured proposals (2, not 6)
DECOUPLED_MEASURED = {
    "id": "5e4f3a2b1c",
    "finish_reason": {"type": "length", "length": 4},
    "prompt_tokens": 12,
    "completion_tokens": 4,
    "weight_version": "step-000042",
    "spec_verify_ct": 2,
    "spec_num_correct_drafts": 1,
    "spec_num_proposed_drafts": 2,
    "spec_accept_rate": 0.5,
    "spec_accept_length": 2.0,
    "spec_draft_occupancy_rate": 1 / 3,
    "spec_proposed_draft_length": 1.0,
    "spec_num_proposed_drafts_by_position": [2, 0, 0],
    "spec_num_correct_drafts_by_position": [1, 0, 0],
    "spec_accept_rate_by_position": [0.5, None, None],
    "spec_proposed_drafts_histogram": [0, 2],
    "spec_correct_drafts_histogram": [1, 1],
}
DECOUPLED_MEASURED_COUNTERS = (1, 2, 2, 4, [1, 1])

#: test_other_spec_falls_back_to_fixed_k: the engine did not measure, proposals nominal
NOMINAL_FALLBACK = {
    "id": "9a8b7c6d5e",
    "finish_reason": {"type": "length", "length": 4},
    "prompt_tokens": 12,
    "completion_tokens": 4,
    "weight_version": "step-000042",
    "spec_verify_ct": 2,
    "spec_num_correct_drafts": 1,
    "spec_num_proposed_drafts": 6,
    "spec_accept_rate": 1 / 6,
    "spec_accept_length": 2.0,
    "spec_draft_occupancy_rate": 1.0,
}
NOMINAL_FALLBACK_COUNTERS = (1, 6, 2, 4, None)

#: spec_tokens_details_from_meta_info's keys (SpecTokensDetails' fields)
_DETAIL_KEYS = {
    "spec_accept_rate": 0.0,
    "spec_accept_length": 0.0,
    "spec_cap_length": 0.0,
    "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0,
    "spec_num_proposed_drafts": 0,
    "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [],
    "spec_cap_lens_histogram": [],
}


def spec_tokens_details(meta_info: dict[str, Any]) -> dict[str, Any] | None:
    """utils.py spec_tokens_details_from_meta_info: None without any key, else every field
    ``meta_info.get(key) or default``."""
    if not any(key in meta_info for key in _DETAIL_KEYS):
        return None
    return {key: meta_info.get(key) or default for key, default in _DETAIL_KEYS.items()}


def _sglext(ret: list[dict[str, Any]], n: int) -> dict[str, Any] | None:
    details = [d for d in (spec_tokens_details(item["meta_info"]) for item in ret) if d is not None]
    value = details if n > 1 else (details[0] if details else None)
    return {"spec_tokens_details": value} if value else None


def openai_response(ret: list[dict[str, Any]], *, n: int = 1, chat: bool = True) -> dict[str, Any]:
    """serving_chat.py / serving_completions.py ``_build_*_response`` over ``ret`` (the
    tokenizer manager's outputs, each ``{"text", "meta_info"}``)."""
    choices = []
    for index, item in enumerate(ret):
        finish = item["meta_info"]["finish_reason"]
        choice: dict[str, Any] = {"index": index, "finish_reason": finish["type"], "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": item["text"]}
        else:
            choice["text"] = item["text"]
        choices.append(choice)
    prompt = sum(ret[i]["meta_info"]["prompt_tokens"] for i in range(0, len(ret), n))
    completion = sum(item["meta_info"]["completion_tokens"] for item in ret)
    response: dict[str, Any] = {
        "id": ret[0]["meta_info"]["id"],
        "object": "chat.completion" if chat else "text_completion",
        "created": 1767600000,
        "model": "Qwen/Qwen3-8B",
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        "metadata": {"weight_version": ret[0]["meta_info"]["weight_version"]},
    }
    sglext = _sglext(ret, n)
    if sglext is not None:
        response["sglext"] = sglext
    return response


def openai_stream(ret: list[dict[str, Any]], *, n: int = 1) -> str:
    """The SSE body of the same generation streamed with ``stream_options.include_usage``:
    content chunks, the sglext chunk (``choices: []``), the usage chunk, ``[DONE]``."""
    rid = ret[0]["meta_info"]["id"]
    base = {"id": rid, "object": "chat.completion.chunk", "created": 1767600000, "model": "Qwen/Qwen3-8B"}
    events = []
    for index, item in enumerate(ret):
        for piece in (item["text"][:3], item["text"][3:]):
            delta = {"index": index, "delta": {"content": piece}, "finish_reason": None}
            events.append({**base, "choices": [delta]})
        events.append({**base, "choices": [{"index": index, "delta": {}, "finish_reason": "stop"}]})
    sglext = _sglext(ret, n)
    if sglext is not None:
        events.append({**base, "choices": [], "sglext": sglext})
    whole = openai_response(ret, n=n)
    events.append({**base, "choices": [], "usage": whole["usage"]})
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


def ret_item(meta_info: dict[str, Any], text: str = "The answer is 42.") -> dict[str, Any]:
    """One tokenizer-manager output (what Engine.generate and /generate return)."""
    return {"text": text, "output_ids": list(range(meta_info["completion_tokens"])), "meta_info": meta_info}
