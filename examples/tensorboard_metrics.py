"""Write specmeter's per-batch metrics as TensorBoard scalars, at the training step.

    pip install tensorboard torch      # or: pip install tensorboardX
    python examples/tensorboard_metrics.py --broker kafka:9092 --run-id "$RUN_ID" --logdir runs/my-rl

Point it at the trainer's log directory to see acceptance next to the loss. The
trainer names its rollout batches ``step-<N>``; each batch is written once when
it is published, and again at the same step if a late record makes a newer
revision (TensorBoard then shows the later point); an older or repeated revision
is never written. Per-policy-version acceptance appears as
``specmeter/by_weight_version/<version>/accept_rate``.

Where drafts stop being accepted: ``specmeter/accept_rate_by_position/<k>`` is a
scalar per draft position k, and ``specmeter/accept_rate_by_position`` in the
Histograms tab (offset view) is one curve per step over the positions: x is the draft
position, the height the share of verify steps that accepted that draft.

The draft budget: ``specmeter/tokens_per_verify_by_budget`` in the Histograms tab is
one curve per step over the budgets k, the height the tokens per verify step a budget
of k draft tokens would have given (exact for chain drafters, an upper bound for trees,
ending at the budget the fleet ran). By task (the records' ``task``), the Custom
Scalars tab has a panel per task (its tokens per verify step at each budget, over the
steps) and one comparing the tasks' accept rates; the scalars are under
``specmeter/by_task/<task>/``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from typing import Any

from specmeter.schemas import BatchMetrics
from specmeter.streams import consume_metrics_sync, metrics_scalars


def step_of(batch_id: str) -> int | None:
    """The training step a batch id ends in (``step-42`` -> 42), or None."""
    match = re.search(r"(\d+)$", batch_id)
    return int(match.group(1)) if match else None


def follow(metrics: Iterable[BatchMetrics], writer: Any) -> int:
    """Write each batch's scalars, its acceptance-by-position and budget curves at its
    step, and a Custom Scalars panel per task seen so far; returns how many batches were
    written."""
    written = 0
    tasks: set[str] = set()
    for m in metrics:
        step = step_of(m.batch_id)
        if step is None:
            continue
        for tag, value in metrics_scalars(m).items():
            writer.add_scalar(tag, value, global_step=step)
        for tag, values in (
            ("specmeter/accept_rate_by_position", m.accept_rate_by_position),
            ("specmeter/tokens_per_verify_by_budget", m.tokens_per_verify_by_budget),
        ):
            if values:
                writer.add_histogram_raw(tag, global_step=step, **position_curve(values))
        named = {e.task or "unknown" for e in m.by_task or ()}
        if not named <= tasks:  # a new task: the layout again, with its panel
            tasks |= named
            writer.add_custom_scalars(task_layout(sorted(tasks)))
        writer.flush()
        written += 1
    return written


def task_layout(tasks: list[str]) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout: the tasks' accept rates in one chart, then a panel per task
    with its tokens per verify step at each draft budget (a line per budget k)."""
    return {
        "specmeter: by task": {
            "accept rate, every task": ["Multiline", [r"specmeter/by_task/[^/]+/accept_rate$"]],
            **{
                f"{task}: tokens per verify step by draft budget": [
                    "Multiline",
                    [rf"specmeter/by_task/{re.escape(task)}/tokens_per_verify_by_budget/\d+$"],
                ]
                for task in tasks
            },
        }
    }


def position_curve(values: list[float]) -> dict[str, Any]:
    """``add_histogram_raw`` arguments drawing a curve over 1, 2, ... (draft positions,
    budgets): one bucket per k (bounds k - 0.5 .. k + 0.5) whose height is its value. For
    acceptance by draft position the total (``num``) is the mean number of drafts accepted
    per verify step."""
    positions = range(1, len(values) + 1)
    return {
        "min": 1.0,
        "max": float(len(values)),
        "num": sum(values),
        "sum": sum(k * r for k, r in zip(positions, values, strict=True)),
        "sum_squares": sum(k * k * r for k, r in zip(positions, values, strict=True)),
        "bucket_limits": [k + 0.5 for k in positions],
        "bucket_counts": list(values),
    }


def _summary_writer(logdir: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from tensorboardX import SummaryWriter
    return SummaryWriter(log_dir=logdir)


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
    parser.add_argument("--logdir", required=True, help="TensorBoard log directory")
    args = parser.parse_args(argv)

    writer = _summary_writer(args.logdir)
    try:
        follow(
            consume_metrics_sync(
                args.broker, run_id=args.run_id, topic=args.topic, from_beginning=True, topic_wait_s=args.topic_wait
            ),
            writer,
        )
    except LookupError as exc:  # a mistyped --topic: one line naming existing ones, never a new topic
        parser.exit(1, f"{parser.prog}: {exc}\n")
    finally:
        writer.close()


if __name__ == "__main__":
    main()
