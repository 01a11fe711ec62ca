"""Crash points and refused writes, for fault tests.

**Crash points**: SIGKILL the worker at a named step, or (``SPECMETER_HANG_AT``) stop
there for good while the rest of the process runs on: a stage stuck in its work, which
its consumer group must notice.

Off unless ``SPECMETER_CRASH_AT=<point>:<n>`` is set: the worker then kills
itself (SIGKILL, no clean-up) the n-th time it passes ``<point>``. Points sit
where a crash is most dangerous: after state changed in memory but before it is
durable, after a partial or a publication left the process but before the
consumed offsets are committed, and in the middle of restoring a partition.
Output queued before a point is flushed first, so "after" means "on the broker".

**Refused writes**: off unless ``SPECMETER_FAIL_WRITE=<kind>:<n>`` is set: the n-th write
of that kind (``WRITE_KINDS``) is sent padded to ``PADDED_BYTES``, past the broker's
default ``max.message.bytes`` (1 MiB) and within what the worker's producer accepts, so
that Kafka itself refuses it (on a topic created without a larger limit). The tests then
check that nothing the worker wrote after it counts, and that its successor resumes exactly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable

__all__ = ["CrashPoints", "CRASH_POINTS", "WriteFaults", "WRITE_KINDS", "write_kind"]

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

    def __init__(self, point: str | None = None, after: int = 1, *, hang: bool = False) -> None:
        if point is not None and point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; known: {', '.join(CRASH_POINTS)}")
        self.point = point
        self.remaining = after
        self.hang = hang

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CrashPoints:
        found = os.environ if env is None else env
        for name, hang in (("SPECMETER_CRASH_AT", False), ("SPECMETER_HANG_AT", True)):
            spec = found.get(name, "")
            if spec:
                point, _, count = spec.partition(":")
                return cls(point, int(count or 1), hang=hang)
        return cls()

    async def reached(self, point: str, flush: Callable[[], Awaitable[object]] | None = None) -> None:
        """Die here if this is the armed point's n-th pass (after flushing queued output)."""
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            await self._stop_here(point, flush)

    async def _stop_here(self, point: str, flush: Callable[[], Awaitable[object]] | None) -> None:
        """The armed point's n-th pass: hang for good (``hang``), or flush and SIGKILL the
        process, as a crash at that point would."""
        if self.hang:
            log.warning("hang point %s reached: this stage stops here", point)
            await asyncio.Event().wait()
        if flush is not None:
            await flush()
        log.warning("crash point %s reached: SIGKILL", point)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


#: the kinds of write a refusal can be injected at: changelog writes by their key's kind,
#: outputs by their topic
WRITE_KINDS = ("delta", "checkpoint", "status", "merge", "partial", "dead_letter", "metrics")
_CHANGELOG_KINDS = {b"d": "delta", b"c": "checkpoint", b"s": "status", b"m": "merge", b"p": "merge", b"k": "checkpoint"}
#: past the broker's default max.message.bytes (1,048,588), within the producer's request limit
PADDED_BYTES = 2 * 1024 * 1024


def write_kind(key: bytes) -> str | None:
    """The kind of a changelog write, from its key (``core.layout``: ``P[@E] <kind> ...``)."""
    _, _, rest = key.partition(b"\x1f")
    return _CHANGELOG_KINDS.get(rest[:1].lower())


class WriteFaults:
    """Pads the armed kind's n-th write so that the broker refuses it; every other write
    costs one comparison."""

    def __init__(self, kind: str | None = None, after: int = 1) -> None:
        if kind is not None and kind not in WRITE_KINDS:
            raise ValueError(f"unknown write kind {kind!r}; known: {', '.join(WRITE_KINDS)}")
        self.kind = kind
        self.remaining = after

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WriteFaults:
        spec = (os.environ if env is None else env).get("SPECMETER_FAIL_WRITE", "")
        if not spec:
            return cls()
        kind, _, count = spec.partition(":")
        return cls(kind, int(count or 1))

    def apply(self, kind: str | None, value: bytes | None) -> bytes | None:
        if kind != self.kind or value is None:
            return value
        self.remaining -= 1
        if self.remaining != 0:
            return value
        log.warning("refused write armed: the %s write sent now is padded to %d bytes", kind, PADDED_BYTES)
        return value + bytes(PADDED_BYTES)
