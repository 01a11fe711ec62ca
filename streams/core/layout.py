"""Where the workers' state lives: changelog topics, their keys, their durable structs.

Both stages keep their state in a compacted changelog topic of their own, one
changelog partition per input partition. This module is the one place that
says how: the topic names, every key format, and every struct written there.
Fields of a durable struct are only appended (a worker upgraded mid-run restores
what the old one wrote), and the default run keeps the key layout it had before
runs existed.

Stage 1 keys (per records partition P), ``\\x1f`` between parts:

* ``P d <batch_id> <last offset, 20 digits>``: a ``BatchDelta``
* ``P s <batch_id>``: the batch's ``BatchStatus``
* ``P o <batch_id>``: an overflowed batch's last ``PartialAggregate`` (until grace ends)
* ``P c``: the partition's ``Checkpoint`` (its offset; lists of batches only when an
  older worker wrote it)
* ``P x <expiry time ms, 20 digits>``: ``GoneBatches``, the batches an expiry tick let go
* ``P y <last offset, 20 digits>``: ``GoneBatches``, the batches a chunk closed early at
  the open-generation limit (stale, like a delta, past the checkpoint)

``x`` and ``y`` keys are written once, when their batches go, and tombstoned when the
retention horizon has passed (``expired``). A ``BatchDelta`` is written compressed:
``COMPRESSED`` (a byte no msgpack value starts with), then an LZ4 block with its
uncompressed size first (4 bytes, little-endian: LZ4's ``store_size`` layout); an
uncompressed one (older workers, or when compressing would not make it smaller) is
plain msgpack and reads the same.

A batch of a named run uses the upper-case kind (``D``, ``S``, ``O``) and
``<len(run_id)>:<run_id><batch_id>`` in place of the batch_id, so keys stay unique
whatever characters ids hold. Stage 2 (per partials partition P): ``P m <batch_id>``
(``P M ...`` for a named run) holds a ``MergeEntry`` (its bookkeeping), ``P p <batch_id>
<records partition, 10 digits>`` (``P P ...``) the latest ``PartialAggregate`` of one
records partition, and ``P k`` the ``Stage2Checkpoint``. A partial is written once when it
arrives, not again with each later one (a ``MergeEntry`` written before that split holds
its partials itself, and still restores); the ``MergeEntry`` with the first partial, each
publication and every partial after it (``BatchMerger.on_partial``).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable

import cramjam
import msgspec

from specmeter.schemas import BatchMarker, PartialAggregate

__all__ = [
    "REWRITTEN_KINDS",
    "BatchKey",
    "KeyPart",
    "BatchDelta",
    "BatchStatus",
    "Checkpoint",
    "MergeEntry",
    "Stage2Checkpoint",
    "changelog_topics",
    "state_key_prefix",
    "delta_key",
    "status_key",
    "overflow_key",
    "checkpoint_key",
    "expired_key",
    "overflowed_key",
    "key_number",
    "GoneBatches",
    "batch_hash",
    "pack_hashes",
    "unpack_hashes",
    "COMPRESSED",
    "compress_state",
    "encode_delta",
    "decode_gone",
    "merge_key",
    "merge_key_prefixes",
    "merge_partial_key",
    "merge_partial_prefixes",
    "stage2_checkpoint_key",
    "batch_from_durable",
    "encode_state",
    "decode_delta",
    "decode_status",
    "decode_checkpoint",
    "decode_merge_entry",
    "decode_stage2_checkpoint",
    "content_digest",
]

#: a batch's identity: (run_id, batch_id), run_id None for the default run
BatchKey = tuple[str | None, str]
#: the first part of a key: the input partition, tagged with its owner's epoch once a
#: worker took it over (``ownership.owner_key_part``: ``"3@1234"``; a bare 3 untagged)
KeyPart = int | str

_SEP = "\x1f"
#: the key kinds a stage writes again and again under one logical key (stage 1: the
#: checkpoint and the statuses; stage 2: the bookkeeping, the partials and the
#: checkpoint), each write under a version of its own (``ownership.RewrittenKeys``)
REWRITTEN_KINDS = (b"c", b"s", b"m", b"p", b"k")


def changelog_topics(app_id: str) -> tuple[str, str]:
    """Names of the stage-1 and stage-2 state changelogs of an app."""
    return f"{app_id}-stage1-state-changelog", f"{app_id}-stage2-state-changelog"


# -- keys -------------------------------------------------------------------------------
def _batch_part(kind: str, key: BatchKey) -> str:
    run_id, batch_id = key
    if run_id is None:
        return f"{kind}{_SEP}{batch_id}"
    return f"{kind.upper()}{_SEP}{len(run_id)}:{run_id}{batch_id}"


def state_key_prefix(partition: KeyPart) -> bytes:
    """Every stage-1 key of a records partition starts with this."""
    return f"{partition}{_SEP}".encode()


def delta_key(partition: KeyPart, key: BatchKey, last_offset: int) -> bytes:
    return f"{partition}{_SEP}{_batch_part('d', key)}{_SEP}{last_offset:020d}".encode()


def status_key(partition: KeyPart, key: BatchKey) -> bytes:
    return f"{partition}{_SEP}{_batch_part('s', key)}".encode()


def overflow_key(partition: KeyPart, key: BatchKey) -> bytes:
    return f"{partition}{_SEP}{_batch_part('o', key)}".encode()


def checkpoint_key(partition: KeyPart) -> bytes:
    return f"{partition}{_SEP}c".encode()


def expired_key(partition: KeyPart, at_ms: int) -> bytes:
    return f"{partition}{_SEP}x{_SEP}{at_ms:020d}".encode()


def overflowed_key(partition: KeyPart, last_offset: int) -> bytes:
    return f"{partition}{_SEP}y{_SEP}{last_offset:020d}".encode()


def key_number(key: bytes) -> int:
    """The number an ``x``, ``y`` or delta key ends with."""
    return int(key.rsplit(_SEP.encode(), 1)[1])


def merge_key(partition: KeyPart, key: BatchKey) -> bytes:
    return f"{partition}{_SEP}{_batch_part('m', key)}".encode()


def merge_key_prefixes(partition: KeyPart) -> tuple[bytes, bytes]:
    """The prefixes of a partials partition's merge entries (default run, named runs)."""
    return f"{partition}{_SEP}m{_SEP}".encode(), f"{partition}{_SEP}M{_SEP}".encode()


