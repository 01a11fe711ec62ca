"""Batches a partition has let go of for good, remembered for a horizon (SPEC §4, Late records).

A batch expires when it has been closed longer than grace; one closed early at the
open-generation limit overflows. Either way its state is dropped, and input for it
must never open it again: a record or marker for it is dead-lettered (``late``,
``overflow``) for as long as the retention horizon, days, not for the last few
thousand batches.

What is remembered per batch is its 64-bit identity hash (``layout.batch_hash``):
8 bytes in a sorted ``array('Q')``, not a Python object. The hashes are grouped in
generations by when the batch went, ``horizon / 64`` wide, so a whole generation is
forgotten at once when the horizon has passed over it (an id is remembered for at
least the horizon, at most 1/64 longer), and a lookup is a binary search in each of
at most 65 generations. The newest generation takes new ids in a set until a newer
one begins.

Each id is written to the changelog once, when its batch goes: one key per moment
that lets batches go (an expiry tick, a chunk with an overflow), whose number the
generation keeps (8 bytes per key) to tombstone it when the generation is forgotten.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from .layout import BatchKey, batch_hash

__all__ = ["GoneIds", "GENERATIONS_PER_HORIZON"]

#: generations the horizon is cut into: how coarse the remembered expiry time is
GENERATIONS_PER_HORIZON = 64


class _Generation:
    """The ids that went within one span of time, and the changelog keys holding them."""

    __slots__ = ("hashes", "keys", "recent")

    def __init__(self) -> None:
        #: sorted hashes (frozen part)
        self.hashes = array("Q")
        #: hashes added since the last freeze (the newest generation takes them here)
        self.recent: set[int] = set()
        #: the numbers of the changelog keys that hold these ids
        self.keys = array("q")

    def __contains__(self, h: int) -> bool:
        if h in self.recent:
            return True
        hashes = self.hashes
        i = bisect_left(hashes, h)
        return i < len(hashes) and hashes[i] == h

    def freeze(self) -> None:
        """Move the recent hashes into the sorted array."""
        if self.recent:
            self.hashes = array("Q", sorted({*self.hashes, *self.recent}))
            self.recent = set()

    def __len__(self) -> int:
        return len(self.hashes) + len(self.recent)

    def heap_bytes(self) -> int:
        return self.hashes.buffer_info()[1] * 8 + self.keys.buffer_info()[1] * 8 + len(self.recent) * 64


class GoneIds:
    """The batches a partition let go of (one instance for expired, one for overflowed).

    ``key in gone`` takes a batch key ``(run_id, batch_id)``; ``add`` takes the hashes
    one changelog key holds, when they went and that key's number; ``forget`` returns
    the numbers of the keys whose ids the horizon has passed (to be tombstoned).
    """

    def __init__(self, horizon_ms: int) -> None:
        if horizon_ms <= 0:
            raise ValueError(f"the retention horizon must be positive (got {horizon_ms} ms)")
        self.horizon_ms = horizon_ms
        self.span_ms = max(1, horizon_ms // GENERATIONS_PER_HORIZON)
        #: span index -> generation (insertion order is not relied on)
        self._generations: dict[int, _Generation] = {}
        #: the span whose generation takes new ids in its set (others are frozen)
        self._open: int | None = None

    # -- lookup ------------------------------------------------------------------
    def __contains__(self, key: BatchKey) -> bool:
        return self.has_hash(batch_hash(key))

    def has_hash(self, h: int) -> bool:
        return any(h in generation for generation in self._generations.values())

    def __len__(self) -> int:
        """Ids remembered (an id written twice, e.g. by a migration, counts twice)."""
        return sum(len(g) for g in self._generations.values())

    def hashes(self) -> Iterator[int]:
        for generation in self._generations.values():
            yield from generation.hashes
            yield from generation.recent

    def heap_bytes(self) -> int:
        """Bytes held by the arrays and sets (what the memory benchmark reports)."""
        return sum(g.heap_bytes() for g in self._generations.values())

    # -- change ------------------------------------------------------------------
    def add(self, hashes: Iterable[int], at_ms: int, key_number: int) -> None:
        """Remember ``hashes``, gone at ``at_ms``, held by changelog key ``key_number``."""
        span = at_ms // self.span_ms
        generation = self._generations.get(span)
        if generation is None:
            generation = self._generations[span] = _Generation()
        generation.keys.append(key_number)
        generation.recent.update(hashes)
        self._settle(span, generation)

    def _settle(self, span: int, generation: _Generation) -> None:
        """Keep one generation open, the newest: a newer span opens (the one open before
        is frozen, no id joins it again); an older one is frozen at once."""
        if self._open is None or span > self._open:
            if self._open is not None:  # always held: ``forget`` drops the open span's generation with it
                self._generations[self._open].freeze()
            self._open = span
        elif span < self._open:
            generation.freeze()  # an older span (a restore, a clock behind): kept sorted at once

    def forget(self, now_ms: int) -> list[int]:
        """Drop the generations the horizon has passed over (every id in them went at
        least ``horizon`` ago); returns the numbers of their changelog keys."""
        span_ms, horizon_ms = self.span_ms, self.horizon_ms
        gone = [span for span in self._generations if (span + 1) * span_ms + horizon_ms <= now_ms]
        keys: list[int] = []
        for span in gone:
            keys.extend(self._generations.pop(span).keys)
            if span == self._open:
                self._open = None
        return keys

    def past_horizon(self, at_ms: int, now_ms: int) -> bool:
        """Whether ids that went at ``at_ms`` are forgotten at ``now_ms`` (a restore
        tombstones their key instead of loading it)."""
        return (at_ms // self.span_ms + 1) * self.span_ms + self.horizon_ms <= now_ms
