"""Dead letters said in the log by reason, folded like outages.

Every rejected input goes to the dead-letter topic, one message each, and is
counted (``specmeter_dead_letters_total{reason}``). The log is for a person: a
producer bug that makes every record invalid wrote one WARNING line per record
(issue 33). Here the first dead letter of a reason is said at once, with its
detail; the ones after it are counted, and at most once per ``interval_s`` a line
says how many more there were of that reason, on which partitions, and the latest
one. A reason quiet for an interval is said at once again when it comes back.
Times are passed in (``time.monotonic`` seconds), so the decisions are tested
without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from specmeter.schemas import DeadLetter

from ..core.stage1 import shorten

__all__ = ["DeadLetterLog"]

log = logging.getLogger("specmeter.worker")


def describe(letter: DeadLetter) -> str:
    """``key=value`` context of one dead letter, ids and detail cut short."""
    return (
        f"partition={letter.source_partition} offset={letter.source_offset} batch={shorten(letter.batch_id)} "
        f"run={shorten(letter.run_id)} detail={shorten(letter.detail, 300)}"
    )


@dataclass
class _Reason:
    said_at: float
    #: dead letters since the last line, the partitions they came from, the latest one
    folded: int = 0
    partitions: set[int | None] = field(default_factory=set)
    latest: DeadLetter | None = None


class DeadLetterLog:
    """One WARNING for the first dead letter of a reason, then one line per reason and
    ``interval_s`` with the count folded since the last line (see the module)."""

    def __init__(self, *, interval_s: float = 60.0, logger: logging.Logger = log) -> None:
        self.interval_s = interval_s
        self._log = logger
        self._reasons: dict[str, _Reason] = {}

    def letter(self, letter: DeadLetter, now: float) -> None:
        """One dead letter sent: said now if its reason is not being folded, else counted."""
        reason = self._reasons.get(letter.reason)
        if reason is None:
            self._say_first(letter, now)
            return
        reason.folded += 1
        reason.partitions.add(letter.source_partition)
        reason.latest = letter

    def _say_first(self, letter: DeadLetter, now: float) -> None:
        """The first dead letter of a reason: said now, the next ones folded."""
        self._reasons[letter.reason] = _Reason(said_at=now)
        self._log.warning(
            "dead-lettered reason=%s %s; further dead letters of this reason are folded into one line a "
            "minute (each is on the dead-letter topic)",
            letter.reason,
            describe(letter),
        )

    def tick(self, now: float) -> None:
        """Say what was folded for each reason whose interval is over; forget a reason
        that stayed quiet for a whole interval."""
        self._say(lambda reason: now - reason.said_at >= self.interval_s, now)

    def flush(self, now: float) -> None:
        """Say everything folded so far (at shutdown: no count is left unsaid)."""
        self._say(lambda reason: True, now)

    def _say(self, due: Callable[[_Reason], bool], now: float) -> None:
        for name, reason in list(self._reasons.items()):
            if not due(reason):
                continue
            if reason.folded == 0:
                del self._reasons[name]  # quiet for an interval: the next one is said at once
                continue
            self._say_folded(name, reason, now)
            self._reasons[name] = _Reason(said_at=now)

    def _say_folded(self, name: str, reason: _Reason, now: float) -> None:
        """One line for what a reason folded since its last line."""
        assert reason.latest is not None
        self._log.warning(
            "dead-lettered %d more reason=%s in the last %.0f s, from partitions %s (latest: %s)",
            reason.folded,
            name,
            now - reason.said_at,
            _partitions_shown(reason.partitions),
            describe(reason.latest),
        )


def _partitions_shown(partitions: set[int | None]) -> str:
    """The source partitions of folded dead letters, in order (an unknown one first)."""
    return ",".join(str(p) for p in sorted(partitions, key=lambda p: -1 if p is None else p))
