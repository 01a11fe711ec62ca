"""Running schedules: one seed's, many over a process per core, the shortest prefix of a
failing one, the first failure below a limit, and the long mode. Apart from the scheduler
because these say which schedules run and how, not what happens in one. A setting here
(``REAL_EVERY``, ``WORKERS``, ``STEPS``) is read from this module: change it here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from .outcomes import Violation
from .scheduler import Simulation

#: one schedule in this many runs the worker's own stages (the others, checkpoint-only ones)
REAL_EVERY = 10


def runs_real_stages(seed: int) -> bool:
    """Whether schedule ``seed`` runs the worker's own stages."""
    return seed % REAL_EVERY == REAL_EVERY - 1


#: how many workers a schedule runs, by its seed (two to four)
WORKERS = (2, 3, 2, 4, 3)
#: the steps of a schedule before its group is left quiet
STEPS = 100


def run_simulation(seed: int, *, steps: int = STEPS, real: bool | None = None, bare: bool = False) -> Simulation:
    """One schedule (with the worker's own stages when ``real``; None: as the seed says;
    ``bare``: checkpoint-only stages whose restore writes nothing); raises ``Violation``
    when an invariant breaks."""
    real = runs_real_stages(seed) if real is None else real
    sim = Simulation(seed, workers=WORKERS[seed // REAL_EVERY % len(WORKERS)], real=real, bare=bare)
    try:
        sim.rebalance_all()
        for _ in range(steps):
            sim.step()
        sim.settle()
        sim.check_settled()
    finally:
        for w in sim.workers:
            if not w.loop.is_closed():
                w.close()
        asyncio.set_event_loop(None)
    return sim


def shortest_failure(seed: int, steps: int = STEPS) -> Violation | None:
    """The violation of the shortest prefix of schedule ``seed`` that still breaks an
    invariant (its steps, then the quiet group's settling): the trace to read first."""
    for length in range(1, steps + 1):
        try:
            run_simulation(seed, steps=length)
        except Violation as violation:
            return violation
    return None


def failures_among(seeds: range) -> list[str]:
    """The violations of the schedules ``seeds``, each with its seed and its shortest trace."""
    found = []
    for seed in seeds:
        try:
            run_simulation(seed)
        except Violation as violation:
            shortest = shortest_failure(seed)
            found.append(str(shortest or violation))
    return found


def run_many(
    schedules: int, *, start: int = 0, jobs: int = 0, progress: Callable[[int, list[str]], None] | None = None
) -> list[str]:
    """Schedules ``start`` to ``start + schedules - 1`` over ``jobs`` processes (0: one per
    core); the violations found, each with its seed and shortest trace."""
    import multiprocessing

    jobs = jobs or multiprocessing.cpu_count()
    size = max(1, min(100, schedules // (jobs * 8) or 1))  # small: no core idles long at the end
    chunks = [range(s, min(s + size, start + schedules)) for s in range(start, start + schedules, size)]
    found: list[str] = []
    done = 0
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_quiet) as pool:
        for violations, chunk in zip(pool.imap(failures_among, chunks), chunks, strict=True):
            found += violations
            done += len(chunk)
            if progress is not None:
                progress(done, found)
    return found


def _quiet() -> None:
    """A schedule's process logs nothing: the workers say much, a violation carries its
    trace, and under pytest every line would be formatted and held by its capture."""
    import logging

    logging.disable(logging.CRITICAL)


def _violation_of(seed: int, real: bool | None = None, bare: bool = False) -> str | None:
    try:
        run_simulation(seed, real=real, bare=bare)
    except Violation as violation:
        return str(violation)
    return None


def first_failure(limit: int, *, jobs: int = 0, real: bool | None = None, bare: bool = False) -> tuple[int, str] | None:
    """The first seed below ``limit`` whose schedule breaks an invariant, and its violation
    (None: none does); every schedule with the worker's own stages when ``real``, or with
    stages whose restore writes nothing when ``bare``. Over a
    process per core, forked: a function replaced in this process (a fix reverted) is
    replaced in theirs."""
    import multiprocessing

    check = functools.partial(_violation_of, real=real, bare=bare)
    with multiprocessing.get_context("fork").Pool(jobs or multiprocessing.cpu_count(), initializer=_quiet) as pool:
        for seed, violation in enumerate(pool.imap(check, range(limit), chunksize=4)):
            if violation is not None:
                pool.terminate()
                return seed, violation
    return None


def with_fixed_hash_seed(module: str) -> None:
    """Run ``python -m module`` again under ``PYTHONHASHSEED=0`` unless a hash seed is set:
    the schedules iterate sets of strings, so one seed replays one schedule only under one
    hash seed (``deploy/dev test`` sets the same)."""
    import os
    import sys

    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    """The long mode: ``python -m tests.support.delivery_sim --schedules 1000000``."""
    with_fixed_hash_seed("tests.support.delivery_sim")
    import argparse
    import json
    import logging
    import sys
    import time

    parser = argparse.ArgumentParser(
        prog="python -m tests.support.delivery_sim",
        description="Run the delivery simulation's schedules (one seed, one schedule) and report violations.",
    )
    parser.add_argument("--schedules", type=int, default=10_000, help="how many schedules (default 10,000)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--jobs", type=int, default=0, help="processes (default: one per core)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines (default 30)")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the workers say what they do; the violations say what matters
    began = last = time.monotonic()

    said = 0

    def progress(done: int, found: list[str]) -> None:
        nonlocal last, said
        for violation in found[said:]:  # each as soon as it is found
            print(violation, file=sys.stderr, flush=True)
        said = len(found)
        now = time.monotonic()
        if now - last >= args.every or done == args.schedules:
            last = now
            rate = done / (now - began)
            print(
                f"{done:,}/{args.schedules:,} schedules, {said} violations, {rate:,.0f}/s", file=sys.stderr, flush=True
            )

    found = run_many(args.schedules, start=args.start, jobs=args.jobs, progress=progress)
    elapsed = time.monotonic() - began
    summary = {"schedules": args.schedules, "start": args.start, "violations": len(found), "seconds": round(elapsed, 1)}
    print(json.dumps(summary))
    return 1 if found else 0
