"""The status page's renderer (issue 39 item 5): values in, SVG out.

``report.svg`` draws marks whose numbers a test can read back (``data-value``, ``<title>``);
``report.status_page`` turns recent BatchMetrics into the page. Checked here on metrics
the offline core computes for a synthetic fleet and on metrics built by hand (revision 5's
``by_draft_lag`` and ``tokens_per_verify_distribution``, which the stream does not fill
yet): every chart's numbers equal the metrics', and no user string (batch id, run id,
weight version) reaches the page unescaped. The page in a real browser, from a real
worker: tests/test_status_page_browser.py.
"""

from __future__ import annotations

import math
import re

import msgspec
import pytest

from specmeter.schemas import BatchMetrics, DraftLagMetrics, WeightVersionMetrics
from specmeter.streams import OfflineAggregator
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet
from specmeter.streams.report.status_page import RecentBatches, bucket_range, render_page, staleness
from specmeter.streams.report.svg import Mark, bar_chart, number, point_chart

from .support.status_page import assert_page_shows, read_charts, read_page


def fleet_metrics(batches: int = 6, seed: int = 3, *, draft_lags: bool = True) -> list[BatchMetrics]:
    """What the offline core publishes for a synthetic fleet (weight versions, histograms,
    tasks and, unless told otherwise, draft lags)."""
    aggregator = OfflineAggregator()
    spec = FleetSpec(batches=batches, sessions_per_batch=20, seed=seed, draft_lags=draft_lags)
    for event in synthetic_fleet(spec):
        if event.kind in ("record", "marker"):
            aggregator.feed(event.payload)
    return sorted(aggregator.results(), key=lambda m: m.batch_id)


def lag_entry(lag: int | None, accepted: int, proposed: int) -> DraftLagMetrics:
    return DraftLagMetrics(
        draft_lag=lag,
        metrics={
            "spec/paired_accepted_total": accepted,
            "spec/paired_proposed_total": proposed,
            "spec/accept_rate": accepted / proposed,
        },
        accept_histogram=None,
    )


def with_revision5(metrics: list[BatchMetrics]) -> list[BatchMetrics]:
    """The batches with a draft-lag breakdown (lags 0-2 and unknown, the unknown last; one
    batch without) and a spread of 64 buckets, as the stream will publish them."""
    out = []
    for i, m in enumerate(metrics):
        lags = None if i == 1 else [lag_entry(i % 3, 40 + i, 100), lag_entry(2 + i % 2, 7, 30), lag_entry(None, 3, 9)]
        distribution = [(b * (i + 1)) % 7 for b in range(64)]
        out.append(msgspec.structs.replace(m, by_draft_lag=lags, tokens_per_verify_distribution=distribution))
    return out


# -- the SVG ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (0, "0"), (0.1, "0.1"), (1 / 3, "0.3333333333333333"), (2.0, "2.0"), (True, "1"), (1e-20, "1e-20")],
)
def test_a_number_is_written_exactly(value, text):
    assert number(value) == text
    assert float(text) == value


def test_each_bar_carries_its_number_key_and_title():
    marks = [Mark(key="a", value=0.25, label="A", title="a is 0.25"), Mark(key="b", value=3, title="b is 3")]
    chart = read_charts(bar_chart("c1", "a chart", marks, y_max=4.0))["c1"]
    assert chart.attrs["data-kind"] == "bar"
    assert [(m["data-key"], m["data-value"], m["title"]) for m in chart.marks] == [
        ("a", "0.25", "a is 0.25"),
        ("b", "3", "b is 3"),
    ]


def test_a_bar_chart_may_write_each_value_above_its_bar():
    marks = [Mark(key="a", value=0.25), Mark(key="b", value=0.5)]
    assert 'class="value"' not in bar_chart("c", "t", marks)
    svg = bar_chart("c", "t", marks, value_format=".3f")
    assert svg.count('class="value"') == 2 and ">0.250<" in svg and ">0.500<" in svg


