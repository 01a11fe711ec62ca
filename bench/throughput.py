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

The loops and the worker run interleaved ``--runs`` times (default 3; the order
alternates each round) and the figures are medians with their spread: the bare loop
itself varies by about 15 % from run to run, so one run decides nothing. Ratios are
taken within a round. ``--profile DIR`` adds one untimed worker run under cProfile.

Targets (issue #46): steady state >= 2.5x the baseline (goal 3x), end to end >= 1.2x
(goal 1.5x), steady >= 0.3x fetch only (goal 0.5x), start-up to ready <= 0.5 s.
"""

from __future__ import annotations

import argparse
import pstats
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, report
from _pipeline import bare_consumer, fetch_only, fleet, preload, run_workers_timed

#: each round's figures, by name: records/s, seconds and ratios to the same round's loops
FIGURES = (
    ("steady_state_records_per_s", "worker, steady state (ready to last metrics)", "{:,.0f} records/s"),
    ("end_to_end_records_per_s", "worker, end to end (start to last metrics)", "{:,.0f} records/s"),
    ("startup_to_ready_s", "worker start-up to ready (state restored)", "{:.2f} s"),
    ("baseline_records_per_s", "baseline bare aiokafka+msgspec+dict", "{:,.0f} records/s"),
    ("fetch_only_records_per_s", "fetch only (aiokafka getmany, no decoding)", "{:,.0f} records/s"),
    ("steady_state_ratio", "ratio steady / baseline", "{:.2f}x"),
    ("end_to_end_ratio", "ratio end to end / baseline", "{:.2f}x"),
    ("fetch_only_ratio", "ratio steady / fetch only (the I/O limit)", "{:.2f}x"),
)


def one_round(
    bootstrap: str, topic: str, records: int, partitions: int, batches: int, *, worker_first: bool
) -> dict[str, float]:
    """The two loops and the worker over the same messages, in the order given (the rounds
    alternate it, so that neither side always runs on a warmer broker)."""
    loops: dict[str, float] = {}

    def run_loops() -> None:
        loops["fetch"] = fetch_only(bootstrap, topic, records, partitions)
        loops["baseline"] = bare_consumer(bootstrap, topic, records)

    if not worker_first:
        run_loops()
    run = run_workers_timed(bootstrap, topic, partitions, batches, workers=1)
    if worker_first:
        run_loops()
    steady, end_to_end = records / run.steady_s, records / run.seconds
    return {
        "steady_state_records_per_s": steady,
        "end_to_end_records_per_s": end_to_end,
        "startup_to_ready_s": run.startup_s,
        "baseline_records_per_s": loops["baseline"],
        "fetch_only_records_per_s": loops["fetch"],
        "steady_state_ratio": steady / loops["baseline"],
        "end_to_end_ratio": end_to_end / loops["baseline"],
        "fetch_only_ratio": steady / loops["fetch"],
    }


def summary_rows(rounds: list[dict[str, float]]) -> list[tuple[str, str]]:
    """One row per figure: the median, the spread and each round's value."""
    rows = []
    for key, label, form in FIGURES:
        values = [r[key] for r in rounds]

        def number(v: float, form: str = form) -> str:
            return form.format(v).split(" ")[0]

        each = ", ".join(map(number, values))
        spread = f"  (min {number(min(values))}, max {number(max(values))}; runs: {each})"
        rows.append((label, form.format(statistics.median(values)) + (spread if len(values) > 1 else "")))
    return rows


def write_profile(stats_path: Path) -> Path:
    """The profiled worker's cProfile stats as text beside them: where its CPU went."""
    text = stats_path.with_suffix(".txt")
    with text.open("w") as out:
        stats = pstats.Stats(str(stats_path), stream=out)
        out.write("# by own time\n")
        stats.sort_stats("tottime").print_stats(40)
        out.write("# by cumulative time\n")
        stats.sort_stats("cumulative").print_stats(60)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds of loops and worker (default 3)")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="after the timed rounds, one more worker run under cProfile: DIR/worker.prof and a text summary",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    target, runs = (5_000, 1) if args.smoke else (args.records, args.runs)
    bootstrap = broker_address()
    print(f"preloading ≈{target:,} records ...", file=sys.stderr)
    topic, records, batches = preload(bootstrap, fleet(target), args.partitions)
    rounds = []
    for i in range(runs):
        print(f"round {i + 1}/{runs}: fetch only, baseline and the worker ({core_name()} core) ...", file=sys.stderr)
        rounds.append(one_round(bootstrap, topic, records, args.partitions, batches, worker_first=i % 2 == 1))
    profiled = None
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        stats_path = Path(args.profile) / "worker.prof"
        print(f"one more worker run under cProfile -> {stats_path} ...", file=sys.stderr)
        run_workers_timed(bootstrap, topic, args.partitions, batches, workers=1, profile_to=str(stats_path))
        profiled = str(write_profile(stats_path))
    medians = {key: statistics.median(r[key] for r in rounds) for key, _, _ in FIGURES}
    rows = summary_rows(rounds)
    if profiled:
        rows.append(("profile (a separate run, not timed)", profiled))
    report(
        f"throughput ({records:,} records, {batches} batches, {args.partitions} partitions, {core_name()} core; "
        f"medians of {runs} interleaved round{'s' if runs > 1 else ''})",
        rows,
        {
            "records": records,
            "batches": batches,
            "partitions": args.partitions,
            "core": core_name(),
            "runs": runs,
            **medians,  # each figure's median under the figure's name
            "rounds": rounds,
            "profile": profiled,
        },
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
