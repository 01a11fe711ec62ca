"""``specmeter tail``: an 80-column table with run ids and the drift view; like
``tail`` it starts with the last messages already on the topic; piped output ends
with a newline."""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import msgspec
import pytest
from rich.console import Console

from specmeter.schemas import BatchMetrics, TaskMetrics, WeightVersionMetrics, encode_metrics, encode_metrics_key
from specmeter.streams.cli.tables import batch_label, drift_text, fit_labels, metrics_table, positions_text, tasks_text


def version(name: str | None, rate: float | None) -> WeightVersionMetrics:
    metrics = {} if rate is None else {"spec/accept_rate": rate}
    return WeightVersionMetrics(weight_version=name, metrics=metrics, accept_histogram=None)


def batch(
    batch_id: str,
    *,
    run_id: str | None = None,
    versions=(),
    revision: int = 0,
    complete: bool = True,
    generations: int = 98_765,
) -> BatchMetrics:
    return BatchMetrics(
        batch_id=batch_id,
        revision=revision,
        close_reason="markers" if complete else "timeout",
        closed_at=0.0,
        speculative=True,
        complete=complete,
        partitions_reported=4,
        partitions_expected=4,
        record_count=123_456,
        invalid_record_count=3,
        missing_record_count=0,
        late_record_count=1,
        accept_histogram=None,
        metrics={
            "spec/accept_rate": 0.7512,
            "spec/tokens_per_verify": 3.41,
            "spec/accept_count_coverage": 0.95,
            "spec/unique_generation_count": generations,
            "spec/conflicting_generation_count": 2,
        },
        run_id=run_id,
        by_weight_version=[version(v, r) for v, r in versions] or None,
    )


