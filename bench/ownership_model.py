"""The ownership protocol's model over many more schedules than CI runs.

    python bench/ownership_model.py [--schedules 200000] [--steps 80 160] [--workers 2 3]
                                    [--first-seed 0] [--json]

Each schedule (``tests/support/ownership_model.py``) interleaves two or three workers'
takeovers, restores, chunks, ticks and writes with freezes, crashes, missed rebalances,
cancelled rounds and compaction, then checks the invariants (one content per batch and
revision, restores never go back, a stray takeover fences nobody, the state exact).
Schedules are spread over the step counts and worker counts given. Prints progress
every 10,000 schedules, then the schedules run, the violations (each with its seed, to
run again with ``tests.support.ownership_model.run_schedule``) and the rate. Exits 1
when any schedule broke an invariant.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.ownership_model import Violation, run_schedule


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--steps", type=int, nargs="+", default=[80, 160])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    args = parser.parse_args()
    shapes = itertools.cycle(itertools.product(args.steps, args.workers))
    violations: list[dict] = []
    started = time.monotonic()
    for n in range(args.schedules):
        seed = args.first_seed + n
        steps, workers = next(shapes)
        try:
            run_schedule(seed, steps=steps, workers=workers)
        except Violation as exc:
            violations.append({"seed": seed, "steps": steps, "workers": workers, "violation": str(exc).splitlines()[0]})
        if not args.json and (n + 1) % 10_000 == 0:
            print(f"{n + 1} schedules, {len(violations)} violations, {time.monotonic() - started:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    result = {"schedules": args.schedules, "violations": violations, "seconds": round(elapsed, 1)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"schedules: {args.schedules}  violations: {len(violations)}  {args.schedules / elapsed:.0f} schedules/s")
        for v in violations[:20]:
            print(f"  seed {v['seed']} (steps {v['steps']}, workers {v['workers']}): {v['violation']}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
