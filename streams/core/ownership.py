"""Who may write a changelog partition, and which of its records count: pure, no I/O.

A stage's state of one input partition lives in one changelog partition, written by
whichever worker owns the input partition. Ownership moves (rebalances, crashes), and a
worker that lost a partition may still write it for a while: one frozen past its session
(a stalled VM, a SIGSTOP) wakes up with writes in flight. Kafka's group generations do
not reach a plain producer's writes, so the changelog orders them itself:

* **Takeover.** A worker that takes a partition over first appends a *takeover record*
  (key ``P e <token>``) and waits for its acknowledgement. Its offset is the new owner's
  **epoch**. Only then does it read the changelog, up to and including that record.
* **Tags.** Every key the owner writes afterwards carries its epoch in its first part
  (``P@<epoch>``, see ``owner_key_part``), so no two owners ever write the same key:
  a late write can never replace, under compaction, a value another owner wrote.
* **Validity.** A record counts when its tag is the epoch of the latest takeover before
  it in the log (keys without a tag, written before takeovers existed, count until the
  first one). A stale owner's late writes land after the new owner's takeover: they
  never count, whatever they say, and the next restore deletes them.
* **Supersession.** Keys of one logical state (a batch's status, the checkpoint) may
  exist under several tags; the valid one with the highest offset holds the state, the
  others are deleted by the next restore.

``ChangelogView`` applies these rules to one partition's records read in offset order,
exactly as compaction keeps them (the latest value per key, tombstones deleting it).
What the writer checks so that a stale owner's writes never release an output is in
``delivery.output`` (the writes of a partition are acknowledged at consecutive offsets, or the
offsets skipped are read for a newer takeover).
"""

from __future__ import annotations

import bisect
import uuid
from dataclasses import dataclass, field

import msgspec

__all__ = [
    "Takeover",
    "ChangelogView",
    "ValidState",
    "owner_key_part",
    "split_key",
    "takeover_key",
    "takeover_token",
    "is_takeover",
    "takeover_of",
    "encode_takeover",
]

_SEP = b"\x1f"
_TAG = b"@"
#: the key kind of a takeover record: ``P e <token>`` (never tagged)
TAKEOVER_KIND = b"e"


class Takeover(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """A worker's takeover of a changelog partition (its offset is the owner's epoch)."""

    token: str
    #: who took it over and when, for operators reading the changelog
    owner: str = ""
    at_ms: int = 0


_takeover_decoder = msgspec.msgpack.Decoder(Takeover)
_encoder = msgspec.msgpack.Encoder()


def takeover_token() -> str:
    """A token no other takeover has (it names the record's key)."""
    return uuid.uuid4().hex


def takeover_key(partition: int, token: str) -> bytes:
    return f"{partition}\x1fe\x1f{token}".encode()


def encode_takeover(takeover: Takeover) -> bytes:
    return _encoder.encode(takeover)


def owner_key_part(partition: int, epoch: int | None) -> str:
    """The first part of every key an owner writes: the partition, tagged with the owner's
    epoch (None: untagged, as written before takeovers existed, and offline)."""
    return str(partition) if epoch is None else f"{partition}@{epoch}"


def split_key(key: bytes) -> tuple[bytes, int | None]:
    """A key's logical form (its tag removed) and its tag (None: untagged)."""
    head, sep, rest = key.partition(_SEP)
    partition, tagged, epoch = head.partition(_TAG)
    if not tagged:
        return key, None
    try:
        return partition + sep + rest, int(epoch)
    except ValueError:  # not ours to read: left as it is
        return key, None


def is_takeover(key: bytes) -> bool:
    _, sep, rest = key.partition(_SEP)
    return bool(sep) and rest[:1] == TAKEOVER_KIND and rest[1:2] == _SEP


def takeover_of(value: bytes) -> Takeover | None:
    """A takeover record's value (None when it is not one this worker can read)."""
    try:
        return _takeover_decoder.decode(value)
    except msgspec.MsgspecError:
        return None


@dataclass(frozen=True, slots=True)
class ValidState:
    """What one changelog partition holds that counts, and what to delete."""

    #: (physical key, value) of every valid record that holds its logical key's state,
    #: in offset order
    entries: list[tuple[bytes, bytes]]
    #: physical keys whose records do not count (a stale owner's late writes) or are
    #: superseded by a valid record of the same logical key, and takeovers no longer needed
    deletions: list[bytes]
    #: the epoch of the latest takeover read (None: none yet)
    epoch: int | None


@dataclass
class ChangelogView:
    """One changelog partition's records, fed in offset order (``add``), and what of them
    counts (``result``): see the module docstring for the rules."""

    #: physical key -> (offset, value) of its latest record (what compaction keeps)
    _latest: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    #: takeover records: physical key -> offset
    _takeovers: dict[bytes, int] = field(default_factory=dict)

    def add(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        if value is None:
            self._latest.pop(key, None)
            self._takeovers.pop(key, None)
        elif is_takeover(key):
            self._takeovers[key] = offset
        else:
            self._latest[key] = (offset, value)

    def result(self) -> ValidState:
        """The valid state now (the view can take more records afterwards)."""
        epochs = sorted(self._takeovers.values())
        latest_epoch = epochs[-1] if epochs else None
        valid, deletions = self._valid(epochs)
        deletions += self._stale_takeovers(valid, latest_epoch)
        entries = [(physical, value) for _, physical, value in sorted(valid.values())]
        return ValidState(entries=entries, deletions=sorted(deletions), epoch=latest_epoch)

    def _valid(self, epochs: list[int]) -> tuple[dict[bytes, tuple[int, bytes, bytes]], list[bytes]]:
        """Each logical key's latest record its epoch's owner wrote (logical -> (offset,
        physical, value)), and the physical keys of the records that lost to it."""
        valid: dict[bytes, tuple[int, bytes, bytes]] = {}
        deletions: list[bytes] = []
        for physical, (offset, value) in self._latest.items():
            logical, tag = split_key(physical)
            if tag != _epoch_at(epochs, offset):
                deletions.append(physical)  # a stale owner's late write
                continue
            held = valid.get(logical)
            if held is not None:
                if held[0] > offset:
                    deletions.append(physical)
                    continue
                deletions.append(held[1])
            valid[logical] = (offset, physical, value)
        return valid, deletions

    def _stale_takeovers(self, valid: dict[bytes, tuple[int, bytes, bytes]], latest_epoch: int | None) -> list[bytes]:
        """The takeover records no valid record needs any more."""
        tags = [tag for _, physical, _ in valid.values() if (tag := split_key(physical)[1]) is not None]
        # a takeover older than every tag still held judges no record any more: records
        # written later by its owner land after a newer takeover, and are judged by that one
        needed_from = min([*tags, latest_epoch]) if latest_epoch is not None else None
        return [key for key, offset in self._takeovers.items() if needed_from is not None and offset < needed_from]


def _epoch_at(epochs: list[int], offset: int) -> int | None:
    """The epoch of the latest takeover before ``offset`` (epochs sorted), None if none."""
    i = bisect.bisect_left(epochs, offset)
    return epochs[i - 1] if i else None
