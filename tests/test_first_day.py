"""A newcomer's first day, second pass (issue 39; issue 37 item 5): options that refuse
what they cannot mean, output that survives a pipe, starts and stops that say so, logs an
operator reads, an outage's client lines folded in every command."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

from specmeter.streams.cli import main
from specmeter.streams.cli.base import Number
from specmeter.streams.cli.demo import main as demo_main


def _commands() -> list[tuple[str, click.Command]]:
    return [*((f"specmeter {name}", command) for name, command in main.commands.items()), ("demo", demo_main)]


def _numeric(command: click.Command) -> list[click.Parameter]:
    return [p for p in command.params if isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)]


def test_every_numeric_option_of_every_command_is_the_one_number_type_and_refuses_nan_and_inf():
    """Issue 39.1: `worker --batch-timeout nan` ended in a traceback, `loadgen --rate nan` ran
    unthrottled, `tail --timeout nan` exited at once: a range alone lets NaN through."""
    seen = 0
    for name, command in _commands():
        for param in _numeric(command):
            assert isinstance(param.type, Number), f"{name} {param.opts}: {param.type!r}, not streams.cli.base.Number"
            for bad in ("nan", "NaN", "inf", "-inf", "1e400"):
                with pytest.raises(click.BadParameter, match=r"finite|not in the range|whole number"):
                    param.type.convert(bad, param, None)
            seen += 1
    assert seen >= 30  # worker, loadgen, tail, replay, advise and the demo all have some


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--batch-timeout", "nan"],
        ["loadgen", "--drift", "nan", "--dump", "-"],
        ["loadgen", "--rate", "nan", "--dump", "-"],
        ["loadgen", "--redelivery-rate", "nan", "--dump", "-"],
        ["tail", "--timeout", "nan"],
        ["replay", "--rate", "inf", "-"],
    ],
)
def test_nan_is_one_line_naming_the_option(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and args[1] in errors[0] and "finite" in errors[0], result.output


def test_a_range_still_holds_and_help_shows_it():
    result = CliRunner().invoke(main, ["loadgen", "--conflict-rate", "1.5", "--dump", "-"])
    assert result.exit_code == 2 and "--conflict-rate" in result.output and "0<=x<=1" in result.output
    result = CliRunner().invoke(main, ["worker", "--partitions", "2.5"])
    assert result.exit_code == 2 and "--partitions" in result.output and "whole number" in result.output
    result = CliRunner().invoke(main, ["worker", "--help"], terminal_width=200)
    assert "x>=0.1" in result.output  # --batch-timeout's range, as click shows its own


def _expected(**spec) -> list[dict]:
    from specmeter.streams.fleet.publish import write_expected
    from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

    out = io.BytesIO()
    write_expected(synthetic_fleet(FleetSpec(**spec)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_conflict_rate_zero_makes_no_conflicts_whatever_the_missing_rate():
    """Issue 39.1: `loadgen --conflict-rate 0` made 29 conflicts of 986 generations: a shared
    ancestor drew its missing counters per occurrence, reported with and without them."""
    batches = _expected(batches=6, sessions_per_batch=200, conflict_rate=0.0, missing_rate=0.3, seed=3)
    conflicts = sum(m["metrics"].get("spec/conflicting_generation_count") or 0 for m in batches)
    assert conflicts == 0
    some = _expected(batches=6, sessions_per_batch=200, conflict_rate=0.05, missing_rate=0.3, seed=3)
    assert sum(m["metrics"].get("spec/conflicting_generation_count") or 0 for m in some) > 0


def test_aggregate_strict_exits_non_zero_on_a_bad_line(tmp_path):
    dump = tmp_path / "dump.jsonl"
    good = {"batch_id": "b1", "session_id": "s", "generation_id": "g", "accepted": 3, "proposed": 4, "verify": 2}
    dump.write_text(json.dumps(good) + "\n{not json\n")
    assert CliRunner().invoke(main, ["aggregate", str(dump), "--format", "jsonl"]).exit_code == 0
    strict = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", "aggregate", str(dump), "--format", "jsonl", "--strict"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert strict.returncode == 1, strict.stderr
    assert '"batch_id":"b1"' in strict.stdout  # the metrics printed all the same
    assert "1 bad line(s) in" in strict.stderr and "--strict" in strict.stderr


# -- 39.2: output that survives a pipe -------------------------------------------------


def _piped_batches():
    from .test_tail import batch

    drift = [(f"v{i}", 0.9 - 0.03 * i) for i in range(1, 15)]
    return {
        (run, step): batch(step, run_id=run, versions=drift)
        for run in ("audit-replay", "audit-replay2")
        for step in ("step-00004", "step-00005")
    }


def test_piped_rows_keep_ids_whole_and_wide_the_drift_view():
    """`specmeter tail ... | grep rep` showed `audit-rep…/step-00004` for two runs named
    `audit-replay` and `audit-replay2`; the drift column `… v10 .32`."""
    from specmeter.streams.cli.tables import RowPrinter

    printer = RowPrinter(80)
    rows = [printer.row(m) for m in _piped_batches().values()]
    assert [row.split()[0] for row in rows] == [
        "audit-replay/step-00004",
        "audit-replay/step-00005",
        "audit-replay2/step-00004",
        "audit-replay2/step-00005",
    ]
    assert all(row.endswith("v14 .48") for row in rows), rows  # the newest versions that fit
    wide = RowPrinter(80, whole=True)
    rows = [wide.row(m) for m in _piped_batches().values()]
    assert all("…" not in row and "v1 .87 v2 .84" in row and row.endswith("v14 .48") for row in rows), rows


def test_the_final_table_of_a_pipe_keeps_ids_whole_and_wide_everything():
    from specmeter.streams.cli.tables import metrics_table, output_console

    for whole in (False, True):
        out = io.StringIO()
        console = output_console(file=out)
        console.print(metrics_table(_piped_batches(), 20, 80, whole=whole, ids=True))
        text = out.getvalue()
        assert "audit-replay2/step-00005" in text and "audit-replay/step-00004" in text, text
        assert ("v1 .87" in text and "…" not in text) if whole else "… v13 .51 v14 .48" in text, text


def test_tail_says_wide_in_its_help():
    help_text = CliRunner().invoke(main, ["tail", "--help"], terminal_width=200).output
    assert "--wide" in help_text and "ids are never cut" in help_text


def test_the_demo_table_redirected_keeps_its_headers_and_drift(capsys):
    """The demo's headers read `tokens/ver…` and `generatio…` when its output was redirected."""
    from specmeter.streams.cli.demo import _print_results

    _print_results(list(_piped_batches().values()), {}, as_json=False)
    text = capsys.readouterr().out
    for header in ("tokens/verify", "generations", "accept cov.", "verify cov.", "= offline"):
        assert header in text, text
    assert "…" not in text and "v14 .48" in text and "v1 .87" in text, text


