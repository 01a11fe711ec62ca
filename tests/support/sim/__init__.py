"""A deterministic simulation of the worker (issue 43): its own delivery layer, stages and
ordered producer, for two to four workers over an in-memory Kafka that behaves like Kafka where
the ownership protocol cares.

Two kinds of schedule share the scheduler:

* **the worker's own stages** (``real=True``): each worker is the worker's ``StreamShell``
  (``worker/app.py``: both stage cores, stage 2 merging the partials stage 1 publishes, the
  ordered producer, the delivery driver), built through its seams (the Kafka clients'
  factories, its wall clock, its stop). A seeded fleet's records and markers go to the
  records topic as the producers' library would place them; both stages' groups rebalance.
* **checkpoint-only stages** (``tests/support/fake_kafka.FakeStages``): the driver alone,
  cheaper, so that more schedules reach the ownership protocol's corners.

The in-memory Kafka: partition logs with offsets; compaction at any step (the latest
record per key, tombstones kept or dropped, emptied offsets never served); a coordinator per
consumer group with the classic protocol's generations and member ids, the project's own
sticky assignor (or another leader's mind), members expired while frozen (their commits
refused, their fetches and writes going on), groups deleted and started again (generations
from 1, new member ids); fetches that end on input; writes in flight that land whenever the
scheduler says, in order per partition, from frozen and dead workers too, sometimes twice,
answered without an offset, or timed out (landed, or lost with the later writes to its
partition); takeover records appended twice. Workers freeze, wake, stop as designed (fail
fast) and are killed between any two awaits, and restart.

Each worker runs on an event loop of its own whose clock is virtual (``VirtualLoop``: it
jumps to the next timer when nothing is ready), advanced to the simulation's time only when
the scheduler lets it run. Its wall clock is the simulation's time plus a skew of its own
(up to ±20 s; a restarted group's takeovers are judged past the 60 s bound). One seed is one
schedule, and replays exactly under one hash seed (``PYTHONHASHSEED``: sets of strings
are iterated; ``deploy/dev test`` and the long mode fix it at 0).

The parts, a module each, so that each can be read (and changed) on its own:

* ``loop``: the virtual event loop each worker runs on;
* ``deployment``: the topics, partitions and settings every part reads;
* ``kafka``: the in-memory Kafka's clients as the worker sees them;
* ``worker``: one worker, built through its seams and instrumented for the checks;
* ``changelog_records``: what the checks read in a changelog record;
* ``outcomes``: a violation, an injected fault, a worker stopped as designed;
* ``scheduler``: the schedule's steps, the groups' coordinator and the invariants' checks;
* ``fleet_input``: the seeded fleet's messages on the records topic;
* ``runs``: one schedule, many over processes, the shortest failure, the long mode.

``tests/support/delivery_sim.py`` re-exports their names (its importers, its long mode).
"""