def test_bar_heights_are_proportional_to_the_values():
    marks = [Mark(key=str(v), value=v) for v in (1, 2, 4)]
    chart = read_charts(bar_chart("c", "t", marks, y_max=4.0))["c"]
    heights = [float(m["height"]) for m in chart.marks]
    assert heights[1] == pytest.approx(2 * heights[0], abs=0.15)
    assert heights[2] == pytest.approx(4 * heights[0], abs=0.15)


def test_points_run_left_to_right_and_higher_values_sit_higher():
    marks = [Mark(key=str(i), value=v) for i, v in enumerate((0.2, 0.8, 0.5))]
    chart = read_charts(point_chart("p", "t", marks, y_max=1.0))["p"]
    xs = [float(m["cx"]) for m in chart.marks]
    ys = [float(m["cy"]) for m in chart.marks]
    assert xs == sorted(xs)
    assert ys[1] < ys[2] < ys[0], "SVG's y grows downwards"


def test_the_axis_grows_past_a_value_above_its_top_and_a_non_finite_value_is_still_written():
    marks = [Mark(key="big", value=7.3), Mark(key="nan", value=math.nan)]
    svg = bar_chart("c", "t", marks, y_max=1.0)
    chart = read_charts(svg)["c"]
    assert chart.values()["big"] == 7.3
    assert math.isnan(chart.values()["nan"])
    assert ">8.00<" in svg and ">2.00<" in svg, "the axis tops at a round number above 7.3, in round quarters"


@pytest.mark.parametrize(
    ("largest", "y_format", "ticks"),
    [
        (2.41, ".2f", ["0.00", "0.75", "1.50", "2.25", "3.00"]),
        (0.037, ".2f", ["0.00", "0.01", "0.02", "0.03", "0.04"]),
        (45, ".0f", ["0", "15", "30", "45", "60"]),
        (200, ".0f", ["0", "50", "100", "150", "200"]),
        (3, ".0f", ["0", "1", "2", "3", "4"]),
    ],
)
def test_the_axis_ticks_are_round_and_read_exactly(largest, y_format, ticks):
    svg = bar_chart("c", "t", [Mark(key="a", value=largest)], y_format=y_format)
    assert re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg) == ticks


def test_an_empty_chart_says_so():
    svg = point_chart("e", "t", [])
    assert read_charts(svg)["e"].marks == []
    assert "nothing to draw yet" in svg


def test_every_string_is_escaped_in_the_svg():
    evil = "\"><script>alert(1)</script><x a='"
    marks = [Mark(key=evil, value=1, label=evil, title=evil, attrs={"run": evil})]
    svg = bar_chart(evil, evil, marks, attrs={"batch": evil}, x_label=evil, y_label=evil)
    assert "<script" not in svg and "<x " not in svg
    chart = read_charts(svg)[evil]
    assert chart.attrs["data-batch"] == evil
    (mark,) = chart.marks
    assert (mark["data-key"], mark["data-run"], mark["title"]) == (evil, evil, evil)


# -- the page -------------------------------------------------------------------------------


def test_recent_batches_keep_the_newest_revision_of_the_last_batches_in_publication_order():
    base = fleet_metrics(batches=3)
    recent = RecentBatches(keep=2)
    a, b, c = base
    recent.observe(a)
    recent.observe(b)
    recent.observe(msgspec.structs.replace(a, revision=1, record_count=99))
    recent.observe(a)  # an older revision (a repeat) changes nothing
    assert [(m.batch_id, m.revision) for m in recent.batches()] == [(a.batch_id, 1), (b.batch_id, 0)]
    recent.observe(c)
    assert [m.batch_id for m in recent.batches()] == [b.batch_id, c.batch_id]
    other_run = msgspec.structs.replace(c, run_id="another")
    recent.observe(other_run)
    assert [(m.run_id, m.batch_id) for m in recent.batches()] == [(None, c.batch_id), ("another", c.batch_id)]


def test_the_page_draws_the_published_numbers_of_a_fleet():
    batches = fleet_metrics()
    html = render_page(batches, worker="w")
    charts = assert_page_shows(html, batches)
    assert set(charts) == {"accept_rate", "tokens_per_verify", "coverage", "drift", "positions", "staleness", "spread"}
    assert len(charts["accept_rate"].marks) == len(batches)
    assert len(charts["drift"].marks) >= 2 and len(charts["positions"].marks) >= 2
    assert '<meta http-equiv="refresh" content="10">' in html


