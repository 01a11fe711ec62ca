"""The trainer-side consumer (``specmeter.streams.consume_metrics``) against a real broker:
repeats and older revisions folded, runs kept apart, the consumer closed (issue #13)."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from specmeter.schemas import BatchMetrics, TaskMetrics, WeightVersionMetrics, encode_metrics, encode_metrics_key
from specmeter.streams import consume_metrics, consume_metrics_sync, metrics_scalars


def metrics(batch_id: str, revision: int, run_id: str | None = "run-a", accepted: int = 1) -> BatchMetrics:
    return BatchMetrics(
        batch_id=batch_id,
        revision=revision,
        close_reason="markers",
        closed_at=1.0,
        speculative=True,
        complete=True,
        partitions_reported=1,
        partitions_expected=1,
        record_count=1,
        invalid_record_count=0,
        missing_record_count=0,
        late_record_count=0,
        accept_histogram=None,
        metrics={"spec/paired_accepted_total": accepted},
        speculative_algorithm="EAGLE3",
        run_id=run_id,
    )


async def publish(bootstrap: str, topic: str, items: list[BatchMetrics | bytes]) -> None:
    """As the worker does: JSON keyed by batch_id (bytes: a foreign message)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for item in items:
            if isinstance(item, bytes):
                await producer.send_and_wait(topic, item, key=b"junk")
            else:
                key = encode_metrics_key(item.run_id, item.batch_id)  # as the worker keys it
                await producer.send_and_wait(topic, encode_metrics(item), key=key)
    finally:
        await producer.stop()


def seen(items: list[BatchMetrics]) -> list[tuple[str | None, str, int]]:
    return [(m.run_id, m.batch_id, m.revision) for m in items]


#: what the worker may publish: repeats (after a crash), revisions, a second run
#: reusing batch ids (a restart from a checkpoint), a foreign message
HISTORY = [
    metrics("step-1", 0),
    metrics("step-1", 0),
    metrics("step-2", 0),
    metrics("step-1", 1, accepted=5),
    metrics("step-1", 0),
    b"not json",
    metrics("step-1", 0, run_id="run-b"),
    metrics("step-3", 0),
    metrics("step-2", 0),
    metrics("step-3", 2, accepted=9),
    metrics("step-3", 1),
    metrics("step-9", 0, run_id=None),
]


@pytest.mark.kafka
def test_backlog_yields_each_batch_once_at_its_newest_revision(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=3)
    asyncio.run(publish(kafka_bootstrap, topic, HISTORY))

    async def read(**kwargs) -> list[BatchMetrics]:
        async with contextlib.aclosing(
            consume_metrics(kafka_bootstrap, topic=topic, from_beginning=True, stop_at_end=True, **kwargs)
        ) as stream:
            return [m async for m in stream]

    run_a = asyncio.run(read(run_id="run-a"))
    assert sorted(seen(run_a)) == [("run-a", "step-1", 1), ("run-a", "step-2", 0), ("run-a", "step-3", 2)]
    assert {m.batch_id: m.metrics["spec/paired_accepted_total"] for m in run_a} == {
        "step-1": 5,
        "step-2": 1,
        "step-3": 9,
    }
    assert seen(asyncio.run(read(run_id="run-b"))) == [("run-b", "step-1", 0)]
    assert seen(asyncio.run(read(run_id=None))) == [(None, "step-9", 0)]
    assert len(asyncio.run(read())) == 5, "every run: 3 + 1 + 1 batches"


@pytest.mark.kafka
def test_a_single_partition_backlog_keeps_first_appearance_order(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1)
    asyncio.run(publish(kafka_bootstrap, topic, HISTORY))
    got = list(
        consume_metrics_sync(kafka_bootstrap, topic=topic, run_id="run-a", from_beginning=True, stop_at_end=True)
    )
    assert seen(got) == [("run-a", "step-1", 1), ("run-a", "step-2", 0), ("run-a", "step-3", 2)]


