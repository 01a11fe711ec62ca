"""A synthetic rollout fleet: realistic records for demos, tests and benchmarks.

Seeded and pure (no I/O): the same ``FleetSpec`` always gives the same events.
Sessions branch into trajectories that share ancestor generations; counters
follow a per-step acceptance model of each speculative algorithm; a share of
records is redelivered, conflicting, missing counters or invalid.

Policy drift, as asynchronous RL shows it: batch ``b`` is generated mostly by
the current policy version (``v{first_version + b}``) and partly by up to
``stale_versions`` older ones (each session by one version, the older the
rarer). The draft model was trained against one policy version and is
refreshed every ``draft_refresh_batches`` batches; a generation's per-draft
acceptance falls by ``drift_per_version`` (relative) for every version its
policy is ahead of the draft's. So within a batch the newer versions accept
less, and over the batches acceptance saws down and back up at each refresh.

Tasks (revision 4): each session's prompt comes from one task (dataset) of
``tasks``, and the draft accepts differently on each (a per-draft acceptance
factor per task); the tasks are drawn from a generator of their own, so the rest
of the fleet's draws are those of a spec without them. A share
``inconsistent_rate`` of the generations reports a histogram that contradicts its
own counters (one verify step too many, or the histogram indexed by accept
length), as a broken engine or adapter would.

Draft lags (revision 5): with ``draft_lags``, each record names how many policy
versions its session's policy is ahead of the draft model (``staleness``, the very
number its acceptance drifts by), as a rollout framework that knows both would; no
draw is added, so the fleet's counters are those of a spec without lags.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from specmeter.schemas import MAX_ID, BatchMarker, GenerationRecord

__all__ = ["FleetSpec", "FleetEvent", "synthetic_fleet", "ALGORITHMS"]

#: algorithm -> (drafts proposed per verify step, range of per-draft acceptance probability)
ALGORITHMS: dict[str, tuple[int, tuple[float, float]]] = {
    "NGRAM": (7, (0.25, 0.7)),
    "EAGLE": (3, (0.55, 0.85)),
    "EAGLE3": (4, (0.6, 0.9)),
    "STANDALONE": (4, (0.45, 0.8)),
}


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """What the synthetic fleet produces. Rates are per record."""

    batches: int = 3
    sessions_per_batch: int = 16
    producers: int = 3
    max_samples_per_session: int = 3
    max_turns: int = 4
    redelivery_rate: float = 0.2
    conflict_rate: float = 0.01
    missing_rate: float = 0.05
    invalid_rate: float = 0.005
    algorithm: str | None = "EAGLE3"
    seed: int = 0
    batch_prefix: str = "step-"
    template_pool: int = 2048
    #: older policy versions mixed into each batch besides the current one
    stale_versions: int = 3
    #: the draft model is retrained on the then-current policy every this many batches (0: never)
    draft_refresh_batches: int = 8
    #: relative drop of per-draft acceptance per version the policy is ahead of the draft
    drift_per_version: float = 0.06
    #: the policy version of batch 0 (versions are named ``v<N>``)
    first_version: int = 10
    #: the training run every record and marker names (None: the default run)
    run_id: str | None = None
    #: (revision 4) the tasks sessions draw their prompts from, each with the factor of
    #: per-draft acceptance the draft model shows on it; empty: records name no task
    tasks: tuple[tuple[str, float], ...] = (("chat", 0.9), ("gsm8k", 1.0), ("swe-bench", 0.8))
    #: (revision 4) share of generations whose histogram contradicts their counters
    inconsistent_rate: float = 0.005
    #: (revision 5) records name their draft lag (``staleness``); False: they name none
    draft_lags: bool = True

    def __post_init__(self) -> None:
        self._check_algorithm()
        self._check_fleet()
        self._check_rates()
        self._check_names()

    def _check_algorithm(self) -> None:
        """The algorithm the markers name: one the contract knows, or None."""
        if self.algorithm is not None and self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}: choose from {sorted(ALGORITHMS)} or None")

    def _check_fleet(self) -> None:
        """The fleet's sizes and its versions."""
        if min(self.producers, self.sessions_per_batch) < 1 or self.batches < 0:
            raise ValueError("producers and sessions_per_batch must be >= 1, batches >= 0")
        if min(self.stale_versions, self.draft_refresh_batches, self.first_version) < 0:
            raise ValueError("stale_versions, draft_refresh_batches and first_version must be >= 0")

    def _check_rates(self) -> None:
        """What shapes the records' counters: the drift and the contradicting share."""
        if not 0 <= self.drift_per_version < 1:
            raise ValueError("drift_per_version must be in [0, 1)")
        if not 0 <= self.inconsistent_rate <= 1:
            raise ValueError("inconsistent_rate must be in [0, 1]")

    def _check_names(self) -> None:
        """What the records name: the run and the tasks, as ids a record can carry."""
        if self.run_id == "":
            raise ValueError("run_id must be None or a non-empty string")
        if any(not 0 < len(name) <= MAX_ID or not 0 < factor <= 1 for name, factor in self.tasks):
            raise ValueError(f"tasks must be (name of 1 to {MAX_ID} characters, acceptance factor in (0, 1]) pairs")

    def policy_version(self, batch: int) -> int:
        """The current policy version while batch ``batch`` is generated."""
        return self.first_version + batch

    def draft_version(self, batch: int) -> int:
        """The policy version the draft model was last trained against, at batch ``batch``:
        the version before the one current at its last refresh."""
        refreshed = batch - batch % self.draft_refresh_batches if self.draft_refresh_batches else 0
        return self.policy_version(refreshed) - 1

    def staleness(self, version: int, batch: int) -> int:
        """How many versions the policy ``version`` is ahead of the draft at batch ``batch``."""
        return max(0, version - self.draft_version(batch))


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """One thing a producer publishes: a record, an invalid record dict, or a marker."""

    kind: Literal["record", "invalid", "marker"]
    producer_id: str
    batch_id: str
    payload: GenerationRecord | dict[str, Any] | BatchMarker


