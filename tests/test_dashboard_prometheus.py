"""The Grafana dashboard and the alert rules proven against a real Prometheus (issues #13, #23).

Two workers share the partitions of one stream; a real Prometheus scrapes both
every second and evaluates deploy/prometheus/alerts.yml. Batches with several
policy versions are published in waves, then late records make new revisions (one
adds a generation, one turns a key conflicting, which takes counters back). Every
expression of the dashboard is then evaluated through Prometheus' HTTP API and
checked against the exact BatchMetrics read from the output topic: acceptance by
draft position fleet-wide to float rounding, the newest batch's gauges, acceptance
by version age, by task (issue 31), and the draft-budget curve the recording rules
make of the per-position counters, exactly as the batches' histograms give it. Last,
one worker is stopped and the alerts panel shows its alert.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import urllib.request
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import yaml

from specmeter.producers import Publisher, PublisherSettings
from specmeter.schemas import BatchMetrics, GenerationRecord
from specmeter.streams.fleet.synthetic import FleetEvent, FleetSpec, synthetic_fleet

from .support.kafka_helpers import create_topic
from .support.prometheus_server import PrometheusServer
from .support.tools import find_tool, free_port
from .support.worker_harness import JUNK, Deployment, latest_by_batch, publish_events, wait_complete

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dashboards" / "specmeter.json"
ALERTS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"
SCRAPE_S = 1.0
#: a session's policy version, by a stable hash of its id: a tenth unknown, the rest v1..v3
VERSIONS = (None, "v1", "v1", "v1", "v2", "v2", "v2", "v3", "v3", "v3")

#: counter stem -> the exact value of one BatchMetrics it sums
EXACT = {
    "batches": lambda m: 1,
    "paired_accepted_tokens": lambda m: m.metrics.get("spec/paired_accepted_total", 0),
    "paired_proposed_tokens": lambda m: m.metrics.get("spec/paired_proposed_total", 0),
    "paired_completion_tokens": lambda m: m.metrics.get("spec/paired_completion_total", 0),
    "paired_verify_steps": lambda m: m.metrics.get("spec/paired_verify_total", 0),
    "accepted_tokens": lambda m: m.metrics.get("spec/accepted_total", 0),
    "proposed_tokens": lambda m: m.metrics.get("spec/proposed_total", 0),
    "completion_tokens": lambda m: m.metrics.get("spec/completion_total", 0),
    "verify_steps": lambda m: m.metrics.get("spec/verify_total", 0),
    "accept_covered_generations": lambda m: m.metrics.get("spec/accept_covered_count", 0),
    "verify_covered_generations": lambda m: m.metrics.get("spec/verify_covered_count", 0),
    "generations": lambda m: m.metrics.get("spec/unique_generation_count", 0),
    "conflicting_generations": lambda m: m.metrics.get("spec/conflicting_generation_count", 0),
    "inconsistent_generations": lambda m: m.metrics.get("spec/inconsistent_generation_count", 0),
    "published_records": lambda m: m.record_count,
    "published_invalid_records": lambda m: m.invalid_record_count,
    "published_late_records": lambda m: m.late_record_count,
    "incomplete_batches": lambda m: 0 if m.complete else 1,
    "position_verify_steps": lambda m: sum(m.accept_histogram or ()),
}
MAX_POSITION = 16


def with_versions(events: list[FleetEvent]) -> list[FleetEvent]:
    """The fleet's records, each carrying its session's policy version; a seventh of the
    sessions lose their task (the unknown task)."""
    out = []
    for e in events:
        if e.kind == "record":
            digest = zlib.crc32(e.payload.session_id.encode())
            task = None if digest % 7 == 0 else e.payload.task
            record = msgspec.structs.replace(e.payload, weight_version=VERSIONS[digest % len(VERSIONS)], task=task)
            e = FleetEvent(e.kind, e.producer_id, e.batch_id, record)
        out.append(e)
    return out


#: the per-task counter families -> the key of a by_task entry each sums
TASK_SUMS = {
    "task_paired_accepted_tokens": "spec/paired_accepted_total",
    "task_paired_proposed_tokens": "spec/paired_proposed_total",
    "task_paired_completion_tokens": "spec/paired_completion_total",
    "task_paired_verify_steps": "spec/paired_verify_total",
}


def exact_rule(expr: str) -> str:
    """A rule's expression on the counters themselves: rate(x[w]) -> x. Over counters that
    start at 0 it is the ratio of what they counted, exactly, where rate() extrapolates."""
    return re.sub(r"rate\((specmeter_[a-z_]+(?:\{[^}]*\})?)\[[0-9a-z]+\]\)", r"\1", expr)


def dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def substitute(expr: str, *, run: str, algorithm: str, window: str) -> str:
    """Grafana's template variables, as Grafana would expand them for one run and algorithm."""
    values = {
        "run": re.escape(run),
        "algorithm": re.escape(algorithm),
        "__rate_interval": window,
        "__range": window,
        "__interval": f"{int(SCRAPE_S)}s",
    }
    out = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)
    assert "$" not in out, out
    return out


