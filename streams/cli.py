"""The ``specmeter`` command line: click wiring only; each command calls a ``run``.

Heavy imports (Faust, aiokafka, the producer) happen inside the commands that
need them, so ``specmeter --help`` and ``specmeter aggregate`` stay fast.
"""

from __future__ import annotations

import sys
from typing import IO

import click

from specmeter.schemas import encode_metrics

from ._offline import LineError, OfflineAggregator


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SPECMETER"})
@click.version_option(package_name="specmeter")
def main() -> None:
    """specmeter: correct speculative-decoding metrics for RL rollout fleets.

    Rollout workers publish one record per committed generation (accepted and
    proposed draft tokens, verify steps, completion tokens); specmeter
    deduplicates them per batch and publishes weighted metrics with coverage.

    \b
    Offline:   specmeter aggregate dump.jsonl
    """


@main.command()
@click.argument("file", type=click.File("rb"), metavar="FILE.jsonl")
@click.option(
    "--speculative-algorithm",
    metavar="NAME",
    default=None,
    help="Treat every batch as run with this algorithm (e.g. EAGLE3), as a marker naming it would.",
)
@click.option("--quiet", "-q", is_flag=True, help="Do not report bad lines on stderr (they are still counted).")
def aggregate(file: IO[bytes], speculative_algorithm: str | None, quiet: bool) -> None:
    """Aggregate a JSON-lines rollout dump without Kafka; '-' reads stdin.

    Each line is a record (batch_id, session_id, generation_id, sample_id,
    state_hash, accepted, proposed, verify, completion, accept_histogram,
    producer_id; missing fields are unknown) or a batch marker
    ({"type": "marker", "batch_id", "producer_id", "records_sent",
    "speculative_algorithm", "expected_producers"}). Prints one BatchMetrics JSON
    object per batch, in order of first appearance. A bad line is reported on
    stderr with its line number and reason, counted in its batch when the batch
    is readable, and never stops the run.
    """

    def report(error: LineError) -> None:
        if not quiet:
            click.echo(f"specmeter aggregate: {error}", err=True)

    aggregator = OfflineAggregator(speculative_algorithm=speculative_algorithm, on_error=report)
    aggregator.feed_lines(file)
    out = sys.stdout.buffer
    for metrics in aggregator.results():
        out.write(encode_metrics(metrics) + b"\n")
    out.flush()
    if aggregator.errors and not quiet:
        click.echo(f"specmeter aggregate: {aggregator.errors} bad line(s) reported above", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
