"""Stage 1 alone, no Kafka: microseconds per record, native core against Python.

    python bench/stage1_core.py [--records 1000000] [--no-tasks] [--smoke] [--json] [--kafka]

The throughput bench's fleet (20 % redeliveries, shared ancestors, 1 % conflicts,
unknown counters; each session of one of three tasks, a few histograms contradicting
their counters; ``--no-tasks``: the fleet before revision 4, no record naming a task
or a draft lag),
packed as the producer packs it (one RecordBatch of up to 500
records per producer run, markers between), is fed to one PartitionProcessor in
chunks of about 10k records, as the worker feeds it: decoding, dedup, the journal
and its deltas, checkpoints, closing by markers and partials all included. Also
timed: the bare apply (decode + add_decoded into a batch state, no journal). Both
cores must produce the same partials (checked, by content digest). Times are this
process's CPU time (``time.process_time``; the read from Kafka aside): on a machine
shared with other work, wall time would count the waits for a core.

State bytes: what the processor writes to its changelog, keys and values (tombstones
included), per record. Restore: the live changelog those writes leave (latest value
per key) applied to a fresh processor, as a worker taking the partition over does
(decode, apply, partials of the closed batches rebuilt); with ``--kafka``, also read
back from a topic of the broker (KAFKA_BOOTSTRAP_SERVERS or deploy/kafka/broker).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, report
from _pipeline import fleet

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, encode_records_message
from specmeter.streams.core import cores
from specmeter.streams.core.stage1 import PartitionProcessor, _digest
from specmeter.streams.fleet.synthetic import synthetic_fleet

PER_MESSAGE = 500
CHUNK_RECORDS = 10_000


def messages(target: int, tasks: bool = True) -> tuple[list[tuple[int, bytes]], list[int], int]:
    """The fleet as records-topic messages: (offset, bytes), records per message, records."""
    out: list[tuple[int, bytes]] = []
    sizes: list[int] = []
    pending: dict[str, list[GenerationRecord]] = {}

    def flush(producer: str) -> None:
        records = pending.pop(producer, [])
        if records:
            out.append((len(out), encode_records_message(RecordBatch(records=records, producer_id=producer))))
            sizes.append(len(records))

    for event in synthetic_fleet(fleet(target, tasks=tasks)):
        if isinstance(event.payload, GenerationRecord):
            pending.setdefault(event.producer_id, []).append(event.payload)
            if len(pending[event.producer_id]) >= PER_MESSAGE:
                flush(event.producer_id)
        elif isinstance(event.payload, BatchMarker):
            flush(event.producer_id)
            out.append((len(out), encode_records_message(event.payload)))
            sizes.append(0)
    for producer in list(pending):
        flush(producer)
    return out, sizes, sum(sizes)


def chunks(msgs: list[tuple[int, bytes]], sizes: list[int]) -> list[list[tuple[int, bytes]]]:
    out, chunk, held = [], [], 0
    for message, size in zip(msgs, sizes, strict=True):
        chunk.append(message)
        held += size
        if held >= CHUNK_RECORDS:
            out.append(chunk)
            chunk, held = [], 0
    if chunk:
        out.append(chunk)
    return out


def _processor(core) -> PartitionProcessor:
    return PartitionProcessor(0, source_topic="bench", batch_timeout_ms=10**12, grace_ms=10**12, core=core)


def run_processor(core, work: list[list[tuple[int, bytes]]]) -> tuple[float, list, list[tuple[bytes, bytes | None]]]:
    """Seconds to process every chunk, the partials emitted and the changelog written."""
    p = _processor(core)
    partials, changelog = [], []
    gc.collect()
    t0 = time.process_time()
    for i, chunk in enumerate(work):
        effects = p.process(chunk, now_ms=i)
        partials += effects.partials
        changelog += effects.changelog
    return time.process_time() - t0, partials, changelog


def changelog_bytes(changelog: list[tuple[bytes, bytes | None]]) -> int:
    """Bytes written to the changelog: every key and value (a tombstone: its key)."""
    return sum(len(key) + len(value or b"") for key, value in changelog)


def live(changelog: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes]]:
    """What a compacted changelog holds after these writes: the latest value per key."""
    out: dict[bytes, bytes] = {}
    for key, value in changelog:
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return list(out.items())


def run_restore(core, entries: list[tuple[bytes, bytes]], now_ms: int) -> float:
    """Seconds to restore a fresh processor from the live changelog."""
    p = _processor(core)
    gc.collect()
    t0 = time.process_time()
    p.restore(entries, now_ms)
    return time.process_time() - t0


def kafka_read_s(entries: list[tuple[bytes, bytes]], repeat: int) -> float:
    """Seconds to read the live changelog back from a broker topic, best of ``repeat``
    (one fresh consumer per read, to the end offset, as a restore reads it)."""
    from _common import broker_address, fresh_topic
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    bootstrap = broker_address()
    topic = fresh_topic(bootstrap, "changelog", 1)

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 * 1024 * 1024, linger_ms=20)
        await producer.start()
        try:
            for key, value in entries:
                await producer.send(topic, value, key=key, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    async def read() -> float:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_wait_ms=20,
        )
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            t0 = time.perf_counter()
            held: dict[bytes, bytes] = {}
            position = 0
            while position < end:
                for messages in (await consumer.getmany(tp, timeout_ms=500)).values():
                    for message in messages:
                        held[message.key] = message.value
                        position = message.offset + 1
            return time.perf_counter() - t0
        finally:
            await consumer.stop()

    asyncio.run(write())
    return min(asyncio.run(read()) for _ in range(repeat))


def run_apply(core, msgs: list[tuple[int, bytes]]) -> float:
    """Seconds to decode and apply every message to per-batch states (no journal, no markers)."""
    states: dict = {}
    gc.collect()
    t0 = time.process_time()
    for _, value in msgs:
        decoded = core.decode(value)
        for group, (key, count) in enumerate(decoded.groups):
            state = states.get(key)
            if state is None:
                state = states[key] = core.BatchState(key[1], key[0])
            state.add_decoded(decoded, group, 0, count, producer_id=decoded.producer_id)
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per core; the best counts")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    parser.add_argument("--kafka", action="store_true", help="also time reading the changelog back from a broker")
    parser.add_argument("--no-tasks", action="store_true", help="records without a task (the fleet before revision 4)")
    add_json_flag(parser)
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    print(f"building ≈{target:,} records{' without tasks' if args.no_tasks else ''} ...", file=sys.stderr)
    msgs, sizes, records = messages(target, tasks=not args.no_tasks)
    work = chunks(msgs, sizes)
    built = [cores.PYTHON] + ([cores.NATIVE] if cores.NATIVE is not None else [])
    results: dict[str, dict[str, float]] = {}
    digests = {}
    entries: dict[str, list[tuple[bytes, bytes]]] = {}
    repeat = 1 if args.smoke else args.repeat
    for core in built:
        best_process, best_apply, best_restore = float("inf"), float("inf"), float("inf")
        for _ in range(repeat):
            seconds, partials, changelog = run_processor(core, work)
            best_process = min(best_process, seconds)
            best_apply = min(best_apply, run_apply(core, msgs))
        entries[core.name] = live(changelog)
        for _ in range(repeat):
            best_restore = min(best_restore, run_restore(core, entries[core.name], len(work)))
        digests[core.name] = sorted((p.run_id or "", p.batch_id, _digest(p)) for p in partials)
        results[core.name] = {
            "process": best_process * 1e6 / records,
            "apply": best_apply * 1e6 / records,
            "changelog_bytes": changelog_bytes(changelog) / records,
            "live_bytes": changelog_bytes(entries[core.name]) / records,
            "restore_s": best_restore,
        }
        print(f"{core.name}: {results[core.name]}", file=sys.stderr)
    if "native" in digests and digests["native"] != digests["python"]:
        raise SystemExit("the native and the Python core emitted different partials: a bug, please report it")
    py = results["python"]
    native = results.get("native")
    input_bytes = sum(len(value) for _, value in msgs) / records
    rows = [
        ("records, messages, chunks", f"{records:,}, {len(msgs):,}, {len(work):,}"),
        ("records name a task", "no" if args.no_tasks else "yes (one of three per session)"),
        ("records-topic messages (uncompressed)", f"{input_bytes:.1f} B per record"),
        ("python core: processor / apply", f"{py['process']:.2f} / {py['apply']:.2f} µs per record"),
        (
            "python core: changelog written / live",
            f"{py['changelog_bytes']:.1f} / {py['live_bytes']:.1f} B per record (target <= 21)",
        ),
        ("python core: restore (apply the live changelog)", f"{py['restore_s']:.3f} s"),
    ]
    data: dict = {
        "records": records,
        "tasks": not args.no_tasks,
        "messages": len(msgs),
        "input_bytes_per_record": input_bytes,
        "python_us_per_record": py["process"],
        "python_apply_us_per_record": py["apply"],
        "python_changelog_bytes_per_record": py["changelog_bytes"],
        "python_live_changelog_bytes_per_record": py["live_bytes"],
        "python_restore_s": py["restore_s"],
    }
    if native is not None:
        rows += [
            ("native core: processor / apply", f"{native['process']:.2f} / {native['apply']:.2f} µs per record"),
            (
                "native core: changelog written / live",
                f"{native['changelog_bytes']:.1f} / {native['live_bytes']:.1f} B per record (target <= 21)",
            ),
            ("native core: restore (apply the live changelog)", f"{native['restore_s']:.3f} s"),
            (
                "ratio python/native: processor / apply",
                f"{py['process'] / native['process']:.1f}x / {py['apply'] / native['apply']:.1f}x faster",
            ),
        ]
        data.update(
            native_us_per_record=native["process"],
            native_apply_us_per_record=native["apply"],
            native_changelog_bytes_per_record=native["changelog_bytes"],
            native_live_changelog_bytes_per_record=native["live_bytes"],
            native_restore_s=native["restore_s"],
            speedup=py["process"] / native["process"],
            apply_speedup=py["apply"] / native["apply"],
        )
    else:
        rows.append(("ratio", "native core not built: nothing to compare"))
    if args.kafka:
        print("reading the changelog back from the broker ...", file=sys.stderr)
        name = "native" if native is not None else "python"
        read_s = kafka_read_s(entries[name], repeat)
        rows.append((f"restore: read the live changelog from Kafka ({name})", f"{read_s:.3f} s"))
        data["kafka_read_s"] = read_s
    report(
        f"stage 1 without Kafka ({records:,} records, best of {repeat})",
        rows,
        data,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
