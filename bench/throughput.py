"""End-to-end throughput: records/s from worker start to the last BatchMetrics.

    python bench/throughput.py [--records 1000000] [--smoke]

The fleet (≈1M records, 100 batches, 10k sessions, 20 % redeliveries, shared
ancestors, 1 % conflicts, unknown counters) is pre-loaded into a 4-partition
records topic. Baseline, same run, same messages: a bare aiokafka getmany loop
that decodes with msgspec and dedups in a dict — the practical ceiling for
Python here. Goals: >= 0.5x the baseline and never under 100k records/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import broker_address, report  # noqa: E402
from _pipeline import bare_consumer, fleet, preload, run_workers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    bootstrap = broker_address()
    print(f"preloading ≈{target:,} records ...", file=sys.stderr)
    topic, records, batches = preload(bootstrap, fleet(target), args.partitions)
    print(f"{records:,} records in {batches} batches; baseline ...", file=sys.stderr)
    baseline = bare_consumer(bootstrap, topic, records)
    print("specmeter worker ...", file=sys.stderr)
    seconds = run_workers(bootstrap, topic, args.partitions, batches, workers=1)
    rate = records / seconds
    report(f"end-to-end throughput ({records:,} records, {batches} batches, {args.partitions} partitions)", [
        ("specmeter worker (start to last metrics)", f"{rate:,.0f} records/s  ({seconds:.1f} s)"),
        ("baseline bare aiokafka+msgspec+dict", f"{baseline:,.0f} records/s"),
        ("ratio", f"{rate / baseline:.2f}x   (goal >= 0.5x and >= 100,000 records/s)"),
    ])


if __name__ == "__main__":
    main()
