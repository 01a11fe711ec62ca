"""The README's main job, on a laptop: aggregate the bundled sample rollout.

(The stream-app milestone upgrades this to the worker on an embedded broker.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmeter.schemas import encode_metrics

from ._offline import OfflineAggregator

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_rollout.jsonl"


def main() -> None:
    aggregator = OfflineAggregator()
    with SAMPLE.open("rb") as lines:
        aggregator.feed_lines(lines)
    for metrics in aggregator.results():
        sys.stdout.buffer.write(encode_metrics(metrics) + b"\n")


if __name__ == "__main__":
    main()
