"""Finding a real Kafka broker for the test session.

Order: ``KAFKA_BOOTSTRAP_SERVERS`` when set; testcontainers' ``KafkaContainer``
when a Docker engine answers; otherwise the local KRaft broker of
``deploy/kafka/broker`` (the same script people and benchmarks use).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BROKER_SCRIPT = REPO / "deploy" / "kafka" / "broker"


class NoBroker(RuntimeError):
    """No broker could be found or started; the message says why."""


def _docker_answers(timeout_s: float = 2.0) -> bool:
    """True when a Docker engine answers ``GET /_ping`` (unix socket or tcp DOCKER_HOST)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not os.path.exists(path):
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: object = path
        elif host.startswith("tcp://"):
            name, _, port = host[len("tcp://") :].rstrip("/").partition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (name, int(port or 2375))
        else:
            return False
        with sock:
            sock.settimeout(timeout_s)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64).split(b"\r\n", 1)[0]
            return status_line.startswith(b"HTTP/1.") and b" 200" in status_line
    except OSError:
        return False


def _start_container() -> tuple[str, Callable[[], None]]:
    from testcontainers.kafka import KafkaContainer

    container = KafkaContainer("apache/kafka:4.1.1").with_kraft()
    container.start()
    return container.get_bootstrap_server(), container.stop


def tied_to_me(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` with the brokers deploy/kafka/broker starts tied to this process: they stop
    when it ends, however it ends (a killed test run, a benchmark past its limit)."""
    from specmeter.streams.cli.lifetime import tied_to_me

    return tied_to_me(env)


def _start_local() -> tuple[str, Callable[[], None]]:
    """The local broker, started unless it runs: one this session starts is tied to the
    pytest process (the suite's lifetime; ``stop`` ends it sooner), one it finds is left alone."""
    was_running = subprocess.run([str(BROKER_SCRIPT), "status"], capture_output=True).returncode == 0
    proc = subprocess.run([str(BROKER_SCRIPT), "start"], capture_output=True, text=True, timeout=900, env=tied_to_me())
    if proc.returncode != 0:
        raise NoBroker(f"deploy/kafka/broker start failed:\n{proc.stderr[-4000:]}")
    address = proc.stdout.strip().splitlines()[-1]

    def stop() -> None:
        if not was_running:  # leave a broker someone else started alone
            # --purge: test topics are unique per run; keeping them makes every later
            # start reload hundreds of partitions before groups can join.
            subprocess.run([str(BROKER_SCRIPT), "stop", "--purge"], capture_output=True, timeout=120)

    return address, stop


def find_broker() -> tuple[str, Callable[[], None]]:
    """A bootstrap address and a function that releases what was started."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        return configured, lambda: None
    if _docker_answers():
        return _start_container()
    return _start_local()


def broker_log_tail(lines: int = 60) -> str:
    """The local broker's log tail, for failure reports."""
    log = Path(os.environ.get("SPECMETER_KAFKA_DIR", REPO / ".kafka")) / "broker.log"
    if not log.exists():
        return "(no local broker log)"
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


class PrivateBroker:
    """A second local broker with its own state folder, for tests that must
    configure it (security listeners) or stop it (broker faults) without
    disturbing the session's broker."""

    def __init__(self, state_dir: Path, **env: str) -> None:
        self.state_dir = state_dir
        # tied to this process: a test run killed midway takes the broker along
        own = {"SPECMETER_KAFKA_DIR": str(state_dir), "SPECMETER_KAFKA_HEAP": "512m"}
        self.env = tied_to_me({**os.environ, **own, **env})

    def _run(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(
            [str(BROKER_SCRIPT), *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if proc.returncode != 0:
            raise NoBroker(f"deploy/kafka/broker {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
        return proc.stdout

    def start(self) -> str:
        """Start (or restart on the same data and ports); returns the PLAINTEXT address."""
        return self._run("start").strip().splitlines()[-1]

    def stop(self, purge: bool = False) -> None:
        self._run("stop", *(["--purge"] if purge else []))

    def tool(self, *args: str) -> str:
        """Run a Kafka admin tool class from the broker's jars."""
        return self._run("tool", *args, timeout=120)

    def log_tail(self, lines: int = 60) -> str:
        log = self.state_dir / "broker.log"
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:]) if log.exists() else ""


def local_broker_tools_missing() -> str | None:
    """Why a private local broker cannot run here (None when it can)."""
    import shutil

    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            return f"{tool} not found (a private local broker needs Java 17+ and Maven)"
    return None


class KafkaCluster:
    """A local KRaft cluster of one controller and brokers 1, 2, 3
    (``deploy/kafka/broker cluster``: default.replication.factor=3,
    min.insync.replicas=2) in its own state folder, for tests of replication and of
    brokers that crash, restart or come back with an empty disk."""

    BROKERS = (1, 2, 3)

    def __init__(self, state_dir: Path, **env: str) -> None:
        self.state_dir = state_dir
        # tied to this process (a test run or a benchmark): killed midway, it takes the nodes along
        self.env = tied_to_me({**os.environ, "SPECMETER_KAFKA_CLUSTER_DIR": str(state_dir), **env})
        #: the three brokers' bootstrap list, once started
        self.bootstrap = ""

    def _run(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(
            [str(BROKER_SCRIPT), "cluster", *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if proc.returncode != 0:
            raise NoBroker(f"deploy/kafka/broker cluster {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
        return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""

    def start(self) -> str:
        """Start every node that is not running; returns the bootstrap list of the three brokers."""
        self.bootstrap = self._run("start", timeout=600)
        return self.bootstrap

    def start_broker(self, broker: int) -> None:
        """Start one broker (after ``kill`` or ``wipe``) and wait until it serves."""
        self._run("start", str(broker))

    def kill(self, broker: int) -> None:
        """SIGKILL one broker."""
        self._run("kill", str(broker))

    def restart(self, broker: int) -> None:
        """Clean stop and start of one broker (a rolling restart's step)."""
        self._run("restart", str(broker))

    def wipe(self, broker: int) -> None:
        """SIGKILL one broker and empty its disk (a replaced machine); ``start_broker`` brings it back."""
        self._run("wipe", str(broker))

    def stop(self, purge: bool = False) -> None:
        self._run("stop", *(["--purge"] if purge else []))

    def address(self) -> str:
        return self._run("address")

    def log_tail(self, node: int | str = "controller", lines: int = 40) -> str:
        folder = self.state_dir / ("controller" if node == "controller" else f"broker-{node}")
        log = folder / "broker.log"
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:]) if log.exists() else ""

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {node}:\n{self.log_tail(node, lines)}" for node in ("controller", *self.BROKERS))
