"""A rollout that calls TensorRT-LLM's `trtllm-serve` over HTTP (no GPU in this process).

Released servers report no speculative counters on the response (a choice has only
`avg_decoded_tokens_per_iter`): their records carry the completion and every counter
unknown. With TensorRT-LLM PR #19311 (open, not yet released) each choice carries a
`speculative_decoding` object, and the records are exact. In the rollout process,
`LLM.generate(..., SamplingParams(return_perf_metrics=True))` gives accepted and proposed
today: `tensorrt_llm_adapter.publish_request_outputs`. The test suite runs `rollout_step`
against a recorded answer (tests/test_examples_engines.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from typing import Any

from specmeter.producers import Publisher, PublisherSettings
from specmeter.producers.tensorrt_llm_adapter import publish_response

TRTLLM_URL = os.environ.get("TRTLLM_URL", "http://127.0.0.1:8000")
MODEL = os.environ.get("MODEL", "meta-llama/Llama-3.1-8B-Instruct")


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


async def rollout_step(publisher: Any, base_url: str, prompts: list[str], *, batch_id: str, draft_lag: int) -> int:
    """One /v1/chat/completions request per prompt; returns how many records were published."""
    published = 0
    for number, prompt in enumerate(prompts):
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 256}
        answer = await asyncio.to_thread(post, f"{base_url}/v1/chat/completions", body)
        published += await publish_response(
            publisher, answer, batch_id=batch_id, session_id=f"{batch_id}/prompt-{number}", draft_lags=draft_lag
        )
    return published


async def rollout(prompts: list[str], steps: int = 3, draft_refreshed_at: int = 0) -> None:
    settings = PublisherSettings(bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    async with Publisher(settings) as publisher:
        for step in range(steps):
            batch_id = f"step-{step:06d}"
            await rollout_step(publisher, TRTLLM_URL, prompts, batch_id=batch_id, draft_lag=step - draft_refreshed_at)
            await publisher.close_batch(batch_id, speculative_algorithm="EAGLE3", expected_producers=1)


if __name__ == "__main__":
    asyncio.run(rollout(["Write a haiku about Kafka.", "What is 17 * 23?"]))
