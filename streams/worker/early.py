"""The worker before Faust runs: Faust imported on a thread while the worker's Kafka work
starts on the event loop, and the signals that come meanwhile kept for Faust's worker.

Importing Faust costs about half a second of CPU (``faust.types`` imports aiohttp's client,
which builds its SSL contexts; mode imports croniter), as much as everything else the
worker does before it is ready. So the worker does not wait for it: its topics are checked,
its groups joined and its partitions restored on the loop while a thread imports Faust.
Faust's worker then runs that same loop, and from there on it runs the lifecycle, the
timers and the web pages, as before (``docs/design.md``, "What Faust does").

The thread only imports. The main thread imports what it needs before the thread starts
(``run.run_worker``), so the two never load the same module at once (Python's per-module
import locks would make one wait, and in a cycle fail).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["FaustImport", "EarlySignals"]

log = logging.getLogger("specmeter.worker")

#: how often a thread holding the interpreter lets another have it while Faust is imported
#: (Python's default is 5 ms): the loop, woken by a broker's answer, waits that long for
#: the import thread at most, at each of the dozens of round trips before the worker is ready
SWITCH_INTERVAL_S = 0.0005


class FaustImport:
    """Faust's modules (and its web driver's, with the web pages) imported on a thread.

    ``with FaustImport(web=...) as faust_import:`` starts it (``deferred``: ``start()``
    does, later); ``await faust_import.done()`` waits for it on the loop; leaving the block
    waits for the thread (an error that ends the process before Faust runs does not leave
    it importing at exit)."""

    def __init__(self, *, web: bool, deferred: bool = False) -> None:
        self.web = web
        self.deferred = deferred
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._load, name="specmeter-import-faust", daemon=True)
        self._switch_interval = sys.getswitchinterval()

    def __enter__(self) -> FaustImport:
        if not self.deferred:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.started:
            self._thread.join()
        sys.setswitchinterval(self._switch_interval)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        """The import begins (once)."""
        if not self.started:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._thread.start()

    async def done(self) -> None:
        """Once Faust is imported (its error, if the import failed)."""
        await asyncio.wrap_future(self._done)

    def _load(self) -> None:
        try:
            import faust
            import faust.worker  # the worker's lifecycle

            faust.App  # noqa: B018 - faust's attributes are loaded on first use: the app's module
            if self.web:
                import faust.web.drivers.aiohttp  # the web pages' server
        except BaseException as error:  # noqa: BLE001 - said by whoever awaits it, whatever it is
            self._done.set_exception(error)
        else:
            self._done.set_result(None)
        finally:
            sys.setswitchinterval(self._switch_interval)


class EarlySignals:
    """SIGINT and SIGTERM before Faust's worker runs (it installs its own handlers as it
    starts): kept, and handed to Faust's worker once it runs, so that a stop asked for
    early is the same graceful stop (the groups left, the writes flushed) as any other."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, fatal: Callable[[], str | None] = lambda: None) -> None:
        #: the first signal that came before Faust's worker ran (None: none did)
        self.noted: signal.Signals | None = None
        #: why the worker stops on its own (a write failed for good: it signals itself), if it does
        self._fatal = fatal
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._note, signum)

    def _note(self, signum: signal.Signals) -> None:
        if self.noted is None:
            self.noted = signum
            why = "a write failed for good" if self._fatal() is not None else signum.name
            log.info("%s while Faust is imported: the worker stops as soon as Faust's worker runs", why)
