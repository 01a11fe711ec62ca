"""The README's main job: a worker on an embedded local Kafka broker, fed by the
bundled sample rollout, printing the metrics it publishes.

    deploy/dev demo            (or: python -m specmeter.streams.demo --help)

Steps: start the local KRaft broker (deploy/kafka/broker) unless
KAFKA_BOOTSTRAP_SERVERS is set; start `specmeter worker` with a fresh app id
(its log path is printed on a line of its own); replay the sample dump as its
three producers would; read the metrics topic until every batch is published;
check the result against `specmeter aggregate` on the same file; stop the
worker (and the broker it started); say what to try next.

What it starts ends with it, however it ends (Ctrl-C at any moment, SIGTERM, SIGHUP, an
error; a SIGKILL through ``lifetime``'s reaper and the broker's watchdog): the worker, the
local broker it started (not one it found running, nor KAFKA_BOOTSTRAP_SERVERS'), and its
folder in the temporary directory. ``--keep-broker`` keeps the broker and the worker's log;
a failed demo keeps the log and prints its path.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .base import Number, exit_status
from .lifetime import Reaper, stop_signals_raise, tied_to_me

REPO = Path(__file__).resolve().parents[2]
#: the bundled sample rollout ships inside the package (it works from an installed wheel)
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_rollout.jsonl"
#: the local broker script exists in a checkout only; elsewhere KAFKA_BOOTSTRAP_SERVERS names a broker
BROKER = REPO / "deploy" / "kafka" / "broker"


@dataclass
class Owned:
    """What the demo started, and so stops however it ends (issue 47.3): the local broker
    (unless ``--keep-broker``), the worker, and its folder in the temporary directory
    (``worker.log`` and the worker's data). The reaper does it if the demo is killed."""

    console: Any
    keep_broker: bool
    folder: Path
    reaper: Reaper
    broker: bool = False
    address: str = ""
    worker: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.folder / "worker.log"

    def close(self, outcome: str) -> None:
        """Stop the broker (the worker has stopped); remove the folder, or keep the worker's
        log of a failed demo (``outcome``: ok, interrupted or failed) or of one that keeps its broker."""
        if self.broker:
            self._stop_broker()
        self._remove_folder(outcome)

    def _stop_broker(self) -> None:
        """The broker the demo started stopped, or with ``--keep-broker`` the command that stops it said."""
        if not self.keep_broker:
            # a session of its own: a second Ctrl-C stops the demo, not the broker's stop
            subprocess.run([str(BROKER), "stop"], capture_output=True, start_new_session=True)
            return
        at = f" at {self.address}" if self.address else ""  # an interrupted start: not known yet
        click.echo(f"the local broker keeps running{at}; stop it with: {_shown(BROKER)} stop", err=True)

    def _remove_folder(self, outcome: str) -> None:
        """The demo's folder removed, all but a worker's log worth reading (a failed demo's,
        or one that keeps its broker), whose path is said."""
        keep_log = self._log_worth_reading(outcome)
        shutil.rmtree(self.folder / "data" if keep_log else self.folder, ignore_errors=True)
        if keep_log:
            click.echo(f"worker log kept: {self.log}", err=True)

    def _log_worth_reading(self, outcome: str) -> bool:
        """Whether the worker's log is kept: a failed demo's, or one that keeps its broker,
        and not empty."""
        return bool((outcome == "failed" or self.keep_broker) and self.log.exists() and self.log.stat().st_size)


def _start_broker(owned: Owned) -> tuple[str, bool]:
    """The broker KAFKA_BOOTSTRAP_SERVERS names, else the local one: its address, and
    whether the demo started it."""
    from ..settings import bootstrap_servers

    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        try:
            return bootstrap_servers(configured), False
        except ValueError as exc:
            raise click.ClickException(f"KAFKA_BOOTSTRAP_SERVERS: {exc}") from None
    return _local_broker(owned)


def _local_broker(owned: Owned) -> tuple[str, bool]:
    """The checkout's local broker, started unless it runs already: its address, and
    whether the demo started it. One it starts is the demo's from the first moment (an
    interrupted start stops it too) and, without ``--keep-broker``, tied to the demo's
    process (``lifetime.tied_to_me``): it stops when the demo ends, however it ends."""
    if not BROKER.exists():
        raise click.ClickException(
            "no local broker script here (an installed package, not a checkout): set "
            "KAFKA_BOOTSTRAP_SERVERS to a running broker's HOST:PORT"
        )
    running = subprocess.run([str(BROKER), "status"], capture_output=True, text=True)
    if running.returncode == 0:  # someone else's: the demo leaves it alone
        return running.stdout.strip().splitlines()[-1], False
    return _started_broker(owned), True


def _started_broker(owned: Owned) -> str:
    """The local broker started, the demo's before it answers (an interrupted start stops
    it too) and tied to the demo's process unless ``--keep-broker``: its address."""
    owned.broker = True
    env = None if owned.keep_broker else tied_to_me()
    with owned.console.status("starting the local Kafka broker (first run downloads its jars with Maven)..."):
        proc = subprocess.run([str(BROKER), "start"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise click.ClickException(f"the local broker did not start:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _check_broker(broker: str) -> None:
    from specmeter.producers import KafkaSecurity

    from .preflight import BrokerUnreachable, check_broker

    try:  # the demo's own clients use no security (it runs on a local broker)
        asyncio.run(check_broker(broker, KafkaSecurity()))
    except BrokerUnreachable as exc:
        raise click.ClickException(
            f"no Kafka broker answers at {broker}: set KAFKA_BOOTSTRAP_SERVERS to a running "
            "broker's HOST:PORT, or unset it to start the local one "
            f"({'; '.join(exc.reasons)[:200]})"
        ) from None


def _read_metrics(broker: str, topic: str, batches: set[str], timeout_s: float) -> dict:
    from aiokafka import AIOKafkaConsumer

    from specmeter.schemas import decode_metrics

    async def read() -> dict:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker, auto_offset_reset="earliest", group_id=None)
        await consumer.start()
        latest: dict = {}
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not batches <= set(latest):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    for message in messages:
                        m = decode_metrics(message.value)
                        if m.batch_id not in latest or m.revision >= latest[m.batch_id].revision:
                            latest[m.batch_id] = m
        finally:
            await consumer.stop()
        return latest

    return asyncio.run(read())


def _table(results: list, offline: dict):
    from rich.table import Table

    table = Table(
        title="specmeter: per-batch speculative decoding metrics (from the stream)",
        caption="drift: accept rate per weight version (policy drift away from the draft model) · "
        "staleness: accept rate per draft lag (policy updates the draft is behind)",
    )
    for column in (
        "batch",
        "accept rate",
        "tokens/verify",
        "accept cov.",
        "verify cov.",
        "generations",
        "samples",
        "conflicts",
        "invalid",
        "complete",
        "= offline",
        "drift",
        "staleness",
    ):
        table.add_column(column, **_column_style(column))
    for m in results:
        table.add_row(*_row(m, offline))
    return table


def _column_style(column: str) -> dict[str, Any]:
    """How a column of the demo's table is drawn: the batch and the two views left and
    unwrapped, the numbers right; a numeric column (and the staleness view) never narrower
    than its header."""
    text = column in ("batch", "drift", "staleness")
    return {
        "justify": "left" if text else "right",
        "no_wrap": text,
        "overflow": "ellipsis",
        "min_width": len(column) if column not in ("batch", "drift") else None,
    }


def _row(m, offline: dict) -> list[str]:
    """A batch's row: its numbers, whether it matches the offline result, its drift."""
    from .tables import drift_text, staleness_text

    x = m.metrics
    return [
        m.batch_id,
        *(
            _number(x.get(key))
            for key in (
                "spec/accept_rate",
                "spec/tokens_per_verify",
                "spec/accept_count_coverage",
                "spec/verify_count_coverage",
                "spec/unique_generation_count",
                "spec/sample_count",
                "spec/conflicting_generation_count",
            )
        ),
        str(m.invalid_record_count),
        "yes" if m.complete else "no",
        "yes" if offline.get(m.batch_id) == m.metrics else "NO",
        drift_text(m.by_weight_version, _view_width(32)),
        staleness_text(m.by_draft_lag, _view_width(24)),
    ]


def _view_width(on_terminal: int) -> int:
    """A view's width in the table: ``on_terminal`` on a terminal; piped, whole, so that
    nothing is cut (``| grep`` finds what it looks for)."""
    from .tables import WHOLE_WIDTH

    return on_terminal if sys.stdout.isatty() else WHOLE_WIDTH


def _number(v) -> str:
    """A metric as the table shows it: ``-`` where it is missing, a float to 4 places."""
    return "-" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def next_steps(broker: str, metrics_topic: str, broker_running: bool, cleaned: bool = False) -> str:
    """What to try after the demo, as lines to paste: the tools on the same broker,
    a worker's HTTP side."""
    lines = ["next (the commands are in .venv/bin; `source .venv/bin/activate` puts them on your PATH):"]
    if not broker_running:
        lines += [
            "  # the demo stopped the broker it started; bring it back (or run the demo with --keep-broker)",
            "  deploy/kafka/broker start",
        ]
    if not cleaned:
        lines += [
            "  # this demo's batches again, with the drift view (accept rate per weight version); the demo's",
            "  # topics and groups stay on the broker (`--clean` removes them at the end)",
            f"  specmeter tail --broker {broker} --topic {metrics_topic} --from-beginning",
        ]
    lines += [
        "  # a worker with its HTTP server and Prometheus metrics, a synthetic fleet with drift, the live table",
        f"  specmeter worker --broker {broker} --web-port 6066 &",
        "  curl -s localhost:6066/metrics | grep '^specmeter_'",
        f"  specmeter loadgen --broker {broker} --batches 20 --rate 5000",
        f"  specmeter tail --broker {broker}",
    ]
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dump",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=SAMPLE,
    show_default=True,
    help="Rollout dump to feed the worker.",
)
@click.option("--json", "as_json", is_flag=True, help="Print BatchMetrics JSON lines instead of a table.")
@click.option(
    "--timeout",
    type=Number(min=0, min_open=True),
    default=180.0,
    show_default=True,
    help="Give up after this many seconds.",
)
@click.option(
    "--keep-broker",
    is_flag=True,
    help="Leave the local broker it started running afterwards, and keep the worker's log (the demo prints the "
    "command that stops the broker and where the log is). Without it, what the demo started goes when it ends, "
    "however it ends.",
)
@click.option(
    "--clean",
    is_flag=True,
    help="Remove the topics and consumer groups of the demo's app id (demo-<time>-<id>) at the end. Without "
    "it they are kept (off by default), so `specmeter tail` shows the demo's batches again.",
)
def main(dump: Path, as_json: bool, timeout: float, keep_broker: bool, clean: bool) -> None:
    """Run the worker on a local broker, feed it a rollout dump, print its metrics."""
    from rich.console import Console

    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    reaper = Reaper()
    owned = Owned(Console(stderr=True), keep_broker, Path(tempfile.mkdtemp(prefix=f"specmeter-{run}-")), reaper)
    reaper.folder(owned.folder)
    outcome = "failed"
    try:
        with stop_signals_raise():
            metrics_topic = _run(owned, run, dump, as_json, timeout)
        outcome = "ok"
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM, SIGHUP: what the demo started goes
        outcome = "interrupted"
        click.echo("demo: interrupted: stopping what it started", err=True)
        raise SystemExit(exit_status(interrupt)) from None  # 130, 143: the shell's status for the signal
    finally:
        _clean_up(owned, run, clean, outcome)
    click.echo(
        next_steps(owned.address, metrics_topic, broker_running=keep_broker or not owned.broker, cleaned=clean),
        err=True,
    )


def _clean_up(owned: Owned, run: str, clean: bool, outcome: str) -> None:
    """What the demo started goes, however it ended: the worker, with ``--clean`` the run's
    topics and groups, the broker and the folder; then the reaper is told it is done."""
    _stop_worker(owned.worker)
    if clean and owned.address:
        _say_removed(owned.address, run)
    owned.close(outcome)
    owned.reaper.done()  # not reached when the clean-up itself is interrupted: the reaper finishes it


def _run(owned: Owned, run: str, dump: Path, as_json: bool, timeout: float) -> str:
    """The demo's steps, from the broker to the checked table; returns the metrics topic."""
    console = owned.console
    broker, owned.broker = _start_broker(owned)
    owned.address = broker
    console.print(f"broker: [bold]{broker}[/]")
    _check_broker(broker)
    topics = _demo_topics(broker, run)
    _start_worker(owned, broker, run, topics)
    _replay(console, dump, broker, topics.records)
    expected = _offline(dump)
    latest, results = _published(console, broker, topics.metrics, expected, timeout)
    _print_results(results, expected, as_json)
    _check_results(expected, latest, results, f"within {timeout:.0f}s (log: {owned.log})")
    console.print("[green]every batch matches `specmeter aggregate` on the same dump[/]")
    return topics.metrics


def _start_worker(owned: Owned, broker: str, run: str, topics) -> None:
    """The worker started on the run's topics, in a session of its own (Ctrl-C reaches the
    demo, which stops it) that the reaper knows of, its output in the log; once it is ready."""
    click.echo(f"worker log: {owned.log}", err=True)  # one line, never wrapped: copy it, tail -f it
    with owned.log.open("wb") as log:
        owned.worker = subprocess.Popen(
            _worker_args(broker, run, topics, owned.folder / "data"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    owned.reaper.group(owned.worker.pid)
    _await_ready(owned.console, owned.worker, owned.log)
    owned.console.print(f"worker: ready (app id [bold]{run}[/])")


def _shown(path: Path) -> str:
    """A path as a person types it: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _say_removed(broker: str, run: str) -> None:
    """``--clean``: the demo's topics and consumer groups removed, in one line (a failure too)."""
    try:
        topics, groups = remove_app_state(broker, run)
    except Exception as exc:  # noqa: BLE001 - a clean-up that fails must not hide the demo's own outcome
        click.echo(f"demo: could not remove the topics and groups of {run} ({type(exc).__name__}: {exc})", err=True)
        return
    click.echo(f"removed the demo's {topics} topic(s) and {groups} consumer group(s) ({run}*)", err=True)


def _of_app(name: str, app_id: str) -> bool:
    """A topic or group of ``app_id``: its own topics (``<id>.records``) and the worker's (``<id>-stage1``...)."""
    return name.startswith((f"{app_id}.", f"{app_id}-")) or name == app_id


def remove_app_state(broker: str, app_id: str, timeout_s: float = 30.0) -> tuple[int, int]:
    """Delete the topics and consumer groups named after ``app_id`` (the demo's fresh one, so
    nothing else's); the worker must have stopped (a group with members is not deleted).
    Returns how many topics and groups were removed."""
    return asyncio.run(asyncio.wait_for(_remove_app_state(broker, app_id), timeout_s))


async def _remove_app_state(broker: str, app_id: str) -> tuple[int, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        return await _remove_topics(admin, app_id), await _remove_groups(admin, app_id)
    finally:
        await admin.close()


async def _remove_topics(admin, app_id: str) -> int:
    """Delete ``app_id``'s topics in one request; how many there were."""
    topics = sorted(t for t in await admin.list_topics() if _of_app(t, app_id))
    if topics:
        await admin.delete_topics(topics)
    return len(topics)


async def _remove_groups(admin, app_id: str) -> int:
    """Delete ``app_id``'s consumer groups, a request each (``_delete_group``); how many there were."""
    groups = sorted(g[0] for g in await admin.list_consumer_groups() if _of_app(g[0], app_id))
    for group in groups:
        await _delete_group(admin, group)
    return len(groups)


async def _delete_group(admin, group: str, tries: int = 20) -> None:
    """Delete one consumer group (aiokafka has no call for it: ``delivery.internals``, the
    one room for its private members, sends the DeleteGroups request); one whose members
    are still leaving (GROUP_NOT_EMPTY) is tried again for a few seconds."""
    from aiokafka.errors import for_code

    from ..delivery.internals import delete_consumer_group

    for _ in range(tries):
        code = await delete_consumer_group(admin, group)
        if code in (0, 69):  # none, GROUP_ID_NOT_FOUND
            return
        if code != 68:  # GROUP_NOT_EMPTY: its members are still leaving
            raise for_code(code)(f"deleting consumer group {group}")
        await asyncio.sleep(0.5)
    raise TimeoutError(f"consumer group {group} still has members")


def _demo_topics(broker: str, run: str):
    """The run's own topics, created as the worker wants them (4 partitions)."""
    from ..settings import TopicNames, WorkerSettings
    from ..worker.topics import ensure_topics

    topics = TopicNames(
        records=f"{run}.records", partials=f"{run}.partials", metrics=f"{run}.metrics", deadletter=f"{run}.deadletter"
    )
    asyncio.run(
        ensure_topics(WorkerSettings(broker=broker, app_id=run, topics=topics, partitions=4, batch_timeout_s=20.0))
    )
    return topics


def _worker_args(broker: str, run: str, topics, data_dir: Path) -> list[str]:
    """The worker's command line: the run's topics, short timeouts, no web server, its data dir."""
    return [
        sys.executable,
        "-m",
        "specmeter.streams.cli",
        "worker",
        "--broker",
        broker,
        "--app-id",
        run,
        "--records-topic",
        topics.records,
        "--partials-topic",
        topics.partials,
        "--metrics-topic",
        topics.metrics,
        "--deadletter-topic",
        topics.deadletter,
        "--partitions",
        "4",
        "--batch-timeout",
        "20",
        "--session-timeout",
        "10",
        "--no-web",
        "--data-dir",
        str(data_dir),
    ]


def _await_ready(console, worker: subprocess.Popen, log_path: Path) -> None:
    """Wait for the worker's ready line in its log (90 s); a worker that exits or never gets there fails the demo."""
    with console.status("starting the worker..."):
        deadline = time.monotonic() + 90
        while "Worker ready" not in log_path.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"the worker did not start; its log:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)


def _replay(console, dump: Path, broker: str, topic: str) -> None:
    """Replay the dump as its producers would, and say what was sent."""
    from specmeter.producers import PublisherSettings

    from ..fleet.replay import replay_lines

    with dump.open("rb") as lines, console.status(f"replaying {dump.name} as its producers would..."):
        summary = asyncio.run(replay_lines(lines, PublisherSettings(bootstrap_servers=broker, topic=topic)))
    console.print(
        f"replayed {summary.records} records, {summary.invalid} invalid, {summary.markers} markers "
        f"from {summary.producers} producers"
    )


def _offline(dump: Path) -> dict:
    """Each batch's metrics as ``specmeter aggregate`` computes them from the same dump."""
    from ..core.offline import OfflineAggregator
    from ..fleet.dumps import parse_dump_line

    offline = OfflineAggregator(parse=parse_dump_line)
    with dump.open("rb") as lines:
        offline.feed_lines(lines)
    return {m.batch_id: m.metrics for m in offline.results()}


def _published(console, broker: str, topic: str, expected: dict, timeout: float) -> tuple[dict, list]:
    """What the worker published, each batch's newest, and of it the expected batches in their order."""
    with console.status("waiting for the worker to publish every batch..."):
        latest = _read_metrics(broker, topic, set(expected), timeout)
    return latest, [latest[b] for b in expected if b in latest]


def _print_results(results: list, expected: dict, as_json: bool) -> None:
    """The worker's metrics on stdout: JSON lines, or the table (whole where stdout is no terminal)."""
    from specmeter.schemas import encode_metrics

    from .tables import output_console

    if as_json:
        for m in results:
            sys.stdout.buffer.write(encode_metrics(m) + b"\n")
        sys.stdout.flush()
        return
    out = output_console()  # redirected: as wide as the table, no header or drift view cut
    out.print(_table(results, expected))


def _check_results(expected: dict, latest: dict, results: list, waited: str) -> None:
    """Fail the demo where a batch was not published in time or disagrees with the offline result."""
    missing = set(expected) - set(latest)
    if missing:
        raise click.ClickException(f"no metrics for {sorted(missing)} {waited}")
    if any(expected[m.batch_id] != m.metrics for m in results):
        raise click.ClickException("the stream disagrees with `specmeter aggregate` on the same dump")


def _stop_worker(worker: subprocess.Popen | None) -> None:
    """Stop a worker still running: SIGTERM to its process group, SIGKILL after 30 s."""
    if worker is not None and worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
