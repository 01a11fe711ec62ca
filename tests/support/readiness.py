"""What a Kubernetes readiness probe sees of a worker: its ``/specmeter/readyz``, asked
over HTTP (the cluster tests and ``bench/cluster_hold.py``)."""

from __future__ import annotations

import threading
import time

from .tools import get_json

#: how often the probe asks (a Kubernetes readiness probe's period is seconds)
PROBE_EVERY_S = 0.5


class ReadinessProbe:
    """``/specmeter/readyz`` every ``PROBE_EVERY_S``, from a thread: each answer as (time,
    status, body), the time ``time.monotonic()`` less ``t0``. No answer at all is status 0,
    as unready as it gets."""

    def __init__(self, port: int, t0: float = 0.0) -> None:
        self.port, self.t0 = port, t0
        self.answers: list[tuple[float, int, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            try:
                status, body = get_json(self.port, "/specmeter/readyz")
            except (OSError, ValueError) as exc:  # no answer, or not the page's JSON
                status, body = 0, {"error": repr(exc)}
            self.answers.append((time.monotonic() - self.t0, status, body))

    def start(self) -> ReadinessProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def unready(self, since: float) -> list[tuple[float, int, dict]]:
        return [a for a in self.answers if a[0] >= since and a[1] != 200]


def wait_ready_over_http(port: int, timeout_s: float = 120.0) -> None:
    """Until the worker on ``port`` answers ready (TimeoutError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if get_json(port, "/specmeter/readyz")[0] == 200:
                return
        except (OSError, ValueError):  # not serving yet
            pass
        time.sleep(PROBE_EVERY_S)
    raise TimeoutError(f"the worker on port {port} never answered ready")
