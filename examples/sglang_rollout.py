"""Wiring specmeter into an SGLang rollout loop (needs a GPU and `pip install 'specmeter[sglang]'`).

Each training step is one batch: every committed generation is published as it
finishes (never blocking generation), and the worker marks the batch done.
Run `specmeter worker` next to it and read the metrics topic (or `specmeter tail`).
"""

from __future__ import annotations

import asyncio
import os

from specmeter.producers import Publisher, PublisherSettings
from specmeter.producers.sglang_adapter import publish_outputs, require_sglang

WORKERS = int(os.environ.get("ROLLOUT_WORKERS", "1"))  # how many rollout processes publish per step


async def rollout(prompts: list[str], steps: int = 3) -> None:
    sglang = require_sglang()
    engine = sglang.Engine(
        model_path=os.environ.get("MODEL", "Qwen/Qwen2.5-0.5B-Instruct"),
        speculative_algorithm="NGRAM",
        speculative_num_draft_tokens=8,
    )
    settings = PublisherSettings(bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    async with Publisher(settings) as publisher:
        for step in range(steps):
            batch_id = f"step-{step:06d}"
            sessions = [f"{batch_id}/prompt-{i}" for i in range(len(prompts))]
            outputs = await engine.async_generate(prompts, {"max_new_tokens": 256, "temperature": 1.0})
            await publish_outputs(publisher, outputs, batch_id=batch_id, session_ids=sessions)
            # ... the training step uses `outputs` here ...
            await publisher.close_batch(batch_id, speculative_algorithm="NGRAM", expected_producers=WORKERS)
    engine.shutdown()


if __name__ == "__main__":
    asyncio.run(rollout(["Write a haiku about Kafka.", "What is 17 * 23?"]))
