"""The ownership protocol's model over many more schedules than CI runs.

    python bench/ownership_model.py [--schedules 200000] [--steps 80 160] [--workers 2 3]
                                    [--first-seed 0] [--baseline 2000] [--smoke] [--json]

Each schedule (``tests/support/ownership_model.py``) interleaves two or three workers'
takeovers, restores, chunks, ticks and writes with freezes, crashes, missed rebalances,
cancelled rounds and compaction, then checks the invariants (one content per batch and
revision, restores never go back, a stray takeover fences nobody, the state exact).
Schedules are spread over the step counts and worker counts given; progress is printed
every 10,000 schedules. The baseline, run in the same process: ``--baseline`` schedules
of the same shapes with the fixes of issue 37's items 1 and 2 reverted (one key per
owner and deletions at once; every takeover counting), which break invariants. Printed:
the schedules run, the violations of each (with the seeds, to run again with
``tests.support.ownership_model.run_schedule``) and the rates. Exits 1 when a schedule of
the protocol as it is broke an invariant. ``--smoke``: 500 schedules, a baseline of 500.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_json_flag, report
from specmeter.streams.core import ownership
from specmeter.streams.delivery import writes
from tests.support.ownership_model import Violation, run_schedule


@contextlib.contextmanager
def fixes_reverted() -> Iterator[None]:
    """Items 1 and 2 of issue 37 as they were: every write under one key per owner, every
    deletion sent at once, every takeover counting."""
    saved = (ownership.RewrittenKeys.rewrite, writes._physical, ownership.counts_after, writes.counts_after)  # noqa: SLF001
    ownership.RewrittenKeys.rewrite = lambda self, key, value: (key, None)  # type: ignore[method-assign]
    writes._physical = lambda keys, sent, held: (sent + [(k, None) for k in held], [])  # type: ignore[assignment]  # noqa: SLF001
    ownership.counts_after = writes.counts_after = lambda takeover, before: True  # type: ignore[assignment]
    try:
        yield
    finally:
        ownership.RewrittenKeys.rewrite, writes._physical, ownership.counts_after, writes.counts_after = saved  # type: ignore[method-assign,assignment]  # noqa: SLF001


def run(
    count: int, first_seed: int, steps: list[int], workers: list[int], *, progress: bool
) -> tuple[list[dict], float]:
    """``count`` schedules from ``first_seed``: the violations and the seconds taken."""
    shapes = itertools.cycle(itertools.product(steps, workers))
    violations: list[dict] = []
    started = time.monotonic()
    for n in range(count):
        seed = first_seed + n
        step_count, worker_count = next(shapes)
        try:
            run_schedule(seed, steps=step_count, workers=worker_count)
        except Violation as exc:
            violations.append(
                {"seed": seed, "steps": step_count, "workers": worker_count, "violation": str(exc).splitlines()[0]}
            )
        if progress and (n + 1) % 10_000 == 0:
            print(
                f"{n + 1} schedules, {len(violations)} violations, {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return violations, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--steps", type=int, nargs="+", default=[80, 160])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--baseline", type=int, default=2000, help="schedules with items 1 and 2 reverted")
    parser.add_argument("--smoke", action="store_true", help="500 schedules, a baseline of 500")
    add_json_flag(parser)
    args = parser.parse_args()
    logging.getLogger("specmeter").setLevel(logging.CRITICAL)  # the workers' fencing lines, thousands
    if args.smoke:
        args.schedules = args.baseline = 500
    found, seconds = run(args.schedules, args.first_seed, args.steps, args.workers, progress=not args.smoke)
    with fixes_reverted():
        reverted, _ = run(args.baseline, args.first_seed, args.steps, args.workers, progress=False)
    per_1000 = 1000 * len(found) / args.schedules
    baseline_per_1000 = 1000 * len(reverted) / args.baseline
    rows = [
        (
            "schedules",
            f"{args.schedules} ({args.schedules / seconds:.0f}/s; steps {args.steps}, workers {args.workers})",
        ),
        ("violations", f"{len(found)} ({per_1000:.2f} per 1,000)"),
        ("baseline: items 1 and 2 reverted", f"{len(reverted)} of {args.baseline} ({baseline_per_1000:.2f} per 1,000)"),
        ("ratio (violations per 1,000, protocol : baseline)", f"{per_1000:.2f} : {baseline_per_1000:.2f}"),
        *((f"seed {v['seed']}", v["violation"]) for v in found[:20]),
    ]
    data = {
        "schedules": args.schedules,
        "violations": found,
        "seconds": round(seconds, 1),
        "baseline_schedules": args.baseline,
        "baseline_violations": len(reverted),
    }
    report("ownership protocol over schedules", rows, data, as_json=args.json)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
