"""Running a worker process: topics first, then the Faust worker until stopped."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

import msgspec

from ..report.log_lines import bound_log_lines
from ..report.outages import fold_outage_logs
from ..settings import WorkerSettings
from .app import build_app
from .topics import ensure_topics

__all__ = ["run_worker"]

log = logging.getLogger("specmeter.worker")


def run_worker(settings: WorkerSettings) -> None:
    """Create missing topics, then run the worker until SIGINT/SIGTERM."""
    import faust

    class Worker(faust.Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            """Faust's, mode's and aiokafka's INFO lines (≈300 at start-up, boxed tables of
            topics among them) only at --log-level debug: the worker says what matters."""
            super().on_setup_root_logger(logger, level)
            if level > logging.DEBUG:
                for name in ("faust", "mode", "aiokafka"):
                    logging.getLogger(name).setLevel(logging.WARNING)

    bound_log_lines()
    logging.basicConfig(level=settings.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    if settings.web_enabled and settings.web_port == 0:  # any free port: say which
        settings = msgspec.structs.replace(settings, web_port=_free_port(settings.web_host))
    cluster = asyncio.run(ensure_topics(settings))
    app, shell = build_app(settings)
    # a broker away: one warning, not thousands of errors
    fold_outage_logs(shell.outages, app, brokers=cluster.brokers)
    _tune_gc()
    gc.callbacks.append(_gc_timer(shell.counters))
    if settings.web_enabled:
        _say_web_server(settings)
    worker = Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    finally:
        if shell.fatal is not None:  # a produce failed for good: say so and exit non-zero
            print(f"specmeter worker: {shell.fatal}", file=sys.stderr)
            raise SystemExit(1)


def _say_web_server(settings: WorkerSettings) -> None:
    """Where the web server answers (a wildcard host shown as the loopback one)."""
    shown = "127.0.0.1" if settings.web_host in ("0.0.0.0", "::", "") else settings.web_host
    log.info(
        "web server on http://%s:%d: /metrics (Prometheus), /specmeter/stats, /specmeter/readyz",
        shown,
        settings.web_port,
    )


def _free_port(host: str) -> int:
    """A port free on ``host`` now (``--web-port 0``)."""
    import socket

    with socket.socket() as s:
        s.bind((host if host not in ("", "::") else "0.0.0.0", 0))
        return int(s.getsockname()[1])


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