def merge_partial_key(partition: KeyPart, key: BatchKey, source_partition: int) -> bytes:
    """Where stage 2 keeps one records partition's latest partial of a batch."""
    return f"{partition}{_SEP}{_batch_part('p', key)}{_SEP}{source_partition:010d}".encode()


def merge_partial_prefixes(partition: KeyPart) -> tuple[bytes, bytes]:
    """The prefixes of a partials partition's kept partials (default run, named runs)."""
    return f"{partition}{_SEP}p{_SEP}".encode(), f"{partition}{_SEP}P{_SEP}".encode()


def stage2_checkpoint_key(partition: KeyPart) -> bytes:
    return f"{partition}{_SEP}k".encode()


def batch_from_durable(item: str | tuple[str, str] | list[str]) -> BatchKey:
    """A batch in the lists of a checkpoint an older worker wrote: its batch_id for the
    default run, ``[run_id, batch_id]`` for a named one."""
    return (None, item) if isinstance(item, str) else (item[0], item[1])


# -- stage 1 -------------------------------------------------------------------------------
class BatchDelta(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Changes of one batch on one partition from source offsets first..last (inclusive)."""

    batch_id: str
    first_offset: int
    last_offset: int
    last_input_ms: int
    #: wide entries: [session_id, generation_id, conflict, state_hash, accepted, proposed,
    #: verify, completion, histogram, weight_version, task] (deltas written before tasks
    #: existed lack the last item, those before weight versions the last two; a
    #: conflicting key's entry needs only its first three items)
    entries: list[tuple] = []
    occurrences: list[tuple[str, str | None, str]] = []
    record_count: int = 0
    invalid_record_count: int = 0
    late_record_count: int = 0
    conflicting_record_count: int = 0
    received: dict[str, int] = {}
    markers: list[BatchMarker] = []
    algorithms: list[str] = []
    counters_seen: bool = False
    #: generations first seen in this delta's chunk with one occurrence, no state
    #: hash or histogram and small counters, five flat items each: session,
    #: generation, sample, counters' low 64 bits and high bits (20/20/20/24 bits, each
    #: value + 1). The native core writes them; the Python core wrote them before
    #: it wrote only ``entries`` and reads them still (``state._packed_entries``)
    packed: list[str | int | None] = []
    run_id: str | None = None
    #: like ``packed`` for entries that name a weight_version: six items each, the
    #: sixth the version
    packed_versioned: list[str | int | None] = []


class BatchStatus(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Closing state of one batch on one partition (latest wins)."""

    batch_id: str
    closed: bool
    close_reason: str | None = None
    closed_at_ms: int = 0
    revision: int = -1
    partial_digest: bytes = b""
    run_id: str | None = None


class Checkpoint(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """The last source offset whose effects are durable.

    Workers before issue 21 also wrote the last 10,000 expired batches (``overflowed``:
    those closed early at the open-generation limit) here, with every checkpoint; they
    are read once and written again as ``GoneBatches``. A batch of the default run is
    its batch_id, one of a named run ``[run_id, batch_id]``."""

    offset: int
    expired: list[str | tuple[str, str]] = []
    overflowed: list[str | tuple[str, str]] = []


class GoneBatches(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """Batches a partition let go of at one moment (expired, or closed early at the
    open-generation limit): when, and their ``batch_hash`` es (``pack_hashes``)."""

    at_ms: int
    hashes: bytes


def batch_hash(key: BatchKey) -> int:
    """A batch's identity in 64 bits: what is remembered of an expired batch (durable:
    never change it). Two of a million remembered batches collide with a new batch with
    probability about 10^6 / 2^64 = 5.4e-14 (docs/state.md)."""
    digest = hashlib.blake2b(_encoder.encode(key), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def pack_hashes(hashes: Iterable[int]) -> bytes:
    """64-bit hashes as 8 little-endian bytes each."""
    packed = array("Q", hashes)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_hashes(data: bytes) -> array:
    packed = array("Q")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed


# -- stage 2 -------------------------------------------------------------------------------
class MergeEntry(msgspec.Struct, array_like=True, kw_only=True):
    """Stage-2 state of one batch. Durable without its ``partials``: each is written under
    a key of its own (``merge_partial_key``); entries written before hold them here."""

    batch_id: str
    partials: dict[int, PartialAggregate] = {}
    first_seen_ms: int = 0
    last_change_ms: int = 0
    published_revision: int = -1
    published_digest: bytes = b""
    run_id: str | None = None

    @property
    def key(self) -> BatchKey:
        return (self.run_id, self.batch_id)


class Stage2Checkpoint(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    """The last partials-topic offset whose effects are durable."""

    offset: int


_encoder = msgspec.msgpack.Encoder()
_gone_decoder = msgspec.msgpack.Decoder(GoneBatches)
_delta_decoder = msgspec.msgpack.Decoder(BatchDelta)
_status_decoder = msgspec.msgpack.Decoder(BatchStatus)
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)
_merge_entry_decoder = msgspec.msgpack.Decoder(MergeEntry)
_stage2_checkpoint_decoder = msgspec.msgpack.Decoder(Stage2Checkpoint)


#: the first byte of a compressed state value (msgpack never starts a value with it)
COMPRESSED = 0xC1
_COMPRESSED_PREFIX = bytes([COMPRESSED])


def encode_state(
    obj: BatchDelta | BatchStatus | Checkpoint | GoneBatches | MergeEntry | Stage2Checkpoint,
) -> bytes:
    return _encoder.encode(obj)


def compress_state(raw: bytes) -> bytes:
    """``COMPRESSED`` + an LZ4 block with its size first, or ``raw`` when that is not
    smaller (the native core writes the same: ``streams/core/native/src/compress.rs``)."""
    packed = _COMPRESSED_PREFIX + bytes(cramjam.lz4.compress_block(raw, store_size=True))
    return packed if len(packed) < len(raw) else raw


def encode_delta(delta: BatchDelta) -> bytes:
    """A delta as the changelog holds it (compressed: deltas are most of stage 1's state bytes)."""
    return compress_state(_encoder.encode(delta))


def decode_delta(data: bytes) -> BatchDelta:
    """Reads compressed and plain (older) deltas alike."""
    if data[:1] == _COMPRESSED_PREFIX:
        return _delta_decoder.decode(cramjam.lz4.decompress_block(memoryview(data)[1:]))
    return _delta_decoder.decode(data)


def decode_gone(data: bytes) -> GoneBatches:
    return _gone_decoder.decode(data)


def decode_status(data: bytes) -> BatchStatus:
    return _status_decoder.decode(data)


def decode_checkpoint(data: bytes) -> Checkpoint:
    return _checkpoint_decoder.decode(data)


def decode_merge_entry(data: bytes) -> MergeEntry:
    return _merge_entry_decoder.decode(data)


def decode_stage2_checkpoint(data: bytes) -> Stage2Checkpoint:
    """Also reads the plain decimal offset written before the struct existed."""
    if data.isdigit():
        return Stage2Checkpoint(offset=int(data))
    return _stage2_checkpoint_decoder.decode(data)


def content_digest(obj: msgspec.Struct) -> bytes:
    """Identity of an output's content (``BatchStatus.partial_digest``,
    ``MergeEntry.published_digest``): equal content, equal digest."""
    return hashlib.blake2b(msgspec.msgpack.encode(obj), digest_size=16).digest()
