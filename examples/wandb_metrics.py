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


def position_curves(m: BatchMetrics) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """The batch's acceptance by draft position and each weight version's, as the
    (xs, ys, keys) of a line chart over positions 1, 2, ...; empty when none is known."""
    xs: list[list[int]] = []
    ys: list[list[float]] = []
    keys: list[str] = []
    curves = [("all versions", m.accept_rate_by_position)] + [
        ("unknown" if e.weight_version is None else e.weight_version, e.accept_rate_by_position)
        for e in m.by_weight_version or ()
    ]
    for key, rates in curves:
        if rates:
            xs.append(list(range(1, len(rates) + 1)))
            ys.append(list(rates))
            keys.append(key)
    return xs, ys, keys


def follow(metrics: Iterable[BatchMetrics], run: Any, line_series: Callable[..., Any] | None = None) -> int:
    """Log each batch's scalars at its step, and with ``line_series`` (``wandb.plot.line_series``)
    its acceptance-by-position curve; returns how many batches were logged."""
    run.define_metric("trainer/step")
    run.define_metric("specmeter/*", step_metric="trainer/step")
    logged = 0
    for m in metrics:
        step = step_of(m.batch_id)
        if step is None:
            continue
        row: dict[str, Any] = {"trainer/step": step, **metrics_scalars(m)}
        xs, ys, keys = position_curves(m)
        if line_series is not None and ys:
            row["specmeter/accept_rate_by_position_curve"] = line_series(
                xs=xs, ys=ys, keys=keys, title=f"acceptance by draft position, step {step}", xname="draft position"
            )
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
