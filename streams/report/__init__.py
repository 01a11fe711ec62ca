"""What the worker reports: to Prometheus, on its pages, in its log.

``counters`` sums what the worker publishes and names each series, ``prometheus``
builds the exposition at scrape time, ``readiness`` decides what ``/specmeter/readyz``
answers, ``waits`` says what each open batch waits for, ``outages`` and
``dead_letters`` fold a flood of log lines into a few, ``log_lines`` bounds every
line. Each reads what it is given (the stages' waiting lists, the counters, the
outages seen) and decides nothing the stages do. Imports the core, never the delivery,
Faust or the commands.
"""
