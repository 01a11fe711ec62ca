"""The worker: Faust's app around the stages, its topics, its faults, and the process.

``app`` is the shell: the stages' hooks (``StreamShell``), Faust's app (lifecycle,
timers, web pages) and nothing that decides; ``topics`` plans and creates the
worker's topics; ``faults`` holds the crash points and refused writes of the fault
tests; ``run`` runs a worker process until it is stopped. The only layer that
imports Faust. Imports the core, the delivery and the reports, never the commands.
"""
