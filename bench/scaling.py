"""Scaling: the same pre-loaded load with 1 and 2 worker processes on 8 partitions.

    python bench/scaling.py [--records 500000] [--smoke] [--json]

Prints records/s for each and the ratio. On a 2-core machine the broker, the
benchmark and the workers share both cores, so the second worker mostly adds
a rebalance: expect well under 2x here; on separate machines each worker adds
its share of partitions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, report
from _pipeline import fleet, preload, run_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    bootstrap = broker_address()
    topic, records, batches = preload(bootstrap, fleet(target), 8)
    rates = {}
    for workers in (1, 2):
        rates[workers] = records / run_workers(bootstrap, topic, 8, batches, workers=workers)
    report(
        f"scaling ({records:,} records, {batches} batches, 8 partitions)",
        [
            ("1 worker", f"{rates[1]:,.0f} records/s"),
            ("2 workers", f"{rates[2]:,.0f} records/s"),
            ("ratio 2/1", f"{rates[2] / rates[1]:.2f}x   (baseline: 1 worker, same run)"),
        ],
        {
            "records": records,
            "batches": batches,
            "core": core_name(),
            "one_worker_records_per_s": rates[1],
            "two_workers_records_per_s": rates[2],
        },
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
