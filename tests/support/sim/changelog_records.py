"""What the checks read in a changelog record: the checkpoint a write carries, the takeover a
record is or stands for, and whether that takeover may fence an owner. Apart from the
scheduler because the worker's instrumentation reads checkpoints too."""

from __future__ import annotations

from typing import Any

from specmeter.streams.core.layout import decode_checkpoint, decode_stage2_checkpoint
from specmeter.streams.core.ownership import CLOCK_SKEW_MS, confirmation_of, is_confirmation, is_takeover, takeover_of


def _checkpoint_in(key: bytes, value: bytes | None) -> int | None:
    """The input offset a changelog write checkpoints (None: it is no checkpoint): stage 1's
    ``c``, stage 2's ``k``, a checkpoint-only stage's plain number."""
    kind = key.partition(b"\x1f")[2]
    if value is None or kind not in (b"c", b"k"):
        return None
    if value.isdigit():
        return int(value)
    return decode_checkpoint(value).offset if kind == b"c" else decode_stage2_checkpoint(value).offset


def _takeover_at(offset: int, key: bytes | None, value: bytes | None, epoch: int) -> Any:
    """The takeover a changelog record after ``epoch`` is or stands for (None: none)."""
    if offset <= epoch or key is None or value is None:
        return None
    if is_takeover(key):
        return takeover_of(value)
    confirmation = confirmation_of(value) if is_confirmation(key) else None
    return confirmation.as_takeover() if confirmation is not None and confirmation.epoch > epoch else None


def _may_fence(found: tuple[int, int, int], installed: tuple[int, int, int]) -> bool:
    """Whether a takeover confirmed at ``found`` (rebalance, incarnation, time) may fence an
    owner that installed at ``installed``."""
    if found[0] >= installed[0]:
        return True
    return found[1] < installed[1] and found[2] + CLOCK_SKEW_MS >= installed[2]
