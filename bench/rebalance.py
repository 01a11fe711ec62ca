"""A rebalance costs what moves: a fourth worker joins three at 12 partitions.

    python bench/rebalance.py [--records 600000] [--partitions 12] [--smoke] [--json]

Three workers read a pre-loaded fleet of ``--records`` records on ``--partitions``
partitions to its last batch's metrics (their state: the batches within grace); then a
fourth worker starts. Printed, from each worker's ``/specmeter/stats``: how many
partitions each worker restored from its changelog and how many it kept through the
rebalance, how long the newcomer took to be ready, and the longest the event loop of
any worker did not answer while a takeover was under way (its stall).

Baseline, measured in the same run: what every rebalance cost before issue 30, when every
worker dropped and restored every partition it was assigned, of both stages: the four
workers are stopped and one is started on the same state, which restores all ``2 ×
partitions`` (its count and its time). The target is a stall under 100 ms: heartbeats,
probes and the other partitions answer throughout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, broker_address, core_name, delete_topics, free_port, report
from _pipeline import app_topics, fleet, preload, start_workers, stop_workers


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=10) as response:
        return json.loads(response.read())


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/readyz", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def wait(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="a quick run (60k records)")
    add_json_flag(parser)
    args = parser.parse_args()
    records = 60_000 if args.smoke else args.records
    n = args.partitions
    bootstrap = broker_address()
    spec = fleet(records, batches=20)
    topic, produced, batches = preload(bootstrap, spec, n)
    ports = [free_port() for _ in range(4)]
    # a long grace: every batch is still held (and restored) when the fourth worker comes
    extra = ("--grace", "3600")
    name, procs = start_workers(bootstrap, topic, n, 3, web_ports=ports[:3], extra=extra)
    try:
        wait(lambda: all(ready(p) for p in ports[:3]), 120, "three workers ready")
        wait(
            lambda: sum(stats(p)["counters"].get("batches_published", 0) for p in ports[:3]) >= batches,
            600,
            "the fleet's metrics",
        )
        before = {p: stats(p)["delivery"] for p in ports[:3]}
        _, fourth = start_workers(bootstrap, topic, n, 1, name=name, web_ports=ports[3:], first=3, extra=extra)
        procs += fourth
        joined = wait(lambda: ready(ports[3]) and stats(ports[3])["delivery"]["restored"] > 0, 120, "the fourth")
        time.sleep(3)  # the group settles
        wait(lambda: all(ready(p) for p in ports), 60, "all four ready")
        after = {p: stats(p)["delivery"] for p in ports}
        # the baseline: every partition of both stages restored, as every rebalance did before
        stop_workers(procs)
        procs = []
        cold_port = [free_port()]
        _, procs = start_workers(bootstrap, topic, n, 1, name=name, web_ports=cold_port, first=4, extra=extra)
        cold_s = wait(lambda: ready(cold_port[0]) and stats(cold_port[0])["delivery"]["restored"] >= 2 * n, 300, "cold")
        cold = stats(cold_port[0])["delivery"]
    finally:
        stop_workers(procs)
        delete_topics(bootstrap, [topic, *app_topics(name)])
    newcomer = after[ports[3]]
    elsewhere = sum(after[p]["restored"] - before[p]["restored"] for p in ports[:3])
    kept = sum(after[p]["kept"] - before[p]["kept"] for p in ports[:3])
    moved = newcomer["restored"] + elsewhere
    stall_ms = max(d["longest_stall_restoring_ms"] for d in after.values())
    step_ms = max(d["longest_restore_step_ms"] for d in after.values())
    everything = cold["restored"]
    data = {
        "records": produced,
        "partitions": n,
        "restored_by_the_newcomer": newcomer["restored"],
        "restored_elsewhere": elsewhere,
        "kept_through_the_rebalance": kept,
        "restored_by_a_full_restore": everything,
        "full_restore_s": round(cold_s, 2),
        "full_restore_longest_stall_ms": cold["longest_stall_restoring_ms"],
        "newcomer_ready_s": round(joined, 2),
        "longest_stall_restoring_ms": stall_ms,
        "longest_restore_step_ms": step_ms,
        "core": core_name(),
    }
    report(
        "rebalance: a fourth worker joins three",
        [
            ("fleet", f"{produced:,} records, {batches} batches, {n} partitions ({core_name()} core)"),
            (
                "restored (both stages)",
                f"{moved} partitions ({newcomer['restored']} by the newcomer, {elsewhere} by the others); "
                f"{kept} kept where they were",
            ),
            (
                "baseline: a full restore (every rebalance before issue 30)",
                f"{everything} partitions in {cold_s:.1f} s; ratio of partitions restored {moved / everything:.2f}",
            ),
            ("newcomer ready in", f"{joined:.1f} s"),
            ("longest event-loop stall during a takeover", f"{stall_ms:.0f} ms (target < 100 ms)"),
            ("longest restore step", f"{step_ms:.0f} ms"),
        ],
        data,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
