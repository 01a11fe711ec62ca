"""Three workers frozen, killed, stopped and restarted many times over while a stream
runs: is every batch still exact?

    python bench/group_chaos.py [--faults 60] [--seed 1] [--partitions 6] [--cluster] [--smoke] [--json]

One group of three workers (6 partitions, a 6 s session) reads a paced stream (two
batches of a small fleet every 2 s, with redeliveries, conflicts, missing counters and
invalid records) while ``--faults`` faults are drawn from ``--seed``
(``tests/support/group_chaos.py``): a freeze shorter than the session, a freeze past it,
SIGKILL and restart, SIGTERM and restart, a frozen owner woken after another worker was
killed and restarted beside it, and a replacement frozen a few seconds after it starts
(mid-takeover or mid-restore). The kinds come in rounds of every kind once.

``--cluster``: on a private three-broker cluster instead (started as
``bench/cluster_hold.py`` starts one: replication factor 3, ``min.insync.replicas=2``; in a
temporary folder, stopped and removed at the end, Ctrl-C and SIGTERM included), and broker
faults join the kinds, drawn from the same seed: a broker SIGKILLed and started again
after a drawn pause (1-15 s), and a broker stopped cleanly and started again. Each runs
beside the worker faults that follow it; one broker at most is away (the next broker
fault waits until every partition is in sync again), so every write keeps its two
in-sync replicas. Printed besides: the broker faults by kind, how long their brokers were
away and how long until every partition was in sync again.

Afterwards every worker is awake and the stream stopped. Target, all of: every batch's
latest publication equals ``specmeter aggregate`` over the same events (complete, closed
by its markers), one content per (batch, revision) over every message published, and
every record sent counted once (in its batch or in a dead letter). The baseline is what
the offline core computes from the same events, in the same run. Printed: the faults by
kind, batches, records, publications, the fencing lines the workers logged, the
duration. Exits 1 when a target is missed. ``--smoke``: 6 faults (8 with ``--cluster``:
every kind once).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_json_flag, broker_address, report
from specmeter.streams.cli.base import exit_status
from specmeter.streams.cli.lifetime import stop_signals_raise
from tests.support.group_chaos import BROKER_KINDS, KINDS, ChaosReport, run_chaos, three_brokers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=60, help="faults to inject (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the records topic (default 6)")
    parser.add_argument(
        "--cluster", action="store_true", help="on a three-broker cluster of its own, broker faults among the kinds"
    )
    parser.add_argument("--smoke", action="store_true", help="6 faults (8 with --cluster)")
    add_json_flag(parser)
    args = parser.parse_args()
    faults = (len(KINDS) + len(BROKER_KINDS) if args.cluster else 6) if args.smoke else args.faults
    started = time.monotonic()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        with contextlib.ExitStack() as stack:
            cluster = None
            if args.cluster:
                logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # this process's clients, a broker away
                progress("starting a three-broker cluster")
                cluster = stack.enter_context(three_brokers(progress))
            bootstrap = broker_address() if cluster is None else cluster.bootstrap
            chaos = run_chaos(
                bootstrap, seed=args.seed, faults=faults, partitions=args.partitions, progress=progress, cluster=cluster
            )
    except AssertionError as exc:
        report(
            "a group of three through faults",
            [("verdict", f"missed: {str(exc).splitlines()[0]}")],
            {"ok": False},
            as_json=args.json,
        )
        return 1
    worker_faults = {k: n for k, n in chaos.faults.items() if k not in BROKER_KINDS}
    rows = [
        (
            "faults",
            f"{sum(worker_faults.values())}: " + ", ".join(f"{k} {n}" for k, n in sorted(worker_faults.items())),
        ),
        *(broker_rows(chaos) if args.cluster else []),
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
        "cluster": args.cluster,
        "faults": dict(chaos.faults),
        "broker_away_s": [round(s, 1) for s in chaos.broker_away_s],
        "in_sync_after_s": [None if s is None else round(s, 1) for s in chaos.in_sync_after_s],
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


def broker_rows(chaos: ChaosReport) -> list[tuple[str, str]]:
    """The broker faults by kind, how long their brokers were away, how long until in sync."""
    done = {k: chaos.faults[k] for k in BROKER_KINDS}
    synced = [s for s in chaos.in_sync_after_s if s is not None]
    return [
        ("run", "3 brokers (replication factor 3, min.insync.replicas 2), one away at most"),
        ("broker faults", f"{sum(done.values())}: " + ", ".join(f"{k} {n}" for k, n in done.items())),
        (
            "broker away, its start included (s) / every partition in sync after its return (s): min-max",
            f"{min(chaos.broker_away_s, default=0):.1f}-{max(chaos.broker_away_s, default=0):.1f} / "
            f"{min(synced, default=0):.1f}-{max(synced, default=0):.1f}"
            + (
                f" ({len(chaos.in_sync_after_s) - len(synced)} not in sync within the wait)"
                if len(synced) < len(chaos.in_sync_after_s)
                else ""
            ),
        ),
    ]


if __name__ == "__main__":
    with stop_signals_raise():  # SIGTERM and SIGHUP stop it as Ctrl-C does: its clean-up runs
        try:
            sys.exit(main())
        except KeyboardInterrupt as interrupt:
            print("group_chaos: interrupted: what it started was stopped", file=sys.stderr)
            sys.exit(exit_status(interrupt))  # 130, 143