def _templates(rng: random.Random, algorithm: str | None, n: int, factor: float = 1.0) -> list[tuple]:
    """A pool of (accepted, proposed, verify, completion, histogram) from a per-step model;
    ``factor`` scales the per-draft acceptance probability (policy drift)."""
    pool: list[tuple[int | None, int | None, int | None, int, list[int] | None]] = []
    for _ in range(n):
        target = max(8, min(4096, int(rng.lognormvariate(5.3, 0.8))))
        if algorithm is None:
            pool.append((None, None, None, target, None))
        else:
            pool.append(_speculated(rng, algorithm, target, factor))
    return pool


def _speculated(rng: random.Random, algorithm: str, target: int, factor: float) -> tuple:
    """One generation of about ``target`` tokens, its verify steps drawn from the per-step
    model: k drafts accepted with probability ~ p^k (1-p) for k < drafts, p^drafts for all."""
    drafts, (lo, hi) = ALGORITHMS[algorithm]
    weights = _acceptance_weights(rng.uniform(lo, hi) * factor, drafts)
    steps = max(1, round(target / sum((k + 1) * w for k, w in enumerate(weights))))
    histogram = [0] * (drafts + 1)
    for k in rng.choices(range(drafts + 1), weights=weights, k=steps):
        histogram[k] += 1
    accepted = sum(k * c for k, c in enumerate(histogram))
    return (accepted, drafts * steps, steps, accepted + steps, histogram)


def _acceptance_weights(p: float, drafts: int) -> list[float]:
    """The per-step model's chances of k = 0 .. ``drafts`` drafts accepted, each draft with
    probability ``p``: p^k (1-p) for k < drafts, p^drafts for all."""
    return [p**k * (1 - p) for k in range(drafts)] + [p**drafts]


def _with_missing(rng: random.Random, value: tuple) -> tuple:
    """The value with some counters missing, one of four ways a producer reports less."""
    accepted, proposed, verify, completion, histogram = value
    return [
        (None, None, verify, completion, None),  # an older SGLang: no accepted/proposed, no histogram
        (None, None, None, completion, None),  # resumed, one attempt lost its spec counters
        (accepted, proposed, verify, completion, None),  # no histogram
        (accepted, proposed, None, None, histogram),  # verify/completion not reported
    ][rng.randrange(4)]


def _contradicting(generation_id: str, rate: float, value: tuple) -> tuple:
    """For a share ``rate`` of the generations (by a hash of the id: every occurrence of a
    generation alike), a value whose histogram contradicts its counters (SPEC §3.5), as a
    broken engine or adapter reports it: one verify step too many (the prefill counted),
    or the histogram shifted by one bin (indexed by accept length, not drafts accepted)."""
    accepted, proposed, verify, completion, histogram = value
    h = zlib.crc32(generation_id.encode())
    if histogram is None or (h & 0xFFFF) >= rate * 0x10000:
        return value
    if h >> 31 and verify is not None:
        return (accepted, proposed, verify + 1, completion, histogram)
    return (accepted, proposed, verify, completion, [0, *histogram[:-1]])


