"""Crash points: SIGKILL the worker at a named step, for fault tests.

Off unless ``SPECMETER_CRASH_AT=<point>:<n>`` is set: the worker then kills
itself (SIGKILL, no clean-up) the n-th time it passes ``<point>``. Points sit
where a crash is most dangerous: after state changed in memory but before it is
durable, after a partial or a publication left the process but before the
consumed offsets are committed, and in the middle of restoring a partition.
Output queued before a point is flushed first, so "after" means "on the broker".
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable

__all__ = ["CrashPoints", "CRASH_POINTS"]

log = logging.getLogger("specmeter.faults")

CRASH_POINTS = (
    "stage1-processed",  # a chunk applied in memory; nothing written yet
    "stage1-changelog",  # its deltas and checkpoint on the broker; partials not sent
    "stage1-partials",  # its partials on the broker; input offsets not committed
    "stage2-merged",  # partials merged in memory; nothing written yet
    "stage2-published",  # BatchMetrics on the broker; stage-2 offsets not committed
    "restore",  # a partition's changelog read, its state not installed
)


class CrashPoints:
    """Counts passes of the armed point; every other point costs one dict lookup."""

    def __init__(self, point: str | None = None, after: int = 1) -> None:
        if point is not None and point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; known: {', '.join(CRASH_POINTS)}")
        self.point = point
        self.remaining = after

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CrashPoints:
        spec = (os.environ if env is None else env).get("SPECMETER_CRASH_AT", "")
        if not spec:
            return cls()
        point, _, count = spec.partition(":")
        return cls(point, int(count or 1))

    async def reached(self, point: str, flush: Callable[[], Awaitable[object]] | None = None) -> None:
        """Die here if this is the armed point's n-th pass (after flushing queued output)."""
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining > 0:
            return
        if flush is not None:
            await flush()
        log.warning("crash point %s reached: SIGKILL", point)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
