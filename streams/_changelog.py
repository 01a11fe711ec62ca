"""The workers' own state changelogs: compacted topics, one per stage.

The shell writes them through its ordered producer with explicit partitions;
the delivery driver's direct reader (``_reader.DirectReader.read_changelog``)
reads a partition back when a worker takes it over. Faust's table recovery is
not used: it can hang on rebalances (faust-streaming#21, #74, robinhood/faust#218).
"""

from __future__ import annotations

from ._layout import changelog_topics

__all__ = ["changelog_topics"]