# -- 39.3: clean stops ---------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_sigterm_during_replay_prints_the_summary_ctrl_c_prints(kafka_bootstrap, new_topic, tmp_path):
    """`replay` on SIGTERM exited 143 with no output; Ctrl-C printed what was sent and which
    batches are half-sent."""
    from .support.tools import start_specmeter
    from .test_replay_interrupt import RECORDS_PER_BATCH, _dump

    topic = new_topic(partitions=2, prefix="replay-term")
    dump = tmp_path / "dump.jsonl"
    _dump(dump)
    args = ["replay", str(dump), "--broker", kafka_bootstrap, "--topic", topic, "--rate", "200", "--no-progress"]
    proc = start_specmeter(*args)
    time.sleep(4.5)  # step-1 (600 records at 200/s) sent, step-2 under way
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    summary = re.search(r"stopped by SIGTERM after [\d.]+s: sent ([\d,]+) records", stderr)
    assert summary and int(summary.group(1).replace(",", "")) > RECORDS_PER_BATCH // 2, stderr
    assert "left half-sent, their markers not sent: step-" in stderr, stderr


@pytest.mark.kafka
@pytest.mark.slow
def test_sigterm_and_ctrl_c_during_loadgen_print_what_was_sent(kafka_bootstrap, new_topic):
    from .support.tools import start_specmeter

    topic = new_topic(partitions=2, prefix="loadgen-term")
    for sig, status, said in ((signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")):
        args = ["loadgen", "--broker", kafka_bootstrap, "--topic", topic, "--batches", "100", "--rate", "300"]
        proc = start_specmeter(*args, "--no-progress")
        time.sleep(4.0)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == status, stderr
        assert "Traceback" not in stderr, stderr
        sent = re.search(rf"loadgen: {said} after [\d.]+s: (\d+) records, \d+ invalid, \d+ markers sent", stderr)
        assert sent and int(sent.group(1)) > 0, stderr


@pytest.mark.kafka
@pytest.mark.slow
def test_the_worker_says_it_stops_leaves_its_groups_and_stopped_in_one_log_format(kafka_bootstrap, tmp_path):
    """The worker's log had no line saying it was stopping, leaving its groups, stopped; and
    two formats (`INFO specmeter.topics:` and mode's `[11235] [INFO]`); and it said
    http://127.0.0.1 while it bound 0.0.0.0."""
    import asyncio
    import os
    import stat

    from .support.kafka_helpers import create_topic
    from .support.worker_harness import Deployment

    d = Deployment(kafka_bootstrap, partitions=2)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, 2))
    data_dir = tmp_path / "fresh-data-dir"
    try:
        worker = d.start_worker(
            "--web-port", "0", "--log-level", "info", "--data-dir", str(data_dir), env={"SPECMETER_WORKER_WEB_HOST": ""}
        )  # fmt: skip
        d.wait_ready(worker)
        assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        text = d.logs[0].read_text()
    finally:
        d.close()
    assert re.search(r"web server on http://127\.0\.0\.1:\d+:", text), text  # the default: loopback
    lines = [line for line in text.splitlines() if line.startswith("[")]
    assert all(re.match(r"\[[\d\- :,]+\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ", line) for line in lines), text
    assert "[INFO]" not in text and f"[{worker.pid}]" not in text, text
    stopping = text.index("stopping on SIGTERM: leaving its consumer groups")
    left = text.index(f"left its consumer groups {d.name}-stage1, {d.name}-stage2")
    assert stopping < left < text.index("stopped (on SIGTERM)"), text


