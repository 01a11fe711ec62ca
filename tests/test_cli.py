"""The command line: offline aggregate's error reporting, --help, packaging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from specmeter.streams.cli import main

from .support.tools import run_specmeter

REPO = Path(__file__).resolve().parents[1]


def test_aggregate_reports_bad_lines_and_keeps_going(tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_text(
        "\n".join(
            [
                json.dumps({"batch_id": "b1", "session_id": "s", "generation_id": "g1", "accepted": 1, "proposed": 2}),
                "{not json",
                json.dumps({"batch_id": "b1", "session_id": "s", "generation_id": "g2", "accepted": -3}),
                "",
                json.dumps({"batch_id": "", "session_id": "s", "generation_id": "g3"}),
                json.dumps({"type": "marker", "batch_id": "b1", "producer_id": "p", "speculative_algorithm": "NGRAM"}),
            ]
        )
        + "\n"
    )
    result = CliRunner().invoke(main, ["aggregate", str(dump)])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.strip().splitlines()
    metrics = json.loads(line)
    assert metrics["batch_id"] == "b1" and metrics["invalid_record_count"] == 1
    assert metrics["metrics"]["spec/accept_rate"] == 0.5 and metrics["speculative_algorithm"] == "NGRAM"
    assert "line 2: undecodable" in result.stderr
    assert "line 3: invalid: Expected `int` >= 0 - at `$.accepted` (batch 'b1')" in result.stderr
    assert "line 5: invalid" in result.stderr and "counted nowhere" in result.stderr
    assert "3 bad line(s)" in result.stderr


def test_aggregate_reads_stdin_and_sglang_outputs():
    lines = [
        json.dumps(
            {
                "meta_info": {
                    "id": "r1",
                    "spec_accept_token_num": 3,
                    "spec_draft_token_num": 4,
                    "spec_verify_ct": 2,
                    "completion_tokens": 5,
                },
                "batch_id": "b",
                "session_id": "s",
            }
        )
    ]
    result = CliRunner().invoke(main, ["aggregate", "-"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0
    metrics = json.loads(result.stdout)["metrics"]
    assert metrics["spec/accept_rate"] == 0.75 and metrics["spec/tokens_per_verify"] == 2.5


@pytest.mark.parametrize("command", [[], ["aggregate"], ["worker"], ["replay"], ["loadgen"], ["tail"]])
def test_help_explains(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output
    assert len(result.output.splitlines()) > 5


@pytest.mark.slow
def test_plain_wheel_installs_under_the_specmeter_namespace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("specmeter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "specmeter" in tops and not tops & {"schemas", "producers", "streams"}, tops
    assert "specmeter/schemas/__init__.py" in names and "specmeter/streams/cli/__init__.py" in names
    # every module of every folder ships (a subpackage missing from pyproject's list would not)
    sources = {
        f"specmeter/{p.relative_to(REPO).as_posix()}"
        for folder in ("schemas", "producers", "streams")
        for p in (REPO / folder).rglob("*.py")
    }
    assert sources <= set(names), sorted(sources - set(names))
    # install = unpack (a pure wheel); import from there alone: -S skips site, so the
    # editable finder of this checkout is not loaded; PYTHONPATH brings the dependencies
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])}
    code = (
        "import specmeter.schemas, specmeter.producers, specmeter.streams, sys;"
        "assert 'sglang' not in sys.modules and 'faust' not in sys.modules;"
        "print(specmeter.streams.__file__)"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(str(site)), out.stdout
    assert "specmeter/streams/data/sample_rollout.jsonl" in names  # the demo's sample ships with it


@pytest.mark.slow
@pytest.mark.kafka
def test_the_demo_runs_from_an_installed_wheel(tmp_path, kafka_bootstrap):
    """Outside a checkout: the sample comes from the package, the broker from the environment."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("specmeter-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    out = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.demo", "--timeout", "120"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "step-00000" in out.stdout and " NO " not in out.stdout  # every batch equals the offline result
    assert "specmeter tail --broker" in out.stderr  # what to try next


# -- day-one polish ----------------------------------------------------------------

KAFKA_ENV = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD_FILE",
    "KAFKA_SSL_CAFILE",
)


