"""Regenerate streams/data/sample_rollout.jsonl, the bundled sample rollout dump.

    python examples/make_sample_rollout.py > streams/data/sample_rollout.jsonl

Three training steps of a 3-worker EAGLE3 fleet: branching trajectories with
shared ancestors, 20 % redeliveries, a few conflicts, missing counters and
invalid records, and each worker's end-of-batch marker. Each step mixes the
current policy version with up to three older ones (weight_version v<N>),
and acceptance falls 10 % per version the policy is ahead of the draft model,
so the per-version breakdown shows drift; each record names its draft lag (how
many versions the policy is ahead of the draft), so by_draft_lag shows the
staleness curve.
"""

from __future__ import annotations

import sys

import msgspec

from specmeter.schemas import record_to_builtins
from specmeter.streams.fleet.synthetic import FleetSpec, synthetic_fleet

encoder = msgspec.json.Encoder()
for event in synthetic_fleet(
    FleetSpec(
        batches=3,
        sessions_per_batch=16,
        producers=3,
        seed=3,
        conflict_rate=0.02,
        invalid_rate=0.01,
        drift_per_version=0.1,
    )
):
    payload = event.payload if event.kind == "invalid" else record_to_builtins(event.payload)
    sys.stdout.buffer.write(encoder.encode(payload) + b"\n")
