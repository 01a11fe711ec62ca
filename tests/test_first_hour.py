"""A user's first hour, walked from the README as written (issue #24): the main job, a worker,
the producer snippet run by one process (it says expected_producers=8), `specmeter tail` with
the right topic and a mistyped one, Ctrl-C during `specmeter replay`. Nothing surprising may
happen: no topic created by a reader, no traceback, every wait explained."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .support.kafka_helpers import create_topic, topic_names
from .support.sglang_meta_info import SGLANG_OUTPUTS
from .support.tools import run_specmeter, start_specmeter
from .support.worker_harness import Deployment
from .test_readme_snippets import python_blocks, readme_section

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


_specmeter = functools.partial(run_specmeter, timeout=120)


def _wait_for(log_path, pattern: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in the worker's log:\n{log_path.read_text()[-3000:]}")


def test_a_first_hour_from_the_readme_has_no_surprise(kafka_bootstrap, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "SPECMETER_"))}
    env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    outputs: list[str] = []

    # 1. the main job (`deploy/dev demo` runs this module)
    demo = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.demo", "--timeout", "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    outputs += [demo.stdout, demo.stderr]
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "specmeter tail" in demo.stderr  # it ends with what to try next

    # 2. a worker of one's own, its web server on a free port the log names
    d = Deployment(kafka_bootstrap, partitions=4, batch_timeout_s=8.0)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    try:
        worker = d.start_worker("--web-port", "0", "--web-host", "127.0.0.1")
        d.wait_ready(worker)
        log = d.logs[0]
        assert re.search(r"web server on http://127\.0\.0\.1:\d+", log.read_text())

        # 3. the README's producer snippet, as written, run by one process of the eight it names
        (snippet,) = python_blocks(readme_section("Using the producer library"))
        code = snippet.replace('"kafka:9092"', repr(kafka_bootstrap)).replace(
            "PublisherSettings(", f"PublisherSettings(topic={d.topics.records!r}, ", 1
        )
        namespace = {
            "outputs": [{"meta_info": {**m, "id": f"r{i}"}} for i, (m, _) in enumerate(SGLANG_OUTPUTS.values())],
            "step": 12,
            "session": "session-0",
            "trajectory": "t0",
            "dataset": "gsm8k",  # the prompt's dataset, which the snippet names as its task
        }
        exec(f"async def _main():\n{textwrap.indent(code, '    ')}", namespace)
        asyncio.run(namespace["_main"]())
        # ... and the worker says at once what the batch waits for
        _wait_for(log, r"step-12.*markers from 1 of 8 producers \(rollout-worker-3\); waiting for 7 more", 20)

        # 4. `specmeter tail` with a mistyped topic: one line naming the real one, nothing created
        before = asyncio.run(topic_names(kafka_bootstrap))
        typo = d.topics.metrics.replace("metrics", "metircs")
        tail_typo = _specmeter("tail", "--topic", typo, "--timeout", "5", env=env)
        outputs += [tail_typo.stdout, tail_typo.stderr]
        assert tail_typo.returncode != 0
        assert d.topics.metrics in tail_typo.stderr and len(tail_typo.stderr.strip().splitlines()) <= 2
        assert typo not in asyncio.run(topic_names(kafka_bootstrap)) and typo not in before

        # 5. `specmeter tail` with the right topic: the batch, closed by timeout and marked incomplete
        tail = _specmeter(
            "tail", "--topic", d.topics.metrics, "--json", "--timeout", "30", "--max-messages", "1", env=env
        )
        outputs += [tail.stdout, tail.stderr]
        assert tail.returncode == 0, tail.stderr
        (batch,) = [json.loads(line) for line in tail.stdout.splitlines() if line.strip()]
        assert batch["batch_id"] == "step-12" and batch["close_reason"] == "timeout" and not batch["complete"]

        # 6. Ctrl-C during `specmeter replay`: a summary, the half-sent batch named, and the
        # worker says later what that batch (no marker: never closed by one) waits for
        dump = tmp_path / "dump.jsonl"
        lines = [
            {"batch_id": "step-13", "session_id": f"s{i}", "generation_id": f"g{i}", "verify": 1, "completion": 2}
            for i in range(2_000)
        ]
        dump.write_text("".join(json.dumps(line) + "\n" for line in lines))
        command = ["replay", str(dump), "--topic", d.topics.records, "--rate", "200", "--no-progress"]
        replay = start_specmeter(*command, env=env)
        time.sleep(4.0)
        replay.send_signal(signal.SIGINT)
        out, err = replay.communicate(timeout=60)
        outputs += [out, err]
        assert replay.returncode == 130, err
        assert "left half-sent" in err and "step-13" in err
        text = _wait_for(log, r"step-13.*no producer's marker yet", 30)
        outputs.append(text)
    finally:
        d.close()

    for output in outputs:
        assert "Traceback" not in output, output[-3000:]
