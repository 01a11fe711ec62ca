"""The status page byte for byte (issue 45): its HTML, every chart's SVG inline, for a
synthetic fleet with and without draft lags and for a page of hostile strings, written to
tests/golden/status_page/ by the code before the page's charts went through the one chart
module (``streams/chart.py``) and its panels became one table of definitions.

Regenerate only for an intended change of output: ``SPECMETER_WRITE_GOLDEN=1 pytest
tests/test_status_page_golden.py``, and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from specmeter.schemas import BatchMetrics
from specmeter.streams.report.status_page import render_page

from .test_status_page import fleet_metrics, with_revision5

GOLDEN = Path(__file__).parent / "golden" / "status_page"
WRITE = os.environ.get("SPECMETER_WRITE_GOLDEN") == "1"


def _hostile() -> list[BatchMetrics]:
    evil = '<script>alert("x")</script>&'
    return [msgspec.structs.replace(m, batch_id=f"{evil}{i}", run_id=evil) for i, m in enumerate(fleet_metrics(3))]


CASES = {
    "fleet": lambda: fleet_metrics(),
    "fleet-no-lags": lambda: [
        msgspec.structs.replace(m, tokens_per_verify_distribution=None) for m in fleet_metrics(draft_lags=False)
    ],
    "revision5": lambda: with_revision5(fleet_metrics()),
    "many": lambda: with_revision5(fleet_metrics(batches=40, seed=7)),
    "hostile": _hostile,
    "empty": lambda: [],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_page_is_byte_for_byte_what_it_was(name):
    page = render_page(CASES[name](), worker="w<1>", refresh_s=10, now_s=1_700_000_000.0).encode()
    golden = GOLDEN / f"{name}.html"
    if WRITE:
        golden.write_bytes(page)
    assert page == golden.read_bytes(), f"{golden.name} changed"
