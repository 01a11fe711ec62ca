"""End-to-end throughput: records/s of the worker, against the bare Python loop.

    python bench/throughput.py [--records 1000000] [--smoke] [--json]

The fleet (≈1M records, 100 batches, 10k sessions, 20 % redeliveries, shared
ancestors, 1 % conflicts, unknown counters) is pre-loaded into a 4-partition
records topic. Figures, same run, same messages:

* end to end: from starting the worker to the last batch's complete BatchMetrics;
* steady state: from ready (the worker's log says its last partition's state is
  restored; fetching records follows) to the last BatchMetrics -- start-up left out;
* start-up to ready: from starting the worker to ready;
* baseline: a bare aiokafka getmany loop that decodes with msgspec and dedups in a
  dict -- the practical ceiling for plain Python here;
* fetch only: the same getmany loop without decoding -- the I/O limit.

Targets (issue #14): steady state >= 1.0x the baseline (goal 2x), end to end
>= 0.7x (goal 1.0x).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, report
from _pipeline import bare_consumer, fetch_only, fleet, preload, run_workers_timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    bootstrap = broker_address()
    print(f"preloading ≈{target:,} records ...", file=sys.stderr)
    topic, records, batches = preload(bootstrap, fleet(target), args.partitions)
    print(f"{records:,} records in {batches} batches; fetch only, baseline ...", file=sys.stderr)
    fetch = fetch_only(bootstrap, topic, records, args.partitions)
    baseline = bare_consumer(bootstrap, topic, records)
    print(f"specmeter worker ({core_name()} core) ...", file=sys.stderr)
    run = run_workers_timed(bootstrap, topic, args.partitions, batches, workers=1)
    end_to_end = records / run.seconds
    steady = records / run.steady_s
    report(
        f"throughput ({records:,} records, {batches} batches, {args.partitions} partitions, {core_name()} core)",
        [
            ("worker, steady state (ready to last metrics)", f"{steady:,.0f} records/s  ({run.steady_s:.2f} s)"),
            ("worker, end to end (start to last metrics)", f"{end_to_end:,.0f} records/s  ({run.seconds:.2f} s)"),
            ("worker start-up to ready (state restored)", f"{run.startup_s:.2f} s"),
            ("baseline bare aiokafka+msgspec+dict", f"{baseline:,.0f} records/s"),
            ("fetch only (aiokafka getmany, no decoding)", f"{fetch:,.0f} records/s"),
            ("ratio steady / baseline", f"{steady / baseline:.2f}x   (floor 1.0x, goal 2x)"),
            ("ratio end to end / baseline", f"{end_to_end / baseline:.2f}x   (floor 0.7x, goal 1.0x)"),
        ],
        {
            "records": records,
            "batches": batches,
            "partitions": args.partitions,
            "core": core_name(),
            "steady_state_records_per_s": steady,
            "end_to_end_records_per_s": end_to_end,
            "baseline_records_per_s": baseline,
            "fetch_only_records_per_s": fetch,
            "startup_to_ready_s": run.startup_s,
            "steady_state_s": run.steady_s,
            "end_to_end_s": run.seconds,
            "steady_state_ratio": steady / baseline,
            "end_to_end_ratio": end_to_end / baseline,
        },
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