@pytest.mark.parametrize(
    ("command", "own"),
    [
        ("worker", ("SPECMETER_WORKER_PARTITIONS", "SPECMETER_WORKER_WEB_PORT", "SPECMETER_WORKER_APP_ID")),
        ("replay", ("SPECMETER_RUN_ID", "SPECMETER_REPLAY_TOPIC")),
        ("loadgen", ("SPECMETER_RUN_ID", "SPECMETER_LOADGEN_BATCHES", "SPECMETER_LOADGEN_SEED")),
        ("tail", ("SPECMETER_TAIL_TOPIC", "SPECMETER_TAIL_LAST")),
    ],
)
def test_help_lists_the_environment_each_command_reads(command, own):
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=120)
    assert result.exit_code == 0
    for name in (*KAFKA_ENV, *own):
        assert name in result.output, (command, name)


def test_every_loadgen_option_explains_itself():
    undocumented = [p.name for p in main.commands["loadgen"].params if isinstance(p, click.Option) and not p.help]
    assert not undocumented


def test_loadgen_algorithm_is_case_insensitive(tmp_path):
    dump = tmp_path / "dump.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "loadgen",
            "--algorithm",
            "eagle3",
            "--batches",
            "1",
            "--sessions-per-batch",
            "2",
            "--producers",
            "1",
            "--dump",
            str(dump),
        ],
    )
    assert result.exit_code == 0, result.output
    markers = [json.loads(line) for line in dump.read_text().splitlines() if '"marker"' in line]
    assert markers and all(m["speculative_algorithm"] == "EAGLE3" for m in markers)
    result = CliRunner().invoke(main, ["loadgen", "--algorithm", "Ngram", "--batches", "1", "--dump", str(dump)])
    assert result.exit_code == 0 and '"speculative_algorithm":"NGRAM"' in dump.read_text()


def test_version_names_the_stack():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith("specmeter ")
    for name in ("faust-streaming", "aiokafka", "msgspec"):
        assert name in lines[1]
    assert lines[2] in ("native core loaded", "python core (native switched off by SPECMETER_NO_NATIVE)") or lines[
        2
    ].startswith("python core (native core not built: ")


class _Captured:
    """Stands in for the Kafka side of a command: what settings it was given."""

    def __init__(self):
        self.settings = None

    async def publish_fleet(self, events, settings, **kwargs):
        from specmeter.streams.fleet.publish import LoadSummary

        self.settings, self.events = settings, list(events)
        return LoadSummary()

    async def replay_lines(self, lines, settings, **kwargs):
        from specmeter.streams.fleet.replay import ReplaySummary

        self.settings = settings
        return ReplaySummary()


@pytest.mark.parametrize("from_env", [False, True])
def test_run_id_reaches_the_publisher_settings(monkeypatch, tmp_path, from_env):
    import specmeter.streams.cli.preflight as preflight
    import specmeter.streams.fleet.publish as loadgen_module
    import specmeter.streams.fleet.replay as replay_module

    captured = _Captured()
    monkeypatch.setattr(preflight, "check_before_start", lambda *a, **k: None)
    monkeypatch.setattr(loadgen_module, "publish_fleet", captured.publish_fleet)
    monkeypatch.setattr(replay_module, "replay_lines", captured.replay_lines)
    args, env = ([], {"SPECMETER_RUN_ID": "run-42"}) if from_env else (["--run-id", "run-42"], {})
    result = CliRunner().invoke(
        main, ["loadgen", *args, "--batches", "1", "--sessions-per-batch", "2", "--no-progress"], env=env
    )
    assert result.exit_code == 0, result.output
    assert captured.settings.run_id == "run-42"
    assert {e.payload.run_id for e in captured.events if not isinstance(e.payload, dict)} == {"run-42"}
    dump = tmp_path / "d.jsonl"
    dump.write_text("")
    result = CliRunner().invoke(main, ["replay", str(dump), *args, "--no-progress"], env=env)
    assert result.exit_code == 0, result.output
    assert captured.settings.run_id == "run-42"


