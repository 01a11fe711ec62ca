"""Reading the worker's status page (``/specmeter/``) back: its charts and the numbers each
mark carries, and the check that they are the published BatchMetrics'."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specmeter.schemas import BatchMetrics


@dataclass
class Chart:
    """One ``<svg data-chart>``: its attributes and its marks' (attributes with the
    ``<title>`` text under ``"title"``), in document order."""

    attrs: dict[str, str]
    marks: list[dict[str, str]] = field(default_factory=list)

    def values(self) -> dict[str, float]:
        """data-key -> data-value, as numbers."""
        return {m["data-key"]: float(m["data-value"]) for m in self.marks}


class _PageReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: dict[str, Chart] = {}
        self.ids: list[str] = []
        self.tags: list[str] = []
        self.attribute_names: set[str] = set()
        self._chart: Chart | None = None
        self._mark: dict[str, str] | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        self.attribute_names.update(a)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "svg" and "data-chart" in a:
            self._chart = self.charts[a["data-chart"]] = Chart(a)
        elif self._chart is not None and "data-value" in a:
            self._mark = dict(a)
            self._chart.marks.append(self._mark)
        elif tag == "title" and self._mark is not None:
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in ("rect", "circle"):
            self._mark = None
        elif tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        if self._in_title and self._mark is not None:
            self._mark["title"] = self._mark.get("title", "") + data


def read_page(html: str) -> _PageReader:
    reader = _PageReader()
    reader.feed(html)
    reader.close()
    return reader


def read_charts(html: str) -> dict[str, Chart]:
    return read_page(html).charts


def _newest(batches: list[BatchMetrics], has: str) -> float | None:
    """The latest ``closed_at`` among the batches whose ``has`` is set."""
    return max((m.closed_at for m in batches if getattr(m, has)), default=None)


def _the_batch(chart: Chart, batches: list[BatchMetrics], has: str) -> BatchMetrics:
    """The batch a newest-batch chart names, checked to be a newest one with ``has``."""
    named = [
        m for m in batches if m.batch_id == chart.attrs["data-batch"] and (m.run_id or "") == chart.attrs["data-run"]
    ]
    assert len(named) == 1, chart.attrs
    assert named[0].closed_at == _newest(batches, has), "the chart draws the newest batch that has it"
    return named[0]


def assert_page_shows(html: str, batches: list[BatchMetrics]) -> dict[str, Chart]:
    """Every chart of the page carries exactly the numbers of ``batches`` (the newest
    revision of each batch the worker published): the per-batch series, the newest batch's
    breakdowns, and the staleness curve and spread when the metrics have them. Returns the charts."""
    charts = read_charts(html)
    by_key = {(m.run_id or "", m.batch_id): m for m in batches}
    assert len(by_key) == len(batches), "one revision per batch"
    for name, key in (("accept_rate", "spec/accept_rate"), ("tokens_per_verify", "spec/tokens_per_verify")):
        drawn = {(mark["data-run"], mark["data-key"]): mark for mark in charts[name].marks}
        want = {k: m for k, m in by_key.items() if key in m.metrics}
        assert set(drawn) == set(want), name
        for k, mark in drawn.items():
            assert float(mark["data-value"]) == want[k].metrics[key], (name, k)
            assert int(mark["data-revision"]) == want[k].revision, (name, k)
    coverage = charts["coverage"]
    drawn = {(mark["data-run"], mark["data-key"]): mark for mark in coverage.marks}
    assert set(drawn) == set(by_key)
    for k, mark in drawn.items():
        m = by_key[k]
        assert int(mark["data-value"]) == m.partitions_reported, k
        assert int(mark["data-expected"]) == m.partitions_expected, k
        assert mark["data-complete"] == ("true" if m.complete else "false"), k
    assert int(coverage.attrs["data-complete"]) == sum(m.complete for m in batches)
    assert int(coverage.attrs["data-batches"]) == len(batches)

    if _newest(batches, "by_weight_version") is None:
        assert "drift" not in charts
    else:
        m = _the_batch(charts["drift"], batches, "by_weight_version")
        want = {
            (e.weight_version or "", "true" if e.weight_version is not None else "false"): e.metrics["spec/accept_rate"]
            for e in m.by_weight_version or ()
            if "spec/accept_rate" in e.metrics
        }
        got = {(mark["data-key"], mark["data-known"]): float(mark["data-value"]) for mark in charts["drift"].marks}
        assert got == want
    if _newest(batches, "accept_rate_by_position") is None:
        assert "positions" not in charts
    else:
        m = _the_batch(charts["positions"], batches, "accept_rate_by_position")
        got = [(mark["data-key"], float(mark["data-value"])) for mark in charts["positions"].marks]
        assert got == [(str(k), r) for k, r in enumerate(m.accept_rate_by_position or (), start=1)]

    lags: dict[str, list[int]] = {}
    for m in batches:
        for e in m.by_draft_lag or ():
            s = lags.setdefault("unknown" if e.draft_lag is None else str(e.draft_lag), [0, 0, 0])
            s[0] += e.metrics.get("spec/paired_accepted_total", 0)
            s[1] += e.metrics.get("spec/paired_proposed_total", 0)
            s[2] += 1
    lags = {k: v for k, v in lags.items() if v[1] > 0}
    if not lags:
        assert "staleness" not in charts
    else:
        marks = charts["staleness"].marks
        order = sorted(lags, key=lambda k: (k == "unknown", int(k) if k != "unknown" else 0))
        assert [mark["data-key"] for mark in marks] == order, "numeric order of lags, unknown last"
        for mark in marks:
            accepted, proposed, count = lags[mark["data-key"]]
            assert (int(mark["data-accepted"]), int(mark["data-proposed"])) == (accepted, proposed)
            assert int(mark["data-batches"]) == count
            assert float(mark["data-value"]) == accepted / proposed
    if _newest(batches, "tokens_per_verify_distribution") is None:
        assert "spread" not in charts
    else:
        m = _the_batch(charts["spread"], batches, "tokens_per_verify_distribution")
        got = [(mark["data-key"], int(mark["data-value"])) for mark in charts["spread"].marks]
        counts = list(m.tokens_per_verify_distribution or ())
        drawn = len(got)  # buckets from 0: every occupied one, an empty one after the last (issue 47.6)
        assert got == [(str(b), c) for b, c in enumerate(counts[:drawn])]
        assert not any(counts[drawn:]), "a bucket left out is empty"
        assert drawn == len(counts) or counts[drawn - 1] == 0, "an empty bucket marks the edge of the data"
        assert int(charts["spread"].attrs["data-buckets"]) == len(counts)
    return charts


# -- headless Chromium ------------------------------------------------------------------

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str:
    """The Chromium binary; skips the test where there is none (fails under CI=true, where
    ``.ci/run``'s deploy/dev test installed it)."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    reason = "no Chromium (deploy/dev test installs Debian's chromium package where apt-get exists)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: in CI the browser test must run")
    pytest.skip(reason)


def _chromium(binary: str, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Headless Chromium, as root too (no sandbox), its own throw-away profile."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="specmeter-chromium-") as profile:
        return subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def dump_dom(binary: str, url: str) -> str:
    """The page's DOM after Chromium loaded it (what it drew from)."""
    proc = _chromium(binary, "--dump-dom", url)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def screenshot(binary: str, url: str, path: Path, *, width: int = 1280, height: int = 1640) -> None:
    proc = _chromium(binary, f"--window-size={width},{height}", f"--screenshot={path}", url)
    assert proc.returncode == 0 and path.is_file(), proc.stderr[-2000:]
