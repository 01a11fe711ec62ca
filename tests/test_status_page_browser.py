"""The status page in a real browser (issue 39 item 5): a real worker fed by ``loadgen``,
its ``/specmeter/`` loaded in headless Chromium, every chart's numbers read back from the
DOM Chromium built and compared with the BatchMetrics read from the metrics topic.

Chromium is Debian's ``chromium`` package (deploy/dev test installs it where apt-get
exists); the test skips where there is none, and fails instead under CI=true. Driven by
its own command line (``--dump-dom``, ``--screenshot``), no driver library.

SPECMETER_STATUS_SCREENSHOT=PATH also writes the page's screenshot there (how
docs/img/status-page.png is made).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from .support.status_page import assert_page_shows, dump_dom, find_chromium, read_page, screenshot
from .support.tools import free_port, run_specmeter
from .support.worker_harness import latest_by_batch, wait_complete

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: a run id a page must escape (the screenshot for the docs uses a plain one)
HOSTILE_RUN = 'grpo-7 <script>alert("run")</script> & co'


def page_batches(port: int) -> int:
    """How many batches the page draws now (its coverage chart has one bar per batch)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/", timeout=5) as answer:
        assert answer.headers.get_content_type() == "text/html"
        html = answer.read().decode()
    coverage = read_page(html).charts.get("coverage")
    return 0 if coverage is None else len(coverage.marks)


def test_the_status_page_in_chromium_shows_the_published_metrics(deployment, tmp_path):
    chromium = find_chromium()
    shot_to = os.environ.get("SPECMETER_STATUS_SCREENSHOT")
    run_id = "grpo-7" if shot_to else HOSTILE_RUN
    d = deployment
    port = free_port()
    worker = d.start_worker("--web-port", str(port), "--web-host", "127.0.0.1")
    d.wait_ready(worker)
    expect = tmp_path / "expect.jsonl"
    fed = run_specmeter(
        "loadgen",
        "--broker",
        d.bootstrap,
        "--topic",
        d.topics.records,
        "--run-id",
        run_id,
        "--batches",
        "12",
        "--sessions-per-batch",
        "40",
        "--draft-refresh",
        "6",
        "--expect",
        str(expect),
        "--no-progress",
        timeout=120,
    )
    assert fed.returncode == 0, fed.stderr
    batches = {json.loads(line)["batch_id"] for line in expect.read_text().splitlines()}
    assert len(batches) == 12
    latest = latest_by_batch(wait_complete(d, batches))
    published = [latest[b] for b in sorted(batches)]
    assert all(m.run_id == run_id for m in published)

    deadline = time.monotonic() + 30
    while page_batches(port) < len(batches):  # it observes a batch as it sends it
        assert time.monotonic() < deadline, "the page did not show every batch"
        time.sleep(0.5)

    url = f"http://127.0.0.1:{port}/specmeter/"
    dom = dump_dom(chromium, url)
    charts = assert_page_shows(dom, published)
    assert len(charts["accept_rate"].marks) == len(batches)
    assert len(charts["drift"].marks) >= 2, "loadgen mixes policy versions into each batch"
    assert charts["positions"].marks, "and EAGLE3's histograms give acceptance by draft position"
    assert charts["coverage"].attrs["data-complete"] == str(len(batches))
    page = read_page(dom)
    assert "script" not in page.tags, "the hostile run id stayed text"
    if run_id == HOSTILE_RUN:
        assert run_id not in dom and "grpo-7 &lt;script&gt;" in dom

    png = tmp_path / "status-page.png"
    screenshot(chromium, url, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if shot_to:
        shutil.copyfile(png, Path(shot_to))