@pytest.mark.kafka
def test_a_worker_without_its_web_server_starts_whatever_its_web_port(kafka_bootstrap):
    """`worker --no-web --web-port 0` ended in Faust's traceback (port 0 out of range), the
    port of a server it would never bind; found by a 10-minute loadgen run."""
    import asyncio

    from .support.kafka_helpers import create_topic
    from .support.worker_harness import Deployment

    d = Deployment(kafka_bootstrap, partitions=2)
    asyncio.run(create_topic(kafka_bootstrap, d.topics.records, 2))
    try:
        worker = d.start_worker("--no-web", "--web-port", "0")
        d.wait_ready(worker)
    finally:
        d.close()


# -- 39.4: logs an operator reads ----------------------------------------------------


def test_a_batch_whose_markers_come_within_a_second_is_not_said(core):
    from specmeter.streams.report.waits import WaitReporter, stage1_waits

    from .test_waits import _marker, _processor, _record

    p = _processor(core)
    p.process([(0, _record(0)), (1, _marker("rollout-0", expected=4))], now_ms=1_000)
    reporter = WaitReporter(batch_timeout_ms=60_000)
    assert reporter.lines(stage1_waits([(0, p.waiting(1_040))]), []) == []  # closes 40 ms later: nothing to say
    (line,) = reporter.lines(stage1_waits([(0, p.waiting(2_000))]), [])  # a second without input: said
    assert "markers from 1 of 4 producers" in line


def test_a_rebalance_s_heartbeat_warning_is_info():
    import logging

    from specmeter.streams.worker.run import quiet_rebalance_chatter

    quiet_rebalance_chatter()
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    record = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "Heartbeat failed for group %s because it is rebalancing",
        ("g",), None,
    )  # fmt: skip
    for f in logger.filters:
        f.filter(record)
    assert record.levelno == logging.INFO and record.levelname == "INFO"
    refused = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1,
        "OffsetCommit failed for group %s due to group error (%s), will rejoin", ("g", "UnknownMemberIdError"), None,
    )  # fmt: skip
    for f in logger.filters:
        f.filter(refused)
    assert refused.levelno == logging.INFO
    other = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "Heartbeat failed: %s", ("x",), None)
    for f in logger.filters:
        f.filter(other)
    assert other.levelno == logging.WARNING


def test_mode_s_handlers_get_the_worker_s_format():
    import logging

    from mode.utils.logging import DEFAULT_FORMAT

    from specmeter.streams.worker.run import LOG_FORMAT, one_log_format

    logger = logging.Logger("x")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter(DEFAULT_FORMAT))
    logger.addHandler(handler)
    one_log_format(logger)
    record = logger.makeRecord("specmeter.topics", logging.INFO, __file__, 1, "hello", (), None)
    assert handler.format(record) == logging.Formatter(LOG_FORMAT).format(record)
    assert " INFO specmeter.topics: hello" in handler.format(record)


