"""An agentic rollout that calls SGLang through its OpenAI-compatible API
(`python -m sglang.launch_server ... --speculative-algorithm EAGLE3`; no GPU in this process).

Each request asks for `return_spec_tokens_details`, so SGLang answers the speculative
counters in `sglext.spec_tokens_details` (PR #33518); every committed answer is published
with the draft's lag, and the step's batch is closed. Run `specmeter worker` beside it.
The test suite runs `rollout_step` against a recorded SGLang answer (tests/test_examples_engines.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from typing import Any

from specmeter.producers import Publisher, PublisherSettings
from specmeter.producers.sglang_adapter import publish_openai_response, sse_events

SGLANG_URL = os.environ.get("SGLANG_URL", "http://127.0.0.1:30000")
MODEL = os.environ.get("MODEL", "Qwen/Qwen3-8B")


def post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return response.read()


async def rollout_step(
    publisher: Any, base_url: str, prompts: list[str], *, batch_id: str, draft_lag: int, stream: bool = False
) -> int:
    """One chat request per prompt (each its own session); returns how many records were published."""
    published = 0
    for number, prompt in enumerate(prompts):
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 256,
            "return_spec_tokens_details": True,  # the counters, in sglext.spec_tokens_details
        }
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        raw = await asyncio.to_thread(post, f"{base_url}/v1/chat/completions", body)
        answer = sse_events(raw) if stream else json.loads(raw)
        # ... the trainer keeps `answer` here; only what it keeps is published ...
        published += await publish_openai_response(
            publisher,
            answer,
            batch_id=batch_id,
            session_id=f"{batch_id}/prompt-{number}",
            draft_lags=draft_lag,
            speculative=True,  # the server speculates: an answer without details verified nothing
        )
    return published


async def rollout(prompts: list[str], steps: int = 3, draft_refreshed_at: int = 0) -> None:
    settings = PublisherSettings(bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    async with Publisher(settings) as publisher:
        for step in range(steps):
            batch_id = f"step-{step:06d}"
            await rollout_step(publisher, SGLANG_URL, prompts, batch_id=batch_id, draft_lag=step - draft_refreshed_at)
            await publisher.close_batch(batch_id, speculative_algorithm="EAGLE3", expected_producers=1)


if __name__ == "__main__":
    asyncio.run(rollout(["Write a haiku about Kafka.", "What is 17 * 23?"]))
