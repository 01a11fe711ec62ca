"""Natural order of names: ``step-2`` before ``step-10``, ``v9`` before ``v10``.

The order every table and the advice read batches in (``batch_order``: by run, then batch),
kept in one place so that ``advise --last N`` reads the batches ``tail`` shows last.
"""

from __future__ import annotations

import re

from specmeter.schemas import BatchMetrics

__all__ = ["natural", "batch_order"]


def natural(text: str | None) -> tuple:
    """Natural order: step-2 before step-10, v9 before v10; None (unknown) last."""
    if text is None:
        return (1, ())
    return (0, tuple(_natural_part(p) for p in re.split(r"(\d+)", text) if p))


def _natural_part(part: str) -> tuple:
    """A run of digits ordered by its number, before any text."""
    return (0, int(part), "") if part.isdigit() else (1, 0, part)


def batch_order(m: BatchMetrics) -> tuple:
    """Rows by run, then batch, both in natural order (step-2 before step-10); the
    default run (no run_id) first."""
    return (m.run_id is not None, natural(m.run_id), natural(m.batch_id))
