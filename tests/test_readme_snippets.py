"""The README's producer snippet, extracted from the README and run as written
(eight rollout workers, each running it) against a real worker: the batch closes
complete, every record counted under the publisher that sent it."""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import pytest

from .support.sglang_meta_info import SGLANG_OUTPUTS

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def python_blocks(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_producer_section_has_one_snippet_that_compiles():
    (snippet,) = python_blocks(readme_section("Using the producer library"))
    compile(f"async def _main():\n{textwrap.indent(snippet, '    ')}", "README.md", "exec")


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_the_readme_producer_snippet_gives_complete_batches(deployment, pack):
    """Packed, the envelope names the producer and run; plain (``pack=False``, one
    message per record), the publisher fills them into each record. Either way the
    worker counts every record under the marker's producer."""
    (snippet,) = python_blocks(readme_section("Using the producer library"))
    # what a reader substitutes: their broker and topic, and which of the 8 workers runs it
    assert '"kafka:9092"' in snippet and '"rollout-worker-3"' in snippet and "expected_producers=8" in snippet
    worker = deployment.start_worker()
    deployment.wait_ready(worker)

    async def rollout_worker(index: int) -> None:
        code = (
            snippet.replace('"kafka:9092"', repr(deployment.bootstrap))
            .replace('"rollout-worker-3"', repr(f"rollout-worker-{index}"))
            .replace("PublisherSettings(", f"PublisherSettings(topic={deployment.topics.records!r}, pack={pack}, ", 1)
        )
        outputs = [
            {"text": "...", "meta_info": {**meta_info, "id": f"w{index}-{version}"}}
            for version, (meta_info, _) in SGLANG_OUTPUTS.items()
        ]
        dataset = ("gsm8k", "chat")[index % 2]
        namespace = {
            "outputs": outputs,
            "step": 12,
            "session": f"session-{index}",
            "trajectory": "t0",
            "dataset": dataset,
        }
        exec(f"async def _main():\n{textwrap.indent(code, '    ')}", namespace)
        await namespace["_main"]()

    async def fleet() -> None:
        await asyncio.gather(*(rollout_worker(i) for i in range(8)))

    asyncio.run(fleet())
    published = deployment.metrics(
        until=lambda ms: any(m.batch_id == "step-12" and m.complete for m in ms), timeout_s=60
    )
    complete = [m for m in published if m.batch_id == "step-12" and m.complete]
    assert complete, (
        "no complete revision of step-12; published: "
        f"{[(m.revision, m.close_reason, m.missing_record_count) for m in published]}"
    )
    batch = complete[-1]
    assert batch.run_id == "grpo-7-attempt-2"
    assert batch.missing_record_count == 0 and batch.close_reason == "markers"
    assert batch.record_count == 8 * len(SGLANG_OUTPUTS)
    assert batch.metrics["spec/unique_generation_count"] == 8 * len(SGLANG_OUTPUTS)
    assert [e.weight_version for e in batch.by_weight_version] == ["step-000120"]
    assert [(e.task, e.metrics["spec/unique_generation_count"]) for e in batch.by_task] == [
        ("chat", 4 * len(SGLANG_OUTPUTS)),
        ("gsm8k", 4 * len(SGLANG_OUTPUTS)),
    ]
