"""The worker's web server listens where it says (issue 47.0): Faust bound every interface
(its own ``web_bind``) while the worker logged 127.0.0.1. Checked on the listening
socket itself, as ``ss -ltn`` sees it, not on the settings."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest

from specmeter.streams.worker.app import listening_hosts

from .support.tools import free_port, get_json


def _proc_listening(pid: int, port: int) -> set[str]:
    """The addresses process ``pid`` listens on at TCP ``port``, from /proc: its socket
    inodes (/proc/PID/fd) matched to the kernel's table of TCP sockets in LISTEN state."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            host_hex, port_hex = local.split(":")
            if state == "0A" and inode in inodes and int(port_hex, 16) == port:
                found.add(_host(host_hex, family))
    return found


def _host(hex_address: str, family: int) -> str:
    """An address of /proc/net/tcp[6] (host byte order, 32-bit words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, words)


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _other_addresses() -> list[str]:
    """Addresses of this machine other than 127.0.0.1 that a client could connect to: another
    loopback address (a server bound to 127.0.0.1 refuses it, one on every interface takes
    it) and the address of the default route's interface, when there is one."""
    addresses = ["127.0.0.2"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            own = probe.getsockname()[0]
        except OSError:
            own = "127.0.0.1"
    if not own.startswith("127."):
        addresses.append(own)
    return addresses


def _web_line(log: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"web server on (.*?): /metrics", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"no web server line in {timeout_s}s:\n{log.read_text()[-3000:]}")


def test_listening_hosts_reads_the_sockets_this_process_listens_on():
    with socket.socket() as listening, socket.socket() as bound_only:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert listening_hosts(port) == ["127.0.0.1"]
        bound_only.bind(("127.0.0.1", 0))  # bound, not listening: no server
        assert listening_hosts(bound_only.getsockname()[1]) == []


@pytest.mark.kafka
@pytest.mark.parametrize("web_host", [None, "0.0.0.0"], ids=["default", "every-interface"])
def test_the_worker_listens_on_the_web_host_and_says_where_it_listens(deployment, web_host):
    port = free_port()
    worker = deployment.start_worker("--web-port", str(port), *(("--web-host", web_host) if web_host else ()))
    deployment.wait_ready(worker)
    line = _web_line(deployment.logs[0])
    listening = _proc_listening(worker.pid, port)
    status, stats = get_json(port, "/specmeter/stats")
    others = {host: _connects(host, port) for host in _other_addresses()}
    if web_host is None:  # the default: loopback, and nothing else accepts a connection
        assert listening == {"127.0.0.1"}, listening
        assert not any(others.values()), others
        assert line == f"http://127.0.0.1:{port}", line
    else:
        assert listening == {"0.0.0.0"}, listening
        assert all(others.values()), others
        assert line.startswith(f"http://0.0.0.0:{port} (every interface"), line
    assert status == 200 and stats["web_listening"] == [f"{host}:{port}" for host in sorted(listening)], stats
