"""The worker's and its tools' own errors: one base, ``SpecmeterError``.

Each subclass also derives from the built-in error it is a kind of (a broker that does
not answer is a ``ConnectionError``), so code that caught those keeps working. Every
message says what is wrong; ``fix``, when set, says what to do, in one line;
``retriable`` says whether trying again later can succeed as it is.
"""

from __future__ import annotations

__all__ = ["SpecmeterError"]


class SpecmeterError(Exception):
    """Base of specmeter's stream-side errors (the worker, ``tail``, ``aggregate``, ...)."""

    #: whether the same call may succeed later unchanged (a broker away for a while)
    retriable: bool = False
    #: what to do about it, one line (None: the message says it)
    fix: str | None = None