def test_run_id_must_be_a_real_id():
    result = CliRunner().invoke(main, ["loadgen", "--run-id", "", "--dump", "-"])
    assert result.exit_code == 2 and "run id" in result.output
    result = CliRunner().invoke(main, ["loadgen", "--run-id", "r" * 1025, "--dump", "-"])
    assert result.exit_code == 2


def test_loadgen_dump_carries_the_run_and_weight_versions(tmp_path):
    dump = tmp_path / "dump.jsonl"
    result = CliRunner().invoke(
        main, ["loadgen", "--run-id", "attempt-2", "--batches", "2", "--sessions-per-batch", "10", "--dump", str(dump)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    assert all(line["run_id"] == "attempt-2" for line in lines)
    records = [line for line in lines if line.get("type") == "record" and "weight_version" in line]
    assert len({r["weight_version"] for r in records}) >= 2


def test_loadgen_dump_and_expect_carry_tasks_and_inconsistent_histograms(tmp_path):
    """Revision 4 in the synthetic fleet: sessions name their task, a share of generations
    contradicts its histogram, and --expect says so (by_task, the inconsistent count);
    --tasks none gives records without a task, a bad --tasks is refused."""
    dump, expect = tmp_path / "dump.jsonl", tmp_path / "expect.jsonl"
    args = ["loadgen", "--batches", "2", "--sessions-per-batch", "60", "--inconsistent-rate", "0.2"]
    result = CliRunner().invoke(
        main, [*args, "--tasks", "math:1,code:0.5", "--dump", str(dump), "--expect", str(expect)]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    assert {r.get("task") for r in records if r.get("type") == "record"} == {"math", "code"}
    for line in expect.read_text().splitlines():
        metrics = json.loads(line)
        assert [e["task"] for e in metrics["by_task"]] == ["code", "math"]
        assert metrics["metrics"]["spec/inconsistent_generation_count"] > 0
        assert len(metrics["tokens_per_verify_by_budget"]) == len(metrics["accept_histogram"]) - 1
    result = CliRunner().invoke(main, [*args, "--tasks", "none", "--dump", str(dump)])
    assert result.exit_code == 0, result.output
    assert all(json.loads(line).get("task") is None for line in dump.read_text().splitlines())
    result = CliRunner().invoke(main, [*args, "--tasks", "math:2", "--dump", str(dump)])
    assert result.exit_code == 2 and "NAME:FACTOR" in result.output


@pytest.mark.parametrize("tasks", ["garbage", "math:1,code", "math:", ":0.5"])
def test_loadgen_refuses_a_task_without_its_factor(tmp_path, tasks):
    """Issue 47.7: `--tasks garbage` made a task called garbage (the help says NAME:FACTOR)."""
    result = CliRunner().invoke(main, ["loadgen", "--tasks", tasks, "--dump", str(tmp_path / "d.jsonl")])
    assert result.exit_code == 2, result.output
    assert "is not NAME:FACTOR with a factor in (0, 1]" in result.output
    assert not (tmp_path / "d.jsonl").exists() or (tmp_path / "d.jsonl").stat().st_size == 0


def test_loadgen_refuses_a_batch_past_its_bound_before_drawing_it(tmp_path):
    """Issue 47.7: `--sessions-per-batch 100000000` grew to 800 MB with no output."""
    from specmeter.streams.cli.loadgen import MAX_SESSIONS_PER_BATCH

    dump = tmp_path / "d.jsonl"
    result = run_specmeter("loadgen", "--sessions-per-batch", "100000000", "--dump", str(dump), timeout=30)
    assert result.returncode == 2, result.stderr
    assert f"100,000,000 is past {MAX_SESSIONS_PER_BATCH:,}: a batch's events are drawn into memory" in result.stderr
    assert "--batches" in result.stderr.splitlines()[-1], "says what to do instead"
    at_bound = ["loadgen", "--sessions-per-batch", str(MAX_SESSIONS_PER_BATCH), "--batches", "0", "--dump", str(dump)]
    assert CliRunner().invoke(main, at_bound).exit_code == 0, "the bound itself is taken"
    help_text = CliRunner().invoke(main, ["loadgen", "--help"], terminal_width=200).output
    assert f"at most {MAX_SESSIONS_PER_BATCH:,}" in help_text


def test_loadgen_shows_the_progress_of_a_dump_on_a_terminal(tmp_path):
    """A big --dump ran with no output at all; a terminal now gets the batches' progress
    (on stderr: stdout may be the dump), a pipe only the closing line."""
    args = ["loadgen", "--batches", "3", "--sessions-per-batch", "5", "--dump", str(tmp_path / "d.jsonl")]
    terminal = run_specmeter(*args, env={"FORCE_COLOR": "1"})  # rich's own switch for a terminal
    assert terminal.returncode == 0, terminal.stderr
    assert "batches (dump)" in terminal.stderr and "3/3" in terminal.stderr
    piped = run_specmeter(*args)
    assert piped.stderr.splitlines() == [f"loadgen: 117 events written to {tmp_path / 'd.jsonl'}"]
    quiet = run_specmeter(*args, "--no-progress", env={"FORCE_COLOR": "1"})
    assert "batches (dump)" not in quiet.stderr


def test_dev_script_help_is_a_clean_usage_text():
    proc = subprocess.run([str(REPO / "deploy" / "dev"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: deploy/dev")
    assert "deploy/dev demo" in proc.stdout and "deploy/dev test" in proc.stdout
    for line in proc.stdout.splitlines():
        assert not line.lstrip().startswith(("set -", "#")) and "REPO=" not in line, line
    proc = subprocess.run([str(REPO / "deploy" / "dev"), "bogus"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown command 'bogus'" in proc.stderr and "usage:" in proc.stderr


def test_demo_says_what_to_try_next():
    from specmeter.streams.cli.demo import next_steps

    text = next_steps("127.0.0.1:9092", "demo-1.metrics", broker_running=True)
    assert "specmeter tail --broker 127.0.0.1:9092 --topic demo-1.metrics --from-beginning" in text
    assert "--web-port 6066" in text and "curl -s localhost:6066/metrics" in text
    assert "deploy/kafka/broker start" not in text
    assert "deploy/kafka/broker start" in next_steps("127.0.0.1:9092", "m", broker_running=False)


# -- against the real broker ------------------------------------------------------


def _specmeter(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specmeter.streams.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.mark.kafka
def test_replay_publishes_lines_without_a_run_in_the_run_given(kafka_bootstrap, new_topic, tmp_path):
    import asyncio

    from specmeter.schemas import decode_records_message

    from .support.kafka_helpers import read_topic

    records = new_topic(partitions=2, prefix="replay-run")
    dump = tmp_path / "dump.jsonl"
    dump.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {"batch_id": "b", "session_id": "s1", "generation_id": "g1", "accepted": 1, "proposed": 2},
                {
                    "batch_id": "b",
                    "session_id": "s2",
                    "generation_id": "g2",
                    "accepted": 1,
                    "proposed": 2,
                    "run_id": "named-in-the-dump",
                },
            ]
        )
        + "\n"
    )
    proc = _specmeter(
        "replay",
        str(dump),
        "--broker",
        kafka_bootstrap,
        "--topic",
        records,
        "--no-progress",
        env={"SPECMETER_RUN_ID": "attempt-2"},
    )
    assert proc.returncode == 0, proc.stderr
    messages = asyncio.run(read_topic(kafka_bootstrap, records, idle_s=2.0, timeout_s=30))
    runs = {(r.session_id, r.run_id) for m in messages for r in decode_records_message(m.value).records}
    assert runs == {("s1", "attempt-2"), ("s2", "named-in-the-dump")}


@pytest.mark.kafka
@pytest.mark.slow
def test_demo_prints_its_log_path_and_what_to_try_next(kafka_bootstrap):
    proc = subprocess.run(
        [sys.executable, "-m", "specmeter.streams.demo", "--timeout", "120"],
        capture_output=True,
        text=True,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log_line,) = [line for line in proc.stderr.splitlines() if line.startswith("worker log: ")]
    log = Path(log_line.removeprefix("worker log: "))  # the demo's folder, gone with a demo that succeeded (47.3)
    assert log.name == "worker.log" and log.parent.name.startswith("specmeter-demo-") and not log.parent.exists()
    assert "next (" in proc.stderr and f"specmeter tail --broker {kafka_bootstrap} --topic demo-" in proc.stderr
    assert "curl -s localhost:6066/metrics" in proc.stderr
    assert "every batch matches" in proc.stderr and "drift" in proc.stdout


def test_every_worker_flag_reaches_the_settings(monkeypatch):
    """Each tuning flag of `specmeter worker` lands in the one settings object, and the
    flags' defaults are the settings' defaults."""
    import specmeter.streams.cli.preflight as preflight
    import specmeter.streams.worker.run as worker_module
    from specmeter.streams.settings import WorkerSettings

    seen = []
    monkeypatch.setattr(preflight, "check_before_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(worker_module, "run_worker", seen.append)
    flags = {
        "--chunk-bytes": ("chunk_bytes", 4096),
        "--fetch-wait-ms": ("fetch_wait_ms", 7),
        "--max-queued-output-bytes": ("max_queued_output_bytes", 1_000_000),
        "--max-open-generations": ("max_open_generations", 99),
        "--grace": ("grace_s", 12.5),
        "--batch-timeout": ("batch_timeout_s", 3.0),
        "--max-message-bytes": ("max_message_bytes", 2048),
        "--max-exported-tasks": ("max_exported_tasks", 3),
    }
    args = ["worker", "--no-web", "--broker", "127.0.0.1:1"]
    for flag, (_, value) in flags.items():
        args += [flag, str(value)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (settings,) = seen
    for flag, (field, value) in flags.items():
        assert getattr(settings, field) == value, flag
    defaults = {p.name: p.default for p in main.commands["worker"].params}
    for field in (
        "chunk_bytes",
        "fetch_wait_ms",
        "max_queued_output_bytes",
        "max_open_generations",
        "max_message_bytes",
        "partitions",
        "max_exported_tasks",
    ):
        assert defaults[field] == getattr(WorkerSettings(), field), field


def test_max_exported_tasks_bounds_the_worker_s_task_counters_by_flag_and_environment(monkeypatch):
    """The bound on task labels (issue 31): --max-exported-tasks, or
    SPECMETER_WORKER_MAX_EXPORTED_TASKS, reaches the counters the worker's /metrics reads."""
    import specmeter.streams.cli.preflight as preflight
    import specmeter.streams.worker.run as worker_module
    from specmeter.streams.worker.app import StreamShell

    seen = []
    monkeypatch.setattr(preflight, "check_before_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(worker_module, "run_worker", seen.append)
    base = ["worker", "--no-web", "--broker", "127.0.0.1:1"]
    for args, env, want in (
        (base, {}, 16),
        ([*base, "--max-exported-tasks", "3"], {}, 3),
        (base, {"SPECMETER_WORKER_MAX_EXPORTED_TASKS": "0"}, 0),
    ):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
        assert StreamShell(seen.pop()).published.max_tasks == want, (args, env)
    result = CliRunner().invoke(main, [*base, "--max-exported-tasks", "-1"])
    assert result.exit_code != 0 and "--max-exported-tasks" in result.output


def test_expired_retention_reaches_the_settings_by_flag_and_environment(monkeypatch):
    """How long expired batches are remembered (issue 21): --expired-retention, or
    SPECMETER_WORKER_EXPIRED_RETENTION; a week by default."""
    import specmeter.streams.cli.preflight as preflight
    import specmeter.streams.worker.run as worker_module
    from specmeter.streams.settings import WorkerSettings

    seen = []
    monkeypatch.setattr(preflight, "check_before_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(worker_module, "run_worker", seen.append)
    base = ["worker", "--no-web", "--broker", "127.0.0.1:1"]
    runs = [
        (base, {}, 7 * 24 * 3600.0),
        ([*base, "--expired-retention", "86400"], {}, 86400.0),
        (base, {"SPECMETER_WORKER_EXPIRED_RETENTION": "3600"}, 3600.0),
    ]
    for args, env, want in runs:
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
        assert seen.pop().expired_retention_s == want, (args, env)
    assert WorkerSettings().expired_retention_s == 7 * 24 * 3600.0
    result = CliRunner().invoke(main, [*base, "--expired-retention", "0"])
    assert result.exit_code != 0 and "--expired-retention" in result.output
