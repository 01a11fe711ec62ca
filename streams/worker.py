"""Running a worker process: topics first, then the Faust worker until stopped."""

from __future__ import annotations

import asyncio
import logging

from ._topics import ensure_topics
from .app import build_app
from .settings import WorkerSettings

__all__ = ["run_worker"]


def run_worker(settings: WorkerSettings) -> None:
    """Create missing topics, then run the worker until SIGINT/SIGTERM."""
    import faust

    logging.basicConfig(level=settings.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    asyncio.run(ensure_topics(settings))
    app, _ = build_app(settings)
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