def late_records(events: list[FleetEvent], conflicting_in: str, new_in: str) -> list[GenerationRecord]:
    """A late redelivery of a clean key of one batch with another value (the key turns
    conflicting: its counters leave the sums) and a new generation in another batch."""
    values: dict[tuple, set] = defaultdict(set)
    records = [e.payload for e in events if e.kind == "record"]
    for r in records:
        values[(r.batch_id, r.session_id, r.generation_id)].add(msgspec.json.encode(r))
    clean = next(
        r
        for r in records
        if r.batch_id == conflicting_in
        and r.accepted
        and r.proposed
        and len(values[(r.batch_id, r.session_id, r.generation_id)]) == 1
    )
    grown = next(r for r in records if r.batch_id == new_in and r.accepted is not None and r.proposed)
    return [
        msgspec.structs.replace(clean, accepted=clean.accepted - 1, producer_id="late"),
        msgspec.structs.replace(grown, generation_id=grown.generation_id + "/late", producer_id="late"),
    ]


async def publish_late(bootstrap: str, topic: str, records: list[GenerationRecord]) -> None:
    async with Publisher(PublisherSettings(bootstrap_servers=bootstrap, topic=topic, producer_id="late")) as pub:
        for record in records:
            await pub.publish(record)
        await pub.flush()


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/specmeter/stats", timeout=5) as response:
        return json.loads(response.read())


def wait_split(ports: list[int], partitions: int, timeout_s: float = 60.0) -> None:
    """Until the two workers own disjoint, non-empty shares of every records partition
    (publishing during the rebalance would let a restore republish a batch)."""
    deadline = time.monotonic() + timeout_s
    owned: list[set] = []
    while time.monotonic() < deadline:
        try:
            owned = [set(stats(port)["partitions"]) for port in ports]
        except OSError:
            owned = []
        if (
            owned
            and all(owned)
            and set().union(*owned) == set(range(partitions))
            and sum(map(len, owned)) == partitions
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"partitions not split between the workers in {timeout_s}s: {owned}")


@pytest.fixture
def fleet(kafka_bootstrap, request):
    if find_tool("prometheus") is None:
        pytest.skip("prometheus not found (deploy/dev test unpacks it from Debian's prometheus package)")
    d = Deployment(kafka_bootstrap)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, d.partitions))
    ports = [free_port(), free_port()]
    workers = [d.start_worker("--web-port", str(port), "--web-host", "127.0.0.1") for port in ports]
    prometheus = PrometheusServer(
        [f"127.0.0.1:{port}" for port in ports], scrape_interval_s=SCRAPE_S, rule_files=[ALERTS]
    )
    try:
        prometheus.start()
        for worker in workers:
            d.wait_ready(worker)
        wait_split(ports, d.partitions)
        yield d, prometheus, ports
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            print(d.log_tail(), f"\n--- prometheus:\n{prometheus.log_tail()}")
        prometheus.stop()
        prometheus.cleanup()
        d.close()


