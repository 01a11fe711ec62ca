"""How a schedule or a worker ends other than well: an invariant broken, a fault injected,
a worker stopped as designed. Apart from the scheduler and the worker because both raise
them and both tell one from another."""

from __future__ import annotations

from aiokafka.errors import KafkaTimeoutError


class Violation(AssertionError):
    """An invariant broken; the message names the seed and the schedule's trace."""


class InjectedFault(RuntimeError):
    """A failure the scheduler injects where the worker must stop on it (rule 11)."""


class Stopped(Exception):
    """A worker stopped as designed (writes in flight past a revocation's deadline): it is restarted."""


def _stops_by_design(failed: BaseException | None) -> bool:
    """A worker's output failed as the protocol says it stops: writes in flight past a
    revocation's deadline, a write whose delivery timed out, or one answered without its
    offset (``docs/ownership.md``, rules 9 and 10)."""
    return isinstance(failed, (TimeoutError, KafkaTimeoutError, InjectedFault)) or (
        isinstance(failed, RuntimeError) and "without its offset" in str(failed)
    )
