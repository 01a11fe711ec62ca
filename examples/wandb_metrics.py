"""Log specmeter's per-batch metrics to Weights & Biases, at the training step.

    pip install wandb
    python examples/wandb_metrics.py --broker kafka:9092 --run-id "$RUN_ID" --project my-rl

Run it beside the trainer (or start ``follow`` in a thread of it). The trainer
names its rollout batches ``step-<N>`` (any id ending in the step number works)
and its producers set ``run_id``, so a restarted attempt's ``step-N`` is not
mixed with the old one. Each batch is logged once when it is published, and
again at the same step if a late record makes a newer revision; an older or
repeated revision is never logged. ``trainer/step`` is declared as the x axis of
every ``specmeter/*`` chart, so out-of-order steps are fine (wandb's own
``step=`` must only grow).

Where drafts stop being accepted: ``specmeter/accept_rate_by_position/<k>`` is a
line per draft position k over the steps, and ``specmeter/accept_rate_by_position_curve``
is, at each step, the curve over positions (the batch's, and one per weight
version in it): the share of verify steps that accepted their k-th draft.

By task (the records' ``task``: the prompt's dataset): ``specmeter/by_task/<task>/...``
are each task's scalars, and each task gets a panel of its own at every step,
``specmeter/by_task/<task>/accept_rate_by_position_curve``: its acceptance by draft
position beside the whole batch's. The draft budget:
``specmeter/tokens_per_verify_by_budget_curve`` is, at each step, the tokens per verify
step a budget of k draft tokens would have given (the batch's, and one per task),
exact for chain drafters, an upper bound for trees, ending at the budget the fleet ran
(``specmeter advise`` adds the draft's cost and picks the best k).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from typing import Any

from specmeter.schemas import BatchMetrics
from specmeter.streams import consume_metrics_sync, metrics_scalars


def step_of(batch_id: str) -> int | None:
    """The training step a batch id ends in (``step-42`` -> 42), or None."""
    match = re.search(r"(\d+)$", batch_id)
    return int(match.group(1)) if match else None


def line_chart(
    curves: Iterable[tuple[str, list[float] | None]],
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Named curves over 1, 2, ... (draft positions, budgets) as the (xs, ys, keys) of a
    line chart; the unknown ones left out."""
    xs: list[list[int]] = []
    ys: list[list[float]] = []
    keys: list[str] = []
    for key, values in curves:
        if values:
            xs.append(list(range(1, len(values) + 1)))
            ys.append(list(values))
            keys.append(key)
    return xs, ys, keys


def position_curves(m: BatchMetrics) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """The batch's acceptance by draft position and each weight version's, as the
    (xs, ys, keys) of a line chart over positions 1, 2, ...; empty when none is known."""
    return line_chart(
        [("all versions", m.accept_rate_by_position)]
        + [(e.weight_version or "unknown", e.accept_rate_by_position) for e in m.by_weight_version or ()]
    )


def budget_curves(m: BatchMetrics) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """The batch's tokens per verify step by draft budget and each task's, as a line chart
    over budgets 1, 2, ...; empty when none is known."""
    return line_chart(
        [("all tasks", m.tokens_per_verify_by_budget)]
        + [(e.task or "unknown", e.tokens_per_verify_by_budget) for e in m.by_task or ()]
    )


def task_panels(m: BatchMetrics) -> dict[str, tuple[list[list[int]], list[list[float]], list[str]]]:
    """A panel per task: its acceptance by draft position beside the whole batch's."""
    return {
        e.task or "unknown": line_chart(
            [(e.task or "unknown", e.accept_rate_by_position), ("all tasks", m.accept_rate_by_position)]
        )
        for e in m.by_task or ()
        if e.accept_rate_by_position
    }


def follow(metrics: Iterable[BatchMetrics], run: Any, line_series: Callable[..., Any] | None = None) -> int:
    """Log each batch's scalars at its step, and with ``line_series`` (``wandb.plot.line_series``)
    its acceptance-by-position curve, its budget curve and a panel per task; returns how
    many batches were logged."""
    run.define_metric("trainer/step")
    run.define_metric("specmeter/*", step_metric="trainer/step")
    logged = 0
    for m in metrics:
        step = step_of(m.batch_id)
        if step is None:
            continue
        row: dict[str, Any] = {"trainer/step": step, **metrics_scalars(m)}
        if line_series is not None:
            charts = {
                "specmeter/accept_rate_by_position_curve": (
                    position_curves(m),
                    f"acceptance by draft position, step {step}",
                    "draft position",
                ),
                "specmeter/tokens_per_verify_by_budget_curve": (
                    budget_curves(m),
                    f"tokens per verify step by draft budget, step {step}",
                    "draft budget k",
                ),
                **{
                    f"specmeter/by_task/{task}/accept_rate_by_position_curve": (
                        chart,
                        f"{task}: acceptance by draft position, step {step}",
                        "draft position",
                    )
                    for task, chart in task_panels(m).items()
                },
            }
            for key, ((xs, ys, keys), title, xname) in charts.items():
                if ys:
                    row[key] = line_series(xs=xs, ys=ys, keys=keys, title=title, xname=xname)
        run.log(row)
        logged += 1
    return logged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--run-id", default=None, help="the training run's run_id (default: the default run)")
    parser.add_argument("--topic", default="specmeter.metrics", help="the worker's --metrics-topic")
    parser.add_argument(
        "--topic-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for a worker to create the topic (default: fail at once; a reader never creates it)",
    )
    parser.add_argument("--project", required=True, help="wandb project")
    parser.add_argument("--wandb-id", default=None, help="log into this existing wandb run (the trainer's)")
    args = parser.parse_args(argv)

    import wandb

    run = wandb.init(project=args.project, id=args.wandb_id, resume="allow" if args.wandb_id else None)
    try:
        follow(
            consume_metrics_sync(
                args.broker, run_id=args.run_id, topic=args.topic, from_beginning=True, topic_wait_s=args.topic_wait
            ),
            run,
            line_series=wandb.plot.line_series,
        )
    except LookupError as exc:  # a mistyped --topic: one line naming existing ones, never a new topic
        parser.exit(1, f"{parser.prog}: {exc}\n")
    finally:
        run.finish()


if __name__ == "__main__":
    main()