def test_every_dashboard_query_on_a_real_prometheus_scraping_two_workers(fleet):
    d, prom, ports = fleet
    started = time.time()
    deadline = time.monotonic() + 20
    while prom.targets_up() < 2:
        assert time.monotonic() < deadline, "prometheus does not reach both workers"
        time.sleep(0.2)

    events = with_versions(
        list(
            synthetic_fleet(
                FleetSpec(
                    batches=6,
                    sessions_per_batch=12,
                    producers=2,
                    seed=13,
                    conflict_rate=0.05,
                    inconsistent_rate=0.05,
                    batch_prefix="dash-",
                )
            )
        )
    )
    by_batch: dict[str, list[FleetEvent]] = defaultdict(list)
    for e in events:
        by_batch[e.batch_id].append(e)
    batches = list(by_batch)
    # in waves, a few scrapes apart: a counter series is born with its first batch, so
    # the later waves are what rate() sees growing
    for i, wave in enumerate((batches[0:2], batches[2:4], batches[4:6])):
        asyncio.run(
            publish_events(
                d.bootstrap, d.topics.records, [e for b in wave for e in by_batch[b]], junk=JUNK if i == 0 else ()
            )
        )
        wait_complete(d, set(wave), timeout_s=60)
        time.sleep(2 * SCRAPE_S)
    late = late_records(events, conflicting_in=batches[0], new_in=batches[1])
    asyncio.run(publish_late(d.bootstrap, d.topics.records, late))

    def revised(published: list[BatchMetrics]) -> bool:
        latest = latest_by_batch(published)
        return all(latest[b].revision >= 1 for b in batches[:2])

    published = d.metrics(until=revised, timeout_s=60)
    latest = latest_by_batch(published)
    assert set(latest) == set(batches) and revised(published), d.log_tail()
    first = {m.batch_id: m for m in published if m.revision == 0}
    assert (
        latest[batches[0]].metrics["spec/paired_accepted_total"]
        < first[batches[0]].metrics["spec/paired_accepted_total"]
    ), "the late conflicting record takes counters back"

    # 1. the counters add up, exactly: total - retracted over both workers equals the
    # sum over every batch's latest revision in the topic (polled: the last scrape of
    # each worker must follow its last publication)
    expected = {stem: sum(f(m) for m in latest.values()) for stem, f in EXACT.items()}

    def fleet_counters() -> dict[str, float]:
        return {
            stem: prom.value(f"sum(specmeter_{stem}_total) - sum(specmeter_{stem}_retracted_total)") for stem in EXACT
        }

    got: dict[str, float] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = fleet_counters()
        if got == expected:
            break
        time.sleep(SCRAPE_S / 2)
    assert got == expected
    # the queries below are evaluated at one instant whose samples have all been written
    # (a scrape ends within its 1 s timeout): every query sees the same data
    time.sleep(2 * SCRAPE_S)
    at = time.time() - 1.5 * SCRAPE_S
    assert expected["inconsistent_generations"] > 0, "the fleet has generations whose histogram contradicts them"
    assert prom.value("sum(specmeter_paired_accepted_tokens_retracted_total)") > 0, "a retraction was exported"
    assert len(prom.query("specmeter_batches_total")) == 2, "each worker published some batches"

    # 2. every dashboard expression returns finite data (a name nobody exports fails here);
    # the alerts table is read at the end, once an alert is pending
    run = latest[batches[0]].run_id or ""
    algorithm = latest[batches[0]].speculative_algorithm
    window = f"{int(at - started) + 30}s"  # covers the whole run
    results = {}
    for title, expr in dashboard_targets():
        if expr.startswith("ALERTS"):
            continue
        query = substitute(expr, run=run, algorithm=algorithm, window=window)
        result = prom.query(query, at)
        assert result, f"panel {title!r}: {query} returned no data"
        values = [float(r["value"][1]) for r in result]
        assert all(math.isfinite(v) for v in values), f"panel {title!r}: {query} gave {values}"
        results[expr] = result

    def panel(title: str, index: int = 0) -> list[dict]:
        exprs = [expr for t, expr in dashboard_targets() if t == title]
        return results[exprs[index]]

    # 3. what Prometheus saw the counters grow by over the run: every series from its
    # first sample, which is its real total when first scraped (a counter is born with
    # the first batch that counts in it, and every scrape shows totals as they are:
    # issue 33), plus every increase after it, adds up to the topic's sums exactly: no
    # increase lost, none counted twice, no reset. A rate-of-sums panel is the ratio of
    # what its counters grew at, summed over both workers: each series' own rate() over
    # the window (rate() extrapolates each series to the window's ends on its own, so the
    # ratio of what the counters grew by is near it, not it: a series born late in a short
    # run, as a task's first batch on a worker, moves its ratio by a few per cent)
    def family(stem: str, by: str | None, query: Callable[[str], str], read: Callable[[dict], float]) -> dict:
        """What ``query`` makes of each series of a counter family, read and summed by label
        ``by`` over both workers, the retracted series subtracted."""
        total: dict[str | None, float] = defaultdict(float)
        for name, sign in ((f"specmeter_{stem}_total", 1), (f"specmeter_{stem}_retracted_total", -1)):
            for series in prom.query(query(name), at):
                total[series["metric"][by] if by else None] += sign * read(series)
        return dict(total)

    def samples(stem: str, by: str | None, index: int) -> dict[str | None, float]:
        return family(stem, by, lambda name: f"{name}[{window}]", lambda series: float(series["values"][index][1]))

    def grown(stem: str, by: str | None = None) -> dict[str | None, float]:
        last, first = samples(stem, by, -1), samples(stem, by, 0)
        return {key: last[key] - first[key] for key in last}

    def born_with(stem: str, by: str | None = None) -> dict[str | None, float]:
        return samples(stem, by, 0)

    def rates(stem: str, by: str | None = None) -> dict[str | None, float]:
        return family(stem, by, lambda name: f"rate({name}[{window}])", lambda series: float(series["value"][1]))

    def rate_of_sums(num: str, den: str, by: str | None = None) -> dict[str | None, float]:
        grew, over = rates(num, by), rates(den, by)
        return {key: grew[key] / rate for key, rate in over.items() if rate}

    assert {stem: grown(stem)[None] + born_with(stem)[None] for stem in EXACT} == expected
    assert born_with("batches")[None] > 0, "a series is born with its first batch, shown as it is"
    for title, num, den in (
        ("Accept rate (weighted: rate of sums)", "paired_accepted_tokens", "paired_proposed_tokens"),
        ("Tokens per verify step (rate of sums)", "paired_completion_tokens", "paired_verify_steps"),
    ):
        [series] = panel(title)
        assert series["metric"] == {"algorithm": algorithm}
        assert float(series["value"][1]) == pytest.approx(rate_of_sums(num, den)[None], rel=1e-9), title
    for index, covered in enumerate(("accept_covered_generations", "verify_covered_generations")):
        [series] = panel("Counter coverage", index)
        assert float(series["value"][1]) == pytest.approx(rate_of_sums(covered, "generations")[None], rel=1e-9)

    # 4. acceptance by draft position, fleet-wide: the steps that accepted at least k drafts
    # over the steps with a histogram, summed over every batch's newest revision in the
    # topic, equals what PromQL makes of both workers' counters, to float rounding
    steps = sum(sum(m.accept_histogram or ()) for m in latest.values())
    width = max(len(m.accept_histogram or ()) for m in latest.values())
    assert width > 2, "the stream has draft positions to check"
    topic_rate = {
        str(k): sum(sum((m.accept_histogram or [])[k:]) for m in latest.values()) / steps
        for k in range(1, min(width - 1, MAX_POSITION) + 1)
    }
    exact = prom.query(
        "(sum by (position) (specmeter_position_accepted_steps_total)"
        " - sum by (position) (specmeter_position_accepted_steps_retracted_total))"
        " / on () group_left () "
        "(sum(specmeter_position_verify_steps_total) - sum(specmeter_position_verify_steps_retracted_total))",
        at,
    )
    assert {r["metric"]["position"]: float(r["value"][1]) for r in exact} == pytest.approx(topic_rate, rel=1e-12)
    over_window, first = grown("position_accepted_steps", "position"), born_with("position_accepted_steps", "position")
    steps_seen = grown("position_verify_steps")[None] + born_with("position_verify_steps")[None]
    assert {k: (v + first[k]) / steps_seen for k, v in over_window.items()} == pytest.approx(topic_rate, rel=1e-12)
    curves = {
        r["metric"]["position"]: float(r["value"][1]) for r in panel("Acceptance by draft position (rate of sums)")
    }
    steps_rate = rates("position_verify_steps")[None]
    assert curves == pytest.approx(
        {k: v / steps_rate for k, v in rates("position_accepted_steps", "position").items()}, rel=1e-9
    )
    steps_grown = grown("position_verify_steps")[None]

    # 5. the newest batch (greatest close time, either worker) at its newest revision
    newest = max(latest.values(), key=lambda m: m.closed_at)
    bars = {r["metric"]["position"]: float(r["value"][1]) for r in panel("Acceptance by draft position, newest batch")}
    assert bars == {str(k): rate for k, rate in enumerate(newest.accept_rate_by_position[:MAX_POSITION], start=1)}
    heatmap = {
        int(r["metric"]["accepted"]): float(r["value"][1])
        for r in panel("Acceptance length (drafts accepted per verify step, newest batch)")
    }
    h = newest.accept_histogram
    assert heatmap == dict(enumerate(h[:MAX_POSITION])) | (
        {MAX_POSITION: sum(h[MAX_POSITION:])} if len(h) > MAX_POSITION else {}
    )
    # per worker, the newest batch it published: identified by its close time
    by_close = {m.closed_at * 1000: m for m in latest.values()}
    closed = {r["metric"]["instance"]: float(r["value"][1]) for r in panel("Newest batch of each run, per worker", 7)}
    assert len(closed) == 2 and max(closed.values()) == newest.closed_at * 1000
    for column, read in ((0, lambda m: m.metrics["spec/accept_rate"]), (5, lambda m: m.revision)):
        got = {
            r["metric"]["instance"]: float(r["value"][1]) for r in panel("Newest batch of each run, per worker", column)
        }
        assert got == {instance: read(by_close[ms]) for instance, ms in closed.items()}
    letters = {r["metric"]["reason"] for r in panel("Dead letters by reason")}
    assert letters, "junk was dead-lettered"
    assert "EAGLE3" in prom.label_values("algorithm", "specmeter_batches_total")
    assert run == "" or run in prom.label_values("run_id", "specmeter_batches_total")

    # 6. drift: acceptance by version age (how many weight versions a generation's policy is
    # behind the newest one in its batch), from by_weight_version read naively
    def ages(m: BatchMetrics) -> dict[str | None, str]:
        named = sorted((e.weight_version for e in m.by_weight_version if e.weight_version), key=lambda v: -int(v[1:]))
        return {None: "unknown", **{v: str(i) if i < 4 else "4+" for i, v in enumerate(named)}}

    assert all(m.by_weight_version for m in latest.values()), "every batch knows its versions"
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in latest.values():
        age = ages(m)
        for entry in m.by_weight_version:
            sums[age[entry.weight_version]][0] += entry.metrics["spec/paired_accepted_total"]
            sums[age[entry.weight_version]][1] += entry.metrics["spec/paired_proposed_total"]
    assert {"0", "1", "unknown"} <= set(sums), sums
    for stem, i in (("version_age_paired_accepted_tokens", 0), ("version_age_paired_proposed_tokens", 1)):
        net = prom.query(
            f"sum by (version_age) (specmeter_{stem}_total) - sum by (version_age) (specmeter_{stem}_retracted_total)",
            at,
        )
        assert {r["metric"]["version_age"]: float(r["value"][1]) for r in net} == {a: s[i] for a, s in sums.items()}
    drift = {
        r["metric"]["version_age"]: float(r["value"][1])
        for r in panel("Policy drift: accept rate by version age (rate of sums)")
    }
    assert drift == pytest.approx(
        rate_of_sums("version_age_paired_accepted_tokens", "version_age_paired_proposed_tokens", "version_age"),
        rel=1e-9,
    ), "the panel is the ratio of what the counters grew at"
    newest_age = ages(newest)
    table = {r["metric"]["version_age"]: float(r["value"][1]) for r in panel("Newest batch by version age")}
    assert table == {
        newest_age[e.weight_version]: e.metrics["spec/accept_rate"]
        for e in newest.by_weight_version
        if "spec/accept_rate" in e.metrics
    }
    matrix = {
        (r["metric"]["version_age"], r["metric"]["position"]): float(r["value"][1])
        for r in panel("Acceptance by draft position and version age, newest batch")
    }
    assert matrix == {
        (newest_age[e.weight_version], str(k)): rate
        for e in newest.by_weight_version
        for k, rate in enumerate((e.accept_rate_by_position or [])[:MAX_POSITION], start=1)
    }

    # 7. by task: each task's sums over both workers equal the sum of its by_task entries over
    # every batch's newest revision (generations without a task: "(unknown)"); the panels are
    # the ratios of what those counters grew at (section 3)
    task_sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for m in latest.values():
        assert m.by_task, "every batch knows some tasks"
        for entry in m.by_task:
            for stem, key in TASK_SUMS.items():
                task_sums["(unknown)" if entry.task is None else entry.task][stem] += entry.metrics[key]
    assert {"chat", "gsm8k", "swe-bench", "(unknown)"} <= set(task_sums), set(task_sums)
    for stem in TASK_SUMS:
        net = prom.query(
            f"sum by (task) (specmeter_{stem}_total) - sum by (task) (specmeter_{stem}_retracted_total)", at
        )
        assert {r["metric"]["task"]: float(r["value"][1]) for r in net} == {t: s[stem] for t, s in task_sums.items()}
    for title, num, den in (
        ("Accept rate by task (rate of sums)", "task_paired_accepted_tokens", "task_paired_proposed_tokens"),
        ("Tokens per verify step by task (rate of sums)", "task_paired_completion_tokens", "task_paired_verify_steps"),
    ):
        shown = {r["metric"]["task"]: float(r["value"][1]) for r in panel(title)}
        assert shown == pytest.approx(rate_of_sums(num, den, "task"), rel=1e-9), title

    # 8. the draft-budget curve: the recording rules, on the counters themselves, give exactly
    # the curve of the summed histogram of every batch's newest revision; what Prometheus
    # recorded (rates over the last hour, at its own evaluation times) is that curve over
    # what the counters grew by (section 3) to rate()'s extrapolation, which is close here:
    # the fleet's histograms are all one width, so every position's series is born with its
    # worker's steps series and shares its extrapolation; the panels read what it recorded
    summed = [0] * width
    for m in latest.values():
        for i, n in enumerate(m.accept_histogram or ()):
            summed[i] += n
    # a step that accepted i drafts yields 1 + min(i, k) tokens with a budget of k (contract §3.5)
    curve = {
        k: sum((1 + min(i, k)) * n for i, n in enumerate(summed)) / steps
        for k in range(1, min(width, MAX_POSITION + 1))
    }
    rules = {
        (r["record"], r.get("labels", {}).get("budget")): r["expr"]
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    steps_now = prom.value(exact_rule(rules[("run_algorithm:specmeter_position_verify_steps:rate1h", None)]), at)
    assert steps_now == steps
    exact_curve = {}
    for k in range(1, MAX_POSITION + 1):
        accepted = prom.query(exact_rule(rules[("run_algorithm:specmeter_budget_accepted_steps:rate1h", str(k))]), at)
        if accepted:
            [series] = accepted
            exact_curve[k] = 1 + float(series["value"][1]) / steps_now
    assert exact_curve == pytest.approx(curve, rel=1e-12), "the histograms' curve, no budget past the one ran"
    # what rate() sees: the steps the counters grew by over the run
    curve_grown = {
        k: 1 + sum(over_window[str(j)] for j in range(1, k + 1)) / steps_grown for k in curve if str(k) in over_window
    }
    recorded = {
        int(r["metric"]["budget"]): float(r["value"][1])
        for r in prom.query("run_algorithm:specmeter_tokens_per_verify_by_budget:ratio_rate1h", at)
    }
    assert recorded == pytest.approx(curve_grown, rel=0.02)
    bars = {
        int(r["metric"]["budget"]): float(r["value"][1])
        for r in panel("Tokens per verify step by draft budget (last hour)")
    }
    assert bars == pytest.approx(recorded, rel=1e-12), "the panel reads what the rules recorded"
    ran = {r["metric"].get("run_id", ""): float(r["value"][1]) for r in panel("Draft budget the fleet ran")}
    assert ran == {run: min(width - 1, MAX_POSITION)}
    at_ran = [float(r["value"][1]) for r in panel("Draft budget the fleet ran", 1)]
    assert at_ran == [recorded[max(recorded)]]
    at_one = [float(r["value"][1]) for r in panel("Draft budget the fleet ran", 2)]
    assert at_one == [recorded[1]]

    # 9. the alerts panel: one worker stops answering; Prometheus evaluates the rules every
    # second, so its SpecmeterWorkerDown is pending (it fires after 2 minutes) within seconds
    [(_, alerts_expr)] = [(t, e) for t, e in dashboard_targets() if e.startswith("ALERTS")]
    down = d.workers[1]
    d.stop(down)
    rows: list[dict] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = prom.query(substitute(alerts_expr, run=run, algorithm=algorithm, window=window))
        if any(r["metric"]["alertname"] == "SpecmeterWorkerDown" for r in rows):
            break
        time.sleep(0.5)
    [worker_down] = [r["metric"] for r in rows if r["metric"]["alertname"] == "SpecmeterWorkerDown"]
    assert worker_down["instance"] == f"127.0.0.1:{ports[1]}" and worker_down["alertstate"] == "pending"
    assert worker_down["severity"] == "warning"
    loaded = {g["name"] for g in prom.api("rules")["groups"]}
    assert loaded == {"specmeter.recording", "specmeter.alerts"}, "the rules file is loaded as shipped"
