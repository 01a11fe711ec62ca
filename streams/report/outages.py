"""Kafka outages said once: a warning when a broker or the group coordinator cannot
be reached, a reminder at most every minute, a line when it is back.

While a broker is away aiokafka logs every failed attempt of every client the
worker holds: a single-node broker stopped for 20 s gave 5,000 ERROR lines
("Unable connect to node with id 1", "Failed fetch messages from 1",
"Unable to update metadata", "Group Coordinator Request failed"), a three-broker
cluster with one broker down ≈1,300 in 70 s (issue 21.3). A log filter on the
aiokafka loggers hands each such line to ``Outages``, which keeps the first one's
text, counts the rest and writes the lines a person reads. The worker is not
changed by any of this: its clients keep retrying as before, and nothing is skipped.

A broker is back when nothing was heard about it for ``quiet_s`` and its address
accepts a connection (aiokafka stops asking a broker that left the cluster's
metadata, so silence alone does not mean back); the group coordinator is back when
aiokafka discovers one, or after a longer silence. ``/specmeter/stats`` shows
``as_dict()``. Readiness does not follow an outage (``readiness``): only when no
broker of the cluster answers (``no_broker_answers``) is the worker not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "Outages",
    "OutageLogFilter",
    "classify",
    "classify_write_retry",
    "fold_command_logs",
    "fold_outage_logs",
    "folded_outages",
]

log = logging.getLogger("specmeter.outages")

COORDINATOR = "group coordinator"
CLUSTER = "Kafka cluster"

#: what an aiokafka line says when it failed because an endpoint cannot be reached
_UNREACHABLE = re.compile(
    r"NodeNotReady|KafkaConnectionError|Connect call failed|Connection refused|Unable connect"
    r"|Unable to (?:update|request) metadata|GroupCoordinatorNotAvailable|Group Coordinator Request failed"
    r"|FindCoordinator Request failed|marking coordinator dead|Marking the coordinator dead"
    r"|Failed fetch (?:messages|offsets) from|Heartbeat send request failed|RequestTimedOut"
    r"|is either not started or not valid"
)
#: a client whose metadata (from a broker back from a restart, say) does not list a broker
#: yet: nothing says that broker is away, and the next metadata lists it again
_STALE_METADATA = re.compile(r"StaleMetadata|not in current metadata")
_NODE = re.compile(
    r"node with id (\d+)|node id (\d+)|\(node (\d+)\)|to node (\d+)|(?:messages|offsets) from (\d+)"
    r"|metadata from \[(\d+)"
)
_ADDRESS = re.compile(r"\('([^']+)', (\d+)|Connection at ([^\s:]+):(\d+)|\"([^\"\s]+):(\d+)\"")
_DISCOVERED = re.compile(r"Discovered coordinator (\d+) for group")
#: what a command's producer logs at every retry while the cluster takes no write: two brokers
#: of three away leave partitions with no leader or too few in-sync replicas, and each retry of
#: each partition is a line (issue 37.5: ``replay`` printed 2,385 in a 75 s outage of two of
#: three brokers); folded by the commands (``folded_outages``) as an outage of the cluster
_WRITES_REFUSED = re.compile(
    r"NotEnoughReplicas|NotLeaderForPartition|NotLeaderOrFollower|LeaderNotAvailable"
    r"|not available during auto-create|KafkaTimeoutError|RequestTimedOut|Error fetching metadata for topic"
)
#: lines about the group's coordinator, not about a broker: a coordinator that moves
#: (a broker restarted, a partition of __consumer_offsets moved) is "marked dead" too
_COORDINATOR = re.compile(
    r"coordinator dead|GroupCoordinatorNotAvailable|NotCoordinatorForGroup|is either not started or not valid"
)


class Outage(msgspec.Struct, kw_only=True):
    """One endpoint the worker cannot reach now (mutable; guarded by ``Outages``' lock)."""

    target: str
    address: str | None
    since_s: float
    since_unix: float
    first_error: str
    last_error: str
    last_error_s: float
    last_line_s: float
    errors: int = 1
    unreported: int = 0
    #: the warning was written (a short coordinator move is shown on stats, not logged)
    warned: bool = False
    #: the group coordinator's broker, when a line named it
    node: str | None = None


def classify(message: str) -> tuple[str, str | None] | None:
    """(target, address) of an aiokafka warning or error that says an endpoint
    cannot be reached; None for any other line (pure)."""
    if not _UNREACHABLE.search(message) or _STALE_METADATA.search(message):
        return None
    if _COORDINATOR.search(message):
        return COORDINATOR, None
    return _endpoint(message)


def classify_write_retry(message: str) -> tuple[str, str | None] | None:
    """``classify``, and a producer's retry of a write the cluster refused (no leader, too few
    in-sync replicas, a timeout) as an outage of the cluster; None for any other line (pure)."""
    kind = classify(message)
    if kind is None and _WRITES_REFUSED.search(message):
        return CLUSTER, None
    return kind


def _endpoint(message: str) -> tuple[str, str | None]:
    """(target, address) of a line that says an endpoint other than the group coordinator
    cannot be reached: a broker by node, else by address, else the coordinator or the cluster."""
    address = _address(message)
    node = _NODE.search(message)
    if node:
        return f"broker {_named(node)}", address
    if address:
        return f"broker at {address}", address
    if "oordinator" in message:
        return COORDINATOR, None
    return CLUSTER, None


def _address(message: str) -> str | None:
    """The host:port a line names, if any."""
    found = _ADDRESS.search(message)
    if not found:
        return None
    host, port = [g for g in found.groups() if g is not None]
    return f"{host}:{port}"


def _named(found: re.Match[str]) -> str:
    """The group of a pattern's alternatives that matched."""
    return next(g for g in found.groups() if g is not None)


def _coordinator_node(message: str) -> str | None:
    found = re.search(r"\(node (\d+)\)|to node (\d+)", message)
    return _named(found) if found else None


@dataclass
class _Due:
    """What a tick decided to say, said once the lock is released."""

    first: list[Outage] = field(default_factory=list)
    back: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    #: (outage, errors folded since its last line, its latest error)
    remind: list[tuple[Outage, int, str]] = field(default_factory=list)


class Outages:
    """Which Kafka endpoints the worker cannot reach now, and the log lines about them.

    ``error`` is called for every folded line (from any thread: Faust's consumer
    runs in its own); ``tick`` once a second, with the targets a probe found
    reachable, decides what is back and what needs a reminder. Times are passed in
    (``time.monotonic`` seconds) so the decisions are tested without waiting.
    """

    def __init__(
        self,
        *,
        repeat_s: float = 60.0,
        quiet_s: float = 5.0,
        coordinator_quiet_s: float = 30.0,
        coordinator_grace_s: float = 5.0,
        forget_silent_s: float = 300.0,
        wall: Callable[[], float] = time.time,
        logger: logging.Logger = log,
        who: str = "the worker",
        back_level: int = logging.INFO,
    ) -> None:
        self.repeat_s = repeat_s
        self.quiet_s = quiet_s
        self.coordinator_quiet_s = coordinator_quiet_s
        self.coordinator_grace_s = coordinator_grace_s
        self.forget_silent_s = forget_silent_s
        self._wall = wall
        self._log = logger
        #: who keeps retrying, in the lines said (the worker, or a command: ``folded_outages``)
        self.who = who
        #: the level of the line that says an outage is over (a command shows warnings only)
        self.back_level = back_level
        self._lock = threading.Lock()
        self._open: dict[str, Outage] = {}
        self._addresses: dict[str, str] = {}  # "broker N" -> host:port
        self._brokers: dict[str, str] = {}  # host:port -> "broker N"
        self._left: set[str] = set()  # brokers nothing asks for any more (taken out of the cluster)
        self.outages_total = 0
        self.errors_total = 0

    def learn_brokers(self, brokers: dict[int, str]) -> None:
        """Node ids and addresses of the cluster's brokers (from its metadata), so a
        line naming only an address and one naming only a node id are one broker."""
        with self._lock:
            for node, address in brokers.items():
                self._learn(f"broker {node}", address)

    def _learn(self, target: str, address: str) -> None:
        self._addresses[target] = address
        self._brokers[address] = target

    def no_broker_answers(self) -> bool:
        """Whether every broker the worker knows (the cluster's at start, and any an
        error named; not one taken out of the cluster) is unreachable now."""
        with self._lock:
            known = {t for t in self._addresses if t.startswith("broker ")} - self._left
            return bool(known) and known <= self._open.keys()

    @property
    def unreachable(self) -> tuple[str, ...]:
        """The endpoints unreachable now (empty: all is well)."""
        with self._lock:
            return tuple(self._open)

    def _name(self, outage: Outage) -> str:
        if outage.target.startswith("broker ") and outage.address and outage.address not in outage.target:
            return f"Kafka {outage.target} ({outage.address})"
        return outage.target if outage.target.startswith("Kafka") else f"Kafka {outage.target}"

    def error(self, target: str, detail: str, now: float, address: str | None = None) -> None:
        """One failed attempt at ``target``: the first opens an outage and says so."""
        with self._lock:
            self.errors_total += 1
            target = self._known_as(target, address)
            self._left.discard(target)  # asked for again: back in the cluster
            outage = self._open.get(target)
            node = _coordinator_node(detail) if target == COORDINATOR else None
            if outage is not None:
                self._fold(outage, detail, node, now)
                return
            outage = self._open[target] = self._new_outage(target, detail, node, now)
            if target in (COORDINATOR, CLUSTER):
                return  # said when it lasts (``tick``): a coordinator moving or loading takes a moment
            self._said(outage)
        self._warn(outage)

    def _new_outage(self, target: str, detail: str, node: str | None, now: float) -> Outage:
        """An outage opened by its first error."""
        return Outage(
            target=target,
            address=self._addresses.get(target),
            since_s=now,
            since_unix=self._wall(),
            first_error=detail,
            last_error=detail,
            last_error_s=now,
            last_line_s=now,
            node=node,
        )

    def _known_as(self, target: str, address: str | None) -> str:
        """The target a line names, as the outages know it: a broker named by its address
        alone is the broker of that address when its node id is known."""
        if address and target.startswith("broker at "):
            return self._brokers.get(address, target)
        if address:
            self._learn(target, address)
        return target

    def _fold(self, outage: Outage, detail: str, node: str | None, now: float) -> None:
        """One more error of an open outage, folded into its next line."""
        outage.node = node or outage.node
        outage.errors += 1
        outage.unreported += 1
        outage.last_error, outage.last_error_s = detail, now
        outage.address = outage.address or self._addresses.get(outage.target)

    def _said(self, outage: Outage) -> None:
        """An outage is one (in ``outages_total``) once it is said: a group coordinator
        that a fresh cluster is still loading, found again within seconds, is none."""
        outage.warned = True
        self.outages_total += 1

    def _warn(self, outage: Outage) -> None:
        self._log.warning(
            "%s %s: %s; %s keeps retrying, and further errors about it are folded into one line a "
            "minute until it is back",
            self._name(outage),
            _out_word(outage),
            outage.first_error,
            self.who,
        )

    def found_coordinator(self, node: str, now: float) -> None:
        """aiokafka discovered a group coordinator: the coordinator's outage is over."""
        self._close(COORDINATOR, now, f" (broker {node})")

    def _close(self, target: str, now: float, where: str = "", *, unused: bool = False) -> None:
        with self._lock:
            outage = self._open.pop(target, None)
        if unused:
            with self._lock:
                self._left.add(target)
        if outage is None or not outage.warned:
            return
        if unused:
            self._say_unused(outage, now)
        else:
            self._say_back(outage, now, where)

    def _say_back(self, outage: Outage, now: float, where: str) -> None:
        """An outage said is over: how long it lasted, and the errors folded into it."""
        self._log.log(
            self.back_level,
            "%s is back%s after %.0f s (%d errors folded)",
            self._name(outage),
            where,
            now - outage.since_s,
            outage.errors,
        )

    def _say_unused(self, outage: Outage, now: float) -> None:
        """A broker that left the cluster's metadata: no longer counted as an outage."""
        self._log.log(
            self.back_level,
            "%s still refuses connections, but nothing has asked for it for %.0f s (it left the cluster's "
            "metadata): no longer counted as an outage (%d errors folded)",
            self._name(outage),
            now - outage.last_error_s,
            outage.errors,
        )

    def to_probe(self, now: float) -> dict[str, str | None]:
        """Targets silent for ``quiet_s``, with the address a probe should try (None: none known)."""
        with self._lock:
            return {
                o.target: o.address or self._addresses.get(o.target)
                for o in self._open.values()
                if o.target != COORDINATOR and now - o.last_error_s >= self.quiet_s
            }

    def tick(self, now: float, reachable: Iterable[str] = ()) -> None:
        """Close what is back, remind of what is not (at most every ``repeat_s``).

        ``reachable``: targets of ``to_probe`` whose address accepted a connection.
        """
        reachable = set(reachable)
        due = _Due()
        with self._lock:
            for target, o in self._open.items():
                self._look_at(target, o, now, reachable, due)
        self._say(due, now)

    def _say(self, due: _Due, now: float) -> None:
        """What a tick decided (outside the lock): first lines, ends, reminders."""
        for o in due.first:
            self._warn(o)
        for target in due.back:
            self._close(target, now)
        for target in due.unused:
            self._close(target, now, unused=True)
        for o, folded, last in due.remind:
            self._remind(o, folded, last, now)

    def _remind(self, o: Outage, folded: int, last: str, now: float) -> None:
        """The reminder of an outage still on, with the errors folded since its last line."""
        self._log.warning(
            "%s still %s after %.0f s: %d errors folded since the last line (latest: %s)",
            self._name(o),
            _out_word(o),
            now - o.since_s,
            folded,
            last,
        )

    def _look_at(self, target: str, o: Outage, now: float, reachable: set[str], due: _Due) -> None:
        """What one outage needs now (under the lock): said at last, over, or a reminder."""
        if self._lasting(o, now):
            self._said(o)
            o.last_line_s, o.unreported = now, 0
            due.first.append(o)
        self._end_or_remind(target, o, now, reachable, due)

    def _end_or_remind(self, target: str, o: Outage, now: float, reachable: set[str], due: _Due) -> None:
        """An outage over (back, or no longer used), or one said ``repeat_s`` ago: a reminder."""
        ended = self._ended(target, o, now, reachable)
        if ended is not None:
            (due.back if ended == "back" else due.unused).append(target)
        elif o.warned and now - o.last_line_s >= self.repeat_s:
            due.remind.append((o, o.unreported, o.last_error))
            o.last_line_s, o.unreported = now, 0

    def _lasting(self, o: Outage, now: float) -> bool:
        """An outage not said yet (the coordinator's, the cluster's) that lasted
        ``coordinator_grace_s``; a coordinator on a broker that is away is that broker's
        outage, said once."""
        subsumed = o.node is not None and f"broker {o.node}" in self._open
        return not o.warned and not subsumed and now - o.since_s >= self.coordinator_grace_s

    def _ended(self, target: str, o: Outage, now: float, reachable: set[str]) -> str | None:
        """``back`` (silent long enough, and reachable when its address is known),
        ``unused`` (a broker nothing asks for any more: taken out of the cluster, not the
        worker's outage) or None (still on)."""
        silent_s = now - o.last_error_s
        if target == COORDINATOR:
            return "back" if silent_s >= self.coordinator_quiet_s else None
        return self._endpoint_ended(silent_s, target in reachable or o.address is None)

    def _endpoint_ended(self, silent_s: float, reachable: bool) -> str | None:
        """``_ended`` for an endpoint (a broker, the cluster): back once silent ``quiet_s``
        and ``reachable`` (a probe connected, or no address to probe); unused once silent
        ``forget_silent_s`` whatever a probe says."""
        if silent_s >= self.quiet_s and reachable:
            return "back"
        return "unused" if silent_s >= self.forget_silent_s else None

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        """For ``/specmeter/stats``: what is unreachable now, and totals since start."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return {
                "unreachable": [_outage_dict(o, now) for o in self._open.values()],
                "outages_total": self.outages_total,
                "errors_folded_total": self.errors_total,
            }


def _out_word(o: Outage) -> str:
    """How an outage's lines say its target is out: a coordinator or the cluster is
    ``unavailable`` (moving, loading, or no broker answers), an endpoint ``unreachable``."""
    return "unavailable" if o.target in (COORDINATOR, CLUSTER) else "unreachable"


def _outage_dict(o: Outage, now: float) -> dict[str, Any]:
    """One outage on ``/specmeter/stats``."""
    return {
        "target": o.target,
        "address": o.address,
        "since_unix": round(o.since_unix, 3),
        "for_s": round(now - o.since_s, 1),
        "errors_folded": o.errors,
        "said": o.warned,
        "first_error": o.first_error,
    }


class OutageLogFilter(logging.Filter):
    """On aiokafka's loggers: hands every line that says an endpoint cannot be
    reached to ``Outages`` and drops it; every other line passes unchanged.

    ``retries``: when given, only lines whose message template starts with one of
    these are considered (for the worker's own retry lines: its other lines, e.g.
    that a reader stopped, are never folded).
    """

    def __init__(
        self,
        outages: Outages,
        clock: Callable[[], float] = time.monotonic,
        retries: tuple[str, ...] | None = None,
        *,
        writes: bool = False,
    ) -> None:
        super().__init__()
        self.outages = outages
        self._clock = clock
        self._retries = retries
        #: also fold a producer's retries of writes the cluster refused (``classify_write_retry``)
        self._classify = classify_write_retry if writes else classify

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if record.levelno < logging.WARNING:
                return self._below_warning(record)
            if self._retries is not None and not str(record.msg).startswith(self._retries):
                return True
            return self._fold(record)
        except Exception:  # noqa: BLE001 - a log filter must never lose the line it was given
            return True

    def _fold(self, record: logging.LogRecord) -> bool:
        """A WARNING or worse: one that says an endpoint cannot be reached goes to
        ``Outages`` and is dropped (False); any other passes (True)."""
        message = _with_exception(record)
        kind = self._classify(message)
        if kind is None:
            if _STALE_METADATA.search(message):  # no outage (``classify``): aiokafka's detail, at INFO
                record.levelno, record.levelname = logging.INFO, "INFO"
                return logging.getLogger("aiokafka").isEnabledFor(logging.INFO)
            return True
        target, address = kind
        self.outages.error(target, message, self._clock(), address)
        return False

    def _below_warning(self, record: logging.LogRecord) -> bool:
        """An INFO or DEBUG line: "Discovered coordinator" ends the coordinator's outage.
        The coordinator's logger is kept at INFO for that line alone: its INFO lines show
        only where aiokafka's own level lets them (worker/run.py quiets it)."""
        if record.levelno == logging.INFO and "Discovered coordinator" in str(record.msg):
            self._discovered(record)
        return record.name != COORDINATOR_LOGGER or logging.getLogger("aiokafka").isEnabledFor(record.levelno)

    def _discovered(self, record: logging.LogRecord) -> None:
        """A "Discovered coordinator" line: the coordinator's outage ends, on the node it names."""
        found = _DISCOVERED.search(record.getMessage())
        if found:
            self.outages.found_coordinator(found.group(1), self._clock())


def _with_exception(record: logging.LogRecord) -> str:
    """A line's message, and its exception's type and text when it carries one."""
    message = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        message = f"{message} ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
    return message


#: the loggers whose lines are folded; aiokafka logs with one logger per module
FOLDED_PREFIXES = ("aiokafka",)
#: the worker's own lines that repeat at every try while Kafka is away (streams/worker/app.py);
#: they are folded only when they name an unreachable endpoint
WORKER_RETRIES = (
    "committing the offsets of",
    "connecting the output producer failed",
)
#: the producer library's line at every retry of a delivery (producers/_publisher.py), folded
#: by the commands that publish (``replay``, ``loadgen``)
PUBLISHER_RETRIES = ("publisher: delivery to partition",)
#: the producer library's logger
PUBLISHER_LOGGER = "specmeter.producers"
#: the logger of aiokafka's "Discovered coordinator" line (INFO), the sign the
#: group's coordinator is back
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"


def _loggers(prefixes: tuple[str, ...]) -> list[logging.Logger]:
    names = [
        name
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and name.startswith(prefixes)
    ]
    return [logging.getLogger(name) for name in sorted(names)]


async def _accepts(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except (TimeoutError, OSError, ValueError):
        return False
    # a client connecting to a closed local port can meet itself (TCP self-connect):
    # that is no broker
    itself = writer.get_extra_info("sockname") == writer.get_extra_info("peername")
    writer.close()
    return not itself


async def probe_and_tick(outages: Outages) -> None:
    """One watch step: try the address of each silent target, then ``tick``."""
    now = time.monotonic()
    candidates = outages.to_probe(now)
    reachable = [t for t, address in candidates.items() if address is not None and await _accepts(address)]
    outages.tick(time.monotonic(), reachable)


def fold_outage_logs(
    outages: Outages,
    every: Callable[[float, Callable[[], Awaitable[None]], str], None] | None = None,
    *,
    brokers: dict[int, str] | None = None,
    interval_s: float = 1.0,
) -> OutageLogFilter:
    """Fold aiokafka's outage lines into ``outages`` (a filter on each aiokafka
    logger, so it holds whatever handlers Faust installs later), its producer's retries of
    writes the cluster refused as an outage of the cluster; with ``every`` (the worker's
    way to run a function periodically: interval, function, name), probe and tick every
    ``interval_s``. ``brokers``: the cluster's node ids and addresses, as its metadata
    gave them at start."""
    # every aiokafka logger exists once its modules are imported
    import aiokafka.admin
    import aiokafka.consumer
    import aiokafka.producer  # noqa: F401 - imported for its loggers

    outages.learn_brokers(brokers or {})
    # a producer's retries of writes the cluster refused are folded too: two brokers of three
    # away gave a worker's log 558 lines of aiokafka's sender in 40 s
    folding = OutageLogFilter(outages, writes=True)
    for logger in _loggers(FOLDED_PREFIXES):
        logger.addFilter(folding)
    # its "Discovered coordinator" line (INFO) says the coordinator is back, whatever level
    # aiokafka's other lines are shown at (the filter shows its INFO lines only where they were)
    coordinator = logging.getLogger(COORDINATOR_LOGGER)
    coordinator.setLevel(min(coordinator.getEffectiveLevel(), logging.INFO))
    logging.getLogger("specmeter.worker").addFilter(OutageLogFilter(outages, retries=WORKER_RETRIES))
    if every is not None:

        async def watch_outages() -> None:
            await probe_and_tick(outages)

        every(interval_s, watch_outages, "specmeter.outages")
    return folding


@contextlib.asynccontextmanager
async def folded_outages(command: str, *, interval_s: float = 1.0) -> AsyncIterator[Outages]:
    """For a command that talks to Kafka (``replay``, ``loadgen``, ``tail``, ``advise``):
    aiokafka's lines about an endpoint it cannot reach folded as the worker folds them, one
    warning when it goes, a reminder a minute, one when it is back, instead of a line per
    retry (an 88 s outage gave ``replay`` 2,652 lines). Its other lines pass unchanged."""
    outages = Outages(who=f"specmeter {command}", back_level=logging.WARNING)
    installed = fold_command_logs(outages)

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval_s)
            await probe_and_tick(outages)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        yield outages
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        for logger, folding in installed:
            logger.removeFilter(folding)


def fold_command_logs(
    outages: Outages, clock: Callable[[], float] = time.monotonic
) -> list[tuple[logging.Logger, logging.Filter]]:
    """A command's client lines folded into ``outages``: aiokafka's about an endpoint it cannot
    reach, and its producer's retries of writes the cluster refused (aiokafka's and the
    producer library's, ``PUBLISHER_RETRIES``), as an outage of the cluster. Returns the
    (logger, filter) pairs installed, for the caller to remove."""
    import aiokafka.admin
    import aiokafka.consumer
    import aiokafka.producer  # noqa: F401 - imported for their loggers

    folding = OutageLogFilter(outages, clock, writes=True)
    installed: list[tuple[logging.Logger, logging.Filter]] = [(logger, folding) for logger in _loggers(FOLDED_PREFIXES)]
    installed.append(
        (logging.getLogger(PUBLISHER_LOGGER), OutageLogFilter(outages, clock, PUBLISHER_RETRIES, writes=True))
    )
    for logger, log_filter in installed:
        logger.addFilter(log_filter)
    return installed
