"""Whether a worker can do its work now: what ``/specmeter/readyz`` answers.

A worker is **ready** while it serves its partitions and can write:

* the group is not rebalancing, and the state of every partition it owns is
  restored (until then it applies no input);
* its writes go through: they have not waited ``ready_write_timeout_s`` with none
  of them acknowledged (``OrderedProducer.stalled_s``);
* some broker answers: not every broker of the cluster is unreachable
  (``Outages.no_broker_answers``).

A broker that is away while the others serve — a rolling restart, a crash, a disk
replaced, on a cluster with replication factor 3 and ``min.insync.replicas=2`` — is
none of these: the worker's clients retry, the other brokers take over the
partitions it led, and nothing is lost (``tests/test_cluster.py``). It is said in
the log, on ``/specmeter/stats`` and in Prometheus (``outages``), and readiness
stays up: a readiness that fell with any broker took every pod of the fleet out of
service at once, and stalled a rolling restart of the brokers (issue 33).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Readiness", "decide"]


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    """The answer, and why not when it is no."""

    ready: bool
    #: why not ready (None when ready)
    reason: str | None = None
    #: what the worker cannot reach now (said whether it is ready or not)
    unreachable: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The page's body: ``{"ready": true}``, with ``reason`` and ``unreachable`` when there are."""
        body: dict[str, Any] = {"ready": self.ready}
        if self.reason is not None:
            body["reason"] = self.reason
        if self.unreachable:
            body["unreachable"] = list(self.unreachable)
        return body


def decide(
    *,
    serving: bool,
    write_stalled_s: float,
    write_timeout_s: float,
    no_broker_answers: bool,
    unreachable: tuple[str, ...] = (),
) -> Readiness:
    """Ready or not, and why (pure: see the module).

    Args:
        serving: not rebalancing, and every owned partition's state restored.
        write_stalled_s: how long writes have waited with none acknowledged.
        write_timeout_s: the longest that may be before the worker is not ready.
        no_broker_answers: every broker of the cluster is unreachable.
        unreachable: the endpoints unreachable now (for the body only).
    """
    if no_broker_answers:
        reason: str | None = "no Kafka broker answers"
    elif write_stalled_s >= write_timeout_s:
        reason = (
            f"writes unacknowledged for {write_stalled_s:.0f} s (--ready-write-timeout {write_timeout_s:g}): "
            "the cluster takes none (brokers down, or fewer in-sync replicas than min.insync.replicas)"
        )
    elif not serving:
        reason = "partitions being assigned or their state restored"
    else:
        reason = None
    return Readiness(ready=reason is None, reason=reason, unreachable=unreachable)
