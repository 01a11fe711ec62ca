"""A rollout that calls vLLM over HTTP (`vllm serve ... --speculative-config '{...}'
--per-request-spec-decode-metrics summary`; no GPU in this process).

vLLM answers each single-sequence request's counters in `metrics.speculative_decoding`
(docs/vllm.md); every committed answer is published with the draft's lag. Send one prompt
and n = 1 per request: with several, vLLM reports nothing per choice. The test suite runs
`rollout_step` against a recorded vLLM answer (tests/test_examples_engines.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from typing import Any

from specmeter.producers import Publisher, PublisherSettings
from specmeter.producers.vllm_adapter import publish_response

VLLM_URL = os.environ.get("VLLM_URL", "http://127.0.0.1:8000")
MODEL = os.environ.get("MODEL", "Qwen/Qwen3-8B")


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


async def rollout_step(publisher: Any, base_url: str, prompts: list[str], *, batch_id: str, draft_lag: int) -> int:
    """One /v1/completions request per prompt; returns how many records were published."""
    published = 0
    for number, prompt in enumerate(prompts):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 256, "temperature": 1.0}
        answer = await asyncio.to_thread(post, f"{base_url}/v1/completions", body)
        # ... the trainer keeps `answer` here ...
        published += await publish_response(
            publisher, answer, batch_id=batch_id, session_id=f"{batch_id}/prompt-{number}", draft_lags=draft_lag
        )
    return published


async def rollout(prompts: list[str], steps: int = 3, draft_refreshed_at: int = 0) -> None:
    settings = PublisherSettings(bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    async with Publisher(settings) as publisher:
        for step in range(steps):
            batch_id = f"step-{step:06d}"
            await rollout_step(publisher, VLLM_URL, prompts, batch_id=batch_id, draft_lag=step - draft_refreshed_at)
            await publisher.close_batch(batch_id, speculative_algorithm="EAGLE3", expected_producers=1)


if __name__ == "__main__":
    asyncio.run(rollout(["Write a haiku about Kafka.", "What is 17 * 23?"]))
