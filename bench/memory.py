"""Memory of the dedup state per open generation, against a plain dict of the same keys.

    python bench/memory.py [--generations 1000000] [--smoke]

One huge batch (every generation open at once), fed through the worker's own
path (journaled BatchState.add_many). Baseline, same run: a plain dict mapping
the same (session_id, generation_id) keys to None. Reports Python-allocated
bytes (tracemalloc) and resident memory, and what is left after the batch is
dropped. Goal: <= 1.5x the plain dict, and released after close.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report

from specmeter.schemas import GenerationRecord
from specmeter.streams import BatchState


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def records(n: int) -> list[GenerationRecord]:
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
            )
        )
    return out


def measure(build) -> tuple[int, int, object]:
    gc.collect()
    tracemalloc.start()
    rss0 = rss_bytes()
    obj = build()
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return traced, rss_bytes() - rss0, obj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    n = 20_000 if args.smoke else args.generations
    recs = records(n)

    def plain() -> dict:
        return {(r.session_id, r.generation_id): None for r in recs}

    def state() -> BatchState:
        s = BatchState("huge")
        s.start_journal()
        for i in range(0, len(recs), 500):
            s.add_many(recs[i : i + 500])
            s.take_delta(first_offset=i, last_offset=i, last_input_ms=0)
        return s

    base_traced, base_rss, base = measure(plain)
    del base
    ours_traced, ours_rss, ours = measure(state)
    assert ours.generation_count == n
    rss_held = rss_bytes()
    del ours
    gc.collect()
    released = rss_held - rss_bytes()
    report(
        f"dedup state memory ({n:,} open generations, one batch)",
        [
            ("plain dict of the keys", f"{base_traced / n:.0f} B/generation allocated, {base_rss / n:.0f} B resident"),
            ("specmeter dedup state", f"{ours_traced / n:.0f} B/generation allocated, {ours_rss / n:.0f} B resident"),
            ("ratio (allocated)", f"{ours_traced / base_traced:.2f}x   (goal <= 1.5x)"),
            ("released after drop", f"{released / max(ours_rss, 1):.0%} of its resident memory"),
        ],
    )


if __name__ == "__main__":
    main()