def test_a_fleet_without_draft_lags_says_the_staleness_and_spread_panels_are_absent():
    batches = [msgspec.structs.replace(m, tokens_per_verify_distribution=None) for m in fleet_metrics(draft_lags=False)]
    html = render_page(batches, worker="w")
    charts = assert_page_shows(html, batches)
    assert set(charts) == {"accept_rate", "tokens_per_verify", "coverage", "drift", "positions"}
    page = read_page(html)
    assert {"panel-staleness", "panel-spread"} <= set(page.ids), "said absent, not left out silently"


def test_the_page_draws_the_staleness_curve_and_the_spread_when_the_metrics_have_them():
    batches = with_revision5(fleet_metrics())
    html = render_page(batches, worker="w", refresh_s=0)
    charts = assert_page_shows(html, batches)
    assert [m["data-key"] for m in charts["staleness"].marks] == ["0", "1", "2", "3", "unknown"]
    zero = charts["staleness"].marks[0]
    # lag 0: batches 0 and 3 (batch 1 has no breakdown): (40 + 0 + 40 + 3) of 200
    assert (zero["data-accepted"], zero["data-proposed"], zero["data-batches"]) == ("83", "200", "2")
    assert float(zero["data-value"]) == 83 / 200
    assert staleness(batches)[0] == (0, 83, 200, 2)
    spread = charts["spread"]
    assert len(spread.marks) == 64
    assert spread.attrs["data-batch"] == batches[-1].batch_id
    assert spread.marks[0]["title"].startswith("< 1.25 tokens per verify step")
    assert "http-equiv" not in html


def test_the_newest_batch_is_the_last_closed_whatever_the_order_published():
    batches = with_revision5(fleet_metrics())
    first = msgspec.structs.replace(batches[0], closed_at=batches[-1].closed_at + 60)
    reordered = [first, *batches[1:]]
    charts = assert_page_shows(render_page(reordered, worker="w"), reordered)
    for name in ("drift", "positions", "spread"):
        assert charts[name].attrs["data-batch"] == first.batch_id, name


def test_an_incomplete_batch_is_drawn_apart_and_counted():
    batches = [
        msgspec.structs.replace(m, complete=i != 1, partitions_reported=3 if i == 1 else 4, partitions_expected=4)
        for i, m in enumerate(fleet_metrics(batches=3))
    ]
    charts = assert_page_shows(render_page(batches, worker="w"), batches)
    coverage = charts["coverage"]
    assert coverage.attrs["data-complete"] == "2"
    assert [m["class"] for m in coverage.marks] == ["mark", "mark incomplete", "mark"]


@pytest.mark.parametrize(
    ("bucket", "text"), [(0, "< 1.25"), (1, "[1.25, 1.50)"), (6, "[2.50, 2.75)"), (63, ">= 16.75")]
)
def test_a_spread_bucket_is_named_by_its_range(bucket, text):
    assert bucket_range(bucket) == text


def test_no_batch_yet():
    html = render_page([], worker="w")
    assert read_charts(html) == {}
    assert "No batch published by this worker yet" in html


EVIL = [
    "<script>alert('batch')</script>",
    '"><img src=x onerror=alert(1)>',
    "</svg><svg onload=alert(2)>",
    "a&b<c>'d\"",
]


@pytest.mark.parametrize("evil", EVIL)
def test_user_strings_never_reach_the_page_unescaped(evil):
    m = fleet_metrics(batches=1)[0]
    versions = [
        WeightVersionMetrics(weight_version=evil, metrics={"spec/accept_rate": 0.5}, accept_histogram=None),
        *(m.by_weight_version or ()),
    ]
    m = msgspec.structs.replace(
        m,
        batch_id=evil,
        run_id=evil,
        speculative_algorithm=evil,
        by_weight_version=versions,
        tokens_per_verify_distribution=[1] * 64,
    )
    html = render_page([m], worker=evil)
    assert evil not in html
    page = read_page(html)
    assert "script" not in page.tags and "img" not in page.tags
    assert page.tags.count("svg") == len(read_charts(html)), "no svg element beside the charts"
    assert not any(name.startswith("on") for name in page.attribute_names), "no event handler"
    charts = assert_page_shows(html, [m])
    assert charts["drift"].marks[0]["data-key"] == evil
    assert charts["accept_rate"].marks[0]["data-key"] == evil
    assert charts["accept_rate"].marks[0]["data-run"] == evil


