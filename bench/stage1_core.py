"""Stage 1 alone, no Kafka: microseconds per record, native core against Python.

    python bench/stage1_core.py [--records 1000000] [--smoke] [--json]

The throughput bench's fleet (20 % redeliveries, shared ancestors, 1 % conflicts,
unknown counters), packed as the producer packs it (one RecordBatch of up to 500
records per producer run, markers between), is fed to one PartitionProcessor in
chunks of about 10k records, as the worker feeds it: decoding, dedup, the journal
and its deltas, checkpoints, closing by markers and partials all included. Also
timed: the bare apply (decode + add_decoded into a batch state, no journal). Both
cores must produce the same partials (checked, by content digest).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, report
from _pipeline import fleet

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, encode_records_message
from specmeter.streams import _core
from specmeter.streams._stage1 import PartitionProcessor, _digest
from specmeter.streams.synthetic import synthetic_fleet

PER_MESSAGE = 500
CHUNK_RECORDS = 10_000


def messages(target: int) -> tuple[list[tuple[int, bytes]], list[int], int]:
    """The fleet as records-topic messages: (offset, bytes), records per message, records."""
    out: list[tuple[int, bytes]] = []
    sizes: list[int] = []
    pending: dict[str, list[GenerationRecord]] = {}

    def flush(producer: str) -> None:
        records = pending.pop(producer, [])
        if records:
            out.append((len(out), encode_records_message(RecordBatch(records=records, producer_id=producer))))
            sizes.append(len(records))

    for event in synthetic_fleet(fleet(target)):
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


def run_processor(core, work: list[list[tuple[int, bytes]]]) -> tuple[float, list]:
    """Seconds to process every chunk, and the partials emitted."""
    p = PartitionProcessor(0, source_topic="bench", batch_timeout_ms=10**12, grace_ms=10**12, core=core)
    partials = []
    gc.collect()
    t0 = time.perf_counter()
    for i, chunk in enumerate(work):
        partials += p.process(chunk, now_ms=i).partials
    return time.perf_counter() - t0, partials


def run_apply(core, msgs: list[tuple[int, bytes]]) -> float:
    """Seconds to decode and apply every message to per-batch states (no journal, no markers)."""
    states: dict = {}
    gc.collect()
    t0 = time.perf_counter()
    for _, value in msgs:
        decoded = core.decode(value)
        for group, (key, count) in enumerate(decoded.groups):
            state = states.get(key)
            if state is None:
                state = states[key] = core.BatchState(key[1], key[0])
            state.add_decoded(decoded, group, 0, count, producer_id=decoded.producer_id)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per core; the best counts")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    add_json_flag(parser)
    args = parser.parse_args()
    target = 5_000 if args.smoke else args.records
    print(f"building ≈{target:,} records ...", file=sys.stderr)
    msgs, sizes, records = messages(target)
    work = chunks(msgs, sizes)
    cores = [_core.PYTHON] + ([_core.NATIVE] if _core.NATIVE is not None else [])
    results: dict[str, dict[str, float]] = {}
    digests = {}
    for core in cores:
        best_process, best_apply = float("inf"), float("inf")
        for _ in range(1 if args.smoke else args.repeat):
            seconds, partials = run_processor(core, work)
            best_process = min(best_process, seconds)
            best_apply = min(best_apply, run_apply(core, msgs))
        digests[core.name] = sorted((p.run_id or "", p.batch_id, _digest(p)) for p in partials)
        results[core.name] = {"process": best_process * 1e6 / records, "apply": best_apply * 1e6 / records}
        print(f"{core.name}: {results[core.name]}", file=sys.stderr)
    if "native" in digests and digests["native"] != digests["python"]:
        raise SystemExit("the native and the Python core emitted different partials: a bug, please report it")
    py = results["python"]
    native = results.get("native")
    rows = [
        ("records, messages, chunks", f"{records:,}, {len(msgs):,}, {len(work):,}"),
        ("python core: processor / apply", f"{py['process']:.2f} / {py['apply']:.2f} µs per record"),
    ]
    data: dict = {
        "records": records,
        "messages": len(msgs),
        "python_us_per_record": py["process"],
        "python_apply_us_per_record": py["apply"],
    }
    if native is not None:
        rows += [
            ("native core: processor / apply", f"{native['process']:.2f} / {native['apply']:.2f} µs per record"),
            (
                "ratio python/native: processor / apply",
                f"{py['process'] / native['process']:.1f}x / {py['apply'] / native['apply']:.1f}x faster",
            ),
        ]
        data.update(
            native_us_per_record=native["process"],
            native_apply_us_per_record=native["apply"],
            speedup=py["process"] / native["process"],
            apply_speedup=py["apply"] / native["apply"],
        )
    else:
        rows.append(("ratio", "native core not built: nothing to compare"))
    report(
        f"stage 1 without Kafka ({records:,} records, best of {1 if args.smoke else args.repeat})",
        rows,
        data,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
