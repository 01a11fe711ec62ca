"""The input of a schedule with the worker's own stages: a seeded fleet's records and markers
as the producers' library puts them on the records topic, and what the published metrics
must then be. Apart from the scheduler, which only lands its messages one by one."""

from __future__ import annotations

import functools
from collections import deque
from typing import Any

import msgspec

from specmeter.schemas import BatchMarker, GenerationRecord, encode_records_message

from .deployment import PARTITIONS


class SimInput:
    """A seeded fleet's records and markers as the producers' library puts them on the
    records topic: a record keyed by its session (Kafka's default partitioner), a producer's
    batch closed by one marker per partition naming what it sent there. One of ``FLEETS``
    fleets, by the seed (drawing one costs more than a schedule)."""

    FLEETS = 64

    def __init__(self, seed: int) -> None:
        self.fleet = seed % self.FLEETS
        self.events, messages = _fleet(self.fleet)
        self.messages = deque(messages)

    def all_published(self, published: dict[tuple[str, int], Any]) -> bool:
        """Every batch of the fleet published, complete."""
        done = {batch for (batch, _), m in published.items() if m.complete}
        return {e.batch_id for e in self.events if e.kind == "marker"} <= done

    def check(self, published: Any, letters: list[Any]) -> None:
        """Exact (the offline core's metrics for the same records) and every record counted once."""
        from ..worker_harness import assert_conserved, assert_each_batch_matches, latest_by_batch, produced_records

        published = list(published)
        assert_each_batch_matches(
            latest_by_batch(published), self.events, partitions=PARTITIONS, expected=_expected(self.fleet)
        )
        assert_conserved(produced_records(self.events), published, letters)


@functools.lru_cache(maxsize=SimInput.FLEETS)
def _fleet(n: int) -> tuple[list[Any], list[tuple[int, bytes | None, bytes]]]:
    """Fleet ``n``: its events (every kind of trouble, small) and its messages in order."""
    from ..worker_harness import fleet_events

    events = fleet_events(n, batches=2, sessions=4, template_pool=16)
    sent: dict[tuple[str, str, int], int] = {}
    return events, [message for event in events for message in _messages(event, sent)]


@functools.lru_cache(maxsize=SimInput.FLEETS)
def _expected(n: int) -> dict[str, Any]:
    """What the offline core says for fleet ``n`` (once per fleet, not per schedule)."""
    from ..worker_harness import expected_metrics

    return expected_metrics(_fleet(n)[0])


def _messages(event: Any, sent: dict[tuple[str, str, int], int]) -> list[tuple[int, bytes | None, bytes]]:
    """An event's messages as the producers' library sends them (``sent``: what each
    producer sent per batch and partition, which its markers name)."""
    from specmeter.producers._publisher import partition_for_key

    payload = event.payload
    if isinstance(payload, BatchMarker):
        return [
            (p, payload.batch_id.encode(), _marker(payload, sent.pop((event.producer_id, payload.batch_id, p), 0)))
            for p in range(PARTITIONS)
        ]
    record = isinstance(payload, GenerationRecord)
    session = payload.session_id if record else payload.get("session_id")
    key = session.encode() if session else None
    partition = partition_for_key(key, PARTITIONS) if key else 0
    batch = payload.batch_id if record else payload.get("batch_id")
    if batch is not None:
        where = (event.producer_id, batch, partition)
        sent[where] = sent.get(where, 0) + 1
    value = encode_records_message(payload) if record else msgspec.msgpack.encode(payload)
    return [(partition, key, value)]


def _marker(marker: BatchMarker, records_sent: int) -> bytes:
    return encode_records_message(msgspec.structs.replace(marker, records_sent=records_sent))
