"""Three workers frozen, killed, stopped and restarted many times over while a stream
runs: is every batch still exact?

    python bench/group_chaos.py [--faults 60] [--seed 1] [--partitions 6] [--smoke] [--json]

One group of three workers (6 partitions, a 6 s session) reads a paced stream (two
batches of a small fleet every 2 s, with redeliveries, conflicts, missing counters and
invalid records) while ``--faults`` faults are drawn from ``--seed``
(``tests/support/group_chaos.py``): a freeze shorter than the session, a freeze past it,
SIGKILL and restart, SIGTERM and restart, a frozen owner woken after another worker was
killed and restarted beside it, and a replacement frozen a few seconds after it starts
(mid-takeover or mid-restore). The kinds come in rounds of every kind once.

Afterwards every worker is awake and the stream stopped. Target, all of: every batch's
latest publication equals ``specmeter aggregate`` over the same events (complete, closed
by its markers), one content per (batch, revision) over every message published, and
every record sent counted once (in its batch or in a dead letter). The baseline is what
the offline core computes from the same events, in the same run. Printed: the faults by
kind, batches, records, publications, the fencing lines the workers logged, the
duration. Exits 1 when a target is missed. ``--smoke``: 6 faults.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_json_flag, broker_address, report
from tests.support.group_chaos import run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=60, help="faults to inject (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the records topic (default 6)")
    parser.add_argument("--smoke", action="store_true", help="6 faults")
    add_json_flag(parser)
    args = parser.parse_args()
    faults = 6 if args.smoke else args.faults
    started = time.monotonic()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        chaos = run_chaos(
            broker_address(), seed=args.seed, faults=faults, partitions=args.partitions, progress=progress
        )
    except AssertionError as exc:
        report(
            "a group of three through faults",
            [("verdict", f"missed: {str(exc).splitlines()[0]}")],
            {"ok": False},
            as_json=args.json,
        )
        return 1
    rows = [
        ("faults", f"{sum(chaos.faults.values())}: " + ", ".join(f"{k} {n}" for k, n in sorted(chaos.faults.items()))),
        ("workers restarted", str(chaos.restarts)),
        ("batches (records sent)", f"{chaos.batches} ({chaos.records})"),
        ("records counted", ", ".join(f"{k} {v}" for k, v in chaos.conserved.items())),
        (
            "publications (revisions above 0; a takeover repeats the latest of each batch it holds, identical)",
            f"{chaos.published} ({chaos.revisions_above_0})",
        ),
        ("fenced / takeovers that did not count (log lines)", f"{chaos.fenced_lines} / {chaos.not_counted_lines}"),
        ("tracebacks in the workers' logs", str(chaos.tracebacks)),
        (
            "ratio (batches exact : batches sent; the baseline is the offline core)",
            f"{chaos.batches} : {chaos.batches}",
        ),
        ("duration", f"{time.monotonic() - started:.0f} s"),
        ("verdict", "every batch exact, one content per (batch, revision), every record counted once: met"),
    ]
    data = {
        "ok": True,
        "faults": dict(chaos.faults),
        "batches": chaos.batches,
        "records": chaos.records,
        "published": chaos.published,
        "fenced": chaos.fenced_lines,
        "not_counted": chaos.not_counted_lines,
        "restarts": chaos.restarts,
        "seconds": round(chaos.seconds),
        "timeline": chaos.timeline,
    }
    report("a group of three through faults", rows, data, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
