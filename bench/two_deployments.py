"""Two deployments on one broker, one records topic, for ten minutes of ``loadgen``
(issue 47.1's target): each publishes every batch, exact, on its own metrics topic, and
neither says a word about the other (0 "arrived again with other content" warnings).

    python bench/two_deployments.py [--minutes 10] [--rate 300] [--sessions-per-batch 40] [--smoke] [--json]

Two workers, each of its own app id and so of its own partials topic, changelogs and
groups (named from the app id, as a user's are: no --partials-topic), read one records
topic of 4 partitions; ``loadgen`` publishes a paced stream (``--expect`` writes what every
batch must come out as). When it has ended, each metrics topic is read until every batch
is complete and checked against the expect file (record count, invalid records, accept
histogram, every metric), and one content per (batch, revision). Exit 1 when a target is
missed. The broker is KAFKA_BOOTSTRAP_SERVERS or the local one (started if needed).
The baseline is what ``loadgen`` computed from the records it sent: the ratio is exact
batches to expected ones, per deployment. ``--smoke``: a 30-second stream at 200 records/s.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_json_flag, broker_address, core_name, fresh_topic, report
from bench.cluster_hold import check_batches, records_per_batch
from tests.support.worker_harness import Deployment

PARTITIONS = 4
CROSS_TALK = "arrived again with other content"


def loadgen(bootstrap: str, topic: str, batches: int, args: argparse.Namespace, expect: Path) -> float:
    """Run the paced stream to its end; its seconds."""
    began = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "specmeter.streams.cli",
            "loadgen",
            "--broker",
            bootstrap,
            "--topic",
            topic,
            "--batches",
            str(batches),
            "--sessions-per-batch",
            str(args.sessions_per_batch),
            "--rate",
            f"{args.rate:g}",
            "--seed",
            "47",
            "--expect",
            str(expect),
            "--no-progress",
        ],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


def check(d: Deployment, expected: dict[str, dict]) -> dict:
    """One deployment's metrics topic against the expect file, and its cross-talk lines."""

    def done(ms: list) -> bool:
        latest = {m.batch_id: m for m in ms if m.complete}
        return all(b in latest for b in expected)

    figures = check_batches(expected, d.metrics(until=done, timeout_s=600))
    said = "\n".join(p.read_text(errors="replace") for p in d.logs)
    figures["cross_talk_warnings"] = said.count(CROSS_TALK)
    figures["partials_topic"] = d.topics.partials
    figures["alive"] = all(w.poll() is None for w in d.workers)
    return figures


def missed(figures: dict) -> list[str]:
    return [
        f"{name}: {what}"
        for name, f in figures["deployments"].items()
        for what, bad in (
            ("batches not exact", f["exact"] != f["expected"]),
            ("cross-talk", f["cross_talk_warnings"]),
            ("two contents for one (batch, revision)", f["conflicting"]),
            ("a worker died", not f["alive"]),
        )
        if bad
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the stream")
    parser.add_argument("--rate", type=float, default=300.0, help="loadgen's records per second")
    parser.add_argument("--sessions-per-batch", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="a 30-second stream at 200 records/s")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.minutes, args.rate = 0.5, 200.0
    bootstrap = broker_address()
    records = fresh_topic(bootstrap, "two-deployments", PARTITIONS)
    run_dir = Path(tempfile.mkdtemp(prefix="specmeter-two-deployments-"))
    first = Deployment(bootstrap, partials_flag=False, records_topic=records)
    second = Deployment(bootstrap, partials_flag=False, records_topic=records)
    figures: dict = {"minutes": args.minutes, "rate": args.rate, "core": core_name()}
    try:
        for d in (first, second):
            d.wait_ready(d.start_worker())
        per_batch = records_per_batch(args.sessions_per_batch, 47, run_dir)
        batches = max(4, math.ceil(args.rate * args.minutes * 60 / per_batch))
        expect = run_dir / "expect.jsonl"
        figures["stream_s"] = round(loadgen(bootstrap, records, batches, args, expect), 1)
        expected = {m["batch_id"]: m for m in map(json.loads, expect.read_text().splitlines())}
        figures["records"] = sum(m["record_count"] for m in expected.values())
        figures["deployments"] = {d.name: check(d, expected) for d in (first, second)}
    finally:
        for d in (second, first):
            d.close()
        from bench._common import delete_topics

        delete_topics(bootstrap, [records])
    bad = missed(figures)
    rows = [("stream", f"{figures['stream_s']} s, {figures['records']} records, {len(expected)} batches")]
    rows += [
        (name, f"{f['exact']}/{f['expected']} exact, cross-talk {f['cross_talk_warnings']}, via {f['partials_topic']}")
        for name, f in figures["deployments"].items()
    ]
    ratios = [f"{f['exact']} : {f['expected']}" for f in figures["deployments"].values()]
    rows.append(("ratio", f"exact : loadgen --expect, each deployment: {', '.join(ratios)}"))
    rows.append(("result", "PASS" if not bad else "MISSED: " + "; ".join(bad)))
    report("two deployments on one records topic", rows, figures, as_json=args.json)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
