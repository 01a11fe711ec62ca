"""The simulated deployment: the checkpoint-only stages' topics, the partitions and the
settings the worker's own stages run with. A module of its own because every part of the
simulation reads it (the clients, the worker, the scheduler, the input)."""

from __future__ import annotations

from specmeter.streams.settings import WorkerSettings

R = "records"
CL = f"{R}-changelog"
PARTITIONS = 2
#: the deployment the worker's own stages run as
SETTINGS = WorkerSettings(
    broker="simulated:9092",
    app_id="sim",
    partitions=PARTITIONS,
    tick_s=30.0,  # timers tick rarely: batches close on their markers, the grace never ends
    batch_timeout_s=1e6,
    grace_s=1e6,
    session_timeout_s=30.0,
    commit_interval_s=1.0,
    web_enabled=False,
)
