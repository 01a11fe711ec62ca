"""What feeds a worker: a rollout fleet's records, made up, saved or published.

``synthetic`` makes up a seeded fleet (sessions, branches, drift, tasks, faults),
``dumps`` reads a saved rollout dump line by line, ``publish`` publishes a synthetic
fleet through one publisher per producer (or writes it, and what the offline core
makes of it, to files) and ``replay`` publishes a dump as its producers would have.
The commands (``loadgen``, ``replay``, ``aggregate``, the demo), the tests and the
benchmarks use them. Imports the core (``offline``) and ``specmeter.producers``,
never the worker, the delivery or the commands.
"""
