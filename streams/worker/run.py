"""Running a worker process: topics first, the Kafka work started while Faust is imported,
then Faust's worker until stopped."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import msgspec

from ..delivery import internals
from ..report.log_lines import bound_log_lines
from ..report.outages import fold_outage_logs
from ..settings import WorkerSettings
from .app import StreamShell, add_timer, build_app, listening_hosts, web_address
from .early import EarlySignals, FaustImport
from .topics import ensure_topics

__all__ = ["run_worker"]

T = TypeVar("T")

log = logging.getLogger("specmeter.worker")

#: the worker's one log format: its own lines, Faust's, mode's and aiokafka's alike
LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"

#: a worker without web pages reads its input first and imports Faust (its timers, its
#: lifecycle) once caught up, or this long after the start at the latest: Faust's import
#: costs half a second of CPU, which a worker with a backlog would otherwise take from reading
FAUST_WITHIN_S = 5.0

#: imported where the worker's start uses them (the topics' checks, the assignor's protocol)
STARTING_NEEDS = ("aiokafka.admin", "aiokafka.admin.config_resource", "aiokafka.coordinator.protocol")


def run_worker(settings: WorkerSettings) -> None:
    """Create missing topics and start the worker's Kafka work while Faust is imported
    beside it (``worker.early``), then run Faust's worker on the same loop until
    SIGINT/SIGTERM: from there on it runs the lifecycle, the timers and the web pages."""
    settings = _prepare_process(settings)
    internals.check_pins()
    _import_what_starting_needs()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # the loop Faust's worker runs (mode's get_event_loop)
    # without web pages to serve, Faust's import waits until the worker has read its input
    with FaustImport(web=settings.web_enabled, deferred=not settings.web_enabled) as faust_import:
        cluster = loop.run_until_complete(ensure_topics(settings))
        shell = StreamShell(settings)
        # from here a signal is kept for Faust's graceful stop (before, it ends the process at once)
        signals = EarlySignals(loop, fatal=lambda: shell.fatal)
        # with the web pages on, "Worker ready" comes once they are served (``_web_server_said``)
        shell.delivery.ready_held = settings.web_enabled
        timers: list[tuple[float, Callable[[], Awaitable[None]], str]] = []
        # a broker away: one warning, not thousands of errors (its watch ticks once Faust runs)
        fold_outage_logs(shell.outages, lambda *timer: timers.append(timer), brokers=cluster.brokers)
        gc.callbacks.append(_gc_timer(shell.counters))
        _or_close(loop, shell, lambda: loop.run_until_complete(_start_before_faust(shell, faust_import)))
    worker = _or_close(loop, shell, lambda: _faust_worker_of(settings, shell, signals, timers))
    _tune_gc()  # once Faust is imported: its import-time objects frozen too
    try:
        worker.execute_from_commandline()
    finally:
        _say_stopped(worker.stopped_by, shell.fatal)


def _faust_worker_of(
    settings: WorkerSettings,
    shell: StreamShell,
    signals: EarlySignals,
    timers: list[tuple[float, Callable[[], Awaitable[None]], str]],
) -> Any:
    """Faust's app around the running shell, its timers and web pages, and the worker that runs it."""
    app = build_app(settings, shell)
    for timer in timers:
        add_timer(app, *timer)
    if settings.web_enabled:
        app.task(_web_server_said(settings.web_host, settings.web_port, shell))
    return faust_worker(settings, signals)(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)


def _or_close(loop: asyncio.AbstractEventLoop, shell: StreamShell, step: Callable[[], T]) -> T:
    """``step``; should it fail once the shell runs (Faust's import, its app), the shell is
    closed first (its writes flushed, its groups left), and the error goes on."""
    try:
        return step()
    except BaseException:
        loop.run_until_complete(shell.close())
        raise


def _import_what_starting_needs() -> None:
    """The modules the worker's start imports where it uses them, imported before Faust's
    import begins beside it: the two threads then never load a module at once
    (``tests/test_early_start.py`` checks that the main thread loads none meanwhile)."""
    import importlib

    for name in STARTING_NEEDS:
        importlib.import_module(name)


async def _start_before_faust(shell: StreamShell, faust_import: FaustImport) -> None:
    """The shell's routes, takeovers and output started (they join the groups and restore
    the partitions meanwhile), until Faust is imported; a deferred import begins once the
    worker has caught up with its input, or ``FAUST_WITHIN_S`` after the start."""
    shell.start()
    if not faust_import.started:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAUST_WITHIN_S
        while not shell.delivery.backlog_read and loop.time() < deadline:
            await asyncio.sleep(0.02)
        faust_import.start()
    await faust_import.done()


