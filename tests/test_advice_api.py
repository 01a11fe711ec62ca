"""The advice as a library (issue 45): ``specmeter.streams.advice`` is what a trainer
calls on the BatchMetrics it holds: a typed, frozen msgspec result, the same as the
command's, imported without the command line, the terminal or Kafka."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from specmeter.streams import advice as library
from specmeter.streams.cli import advise as command

from .test_advise import lag_batches


def test_the_result_is_typed_frozen_and_round_trips_through_msgspec():
    advice = library.advise(lag_batches(), by="draft_lag", draft_cost=0.1, refresh_cost=100.0)
    assert isinstance(advice, msgspec.Struct) and isinstance(advice.curves[0], library.Curve)
    with pytest.raises(AttributeError):
        advice.curves[0].best = 3  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(advice), type=library.Advice) == advice
    assert advice.staleness is not None and advice.staleness.refresh is not None
    assert advice.staleness.refresh.every == 3  # by hand: tests/test_advise.py


def test_the_command_prints_what_the_library_returns():
    """One implementation: the command's names are the library's."""
    for name in ("advise", "budget_curve", "recommend", "engine_settings", "staleness", "refresh_interval"):
        assert getattr(command, name) is getattr(library, name), name
    advice = library.advise(lag_batches(), by="draft_lag", draft_cost=0.1)
    assert (
        library.advice_json(advice) == msgspec.json.format(msgspec.json.encode(advice.as_document()), indent=2) + b"\n"
    )


def test_importing_the_library_loads_no_command_line_terminal_or_kafka():
    code = (
        "import sys; import specmeter.streams.advice; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'rich', 'aiokafka', 'faust') "
        "or m.startswith('specmeter.streams.cli')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
