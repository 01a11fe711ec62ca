"""Running a worker process: topics first, then the Faust worker until stopped."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

from ._logging import bound_log_lines
from ._topics import ensure_topics
from .app import build_app
from .settings import WorkerSettings

__all__ = ["run_worker"]


def run_worker(settings: WorkerSettings) -> None:
    """Create missing topics, then run the worker until SIGINT/SIGTERM."""
    import faust

    bound_log_lines()
    logging.basicConfig(level=settings.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    asyncio.run(ensure_topics(settings))
    app, shell = build_app(settings)
    _tune_gc()
    gc.callbacks.append(_gc_timer(shell.counters))
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    finally:
        if shell.fatal is not None:  # a produce failed for good: say so and exit non-zero
            print(f"specmeter worker: {shell.fatal}", file=sys.stderr)
            raise SystemExit(1)


def _gc_timer(counters):
    """A gc callback that counts each collection's pause (on /specmeter/stats): a full
    collection walks everything the worker holds and stops the event loop meanwhile."""
    import time

    started = [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counters.observe_gc(info["generation"], time.perf_counter() - started[0])

    return timer


def _tune_gc() -> None:
    """Fewer, cheaper cycle collections for a process that allocates a lot and keeps little.

    Every chunk decodes up to ~100k records (GC-tracked structs) that live only
    until the chunk is applied; with the default gen-0 threshold (700) each chunk
    triggers ~140 young collections, each walking the chunk's live records, and
    the older generations walk Faust's and aiokafka's import-time objects. Freezing
    those and raising the threshold cut stage 1's time by about a fifth; cycles are
    still collected (the worker creates few: futures, tracebacks).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
