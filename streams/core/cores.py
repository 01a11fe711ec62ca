"""Which stage-1 core runs: the native one (Rust, ``specmeter.streams.core._native``) when
it is built, else the pure-Python reference (``state``). Both answer the same calls.

``SPECMETER_NO_NATIVE=1`` forces the Python core. It is read once, at import (as
aiokafka reads ``AIOKAFKA_NO_EXTENSIONS``): set it before starting the worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

from . import state

__all__ = ["Core", "PYTHON", "NATIVE", "CORE", "NATIVE_CORE", "NATIVE_DISABLED", "NATIVE_IMPORT_ERROR"]

#: the native core was switched off with SPECMETER_NO_NATIVE
NATIVE_DISABLED = os.environ.get("SPECMETER_NO_NATIVE", "").strip().lower() not in ("", "0", "false", "no")


class Core(NamedTuple):
    """One implementation of the stage-1 core: its state class and its decoder."""

    name: str
    #: ``BatchState(batch_id, run_id=None)``
    BatchState: type
    #: ``decode(data, *, max_bytes=None)``: a decoded message (``state.Decoded`` or
    #: the native twin) with ``groups``, ``producer_id``, ``run_id``, ``invalid``, ``marker``
    decode: Callable[..., Any]


PYTHON = Core("python", state.BatchState, state.decode_message)

NATIVE: Core | None = None
#: why the native core is not loaded (None when it is, or when it was switched off)
NATIVE_IMPORT_ERROR: str | None = None
if not NATIVE_DISABLED:
    try:
        from . import _native
    except ImportError as exc:  # built without a Rust toolchain: the Python core runs
        NATIVE_IMPORT_ERROR = str(exc)
    else:
        _native_decode = _native.decode
        _python_decode = state.decode_message

        def _decode(data: bytes, *, max_bytes: int | None = None) -> Any:
            """The native decoder; a message it does not take whole (anything but a
            clean record or packed batch) goes to the Python decoder."""
            decoded = _native_decode(data, max_bytes)
            return decoded if decoded is not None else _python_decode(data, max_bytes=max_bytes)

        NATIVE = Core("native", _native.BatchState, _decode)

#: the core the worker runs
CORE: Core = NATIVE if NATIVE is not None else PYTHON
#: whether that is the native core (``specmeter --version`` says so)
NATIVE_CORE: bool = CORE is NATIVE
