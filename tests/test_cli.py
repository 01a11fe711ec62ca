"""The command line: offline aggregate's error reporting, --help, packaging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmeter.streams.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_aggregate_reports_bad_lines_and_keeps_going(tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_text("\n".join([
        json.dumps({"batch_id": "b1", "session_id": "s", "generation_id": "g1", "accepted": 1, "proposed": 2}),
        "{not json",
        json.dumps({"batch_id": "b1", "session_id": "s", "generation_id": "g2", "accepted": -3}),
        "",
        json.dumps({"batch_id": "", "session_id": "s", "generation_id": "g3"}),
        json.dumps({"type": "marker", "batch_id": "b1", "producer_id": "p", "speculative_algorithm": "NGRAM"}),
    ]) + "\n")
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
    lines = [json.dumps({"meta_info": {"id": "r1", "spec_accept_token_num": 3, "spec_draft_token_num": 4,
                                       "spec_verify_ct": 2, "completion_tokens": 5},
                         "batch_id": "b", "session_id": "s"})]
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
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("specmeter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "specmeter" in tops and not tops & {"schemas", "producers", "streams"}, tops
    assert "specmeter/schemas/__init__.py" in names and "specmeter/streams/cli.py" in names
    # install = unpack (a pure wheel); import from there alone: -S skips site, so the
    # editable finder of this checkout is not loaded; PYTHONPATH brings the dependencies
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])}
    code = ("import specmeter.schemas, specmeter.producers, specmeter.streams, sys;"
            "assert 'sglang' not in sys.modules and 'faust' not in sys.modules;"
            "print(specmeter.streams.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(str(site)), out.stdout