# -- issue 47.6: what the page cut off or wasted -------------------------------------------
#: DejaVu Sans' advance widths in font units (2048 an em), read from DejaVuSans.ttf's hmtx
#: table for the characters of batch ids, versions and bucket names; any other counts 1 em
DEJAVU_SANS = {
    **dict.fromkeys("0123456789", 1303),
    **{".": 651, "-": 739, "+": 1716, "<": 1716, "_": 1024, "/": 690, " ": 651, "(": 799, ")": 799},
    **{"e": 1260, "p": 1300, "s": 1067, "t": 803, "v": 1212, "r": 842, "u": 1298, "n": 1298, "a": 1255},
    **{"g": 1300, "i": 569, "o": 1253, "l": 569, "c": 1126, "h": 1298, "k": 1186, "x": 1212, "m": 1995},
}


def label_extent(x: float, anchor: str, text: str, font_px: float = 10.0) -> tuple[float, float]:
    """Where a label written in DejaVu Sans at ``font_px`` starts and ends."""
    width = sum(DEJAVU_SANS.get(c, 2048) for c in text) / 2048 * font_px
    start = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
    return start, start + width


@pytest.mark.parametrize("batches", [6, 48])
def test_no_x_axis_label_runs_past_its_chart(batches):
    """The newest batch's name under the per-batch charts ran past the chart's right edge."""
    from specmeter.streams.report.svg import WIDTH

    html = render_page(with_revision5(fleet_metrics(batches=batches)), worker="w")
    charts = re.findall(r'<svg class="chart" id="(\w+)"(.*?)</svg>', html, re.S)
    seen = 0
    for chart, body in charts:
        for x, anchor, text in re.findall(
            r'<text class="xlabel" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)">([^<]*)</text>', body
        ):
            start, end = label_extent(float(x), anchor, text)
            assert start >= 0 and end <= WIDTH, (chart, text, start, end)
            seen += 1
    assert seen >= 20
    last = re.findall(r'class="xlabel"[^>]*>([^<]*)</text>', dict(charts)["accept_rate"])[-1]
    assert last == f"step-{batches - 1:05d}", "the newest batch is still named"


def test_the_spread_draws_the_occupied_buckets_not_the_empty_tail():
    """Issue 47.6: 85 % of the spread chart's width went to empty buckets (a fleet's
    generations rarely pass 3 or 4 tokens per verify step); it draws bucket 0 to one past
    the last occupied one, and says where nothing is drawn."""
    batches = fleet_metrics()
    newest = batches[-1].tokens_per_verify_distribution
    last = max(b for b, count in enumerate(newest) if count)
    assert last < 20, newest  # the synthetic fleet's steps stay below 6 tokens
    html = render_page(batches, worker="w")
    charts = assert_page_shows(html, batches)
    spread = charts["spread"]
    assert [mark["data-key"] for mark in spread.marks] == [str(b) for b in range(max(last + 2, 9))]
    assert f"None at {1 + max(last + 2, 9) / 4:.2f} or more: those buckets are not drawn." in html
    labels = re.findall(r'class="xlabel"[^>]*>([^<]*)</text>', html.split('id="spread"')[1].split("</svg>")[0])
    assert labels[:3] == ["&lt;1.25", "2", "3"], "each whole token named"
    # a distribution to the last bucket is drawn whole, and says nothing of undrawn buckets
    whole = with_revision5(batches)
    html = render_page(whole, worker="w")
    assert len(assert_page_shows(html, whole)["spread"].marks) == 64 and "not drawn" not in html
