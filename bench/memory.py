"""Memory of the dedup state per open generation, against a plain dict of the same keys.

    python bench/memory.py [--generations 1000000] [--smoke] [--json]

One huge batch (every generation open at once), fed through the worker's own
path: raw records messages (500 records each) decoded by the core and applied to a
journaled state, a delta taken after each. Baseline, same run: a plain dict
mapping the same (session_id, generation_id) keys, as a decoder hands them over
(their strings included), to None. Measured per generation, each in a fresh
process: Python-allocated bytes (tracemalloc) for the dict and the Python core;
for the native core its own heap accounting (the capacity of every table and
arena) and the resident memory it adds. Two record shapes: counters only, and
with a 4-bin histogram (SGLang 0.5.9+ sends one; EAGLE3 has 4 bins). Also: how
much of its resident memory the native state gives back when the batch is dropped.

Targets (issue #14): <= 1.0x the plain dict (goal 0.5x).

Expired batches (issue 21): what a partition remembers of each batch that expired,
for the retention horizon (``core.expired.GoneIds``: a 64-bit hash in sorted arrays, and
the number of the changelog key that holds it), at 1M of them spread over a week of
expiry ticks, in a fresh process: Python-allocated bytes and resident memory per id,
for one id per changelog key (a tick expires one batch: the most per id) and 100.
Baseline, same run: the same batches as a Python set of (run_id, batch_id) tuples,
what the worker held before (10,000 of them at most, in an ordered dict). Also: the
time of a lookup (a new batch's first record) and of a restore of every id.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, report

from specmeter.schemas import GenerationRecord, RecordBatch, encode_records_message

PER_MESSAGE = 500


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def records(n: int, histograms: bool) -> list[GenerationRecord]:
    out = []
    for i in range(n):
        session = f"step-000123/sess-{i // 40:07d}"
        out.append(
            GenerationRecord(
                batch_id="huge",
                session_id=session,
                generation_id=f"{session}/gen-{i % 40}",
                sample_id=f"traj-{i % 4}",
                accepted=300 + i % 97,
                proposed=560 + i % 13,
                verify=140 + i % 7,
                completion=440 + i % 101,
                producer_id="w0",
                accept_histogram=[i % 5, 30 + i % 7, 20, 90 + i % 11] if histograms else None,
            )
        )
    return out


def messages(n: int, histograms: bool) -> list[bytes]:
    recs = records(n, histograms)
    return [
        encode_records_message(RecordBatch(records=recs[i : i + PER_MESSAGE], producer_id="w0"))
        for i in range(0, n, PER_MESSAGE)
    ]


def measure(kind: str, n: int, histograms: bool) -> dict:
    """One measurement, in this (fresh) process."""
    from specmeter.streams.core import cores

    if kind == "dict":
        pairs = [(r.session_id.encode(), r.generation_id.encode()) for r in records(n, histograms)]
    else:
        msgs = messages(n, histograms)
        core = cores.NATIVE if kind == "native" else cores.PYTHON
        if core is None:
            return {"skipped": "the native core is not built"}
    gc.collect()
    tracemalloc.start()
    rss0 = rss_bytes()
    if kind == "dict":
        held = {(s.decode(), g.decode()): None for s, g in pairs}  # fresh strings, as decoded
        count = len(held)
    else:
        held = core.BatchState("huge")
        held.start_journal()
        for offset, value in enumerate(msgs):
            decoded = core.decode(value)
            for group, (_, size) in enumerate(decoded.groups):
                held.add_decoded(decoded, group, 0, size, producer_id=decoded.producer_id)
            held.take_delta_encoded(first_offset=offset, last_offset=offset, last_input_ms=0)
            del decoded
        count = held.generation_count
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_held = rss_bytes()
    out = {"generations": count, "traced": traced, "rss": rss_held - rss0}
    if kind == "native":
        out["heap"] = held.heap_bytes()
    del held
    gc.collect()
    out["released"] = rss_held - rss_bytes()
    return out


WEEK_MS = 7 * 24 * 3600 * 1000


def measure_expired(kind: str, n: int, per_key: int) -> dict:
    """Memory of ``n`` remembered expired batches, in this (fresh) process."""
    from specmeter.streams.core.expired import GoneIds
    from specmeter.streams.core.layout import GoneBatches, batch_hash, encode_state, expired_key, pack_hashes

    keys = [(None, f"step-{i:09d}") for i in range(n)]
    ticks = (n + per_key - 1) // per_key
    at = [t * WEEK_MS // ticks for t in range(ticks)]  # expiry ticks spread over a week
    entries = []  # the changelog the ticks write (built first: not counted)
    if kind == "expired":
        for t in range(ticks):
            ids = pack_hashes(batch_hash(k) for k in keys[t * per_key : (t + 1) * per_key])
            entries.append((expired_key(0, at[t]), encode_state(GoneBatches(at_ms=at[t], hashes=ids))))
    gc.collect()
    tracemalloc.start()
    rss0 = rss_bytes()
    out: dict = {"ids": n}
    if kind == "expired":
        held = GoneIds(WEEK_MS)
        for t in range(ticks):
            held.add([batch_hash(k) for k in keys[t * per_key : (t + 1) * per_key]], at[t], at[t])
        out["heap"] = held.heap_bytes()
    else:  # what the worker held before: the batch keys themselves, as Python objects
        held = {(run_id, str(batch_id)): None for run_id, batch_id in keys}  # fresh strings, as decoded
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out.update(traced=traced, rss=rss_bytes() - rss0, held=len(held))
    if isinstance(held, GoneIds):
        probes = [batch_hash((None, f"new-{i}")) for i in range(2_000)]
        t0 = time.perf_counter()
        found = sum(held.has_hash(h) for h in probes)
        out["lookup_us"] = (time.perf_counter() - t0) * 1e6 / len(probes)
        out["false_late"] = found
        out["restore_s"] = _restore_s(entries, n)
    return out


def _restore_s(entries: list[tuple[bytes, bytes]], n: int) -> float:
    """Seconds for a processor's restore to load every remembered id from the keys the
    expiry ticks wrote."""
    from specmeter.streams.core.stage1 import PartitionProcessor

    p = PartitionProcessor(0, source_topic="bench", batch_timeout_ms=60_000, grace_ms=60_000)
    t0 = time.perf_counter()
    p.restore(entries, WEEK_MS)
    seconds = time.perf_counter() - t0
    if len(p.expired) != n:
        raise SystemExit(f"the restore knows {len(p.expired)} expired ids, {n} expected")
    return seconds


def run_expired(kind: str, n: int, per_key: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", kind, "--expired-ids", str(n), "--per-key", str(per_key)]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def run(kind: str, n: int, histograms: bool) -> dict:
    cmd = [sys.executable, __file__, "--measure", kind, "--generations", str(n)] + (["--histograms"] * histograms)
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    if "skipped" not in result and result["generations"] != n:
        raise SystemExit(f"{kind}: {result['generations']} generations held, {n} expected")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    parser.add_argument("--expired-ids", type=int, default=1_000_000, help="expired batches remembered")
    parser.add_argument(
        "--measure", choices=["dict", "python", "native", "expired", "expired-baseline"], help=argparse.SUPPRESS
    )
    parser.add_argument("--histograms", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--per-key", type=int, default=1, help=argparse.SUPPRESS)
    add_json_flag(parser)
    args = parser.parse_args()
    n = 20_000 if args.smoke else args.generations
    expired_ids = 20_000 if args.smoke else args.expired_ids
    if args.measure in ("expired", "expired-baseline"):
        print(json.dumps(measure_expired(args.measure, expired_ids, args.per_key)))
        return
    if args.measure:
        print(json.dumps(measure(args.measure, n, args.histograms)))
        return
    rows: list[tuple[str, str]] = []
    data: dict = {"generations": n}
    for histograms in (False, True):
        shape = "with_histogram" if histograms else "counters_only"
        base, py, native = (run(kind, n, histograms) for kind in ("dict", "python", "native"))
        per = {"plain_dict": base["traced"] / n, "python": py["traced"] / n}
        label = "4-bin histogram" if histograms else "counters only"
        rows += [
            (f"{label}: plain dict of the keys", f"{per['plain_dict']:.0f} B/generation allocated"),
            (
                f"{label}: python core",
                f"{per['python']:.0f} B/generation allocated, ratio {per['python'] / per['plain_dict']:.2f}x",
            ),
        ]
        if "skipped" not in native:
            per.update(native_heap=native["heap"] / n, native_rss=native["rss"] / n)
            rows += [
                (
                    f"{label}: native core",
                    f"{per['native_heap']:.0f} B/generation heap, "
                    f"{per['native_rss']:.0f} B resident, ratio "
                    f"{per['native_heap'] / per['plain_dict']:.2f}x heap, "
                    f"{per['native_rss'] / per['plain_dict']:.2f}x resident",
                ),
                (
                    f"{label}: native, released after drop",
                    f"{native['released'] / max(native['rss'], 1):.0%} of its resident memory",
                ),
            ]
            per.update(
                native_ratio=per["native_heap"] / per["plain_dict"],
                native_rss_ratio=per["native_rss"] / per["plain_dict"],
                native_released=native["released"] / max(native["rss"], 1),
            )
        per["python_ratio"] = per["python"] / per["plain_dict"]
        data[shape] = {
            f"{k}_bytes_per_generation" if not k.endswith(("ratio", "released")) else k: v for k, v in per.items()
        }
    rows.append(("ratio", "native heap / plain dict: floor 1.0x, goal 0.5x"))
    expired_rows, data["expired"] = expired_figures(expired_ids)
    rows += expired_rows
    report(
        f"dedup state memory ({n:,} open generations, one batch); {expired_ids:,} expired batches remembered",
        rows,
        data,
        as_json=args.json,
    )


def expired_figures(n: int) -> tuple[list[tuple[str, str]], dict]:
    """Rows and figures of the expired-batch memory (issue 21)."""
    base = run_expired("expired-baseline", n, 1)
    rows = [
        (
            "expired: Python set of (run_id, batch_id) (baseline)",
            f"{base['traced'] / n:.1f} B/id allocated, {base['rss'] / n:.1f} B/id resident",
        )
    ]
    data: dict = {"ids": n, "baseline_bytes_per_id": base["traced"] / n, "baseline_rss_bytes_per_id": base["rss"] / n}
    for per_key in (1, 100):
        got = run_expired("expired", n, per_key)
        if got["held"] != n:
            raise SystemExit(f"{got['held']} expired ids held, {n} expected")
        rows += [
            (
                f"expired: 64-bit hashes, {per_key} id(s) per changelog key",
                f"{got['traced'] / n:.1f} B/id allocated, {got['rss'] / n:.1f} B/id resident "
                f"({got['rss'] / 2**20:.1f} MiB at {n:,}), ratio {got['traced'] / base['traced']:.2f}x the baseline",
            ),
            (
                f"expired: lookup, restore ({per_key} per key)",
                f"{got['lookup_us']:.1f} µs per new batch, {got['restore_s']:.2f} s to restore all "
                f"({got['false_late']} false 'late' in 2,000 new batches)",
            ),
        ]
        data[f"per_key_{per_key}"] = {
            "bytes_per_id": got["traced"] / n,
            "rss_bytes_per_id": got["rss"] / n,
            "rss_bytes": got["rss"],
            "ratio": got["traced"] / base["traced"],
            "lookup_us": got["lookup_us"],
            "restore_s": got["restore_s"],
        }
    return rows, data


if __name__ == "__main__":
    main()