@pytest.mark.kafka
def test_live_messages_yield_new_batches_and_newer_revisions_only(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1)
    asyncio.run(publish(kafka_bootstrap, topic, [metrics("step-0", 0)]))  # before the start: not read

    async def scenario() -> list[BatchMetrics]:
        got: list[BatchMetrics] = []

        async def follow() -> None:
            async with contextlib.aclosing(
                consume_metrics(kafka_bootstrap, topic=topic, run_id="run-a", idle_timeout_s=3.0)
            ) as stream:
                async for m in stream:
                    got.append(m)

        task = asyncio.create_task(follow())
        await asyncio.sleep(2.0)  # the consumer is at the end before anything new arrives
        await publish(kafka_bootstrap, topic, HISTORY)
        await task
        return got

    got = asyncio.run(scenario())
    # in topic order: step-1 r0, step-2 r0, step-1 r1 (an update), step-3 r0, step-3 r2 (an update);
    # never a repeat, an older revision or another run
    assert seen(got) == [
        ("run-a", "step-1", 0),
        ("run-a", "step-2", 0),
        ("run-a", "step-1", 1),
        ("run-a", "step-3", 0),
        ("run-a", "step-3", 2),
    ]


@pytest.mark.kafka
def test_breaking_out_of_the_sync_iterator_closes_the_consumer(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    asyncio.run(publish(kafka_bootstrap, topic, HISTORY))
    # warnings are errors in this suite: an unclosed consumer or loop would fail the test
    for m in consume_metrics_sync(kafka_bootstrap, topic=topic, from_beginning=True):
        assert m.batch_id.startswith("step-")
        break
    with contextlib.closing(consume_metrics_sync(kafka_bootstrap, topic=topic, from_beginning=True)) as stream:
        assert next(stream).batch_id.startswith("step-")
    import gc

    gc.collect()


@pytest.mark.kafka
def test_cancelling_a_task_that_follows_the_topic_closes_the_consumer(kafka_bootstrap, new_topic):
    """How a trainer stops a background follower: cancel its task (the generator's
    cleanup runs inside it, so nothing is left open; warnings are errors here)."""
    topic = new_topic(partitions=1)
    asyncio.run(publish(kafka_bootstrap, topic, HISTORY[:3]))

    async def scenario() -> list[BatchMetrics]:
        got: list[BatchMetrics] = []

        async def follow() -> None:
            async for m in consume_metrics(kafka_bootstrap, topic=topic, from_beginning=True):
                got.append(m)

        task = asyncio.create_task(follow())
        while len(got) < 2:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    assert seen(asyncio.run(scenario())) == [("run-a", "step-1", 0), ("run-a", "step-2", 0)]
    import gc

    gc.collect()


@pytest.mark.kafka
def test_a_missing_topic_is_a_clear_error(kafka_bootstrap, unique_name):
    topic = unique_name("no-such-metrics")
    with pytest.raises(LookupError, match=f"{topic}.*does not exist.*--metrics-topic"):
        list(consume_metrics_sync(kafka_bootstrap, topic=topic, topic_wait_s=1.0, stop_at_end=True))


def test_metrics_scalars_flattens_a_batch_for_a_logger():
    m = msgspec.structs.replace(
        metrics("step-7", 1, accepted=12),
        record_count=9,
        invalid_record_count=1,
        late_record_count=2,
        metrics={"spec/accept_rate": 0.75, "spec/paired_accepted_total": 12},
        accept_histogram=[2, 1, 1],
        accept_rate_by_position=[0.5, 0.25],
        by_weight_version=[
            WeightVersionMetrics(
                weight_version="v3",
                metrics={"spec/accept_rate": 0.5},
                accept_histogram=[1, 0, 1],
                accept_rate_by_position=[0.5, 0.5],
            ),
            WeightVersionMetrics(
                weight_version=None,
                metrics={"spec/accept_rate": 1.0, "spec/tokens_per_verify": 2.0},
                accept_histogram=[1, 1],
                accept_rate_by_position=[0.5],
            ),
        ],
    )
    scalars = metrics_scalars(m)
    assert scalars["specmeter/accept_rate"] == 0.75
    assert scalars["specmeter/paired_accepted_total"] == 12.0
    assert scalars["specmeter/late_record_count"] == 2.0 and scalars["specmeter/complete"] == 1.0
    assert scalars["specmeter/by_weight_version/v3/accept_rate"] == 0.5
    assert scalars["specmeter/by_weight_version/unknown/tokens_per_verify"] == 2.0
    # acceptance by draft position (docs/contract.md §3.3), numbered from 1 as the engines do
    positions = {k: v for k, v in scalars.items() if "accept_rate_by_position" in k}
    assert positions == {
        "specmeter/accept_rate_by_position/1": 0.5,
        "specmeter/accept_rate_by_position/2": 0.25,
        "specmeter/by_weight_version/v3/accept_rate_by_position/1": 0.5,
        "specmeter/by_weight_version/v3/accept_rate_by_position/2": 0.5,
        "specmeter/by_weight_version/unknown/accept_rate_by_position/1": 0.5,
    }
    assert all(isinstance(v, float) for v in scalars.values())
    bare = metrics_scalars(metrics("step-8", 0))  # no histogram: no position key at all
    assert not any("accept_rate_by_position" in k for k in bare)


def test_metrics_scalars_name_tasks_and_budgets_as_they_name_versions_and_positions():
    """Revision 4: per task under ``by_task/<task>/`` (``unknown`` for the null task), as
    per version; the budget curve as ``tokens_per_verify_by_budget/<k>``, batch and entry."""
    m = msgspec.structs.replace(
        metrics("step-7", 0),
        metrics={"spec/accept_rate": 0.75, "spec/inconsistent_generation_count": 2},
        accept_histogram=[2, 1, 1],
        accept_rate_by_position=[0.5, 0.25],
        tokens_per_verify_by_budget=[1.5, 1.75],
        by_weight_version=[
            WeightVersionMetrics(
                weight_version="v3", metrics={}, accept_histogram=[1, 1], tokens_per_verify_by_budget=[1.5]
            )
        ],
        by_task=[
            TaskMetrics(
                task="gsm8k",
                metrics={"spec/accept_rate": 0.875, "spec/unique_generation_count": 2},
                accept_histogram=[0, 1, 3],
                accept_rate_by_position=[1.0, 0.75],
                tokens_per_verify_by_budget=[2.0, 2.75],
            ),
            TaskMetrics(task=None, metrics={"spec/tokens_per_verify": 3.0}, accept_histogram=None),
        ],
    )
    scalars = metrics_scalars(m)
    assert scalars["specmeter/inconsistent_generation_count"] == 2.0
    assert {k: v for k, v in scalars.items() if "/by_task/" in k} == {
        "specmeter/by_task/gsm8k/accept_rate": 0.875,
        "specmeter/by_task/gsm8k/unique_generation_count": 2.0,
        "specmeter/by_task/gsm8k/accept_rate_by_position/1": 1.0,
        "specmeter/by_task/gsm8k/accept_rate_by_position/2": 0.75,
        "specmeter/by_task/gsm8k/tokens_per_verify_by_budget/1": 2.0,
        "specmeter/by_task/gsm8k/tokens_per_verify_by_budget/2": 2.75,
        "specmeter/by_task/unknown/tokens_per_verify": 3.0,
    }
    assert {k: v for k, v in scalars.items() if "tokens_per_verify_by_budget" in k and "/by_task/" not in k} == {
        "specmeter/tokens_per_verify_by_budget/1": 1.5,
        "specmeter/tokens_per_verify_by_budget/2": 1.75,
        "specmeter/by_weight_version/v3/tokens_per_verify_by_budget/1": 1.5,
    }


def _example(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports wandb / tensorboard only inside main()
    return module


class _Recorder:
    """Stands in for a wandb run and a TensorBoard SummaryWriter: records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.mark.kafka
def test_the_wandb_and_tensorboard_examples_log_each_batch_at_its_step(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1)
    asyncio.run(publish(kafka_bootstrap, topic, HISTORY))

    def read():
        return consume_metrics_sync(
            kafka_bootstrap,
            topic=topic,
            run_id="run-a",
            from_beginning=True,
            stop_at_end=True,
        )

    run = _Recorder()
    assert _example("wandb_metrics").follow(read(), run) == 3
    logs = [args[0] for name, args, _ in run.calls if name == "log"]
    assert [(x["trainer/step"], x["specmeter/revision"]) for x in logs] == [(1, 1.0), (2, 0.0), (3, 2.0)]
    assert ("define_metric", ("specmeter/*",), {"step_metric": "trainer/step"}) in run.calls
    writer = _Recorder()
    assert _example("tensorboard_metrics").follow(read(), writer) == 3
    scalars = [(args[0], args[1], kwargs["global_step"]) for name, args, kwargs in writer.calls if name == "add_scalar"]
    assert ("specmeter/paired_accepted_total", 9.0, 3) in scalars
    assert ("specmeter/paired_accepted_total", 5.0, 1) in scalars


def test_the_examples_draw_acceptance_by_position_as_a_curve_per_step():
    """wandb: the scalars per position and, per step, one line chart over the positions
    (the batch's and each weight version's); TensorBoard: the scalars and a histogram
    whose buckets are the positions (one curve per step in its Histograms tab)."""
    versions = [
        WeightVersionMetrics(
            weight_version="v2", metrics={}, accept_histogram=[1, 0, 1], accept_rate_by_position=[0.5, 0.5]
        ),
        WeightVersionMetrics(weight_version=None, metrics={}, accept_histogram=[1], accept_rate_by_position=None),
    ]
    batches = [
        msgspec.structs.replace(
            metrics("step-4", 0), accept_rate_by_position=[0.75, 0.25, 0.125], by_weight_version=versions
        ),
        metrics("step-5", 0),  # no histogram: scalars only
    ]
    run = _Recorder()
    charts = []

    def line_series(**kwargs):
        charts.append(kwargs)
        return "chart"

    assert _example("wandb_metrics").follow(batches, run, line_series=line_series) == 2
    logs = [args[0] for name, args, _ in run.calls if name == "log"]
    assert logs[0]["specmeter/accept_rate_by_position/3"] == 0.125
    assert logs[0]["specmeter/accept_rate_by_position_curve"] == "chart"
    assert "specmeter/accept_rate_by_position_curve" not in logs[1]
    [chart] = charts
    assert chart["xs"] == [[1, 2, 3], [1, 2]] and chart["ys"] == [[0.75, 0.25, 0.125], [0.5, 0.5]]
    assert chart["keys"] == ["all versions", "v2"] and chart["xname"] == "draft position"

    writer = _Recorder()
    assert _example("tensorboard_metrics").follow(batches, writer) == 2
    [(args, kwargs)] = [(a, k) for name, a, k in writer.calls if name == "add_histogram_raw"]
    assert args == ("specmeter/accept_rate_by_position",) and kwargs["global_step"] == 4
    assert kwargs["bucket_counts"] == [0.75, 0.25, 0.125] and kwargs["bucket_limits"] == [1.5, 2.5, 3.5]
    assert kwargs["num"] == 1.125, "the mean number of drafts accepted per verify step"
    scalars = {a[0]: a[1] for name, a, k in writer.calls if name == "add_scalar" and k["global_step"] == 4}
    assert scalars["specmeter/by_weight_version/v2/accept_rate_by_position/2"] == 0.5


def test_metrics_scalars_name_draft_lags_and_the_spread():
    """Revision 5: per draft lag under ``by_draft_lag/<lag>/`` (``unknown`` for the null
    lag), as per task; the spread as ``tokens_per_verify_distribution/<bucket>``."""
    from specmeter.schemas import DraftLagMetrics

    spread = [0] * 64
    spread[6] = 3
    m = msgspec.structs.replace(
        metrics("step-7", 0),
        by_draft_lag=[
            DraftLagMetrics(draft_lag=0, metrics={"spec/accept_rate": 0.8}, accept_histogram=None),
            DraftLagMetrics(
                draft_lag=12,
                metrics={"spec/accept_rate": 0.5, "spec/unique_generation_count": 3},
                accept_histogram=[1, 1],
                accept_rate_by_position=[0.5],
            ),
            DraftLagMetrics(draft_lag=None, metrics={"spec/tokens_per_verify": 2.0}, accept_histogram=None),
        ],
        tokens_per_verify_distribution=spread,
    )
    scalars = metrics_scalars(m)
    assert {k: v for k, v in scalars.items() if "/by_draft_lag/" in k} == {
        "specmeter/by_draft_lag/0/accept_rate": 0.8,
        "specmeter/by_draft_lag/12/accept_rate": 0.5,
        "specmeter/by_draft_lag/12/unique_generation_count": 3.0,
        "specmeter/by_draft_lag/12/accept_rate_by_position/1": 0.5,
        "specmeter/by_draft_lag/unknown/tokens_per_verify": 2.0,
    }
    distribution = {k: v for k, v in scalars.items() if "tokens_per_verify_distribution/" in k}
    assert len(distribution) == 64 and distribution["specmeter/tokens_per_verify_distribution/6"] == 3.0
    assert not any("distribution" in k or "draft_lag" in k for k in metrics_scalars(metrics("step-8", 0)))
