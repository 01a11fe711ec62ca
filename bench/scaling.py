"""Scaling with partitions: what one worker costs at rest and how fast it reads, at 4, 16 and
64 partitions.

    python bench/scaling.py [--records 400000] [--partitions 4 16 64] [--idle-s 20] [--repeat 3] [--smoke] [--json]

For each partition count: one worker on an idle records topic, once ready, is watched for
``--idle-s``: its TCP connections to the broker and the CPU it burns doing nothing; then
a fresh worker reads a pre-loaded fleet of ``--records`` records to the last batch's
metrics (records/s, from ready to the last metrics: the steady state; ``--repeat`` reads
of each partition count, interleaved, and their median). The baseline is
the smallest partition count, measured in the same run: a worker whose cost grows with
its partitions shows ratios well over 1.

The fleet's batches hold ``--batch-records`` records each (40,000 by default: one rollout
step of a large fleet). Some work is per batch and partition, whatever its records: every
producer's marker reaches every partition, and each partition closes the batch with a
partial, a status and a merge. Small batches on many partitions are slower for that
(see docs/benchmarks.md); ``--batch-records 2000`` shows it. The same records also reach
the worker as more Kafka messages on more partitions (a producer packs a message per
partition, and sends its markers to each): the input messages are printed beside
records/s, so that a slower rate can be told apart from a heavier input.

Beside records/s, each read's CPU seconds (the worker's, from ready to the last metrics,
from /proc): the worker is CPU-bound while it reads a backlog, so this is its own cost;
its wall time also holds the broker's stalls (on a VM disk a produce request to many
fresh partitions can wait seconds on the broker's page faults; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    add_json_flag,
    broker_address,
    broker_connections,
    core_name,
    cpu_seconds,
    delete_topics,
    free_port,
    fresh_topic,
    report,
    topic_messages,
)
from _pipeline import app_topics, fleet, preload, run_workers_timed, start_workers, stop_workers


def idle_worker(bootstrap: str, partitions: int, idle_s: float) -> tuple[int, float]:
    """(connections to the broker, CPU % of one core) of a ready worker on an idle topic."""
    topic = fresh_topic(bootstrap, "idle", partitions)
    port = free_port()
    name, procs = start_workers(bootstrap, topic, partitions, 1, web_port=port)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/readyz", timeout=2) as response:
                    if json.loads(response.read()).get("ready"):
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"the worker on {partitions} partitions was not ready within 120 s")
            time.sleep(0.2)
        time.sleep(min(3.0, idle_s))  # the restore's reader is closed, start-up work done
        pid = procs[0].pid
        port_of_broker = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        connections = broker_connections(pid, port_of_broker)
        before, started = cpu_seconds(pid), time.monotonic()
        time.sleep(idle_s)
        cpu = (cpu_seconds(pid) - before) / (time.monotonic() - started) * 100
        return max(connections, broker_connections(pid, port_of_broker)), cpu
    finally:
        stop_workers(procs)
        delete_topics(bootstrap, [topic, *app_topics(name)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--batch-records", type=int, default=40_000, help="records per batch")
    parser.add_argument("--partitions", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--idle-s", type=float, default=20.0, help="how long an idle worker is watched")
    parser.add_argument("--repeat", type=int, default=3, help="reads per partition count (the median is reported)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    idle_s = 2.0 if args.smoke else args.idle_s
    if args.smoke:
        args.repeat = 1
    if args.smoke and args.partitions == parser.get_default("partitions"):
        args.partitions = [2, 8]  # the script runs; the figures are the full run's
    bootstrap = broker_address()
    rows, figures = [], {}
    idle = {partitions: idle_worker(bootstrap, partitions, idle_s) for partitions in args.partitions}
    spec = fleet(target, max(2, target // args.batch_records))
    loaded = {partitions: preload(bootstrap, spec, partitions) for partitions in args.partitions}
    try:
        # the reads interleaved (4, 16, 64, 4, 16, 64, ...): a drift in the machine's load
        # reaches every partition count alike; each figure is the median of its reads
        seconds: dict[int, list[float]] = {partitions: [] for partitions in args.partitions}
        read_cpu: dict[int, list[float]] = {partitions: [] for partitions in args.partitions}
        for _ in range(args.repeat):
            for partitions, (topic, _, batches) in loaded.items():
                run = run_workers_timed(bootstrap, topic, partitions, batches, workers=1)
                seconds[partitions].append(run.steady_s)
                if run.steady_cpu_s is not None:
                    read_cpu[partitions].append(run.steady_cpu_s)
        messages = {
            partitions: topic_messages(bootstrap, topic, partitions) for partitions, (topic, _, _) in loaded.items()
        }
    finally:
        delete_topics(bootstrap, [topic for topic, _, _ in loaded.values()])
    for partitions in args.partitions:
        connections, cpu = idle[partitions]
        records = loaded[partitions][1]
        steady_s = statistics.median(seconds[partitions])
        rates = sorted(records / s for s in seconds[partitions])
        rate = records / steady_s
        read_cpu_s = statistics.median(read_cpu[partitions]) if read_cpu[partitions] else None
        figures[partitions] = {
            "connections": connections,
            "idle_cpu_percent": cpu,
            "records_per_s": rate,
            "records_per_s_each_read": rates,
            "read_cpu_s": read_cpu_s,
            "read_cpu_s_each_read": sorted(read_cpu[partitions]),
            "input_messages": messages[partitions],
            "input_messages_per_s": messages[partitions] / steady_s,
        }
        spread = f" (reads {rates[0]:,.0f}–{rates[-1]:,.0f})" if len(rates) > 1 else ""
        used = f", {read_cpu_s:.2f} CPU s a read" if read_cpu_s is not None else ""
        rows.append(
            (
                f"{partitions} partitions",
                f"{connections} broker connections, idle CPU {cpu:.1f} %, {rate:,.0f} records/s{spread}{used}, "
                f"{messages[partitions]:,} input messages ({messages[partitions] / steady_s:,.0f}/s)",
            )
        )
    batches = spec.batches
    base, top = figures[args.partitions[0]], figures[args.partitions[-1]]
    cpu_ratio = (
        f", CPU a read {top['read_cpu_s'] / base['read_cpu_s']:.2f}x"
        if base["read_cpu_s"] and top["read_cpu_s"] is not None
        else ""
    )
    rows.append(
        (
            f"ratio {args.partitions[-1]}/{args.partitions[0]}",
            f"connections {top['connections'] / base['connections']:.2f}x, idle CPU "
            f"{top['idle_cpu_percent'] / max(base['idle_cpu_percent'], 0.01):.2f}x, records/s "
            f"{base['records_per_s'] / top['records_per_s']:.2f}x slower{cpu_ratio} (input messages "
            f"{top['input_messages'] / base['input_messages']:.2f}x)   "
            f"(baseline: {args.partitions[0]} partitions, same run)",
        )
    )
    report(
        f"scaling with partitions ({records:,} records, {batches} batches per run; one worker)",
        rows,
        {"records": records, "batches": batches, "core": core_name(), "by_partitions": figures},
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
