"""The fixes of issues 37 and 43, each revertible in the worker's own code, for the evidence
that the simulation can fail (``tests/test_delivery_sim.py``, ``docs/ownership.md``).

A fix is reverted in a copy of each function it touched: the function's source with the
fix's lines put back as they were before it (the reverse patch), compiled in the function's
own module and put in its place (and where another module imported it by name). The
simulation then runs as in CI, over forked processes that inherit the reverted code.

``python -m tests.support.sim_reverts [--limit N]`` prints the table: for each fix, the first
seed whose schedule breaks an invariant with it reverted, and what broke.
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from specmeter.streams.core import ownership, stage2
from specmeter.streams.delivery import output, routes, writes

#: (module, qualified name of the function, the fix's text in it, the text before the fix)
Patch = tuple[ModuleType, str, str, str]


@dataclass(frozen=True)
class Revert:
    """One fix, as the reverse patch of the functions it touched."""

    issue: int
    rule: str
    what: str
    patches: tuple[Patch, ...]
    #: modules that imported a patched function by name: (module, name)
    imported: tuple[tuple[ModuleType, str], ...] = ()
    #: found only with the worker's own stages (its deltas, stage 2): every schedule runs them
    real: bool | None = None
    #: searched with checkpoint-only stages whose restore writes nothing (no checkpoint, no
    #: deletions): a fix the worker's restore deletions also cover, shown needed by the
    #: delivery layer's own rules (``docs/ownership.md``, rule 6)
    bare: bool = False


REVERTS = (
    Revert(
        37,
        "4, 6",
        "write versions: no key written twice, deletions once the group is in place",
        (
            (
                writes,
                "_physical",
                "if keys is None:\n        return writes, deletions",
                "if True:\n        return writes + [(key, None) for key in deletions], []",
            ),
        ),
    ),
    Revert(
        37,
        "2",
        "a takeover counts only after an older generation's",
        ((ownership, "counts_after", "if before is None or", "if True or before is None or"),),
        ((writes, "counts_after"),),
    ),
    Revert(
        37,
        "6",
        "a restore's write group is a barrier",
        ((writes, "OwnedWrites.submit", "barrier=barrier and owned.epoch >= 0", "barrier=False"),),
        real=True,
    ),
    Revert(
        37,
        "10",
        "a revocation waits for the writes in flight under a deadline, then stops the worker",
        (
            (
                routes,
                "DeliveryDriver._let_writes_out",
                "self.revoke_wait_s):",
                "None):",
            ),
        ),
    ),
    Revert(
        43,
        "9",
        "a write acknowledged without its offset fails the output",
        ((output, "OrderedProducer._done", "if exc is None and future.result().offset < 0:", "if False:"),),
        bare=True,
    ),
    Revert(
        43,
        "2",
        "an older group's takeover past the clock-skew bound is a stray",
        (
            (
                ownership,
                "counts_after",
                "if takeover.at_ms + CLOCK_SKEW_MS < before.at_ms:",
                "if False:",
            ),
        ),
        ((writes, "counts_after"),),
    ),
    Revert(
        43,
        "2a",
        "a confirmation says where its takeover landed",
        ((ownership, "ChangelogView._owners", "owner.position = confirmation.epoch", "pass"),),
    ),
    Revert(
        43,
        "2b",
        "the kept path confirms the new generation where its next write was due",
        (
            (
                routes,
                "DeliveryDriver._keep_if_unchanged",
                "if not unchanged or not await self.writes.confirm(changelog, p, *confirmed):",
                "if not unchanged:",
            ),
        ),
    ),
    Revert(
        43,
        "2c",
        "a takeover that does not count is asked for again",
        ((routes, "DeliveryDriver._ask_again", "delay_s = self.RETRY_S", "return"),),
    ),
    Revert(
        43,
        "2d",
        "the same generation by another member counts only past the bound",
        (
            (
                ownership,
                "counts_after",
                "if takeover.generation == before.generation and takeover.member and before.member:",
                "if False:",
            ),
        ),
        ((writes, "counts_after"),),
        bare=True,
    ),
    Revert(
        43,
        "7",
        "a gap that compaction emptied gives the partition up",
        ((writes, "OwnedWrites._check_gap", "if gone:", "if False:"),),
        bare=True,
    ),
    Revert(
        43,
        "stage 2",
        "a restore publishes what its state holds and no publication says (a write group landed in part)",
        ((stage2, "BatchMerger._publish_again", "self._publish_owed(entry, effects)", "pass"),),
        real=True,
    ),
    Revert(
        43,
        "11",
        "a write group's completion that failed stops the worker",
        ((writes, "OwnedWrites._done", "self.output.fail(topic, exc)", "pass"),),
    ),
)


def _reverted_function(module: ModuleType, qualname: str, fixed: str, before: str) -> tuple[object, str, object]:
    """(its owner, its name, the function with ``fixed`` put back to ``before``)."""
    owner_name, _, name = qualname.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
    if fixed not in source:
        raise AssertionError(
            f"{qualname} no longer holds the fix's text {fixed!r}: update tests/support/sim_reverts.py"
        )
    namespace: dict = {}
    exec(compile(source.replace(fixed, before), f"<{qualname}, fix reverted>", "exec"), module.__dict__, namespace)
    return owner, name, namespace[name]


@contextlib.contextmanager
def reverted(revert: Revert) -> Iterator[None]:
    """The worker's code with ``revert``'s fix reverted, for the time of the block."""
    saved = []
    try:
        for module, qualname, fixed, before in revert.patches:
            owner, name, function = _reverted_function(module, qualname, fixed, before)
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, function)
        for module, name in revert.imported:
            saved.append((module, name, module.__dict__[name]))
            setattr(module, name, getattr(ownership, name))
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def main() -> None:
    import argparse
    import logging
    import time

    from .delivery_sim import first_failure
    from .sim.runs import with_fixed_hash_seed

    with_fixed_hash_seed("tests.support.sim_reverts")

    parser = argparse.ArgumentParser(prog="python -m tests.support.sim_reverts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=2000, help="seeds tried per fix (default 2,000)")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    print("| issue | rule | fix reverted | found at seed | what broke |")
    print("|---|---|---|---|---|")
    for revert in REVERTS:
        began = time.monotonic()
        with reverted(revert):
            found = first_failure(args.limit, real=revert.real, bare=revert.bare)
        seconds = time.monotonic() - began
        if found is None:
            print(f"| {revert.issue} | {revert.rule} | {revert.what} | not within {args.limit} ({seconds:.0f} s) | |")
        else:
            seed, violation = found
            what = violation.split("\n")[0].split(": ", 1)[-1]
            kind = " (own stages)" if revert.real else " (bare stages)" if revert.bare else ""
            print(f"| {revert.issue} | {revert.rule} | {revert.what} | {seed}{kind} ({seconds:.0f} s) | {what[:160]} |")


if __name__ == "__main__":
    main()