def faust_worker(settings: WorkerSettings, signals: EarlySignals) -> type:
    """Faust's worker class as the worker runs it: its log, the line that says why it
    stops, and a signal that came before it ran handed to it once it runs."""
    import faust

    class Worker(faust.Worker):
        #: the signal that stopped the worker (None: it stopped on its own, or failed)
        stopped_by: str | None = None

        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            """mode installs handlers of its own format: they get the worker's (one format in the log)."""
            super().on_setup_root_logger(logger, level)
            one_log_format(logger)
            quiet_library_lines(level)

        async def on_first_start(self) -> None:
            """Faust's worker starts (its signal handlers replace ``EarlySignals``'), then
            stops at once if a signal came before."""
            await super().on_first_start()
            if signals.noted is not None:
                self._schedule_shutdown(signals.noted)

        def _schedule_shutdown(self, signum: signal.Signals) -> None:
            """SIGINT or SIGTERM: say that the worker stops and why, once, before mode stops it."""
            if self.stopped_by is None:
                self.stopped_by = signal.Signals(signum).name
                log.info(
                    "stopping on %s: leaving its consumer groups %s, flushing its writes",
                    self.stopped_by,
                    ", ".join(settings.consumer_groups),
                )
            super()._schedule_shutdown(signum)

    return Worker


def quiet_library_lines(level: int) -> None:
    """Faust's, mode's and aiokafka's INFO lines (≈300 at start-up, boxed tables of topics
    among them) only at --log-level debug: the worker says what matters."""
    if level > logging.DEBUG:
        for name in ("faust", "mode", "aiokafka"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _prepare_process(settings: WorkerSettings) -> WorkerSettings:
    """The process made ready before anything talks to Kafka: its log lines and format,
    its private data folder, and (``--web-port 0``) a free port, which the returned
    settings name so that the worker can say where it listens."""
    bound_log_lines()
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    quiet_library_lines(logging.getLevelName(settings.log_level.upper()))
    quiet_rebalance_chatter()
    _private_data_dir(settings.data_dir)
    if settings.web_enabled and settings.web_port == 0:  # any free port: say which
        settings = msgspec.structs.replace(settings, web_port=_free_port(settings.web_host))
    return settings


def _say_stopped(stopped_by: str | None, fatal: str | None) -> None:
    """The worker's last line (and the signal that stopped it); a produce that failed for
    good is said on stderr too, and the process exits non-zero."""
    log.info("stopped%s", f" (on {stopped_by})" if stopped_by else "")
    if fatal is not None:
        print(f"specmeter worker: {fatal}", file=sys.stderr)
        raise SystemExit(1)


def one_log_format(logger: logging.Logger) -> None:
    """Every handler of ``logger`` (the root: mode's, installed when Faust starts) writes
    ``LOG_FORMAT``: one format in the worker's log, not mode's ``[pid] [INFO]`` beside it."""
    formatter = logging.Formatter(LOG_FORMAT)
    for handler in logger.handlers:
        handler.setFormatter(formatter)


class RebalanceChatter(logging.Filter):
    """aiokafka's WARNINGs about an ordinary rebalance ("Heartbeat failed for group ...
    because it is rebalancing", "... generation id is not current") and its ERROR for a
    commit the group refused because it moved on ("OffsetCommit failed ... due to group
    error (...), will rejoin": a member back from a pause), lowered to INFO: a rebalance
    is how workers share partitions, not a problem; the worker's own lines say it."""

    NEEDLES = ("because it is rebalancing", "generation id is not", "re-joining group", "error (%s), will rejoin")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno in (logging.WARNING, logging.ERROR) and any(n in str(record.msg) for n in self.NEEDLES):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger("aiokafka").isEnabledFor(logging.INFO)
        return True


def quiet_rebalance_chatter() -> None:
    """``RebalanceChatter`` on aiokafka's group coordinator's logger (a filter: aiokafka is unchanged)."""
    import aiokafka.consumer.group_coordinator  # noqa: F401 - imported for its logger

    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, RebalanceChatter) for f in coordinator.filters):
        coordinator.addFilter(RebalanceChatter())


def _private_data_dir(path: str) -> None:
    """The data folder, created readable by its owner alone (0700; it was world-readable);
    one that exists is left as it is, with a warning when it is this user's and others can
    read it (a folder of an earlier version; not a mounted volume of another owner)."""
    import os
    import stat

    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # whatever the umask left
        return
    status = os.stat(path)
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077 and status.st_uid == os.getuid():
        log.warning(
            "data dir %s is readable by other users (mode %o): `chmod 700 %s`, or pass --data-dir a private folder",
            path,
            mode,
            path,
        )


def _web_server_said(host: str, port: int, shell: StreamShell) -> Callable[[], Coroutine[Any, Any, None]]:
    """An app task: once the web server listens, the line that says where, read from its
    listening sockets (issue 47.0: it said 127.0.0.1 while Faust listened on 0.0.0.0); then
    the ready line, held until now (the worker starts before Faust runs its web server)."""

    async def say_web_server() -> None:
        try:
            hosts = listening_hosts(port)
            if not hosts:  # descriptors that cannot be listed here: what was asked for, said so
                log.warning("web server: its listening socket could not be read; asked to bind %s:%d", host, port)
                return
            _say_web_server(hosts, port)
        finally:
            shell.delivery.release_ready()

    return say_web_server


def _say_web_server(hosts: list[str], port: int) -> None:
    """Where the web server answers: the addresses it listens on, and for a wildcard how to reach it here."""
    wildcard = any(host in ("0.0.0.0", "::") for host in hosts)
    log.info(
        "web server on %s%s: /metrics (Prometheus), /specmeter/stats, /specmeter/readyz, /specmeter/ (status page)",
        ", ".join(f"http://{web_address(host, port)}" for host in hosts),
        f" (every interface; from this machine http://127.0.0.1:{port})" if wildcard else "",
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
