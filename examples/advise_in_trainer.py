"""The advice inside a training loop: which draft budget the fleet's own acceptance
favours, from metrics the trainer already holds, with no command line (issue 45).

    python examples/advise_in_trainer.py metrics.jsonl --draft-cost 0.1
    python examples/advise_in_trainer.py --broker kafka:9092 --run-id "$RUN_ID" --draft-cost 0.1

A trainer that reads its batches' metrics (``consume_metrics_sync``, or a file of
``specmeter aggregate --format jsonl``) keeps them as ``BatchMetrics`` and, every so
many steps, calls ``specmeter.streams.advice.advise`` on them: the same arithmetic as
``specmeter advise``, returned as a typed result. ``recommend_budget`` is what a
trainer would call before its next rollout (to set the engine's budget, or to turn
speculation off); ``main`` prints it, and the engine settings that apply it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterable
from types import EllipsisType

from specmeter.schemas import BatchMetrics
from specmeter.streams import consume_metrics_sync
from specmeter.streams.advice import Advice, AdviceError, advise, engine_settings, metrics_from_lines


def recommend_budget(
    metrics: Iterable[BatchMetrics], draft_cost: float, run_id: str | EllipsisType | None = ...
) -> tuple[int, Advice]:
    """The draft budget to run next (0: speculation off) over the run's last 20 batches,
    and the whole advice (its curve, ties, and whether the budget is at the edge of the
    data); ``run_id`` omitted: the only run the metrics hold."""
    advice = advise(metrics, run_id=run_id, draft_cost=draft_cost)
    recommendation = advice.curves[0].recommendation
    assert recommendation is not None  # a draft cost was given
    return recommendation.budget, advice


def _metrics(args: argparse.Namespace) -> list[BatchMetrics]:
    """What a trainer already holds: the metrics it read from a file or the topic."""
    if args.file:
        with open(args.file, "rb") as lines:
            return list(metrics_from_lines(lines, args.file))
    stream = consume_metrics_sync(args.broker, from_beginning=True, stop_at_end=True, run_id=_run(args))
    with contextlib.closing(stream):
        return list(stream)


def _run(args: argparse.Namespace) -> str | EllipsisType:
    """--run-id, or every run (the advice then needs the metrics to hold one)."""
    return ... if args.run_id is None else args.run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", help="BatchMetrics JSON lines (else the metrics topic at --broker)")
    parser.add_argument("--broker", default="localhost:9092")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--draft-cost", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        budget, advice = recommend_budget(_metrics(args), args.draft_cost, _run(args))
    except AdviceError as exc:
        print(f"no advice: {exc} ({exc.fix})", file=sys.stderr)
        return 1
    r = advice.curves[0].recommendation
    assert r is not None
    print(f"batches {advice.batches[0]} .. {advice.batches[-1]}: budget {budget}, speedup {r.speedup:.3f}")
    for engine, flags in engine_settings(budget).items():
        print(f"  {engine}: {flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
