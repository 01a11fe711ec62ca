"""``specmeter tail``: an 80-column table with run ids and the drift view; like
``tail`` it starts with the last messages already on the topic; piped output ends
with a newline."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from specmeter.schemas import BatchMetrics, WeightVersionMetrics, encode_metrics
from specmeter.streams._tail import batch_label, drift_text, metrics_table


def version(name: str | None, rate: float | None) -> WeightVersionMetrics:
    metrics = {} if rate is None else {"spec/accept_rate": rate}
    return WeightVersionMetrics(weight_version=name, metrics=metrics, accept_histogram=None)


def batch(
    batch_id: str,
    *,
    run_id: str | None = None,
    versions=(),
    revision: int = 0,
    complete: bool = True,
    generations: int = 98_765,
) -> BatchMetrics:
    return BatchMetrics(
        batch_id=batch_id,
        revision=revision,
        close_reason="markers" if complete else "timeout",
        closed_at=0.0,
        speculative=True,
        complete=complete,
        partitions_reported=4,
        partitions_expected=4,
        record_count=123_456,
        invalid_record_count=3,
        missing_record_count=0,
        late_record_count=1,
        accept_histogram=None,
        metrics={
            "spec/accept_rate": 0.7512,
            "spec/tokens_per_verify": 3.41,
            "spec/accept_count_coverage": 0.95,
            "spec/unique_generation_count": generations,
            "spec/conflicting_generation_count": 2,
        },
        run_id=run_id,
        by_weight_version=[version(v, r) for v, r in versions] or None,
    )


def render(table, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()


LATEST = {
    1: batch("step-00001", versions=[("v7", 0.75), ("v8", 0.25)]),
    2: batch(
        "step-00002",
        run_id="grpo-llama-70b-attempt-3-restarted-from-step-1000",
        versions=[(f"v{i}", 0.9 - 0.05 * i) for i in range(4, 14)] + [(None, 0.5)],
        complete=False,
    ),
    3: batch("a-very-long-batch-identifier-from-some-trainer-000042", generations=12_345_678),
    4: batch("step-00004", run_id="r2", versions=[("v12", 0.5)], revision=3),
}


@pytest.mark.parametrize("width", [80, 100, 160])
def test_table_fits_the_terminal(width):
    lines = render(metrics_table(LATEST, 20, width), width)
    assert max(map(len, lines)) <= width, "\n".join(lines)
    text = "\n".join(lines)
    assert "step-00001" in text and "v7 .75 v8 .25" in text
    assert "r2/step-00004" in text, "the run is shown when it is not null"
    assert "…/step-00002" in text and "/step-00002" in text, "a long run id is shortened, the batch id kept"
    row = next(line for line in lines if "/step-00002" in line)
    assert "… " in row and "? .50" in row and "v4 " not in row, "the oldest versions go first when not all fit"
    if width >= 100:
        assert "v13 .25 ? .50" in row


@pytest.mark.parametrize("width", [80, 100])
def test_columns_of_a_narrow_and_a_wide_terminal(width):
    header = render(metrics_table(LATEST, 20, width), width)[1]
    for name in ("batch", "rev", "accept", "tok/v", "cov", "c/i/l", "close", "drift"):
        assert name in header, header
    assert ("gens" in header) == (width >= 100), "the generation count only where there is room"


def test_drift_text_orders_versions_naturally_and_keeps_the_newest():
    entries = [version("v10", 0.5), version("v9", 0.625), version(None, 0.3), version("v11", None), version("v8", 1.0)]
    assert drift_text(entries, 80) == "v8 1.00 v9 .62 v10 .50 v11 - ? .30"
    assert drift_text(entries, 21) == "… v10 .50 v11 - ? .30"
    assert drift_text(entries, 20) == "… v11 - ? .30"
    assert len(drift_text(entries, 12)) <= 12
    assert drift_text(None, 20) == "-"


def test_batch_label_names_the_run():
    assert batch_label(batch("step-1"), 20) == "step-1"
    assert batch_label(batch("step-1", run_id="run-a"), 20) == "run-a/step-1"
    assert batch_label(batch("step-1", run_id="a-long-run-name"), 12) == "a-lo…/step-1"
    assert len(batch_label(batch("x" * 40, run_id="run"), 12)) == 12


def test_rows_keep_the_latest_batches():
    many = {i: batch(f"step-{i:05d}") for i in range(30)}
    text = "\n".join(render(metrics_table(many, 5, 80), 80))
    assert "step-00029" in text and "step-00025" in text and "step-00024" not in text


# -- against the real broker ------------------------------------------------------


def _tail(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped: rich's default, 80 columns
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "tail", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


async def _publish(bootstrap: str, topic: str, messages: list[BatchMetrics]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for m in messages:
            await producer.send_and_wait(topic, encode_metrics(m), key=m.batch_id.encode())
    finally:
        await producer.stop()


@pytest.fixture
def metrics_topic(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1, prefix="tail")
    published = [batch(f"step-{i:05d}", run_id="run-a", versions=[("v11", 0.6), ("v12", 0.5)]) for i in range(15)]
    asyncio.run(_publish(kafka_bootstrap, topic, published))
    return topic


@pytest.mark.kafka
def test_starts_with_the_last_messages_already_on_the_topic(kafka_bootstrap, metrics_topic):
    proc = _tail(
        "--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--max-messages", "10", "--timeout", "30"
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["batch_id"] for line in proc.stdout.splitlines()] == [
        f"step-{i:05d}" for i in range(5, 15)
    ], "the default: the last 10 of each partition"
    proc = _tail("--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--last", "3", "--timeout", "3")
    assert [json.loads(line)["batch_id"] for line in proc.stdout.splitlines()] == [
        "step-00012",
        "step-00013",
        "step-00014",
    ]
    proc = _tail("--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--last", "0", "--timeout", "2")
    assert proc.returncode == 0 and proc.stdout == "", "--last 0: only new messages"


@pytest.mark.kafka
def test_piped_table_fits_80_columns_and_ends_with_a_newline(kafka_bootstrap, metrics_topic):
    proc = _tail(
        "--broker", kafka_bootstrap, "--topic", metrics_topic, "--rows", "4", "--max-messages", "10", "--timeout", "30"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 80, proc.stdout
    assert "run-a/step-00014" in proc.stdout and "v11 .60 v12 .50" in proc.stdout
    assert "step-00010" not in proc.stdout, "--rows 4 shows the latest four"
