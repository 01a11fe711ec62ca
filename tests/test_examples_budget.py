"""The wandb and TensorBoard examples draw revision 4 (issue 31): a panel per task and the
draft-budget curve per step, in the style of their acceptance-by-position curve."""

from __future__ import annotations

import re

import msgspec

from specmeter.schemas import TaskMetrics

from .test_consume import _example, _Recorder, metrics


def task(name: str | None, positions: list[float] | None, budget: list[float] | None) -> TaskMetrics:
    return TaskMetrics(
        task=name,
        metrics={"spec/accept_rate": 0.5, "spec/tokens_per_verify": 2.0},
        accept_histogram=None,
        accept_rate_by_position=positions,
        tokens_per_verify_by_budget=budget,
    )


BATCHES = [
    msgspec.structs.replace(
        metrics("step-4", 0),
        accept_rate_by_position=[0.75, 0.25],
        tokens_per_verify_by_budget=[1.75, 2.0],
        by_task=[task("chat", [0.5, 0.25], [1.5, 1.75]), task("gsm8k", None, None), task(None, [1.0, 0.0], [2.0, 2.0])],
    ),
    msgspec.structs.replace(
        metrics("step-5", 0),
        accept_rate_by_position=[0.5, 0.5],
        tokens_per_verify_by_budget=[1.5, 2.0],
        by_task=[task("chat", [0.5, 0.5], [1.5, 2.0])],
    ),
    metrics("step-6", 0),  # no histogram, no task: scalars only
]


def test_wandb_draws_the_budget_curve_and_a_panel_per_task():
    run = _Recorder()
    charts: list[dict] = []

    def line_series(**kwargs):
        charts.append(kwargs)
        return f"chart {len(charts)}"

    assert _example("wandb_metrics").follow(BATCHES, run, line_series=line_series) == 3
    logs = [args[0] for name, args, _ in run.calls if name == "log"]
    budget = next(c for c in charts if c["xname"] == "draft budget k" and "step 4" in c["title"])
    assert budget["keys"] == ["all tasks", "chat", "unknown"], "gsm8k knows no curve"
    assert budget["xs"] == [[1, 2]] * 3 and budget["ys"] == [[1.75, 2.0], [1.5, 1.75], [2.0, 2.0]]
    panels = {key for key in logs[0] if key.startswith("specmeter/by_task/") and key.endswith("_curve")}
    assert panels == {
        "specmeter/by_task/chat/accept_rate_by_position_curve",
        "specmeter/by_task/unknown/accept_rate_by_position_curve",
    }
    chat = next(c for c in charts if c["title"] == "chat: acceptance by draft position, step 4")
    assert chat["keys"] == ["chat", "all tasks"] and chat["ys"] == [[0.5, 0.25], [0.75, 0.25]]
    assert logs[0]["specmeter/by_task/chat/accept_rate"] == 0.5, "each task's scalars, from metrics_scalars"
    assert not any(key.endswith("_curve") for key in logs[2]), "no curve without a histogram"


def test_tensorboard_draws_the_budget_curve_and_a_custom_scalars_panel_per_task():
    writer = _Recorder()
    assert _example("tensorboard_metrics").follow(BATCHES, writer) == 3
    curves = [(a, k) for name, a, k in writer.calls if name == "add_histogram_raw"]
    budget = [k for a, k in curves if a == ("specmeter/tokens_per_verify_by_budget",)]
    assert [k["global_step"] for k in budget] == [4, 5]
    assert budget[0]["bucket_counts"] == [1.75, 2.0] and budget[0]["bucket_limits"] == [1.5, 2.5]
    layouts = [a[0] for name, a, _ in writer.calls if name == "add_custom_scalars"]
    assert len(layouts) == 1, "the layout is written again only when a new task appears"
    [(category, charts)] = layouts[0].items()
    assert category == "specmeter: by task"
    assert list(charts) == [
        "accept rate, every task",
        "chat: tokens per verify step by draft budget",
        "gsm8k: tokens per verify step by draft budget",
        "unknown: tokens per verify step by draft budget",
    ]
    tags = {a[0] for name, a, _ in writer.calls if name == "add_scalar"}
    for title, (kind, patterns) in charts.items():
        assert kind == "Multiline"
        matched = {tag for tag in tags for pattern in patterns if re.fullmatch(pattern, tag)}
        if not title.startswith("gsm8k"):  # gsm8k reports no curve
            assert matched, f"{title}: {patterns} match no scalar written"
    chat = charts["chat: tokens per verify step by draft budget"][1]
    assert {t for t in tags if re.fullmatch(chat[0], t)} == {
        "specmeter/by_task/chat/tokens_per_verify_by_budget/1",
        "specmeter/by_task/chat/tokens_per_verify_by_budget/2",
    }
    every = charts["accept rate, every task"][1][0]
    assert {t for t in tags if re.fullmatch(every, t)} == {
        "specmeter/by_task/chat/accept_rate",
        "specmeter/by_task/gsm8k/accept_rate",
        "specmeter/by_task/unknown/accept_rate",
    }
