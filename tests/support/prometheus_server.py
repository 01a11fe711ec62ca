"""A real Prometheus server for tests: started on a free port with a generated config,
scraping the given targets (and evaluating the given rule files), queried through its
HTTP API, stopped (log kept for failures).

The binary is Debian's ``prometheus`` package, unpacked into ``.venv/bin`` by
``deploy/dev`` (``ensure_promtool``); tests skip when it is not there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .tools import find_tool, free_port


class PrometheusError(RuntimeError):
    """A query Prometheus refused (bad PromQL) or a server that would not start."""


class PrometheusServer:
    """One Prometheus process with its own data directory; use as a context manager."""

    def __init__(
        self,
        targets: list[str],
        *,
        scrape_interval_s: float = 1.0,
        binary: str | None = None,
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.binary = binary or find_tool("prometheus")
        if self.binary is None:
            raise FileNotFoundError(
                "prometheus not found: `deploy/dev test` unpacks it from Debian's prometheus "
                "package into .venv/bin (or install the prometheus package)"
            )
        self.targets = targets
        self.scrape_interval_s = scrape_interval_s
        #: rule files it evaluates (every scrape interval), copied into its directory
        self.rule_files = list(rule_files)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="specmeter-prometheus-"))
        self.log_path = self.dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return json.dumps(
            {  # JSON is YAML
                "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
                "rule_files": [str(self.dir / f"rules-{i}-{p.name}") for i, p in enumerate(self.rule_files)],
                "scrape_configs": [
                    {"job_name": "specmeter", "metrics_path": "/metrics", "static_configs": [{"targets": self.targets}]}
                ],
            },
            indent=2,
        )

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        config = self.dir / "prometheus.yml"
        config.write_text(self.config())
        for i, rules in enumerate(self.rule_files):
            (self.dir / f"rules-{i}-{rules.name}").write_text(rules.read_text())
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready in {timeout_s}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no prometheus log)"

    # -- the HTTP API -------------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        """``data`` of a GET on ``/api/v1/<path>``; raises PrometheusError on an error answer."""
        query = urllib.parse.urlencode(
            [(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, list) else [vs]) if v is not None]
        )
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The result of an instant query: ``[{"metric": {...}, "value": [t, "v"]}, ...]``
        (for a range selector: ``"values"``)."""
        return self.api("query", query=expr, time=at)["result"]

    def value(self, expr: str, at: float | None = None) -> float:
        """The single value of an instant query that must return exactly one sample."""
        result = self.query(expr, at)
        if len(result) != 1:
            raise AssertionError(f"{expr!r} returned {len(result)} series, expected 1: {result}")
        return float(result[0]["value"][1])

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` lists."""
        return self.api(f"label/{label}/values", **{"match[]": match})

    def targets_up(self) -> int:
        return sum(1 for t in self.api("targets")["activeTargets"] if t["health"] == "up")