class _Pools:
    """Counter templates per staleness and task, each from its own seeded generator (so
    a pool is the same whenever it is first needed)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.pools: dict[tuple[int, float], list[tuple]] = {}

    def __call__(self, staleness: int, factor: float = 1.0) -> list[tuple]:
        pool = self.pools.get((staleness, factor))
        if pool is None:
            s = self.spec
            pool = self.pools[(staleness, factor)] = _templates(
                random.Random(_pool_seed(s.seed, staleness, factor)),
                s.algorithm,
                s.template_pool,
                factor * (1 - s.drift_per_version) ** staleness,
            )
        return pool


def _pool_seed(seed: int, staleness: int, factor: float) -> str:
    """The seed of a pool's generator: a task factor of 1 seeds the pool a fleet without
    tasks draws from (its events stay those of a spec without tasks)."""
    return f"{seed}/{staleness}" if factor == 1.0 else f"{seed}/{staleness}/{factor}"


def _session_version(rng: random.Random, spec: FleetSpec, batch: int) -> int:
    """The policy version a session of ``batch`` ran on: the current one most often,
    each older one half as often as the next newer."""
    current = spec.policy_version(batch)
    lags = range(min(spec.stale_versions, current) + 1)
    return current - rng.choices(lags, weights=[2.0**-lag for lag in lags])[0]


def synthetic_fleet(spec: FleetSpec) -> Iterator[FleetEvent]:
    """Every event of the fleet, batch by batch, producers interleaved; markers close each batch."""
    fleet = _Fleet(spec)
    for b in range(spec.batches):
        yield from fleet.batch(b)


@dataclass(frozen=True, slots=True)
class _Session:
    """What every record of one session says besides its generation and sample."""

    batch_id: str
    session_id: str
    producer: str
    weight_version: str
    task: str | None
    run_id: str | None
    draft_lag: int | None = None

    def record(self, generation_id: str, sample_id: str | None, value: tuple) -> GenerationRecord:
        accepted, proposed, verify, completion, histogram = value
        return GenerationRecord(
            batch_id=self.batch_id,
            session_id=self.session_id,
            generation_id=generation_id,
            sample_id=sample_id,
            accepted=accepted,
            proposed=proposed,
            verify=verify,
            completion=completion,
            accept_histogram=histogram,
            producer_id=self.producer,
            weight_version=self.weight_version,
            run_id=self.run_id,
            task=self.task,
            draft_lag=self.draft_lag,
        )

    def invalid(self, generation_id: str, sample_id: str | None) -> dict[str, Any]:
        """An invalid record (a negative counter) as its producer would send it."""
        return {
            "type": "record",
            "batch_id": self.batch_id,
            "session_id": self.session_id,
            "generation_id": generation_id,
            "sample_id": sample_id,
            "accepted": -1,
            "producer_id": self.producer,
            "weight_version": self.weight_version,
            "run_id": self.run_id,
            "task": self.task,
            "draft_lag": self.draft_lag,
        }


class _Fleet:
    """The fleet's generators: one for every draw, in the order the events come; tasks
    from one of their own (so the other draws stay as they were without tasks)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.tasks = random.Random(f"{spec.seed}/tasks")
        self.pools = _Pools(spec)
        self.producers = [f"worker-{i}" for i in range(spec.producers)]
        self._reported_values: dict[str, tuple] = {}

    def batch(self, b: int) -> Iterator[FleetEvent]:
        """One batch: its sessions spread over the producers, the producers' streams
        interleaved as a fleet's are, then each producer's marker."""
        batch_id = f"{self.spec.batch_prefix}{b:05d}"
        per_producer = self._sessions(b, batch_id)
        yield from self._interleaved(per_producer)
        yield from self._markers(batch_id, per_producer)

    def _sessions(self, b: int, batch_id: str) -> dict[str, list[FleetEvent]]:
        """Each producer's events of the batch, its sessions dealt round the producers."""
        per_producer: dict[str, list[FleetEvent]] = {p: [] for p in self.producers}
        for s in range(self.spec.sessions_per_batch):
            producer = self.producers[s % self.spec.producers]
            self._session(b, batch_id, s, producer, per_producer[producer])
        return per_producer

    def _interleaved(self, per_producer: dict[str, list[FleetEvent]]) -> Iterator[FleetEvent]:
        """The producers' streams merged at random, each in its own order."""
        queues = [list(reversed(events)) for events in per_producer.values() if events]
        while queues:
            queue = self.rng.choice(queues)
            yield queue.pop()
            if not queue:
                queues.remove(queue)

    def _markers(self, batch_id: str, per_producer: dict[str, list[FleetEvent]]) -> Iterator[FleetEvent]:
        """Each producer's marker closing the batch, with the records it sent."""
        spec = self.spec
        for producer in self.producers:
            yield FleetEvent(
                "marker",
                producer,
                batch_id,
                BatchMarker(
                    batch_id=batch_id,
                    producer_id=producer,
                    records_sent=len(per_producer[producer]),
                    speculative_algorithm=spec.algorithm,
                    expected_producers=spec.producers,
                    run_id=spec.run_id,
                ),
            )

    def _session(self, b: int, batch_id: str, s: int, producer: str, out: list[FleetEvent]) -> None:
        """A session of batch ``b``: its trajectories share their first generations."""
        session, pool = self._drawn_session(b, batch_id, s, producer)
        samples, shared = self._drawn_shape()
        ancestors = [(f"{session.session_id}/gen-{j}", self.rng.choice(pool)) for j in range(shared)]
        self._reported_values = {}  # a generation's counters as its producer reports them, drawn once
        for t in range(samples):
            sample_id = f"traj-{t}" if samples > 1 else None
            for generation_id, value in ancestors + self._own_generations(session, t, shared, pool):
                self._generation(session, sample_id, generation_id, value, out)

    def _drawn_session(self, b: int, batch_id: str, s: int, producer: str) -> tuple[_Session, list[tuple]]:
        """The session's policy version and task, and the counter templates they draw from."""
        spec = self.spec
        version = _session_version(self.rng, spec, b)
        task, factor = self.tasks.choice(spec.tasks) if spec.tasks else (None, 1.0)
        staleness = spec.staleness(version, b)
        lag = staleness if spec.draft_lags else None
        session = _Session(batch_id, f"{batch_id}/sess-{s:05d}", producer, f"v{version}", task, spec.run_id, lag)
        return session, self.pools(staleness, factor)

    def _drawn_shape(self) -> tuple[int, int]:
        """How many trajectories the session has, and how many first generations they share
        (none for a single one)."""
        samples = self.rng.randint(1, self.spec.max_samples_per_session)
        return samples, self.rng.randint(0, self.spec.max_turns - 1) if samples > 1 else 0

    def _own_generations(self, session: _Session, t: int, shared: int, pool: list[tuple]) -> list[tuple[str, tuple]]:
        """Trajectory ``t``'s generations after the ``shared`` ones."""
        turns = self.rng.randint(1, max(1, self.spec.max_turns - shared))
        return [(f"{session.session_id}/traj-{t}/gen-{j}", self.rng.choice(pool)) for j in range(turns)]

    def _generation(
        self, session: _Session, sample_id: str | None, generation_id: str, value: tuple, out: list[FleetEvent]
    ) -> None:
        """One occurrence of a generation: invalid, or a record (some counters missing, its
        histogram maybe contradicting them), maybe delivered again."""
        spec, rng = self.spec, self.rng
        if rng.random() < spec.invalid_rate:
            out.append(
                FleetEvent("invalid", session.producer, session.batch_id, session.invalid(generation_id, sample_id))
            )
            return
        record = session.record(generation_id, sample_id, self._reported(generation_id, value))
        out.append(FleetEvent("record", session.producer, session.batch_id, record))
        if rng.random() < spec.redelivery_rate:
            self._redeliver(session, record, out)

    def _reported(self, generation_id: str, value: tuple) -> tuple:
        """The counters as the producer reports them: some maybe missing, the histogram
        maybe contradicting the rest. Drawn once per generation: a shared ancestor is
        reported alike in every trajectory that holds it (one reported with and once
        without counters would conflict: conflicts come from ``conflict_rate`` alone)."""
        known = self._reported_values.get(generation_id)
        if known is None:
            known = self._reported_values[generation_id] = self._drawn_report(generation_id, value)
        return known

    def _drawn_report(self, generation_id: str, value: tuple) -> tuple:
        """One generation's reported counters, drawn."""
        spec = self.spec
        if self.rng.random() < spec.missing_rate:
            value = _with_missing(self.rng, value)
        if spec.inconsistent_rate:
            value = _contradicting(generation_id, spec.inconsistent_rate, value)
        return value

    def _redeliver(self, session: _Session, record: GenerationRecord, out: list[FleetEvent]) -> None:
        """The record delivered again, later in the same producer's stream, maybe conflicting."""
        spec, rng = self.spec, self.rng
        again = record
        if rng.random() < spec.conflict_rate / max(spec.redelivery_rate, 1e-9):
            again = msgspec.structs.replace(record, accepted=(record.accepted or 0) + 1)
        out.insert(
            rng.randint(len(out) // 2, len(out)), FleetEvent("record", session.producer, session.batch_id, again)
        )