def render(table, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()


LATEST = {
    1: batch("step-00001", versions=[("v7", 0.75), ("v8", 0.25)]),
    2: batch(
        "step-00002",
        run_id="grpo-llama-70b-attempt-3-restarted-from-step-1000",
        versions=[(f"v{i}", 0.9 - 0.05 * i) for i in range(4, 14)] + [(None, 0.5)],
        complete=False,
    ),
    3: batch("a-very-long-batch-identifier-from-some-trainer-000042", generations=12_345_678),
    4: batch("step-00004", run_id="r2", versions=[("v12", 0.5)], revision=3),
}


@pytest.mark.parametrize("width", [80, 100, 160])
def test_table_fits_the_terminal(width):
    lines = render(metrics_table(LATEST, 20, width), width)
    assert max(map(len, lines)) <= width, "\n".join(lines)
    text = "\n".join(lines)
    assert "step-00001" in text and "v7 .75 v8 .25" in text
    assert "r2/step-00004" in text, "the run is shown when it is not null"
    assert "…/step-00002" in text and "/step-00002" in text, "a long run id is shortened, the batch id kept"
    row = next(line for line in lines if "/step-00002" in line)
    assert "… " in row and "? .50" in row and "v4 " not in row, "the oldest versions go first when not all fit"
    if width >= 100:
        assert "v13 .25 ? .50" in row


@pytest.mark.parametrize("width", [80, 100])
def test_columns_of_a_narrow_and_a_wide_terminal(width):
    header = render(metrics_table(LATEST, 20, width), width)[1]
    for name in ("batch", "rev", "accept", "tok/v", "cov", "c/i/l", "close", "drift"):
        assert name in header, header
    assert ("gens" in header) == (width >= 100), "the generation count only where there is room"


def test_drift_text_orders_versions_naturally_and_keeps_the_newest():
    entries = [version("v10", 0.5), version("v9", 0.625), version(None, 0.3), version("v11", None), version("v8", 1.0)]
    assert drift_text(entries, 80) == "v8 1.00 v9 .62 v10 .50 v11 - ? .30"
    assert drift_text(entries, 21) == "… v10 .50 v11 - ? .30"
    assert drift_text(entries, 20) == "… v11 - ? .30"
    assert len(drift_text(entries, 12)) <= 12
    assert drift_text(None, 20) == "-"


def test_batch_label_names_the_run():
    assert batch_label(batch("step-1"), 20) == "step-1"
    assert batch_label(batch("step-1", run_id="run-a"), 20) == "run-a/step-1"
    assert batch_label(batch("step-1", run_id="a-long-run-name"), 12) == "a-lo…/step-1"
    assert len(batch_label(batch("x" * 40, run_id="run"), 12)) == 12


def test_rows_keep_the_latest_batches():
    many = {i: batch(f"step-{i:05d}") for i in range(30)}
    text = "\n".join(render(metrics_table(many, 5, 80), 80))
    assert "step-00029" in text and "step-00025" in text and "step-00024" not in text


@pytest.mark.parametrize(
    ("accept", "verify", "shown"),
    [(1.0, 0.5, "50%v"), (0.25, 1.0, "25%a"), (1.0, 1.0, "100%"), (0.999, 1.0, "99%a"), (None, None, "-")],
)
def test_coverage_is_the_lower_of_accept_and_verify_and_says_which(accept, verify, shown):
    """Issue 33: a batch with verify coverage 0.5 showed 100 % (accept coverage alone),
    while its tokens per verify step covered half the batch."""
    metrics = {} if accept is None else {"spec/accept_count_coverage": accept, "spec/verify_count_coverage": verify}
    m = msgspec.structs.replace(batch("step-1"), metrics={**batch("step-1").metrics, **metrics})
    if accept is None:
        m = msgspec.structs.replace(m, metrics={})
    row = next(line for line in render(metrics_table({1: m}, 5, 100), 100) if line.startswith("step-1"))
    assert f" {shown} " in row, row
    if shown != "100%":
        assert "100%" not in row, row


# -- against the real broker ------------------------------------------------------


def _tail(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped: rich's default, 80 columns
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "tail", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


async def _publish(bootstrap: str, topic: str, messages: list[BatchMetrics]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for m in messages:
            await producer.send_and_wait(topic, encode_metrics(m), key=encode_metrics_key(m.run_id, m.batch_id))
    finally:
        await producer.stop()


@pytest.fixture
def metrics_topic(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1, prefix="tail")
    published = [batch(f"step-{i:05d}", run_id="run-a", versions=[("v11", 0.6), ("v12", 0.5)]) for i in range(15)]
    asyncio.run(_publish(kafka_bootstrap, topic, published))
    return topic


@pytest.mark.kafka
def test_starts_with_the_last_messages_already_on_the_topic(kafka_bootstrap, metrics_topic):
    proc = _tail(
        "--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--max-messages", "10", "--timeout", "30"
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["batch_id"] for line in proc.stdout.splitlines()] == [
        f"step-{i:05d}" for i in range(5, 15)
    ], "the default: the last 10 of each partition"
    proc = _tail("--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--last", "3", "--timeout", "3")
    assert [json.loads(line)["batch_id"] for line in proc.stdout.splitlines()] == [
        "step-00012",
        "step-00013",
        "step-00014",
    ]
    proc = _tail("--broker", kafka_bootstrap, "--topic", metrics_topic, "--json", "--last", "0", "--timeout", "2")
    assert proc.returncode == 0 and proc.stdout == "", "--last 0: only new messages"


@pytest.mark.kafka
def test_piped_table_fits_80_columns_and_ends_with_a_newline(kafka_bootstrap, metrics_topic):
    proc = _tail(
        "--broker", kafka_bootstrap, "--topic", metrics_topic, "--rows", "4", "--max-messages", "10", "--timeout", "30"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 80, proc.stdout
    rows, table = proc.stdout.split("specmeter tail ", 1)  # a line per message, then the table
    assert [line.split()[0] for line in rows.splitlines()[1:] if line.strip()] == [
        f"run-a/step-{i:05d}" for i in range(5, 15)
    ], rows
    assert "run-a/step-00014" in table and "v11 .60 v12 .50" in table
    assert "step-00010" not in table, "--rows 4 shows the latest four"


def _lines_of(proc: subprocess.Popen) -> queue.Queue:
    """Each line of ``proc``'s stdout as it is written (None at its end)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _take(lines: queue.Queue, n: int, timeout_s: float) -> list[str]:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            lines.put(None)  # the end stays the end for the next caller
            break
        got.append(line)
    return got


@pytest.mark.kafka
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_piped_rows_come_as_batches_arrive_and_sigterm_still_prints_the_table(
    kafka_bootstrap, metrics_topic, signum, status
):
    """Issue 33: `timeout 10 specmeter tail ... | head` printed nothing: piped, the
    table came only at the end, and SIGTERM (what `timeout` sends) printed none. Issue
    47.7: it then exited 0 where loadgen and replay exit 130 (Ctrl-C) and 143 (SIGTERM)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    tail = ["tail", "--broker", kafka_bootstrap, "--topic", metrics_topic, "--last", "3"]
    with subprocess.Popen(
        [sys.executable, "-m", "specmeter.streams.cli", *tail],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C's default disposition, even where the suite runs in the background (SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:
        _follow_until_sigterm(proc, kafka_bootstrap, metrics_topic, signum, status)


def _follow_until_sigterm(
    proc: subprocess.Popen, kafka_bootstrap: str, metrics_topic: str, signum: int, status: int
) -> None:
    lines = _lines_of(proc)
    try:
        first = _take(lines, 4, timeout_s=60)
        assert proc.poll() is None, "still following"
        assert first[0].split()[:2] == ["batch", "rev"], first
        assert [line.split()[0] for line in first[1:]] == [f"run-a/step-{i:05d}" for i in (12, 13, 14)], first
        asyncio.run(_publish(kafka_bootstrap, metrics_topic, [batch("step-00099", run_id="run-a")]))
        assert _take(lines, 1, timeout_s=30)[0].split()[0] == "run-a/step-00099", "a new batch, as it arrives"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == status, proc.stderr.read()
        rest = "\n".join(_take(lines, 1000, timeout_s=10))
        assert "specmeter tail " in rest and "latest 4 batches" in rest, rest
        assert "run-a/step-00099" in rest.split("specmeter tail ", 1)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        _take(lines, 10_000, timeout_s=10)  # the reader is done with the pipe before it is closed


# -- issue 24, point 6: what tells rows apart is never cut -------------------------------


def _rows(lines: list[str]) -> list[str]:
    return [line for line in lines if "/step-" in line or line.startswith("step-")]


@pytest.mark.parametrize("width", [80, 100, 200])
def test_restarted_attempts_stay_apart_at_any_width(width):
    """The README's advice for a restarted job (a new run_id per attempt) must not render
    `grpo-7-attempt-2` and `grpo-7-attempt-3` as one name."""
    drift = [(f"v{i}", 0.9 - 0.05 * i) for i in range(4, 14)]
    latest = {
        (run, step): batch(step, run_id=run, versions=drift)
        for run in ("grpo-7-attempt-2", "grpo-7-attempt-3", "grpo-7-attempt-10")
        for step in ("step-1", "step-2")
    }
    lines = render(metrics_table(latest, 20, width), width)
    assert max(map(len, lines)) <= width
    labels = [line.split()[0] for line in _rows(lines)]
    assert len(labels) == 6 and len(set(labels)) == 6, labels
    for attempt in ("-2/", "-3/", "-10/"):
        assert sum(attempt in label for label in labels) == 2, (attempt, labels)


def test_labels_keep_the_batch_and_what_tells_runs_apart():
    m2 = batch("step-1", run_id="grpo-7-attempt-2")
    m3 = batch("step-1", run_id="grpo-7-attempt-3")
    two, three = fit_labels([m2, m3], 14)
    assert len(two) == len(three) == 14
    assert two.endswith("-2/step-1") and three.endswith("-3/step-1") and two.startswith("grpo")
    assert fit_labels([m2, m3], 40) == ["grpo-7-attempt-2/step-1", "grpo-7-attempt-3/step-1"]


@pytest.mark.parametrize("width", [80, 200])
def test_conflicts_invalid_late_are_never_cut(width):
    big = msgspec.structs.replace(
        batch("step-1", complete=False),
        invalid_record_count=67_890,
        late_record_count=12_345,
        metrics={"spec/conflicting_generation_count": 4_321, "spec/accept_rate": 0.5},
        close_reason="end_of_input",
    )
    lines = render(metrics_table({1: big, 2: batch("step-2")}, 20, width), width)
    row = next(line for line in lines if line.startswith("step-1"))
    assert "4321/67890/12345" in row, row
    assert "end_of_input!" in row, "how it closed is not cut either"


def test_rows_are_sorted_by_run_and_step_naturally():
    arrivals = [("run-b", "step-1"), (None, "step-10"), ("run-a", "step-10"), ("run-a", "step-2"), (None, "step-9")]
    latest = {key: batch(key[1], run_id=key[0]) for key in arrivals}
    labels = [line.split()[0] for line in _rows(render(metrics_table(latest, 20, 120), 120))]
    assert labels == ["step-9", "step-10", "run-a/step-2", "run-a/step-10", "run-b/step-1"]


def test_the_rows_shown_are_the_latest_updated_in_sorted_order():
    latest = {i: batch(f"step-{i}") for i in (12, 3, 11, 10)}  # step-3 arrived after step-12
    labels = [line.split()[0] for line in _rows(render(metrics_table(latest, 3, 80), 80))]
    assert labels == ["step-3", "step-10", "step-11"]


def with_positions(m: BatchMetrics, rates: list[float]) -> BatchMetrics:
    return msgspec.structs.replace(m, accept_rate_by_position=rates)


def test_positions_text():
    assert positions_text([0.8125, 0.625, 0.4]) == ".81 .62 .40"
    assert positions_text([1.0, 0.5]) == "1.00 .50"
    assert positions_text(None) == "-" and positions_text([]) == "-"
    assert positions_text([0.5] * 12) == " ".join([".50"] * 8) + " …"
    assert positions_text([0.5] * 5, 12) == ".50 .50 …"


def test_the_position_column_shows_when_there_is_room_and_goes_first():
    latest = {
        1: with_positions(batch("step-1", versions=[("v7", 0.75), ("v8", 0.25)]), [0.81, 0.62, 0.4]),
        2: batch("step-2", versions=[("v8", 0.5)]),
    }
    wide = render(metrics_table(latest, 20, 160), 160)
    assert "pos" in wide[1], wide[1]
    row = next(line for line in wide if line.startswith("step-1"))
    assert ".81 .62 .40" in row and "v7 .75 v8 .25" in row
    drifting = [(f"v{i}", 0.9 - 0.05 * i) for i in range(4, 14)]
    latest[1] = with_positions(batch("step-1", versions=drifting), [0.81, 0.62, 0.4])
    narrow = render(metrics_table(latest, 20, 80), 80)
    assert "pos" not in narrow[1] and "drift" in narrow[1], "dropped before the drift view shrinks"
    assert max(map(len, narrow)) <= 80
    assert "pos" in render(metrics_table(latest, 20, 160), 160)[1], "shown where both fit"


@pytest.mark.kafka
def test_json_lines_carry_the_acceptance_by_position(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1, prefix="tail-pos")
    asyncio.run(_publish(kafka_bootstrap, topic, [with_positions(batch("step-1"), [0.5, 0.25])]))
    proc = _tail("--broker", kafka_bootstrap, "--topic", topic, "--json", "--max-messages", "1", "--timeout", "30")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accept_rate_by_position"] == [0.5, 0.25]
    table = _tail("--broker", kafka_bootstrap, "--topic", topic, "--max-messages", "1", "--timeout", "30")
    assert "step-1" in table.stdout


@pytest.mark.kafka
def test_tail_json_follows_the_variable_rule(kafka_bootstrap, metrics_topic):
    """SPECMETER_<COMMAND>_<FLAG>: `tail --json` reads SPECMETER_TAIL_JSON."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"SPECMETER_TAIL_JSON": "1"}
    args = ["tail", "--broker", kafka_bootstrap, "--topic", metrics_topic, "--max-messages", "2", "--timeout", "30"]
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["batch_id"] for line in proc.stdout.splitlines()] == ["step-00005", "step-00006"]


def task(name: str | None, rate: float | None, generations: int = 10, budget=None) -> TaskMetrics:
    metrics = {"spec/unique_generation_count": generations}
    if rate is not None:
        metrics["spec/accept_rate"] = rate
    return TaskMetrics(task=name, metrics=metrics, accept_histogram=None, tokens_per_verify_by_budget=budget)


def with_tasks(m: BatchMetrics, tasks) -> BatchMetrics:
    return msgspec.structs.replace(m, by_task=list(tasks))


def test_tasks_text_puts_the_largest_tasks_first_and_the_unknown_last():
    entries = [task("chat", 0.71, 5), task(None, 0.5, 50), task("gsm8k", 0.875, 9), task("swe-bench-verified", 0.3, 9)]
    assert tasks_text(entries, 80) == "gsm8k .88 swe-bench-v… .30 chat .71 ? .50"
    assert tasks_text(entries, 30) == "gsm8k .88 swe-bench-v… .30 …"
    assert tasks_text(entries, 12) == "gsm8k .88 …"
    assert len(tasks_text(entries, 5)) <= 5
    assert tasks_text(None, 20) == "-"


@pytest.mark.parametrize("width", [80, 100, 160, 240])
def test_the_task_column_takes_only_the_room_batch_and_drift_leave(width):
    latest = {
        1: with_tasks(
            batch("step-1", versions=[("v7", 0.75), ("v8", 0.25)]), [task("chat", 0.5, 10), task("gsm8k", 0.88, 20)]
        ),
        2: batch("step-2", versions=[(f"v{i}", 0.9 - 0.05 * i) for i in range(4, 14)]),
    }
    lines = render(metrics_table(latest, 20, width), width)
    assert max(map(len, lines)) <= width, "\n".join(lines)
    header = lines[1]
    row = next(line for line in lines if line.startswith("step-1"))
    assert "drift" in header and "v7 .75 v8 .25" in row
    if width >= 160:
        assert "task" in header and "gsm8k .88 chat .50" in row
    if width == 80:
        assert "task" not in header, "no room left by the batch labels and the drift view"
    no_tasks = {k: msgspec.structs.replace(m, by_task=None) for k, m in latest.items()}
    assert "task" not in render(metrics_table(no_tasks, 20, width), width)[1]


@pytest.mark.parametrize("width", [50, 80, 160])
def test_the_by_task_view_has_a_row_per_batch_and_task_and_fits(width):
    from specmeter.streams.cli.tables import task_table

    results = [
        with_tasks(batch("step-2"), [task("chat", 0.5, 3, [1.5, 1.75]), task("gsm8k", 0.875, 9, [2.0, 2.75])]),
        with_tasks(batch("step-1", run_id="run-a"), [task(None, 0.25, 4, [1.25, 1.25])]),
        batch("step-3"),
    ]
    lines = render(task_table(results, width), width)
    assert max(map(len, lines)) <= width, "\n".join(lines)
    rows = [line for line in lines if ".500" in line or ".875" in line or ".250" in line]
    labels = [r.split()[0] for r in rows if r[0] != " "]
    assert labels[0] == "step-2" and labels[1].endswith("/step-1") and len(labels) == 2
    gsm8k, chat = (next(r for r in rows if name in r) for name in ("gsm8k", "chat"))
    assert gsm8k.startswith("step-2") and not chat.startswith("step"), "the largest first, the batch's name once"
    assert ("2.00 2.75" in gsm8k) == (width >= 80)
    assert "?" in next(r for r in rows if ".250" in r)
    assert task_table([batch("step-3")], width) is None