def test_the_web_server_line_names_the_address_it_binds_and_the_default_is_loopback(caplog):
    import logging

    from specmeter.streams.settings import WorkerSettings
    from specmeter.streams.worker.run import _say_web_server

    assert WorkerSettings().web_host == "127.0.0.1"
    with caplog.at_level(logging.INFO, logger="specmeter.worker"):
        _say_web_server(["0.0.0.0"], 6066)
    assert "http://0.0.0.0:6066 (every interface" in caplog.text, caplog.text
    help_text = CliRunner().invoke(main, ["worker", "--help"], terminal_width=200).output
    assert "0.0.0.0" in help_text and "127.0.0.1" in help_text


def test_the_deploy_manifests_open_the_web_server_explicitly():
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[1] / "deploy"
    assert '"--web-host", "0.0.0.0"' in (deploy / "compose.yaml").read_text()
    assert '"--web-host", "0.0.0.0"' in (deploy / "Dockerfile").read_text()
    assert 'SPECMETER_WORKER_WEB_HOST: "0.0.0.0"' in (deploy / "k8s" / "configmap.yaml").read_text()


def test_a_new_data_dir_is_its_owner_s_alone(tmp_path):
    import os
    import stat

    from specmeter.streams.worker.run import _private_data_dir

    path = tmp_path / "data"
    _private_data_dir(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_an_old_world_readable_data_dir_is_warned_of(tmp_path, caplog):
    import logging
    import os

    from specmeter.streams.worker.run import _private_data_dir

    path = tmp_path / "old"
    path.mkdir()
    os.chmod(path, 0o755)
    with caplog.at_level(logging.WARNING, logger="specmeter.worker"):
        _private_data_dir(str(path))
    assert "readable by other users (mode 755)" in caplog.text and "chmod 700" in caplog.text


# -- issue 37.5: a command folds an outage's client lines ------------------------------


def test_replay_folds_a_75_s_outage_of_two_brokers_of_three_into_a_few_lines():
    """`specmeter replay` printed 2,385 lines of aiokafka retry warnings in a 75 s outage of two
    of three brokers: the writes the cluster refused (too few in-sync replicas, no leader) and
    the producer library's retries were not folded. Fed as aiokafka and the producer log them:
    at most a few lines a minute, with the count of retries in them."""
    import logging

    from specmeter.streams.report.outages import Outages, fold_command_logs

    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    out = logging.Logger("test.outages")
    out.addHandler(Said())
    now = [0.0]
    outages = Outages(logger=out, who="specmeter replay", back_level=logging.WARNING)
    installed = fold_command_logs(outages, clock=lambda: now[0])
    sender = logging.getLogger("aiokafka.producer.sender")
    client = logging.getLogger("aiokafka")  # aiokafka/client.py's logger
    publisher = logging.getLogger("specmeter.producers")
    shown: list[str] = []

    def log(logger: logging.Logger, level: int, msg: str, *args: object) -> None:
        record = logger.makeRecord(logger.name, level, __file__, 1, msg, args, None)
        if logger.filter(record):
            shown.append(record.getMessage())

    try:
        for step in range(750):  # 75 s, 10 steps a second
            now[0] = step / 10
            for partition in range(8):
                log(
                    sender, logging.WARNING,
                    "Got error produce response on topic-partition %s, retrying. Error: %s",
                    f"TopicPartition(topic='specmeter.records', partition={partition})",
                    "[Error 19] NotEnoughReplicasError",
                )  # fmt: skip
            if step % 10 == 0:
                for node in (2, 3):
                    log(
                        client, logging.ERROR, "Unable connect to node with id %s: %s", node,
                        f"[Errno 111] Connect call failed ('10.0.0.{node}', 9092)",
                    )  # fmt: skip
                log(client, logging.ERROR, "Unable to update metadata from %s", [2, 3])
                log(sender, logging.WARNING, "Got error produce response: %s", "[Error 7] RequestTimedOutError")
                retry = "publisher: delivery to partition %d failed (%s: %s); retrying in %.2fs"
                error = ("NotEnoughReplicasError", "[Error 19] NotEnoughReplicasError")
                log(publisher, logging.WARNING, retry, step % 8, *error, 5.0)
                outages.tick(now[0])
        for second in range(76, 90):  # the brokers back: their ports answer
            now[0] = float(second)
            outages.tick(now[0], reachable=["broker 2", "broker 3"])
    finally:
        for logger, folding in installed:
            logger.removeFilter(folding)
    lines = said + shown
    assert len(lines) < 20, "\n".join(lines)
    assert shown == [], shown  # every retry line folded
    assert any("Kafka cluster unavailable" in line and "specmeter replay keeps retrying" in line for line in said)
    reminders = [line for line in said if re.search("still (unreachable|unavailable) after", line)]
    assert reminders and all(re.search(r"[1-9]\d* errors folded since the last line", line) for line in reminders)
    assert outages.unreachable == (), said
    assert outages.errors_total >= 750 * 8, outages.errors_total


# -- 39.3: the demo leaves what it says it leaves ---------------------------------------


def test_demo_keep_broker_prints_the_command_that_stops_it(monkeypatch):
    from specmeter.streams.cli import demo

    monkeypatch.setattr(demo, "_start_broker", lambda console: ("127.0.0.1:9", True))
    monkeypatch.setattr(demo, "_check_broker", lambda broker: None)

    def fail(*args: object) -> None:
        raise click.ClickException("stopped here by the test")

    monkeypatch.setattr(demo, "_demo_topics", lambda broker, run: None)
    monkeypatch.setattr(demo, "_worker_args", fail)
    result = CliRunner().invoke(demo.main, ["--keep-broker"])
    assert "the local broker keeps running at 127.0.0.1:9; stop it with: " in result.output, result.output
    assert "deploy/kafka/broker stop" in result.output
    help_text = CliRunner().invoke(demo.main, ["--help"], terminal_width=200).output
    assert "--clean" in help_text and "off by default" in help_text


@pytest.mark.kafka
def test_demo_clean_removes_the_topics_and_groups_of_its_app_id_and_nothing_else(kafka_bootstrap):
    import asyncio
    import uuid

    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from specmeter.streams.cli.demo import remove_app_state

    from .support.kafka_helpers import create_topic, delete_topics

    run = f"demo-test-{uuid.uuid4().hex[:6]}"
    ours = [f"{run}.records", f"{run}.metrics", f"{run}-stage1-state-changelog"]
    other = f"{run}x.records"  # another app id that starts alike
    for topic in [*ours, other]:
        asyncio.run(create_topic(kafka_bootstrap, topic, 1))

    async def join_and_leave(group: str) -> None:
        consumer = AIOKafkaConsumer(ours[0], bootstrap_servers=kafka_bootstrap, group_id=group)
        await consumer.start()
        try:
            await consumer.getmany(timeout_ms=2000)
            await consumer.commit()
        finally:
            await consumer.stop()

    async def left() -> tuple[set[str], set[str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            topics = {t for t in await admin.list_topics() if t.startswith(run)}
            groups = {g[0] for g in await admin.list_consumer_groups() if g[0].startswith(run)}
            return topics, groups
        finally:
            await admin.close()

    try:
        asyncio.run(join_and_leave(f"{run}-stage1"))
        assert remove_app_state(kafka_bootstrap, run) == (3, 1)
        topics, groups = asyncio.run(left())
        assert topics == {other} and groups == set()
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, [*ours, other]))


# -- 39.6: the README a user's page, the docs' pointers valid --------------------------


def test_every_see_below_in_the_docs_names_a_part_that_follows():
    """docs/benchmarks.md said "see Scaling below", and there was no such section."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    found = 0
    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        text = page.read_text()
        for match in re.finditer(r"see \*{0,2}([A-Z][\w-]*(?: [A-Za-z][\w-]*)*?)\*{0,2}(?: in [^)]*?)? below", text):
            name = match.group(1)
            after = text[match.end() :]
            part = rf"(^#+ [^\n]*{re.escape(name)}|\*\*{re.escape(name)}[.:]?\*\*)"
            assert re.search(part, after, flags=re.M), f"{page.name}: {match.group(0)!r}: no part named {name} follows"
            found += 1
    assert found >= 1


@pytest.mark.kafka
def test_loadgen_with_a_mistyped_topic_says_did_you_mean_before_any_progress_bar(kafka_bootstrap, unique_name):
    """`loadgen --topic specmeter.record` drew its progress bar before the error, told a CLI
    user to "set PublisherSettings.topic", and had no did-you-mean (tail and advise do)."""
    import asyncio

    from .support.kafka_helpers import create_topic, delete_topics
    from .support.tools import run_specmeter

    topic = unique_name("first-day") + ".records"
    asyncio.run(create_topic(kafka_bootstrap, topic, 1))
    try:
        for command in (["loadgen", "--batches", "1"], ["replay", "-"]):
            proc = run_specmeter(*command, "--broker", kafka_bootstrap, "--topic", topic[:-1], timeout=60)
            assert proc.returncode == 1, proc.stderr
            assert "PublisherSettings" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert f"did you mean --topic {topic}?" in proc.stderr, proc.stderr
            assert "batches" not in proc.stdout and "━" not in proc.stdout + proc.stderr, proc.stdout
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, [topic]))
