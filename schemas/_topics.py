"""The default topic names (docs/contract.md §4): one home, for producers and streams alike."""

from __future__ import annotations

__all__ = ["RECORDS_TOPIC", "PARTIALS_TOPIC", "METRICS_TOPIC", "DEADLETTER_TOPIC"]

RECORDS_TOPIC = "specmeter.records"
PARTIALS_TOPIC = "specmeter.partials"
METRICS_TOPIC = "specmeter.metrics"
DEADLETTER_TOPIC = "specmeter.deadletter"
