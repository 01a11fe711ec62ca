"""The delivery: how each stage's input reaches it and its writes and outputs leave, on Kafka.

``ledger`` holds the delivery rules, sans-IO (which input a stage applies, when a
partition is restored, kept, caught up, ready); ``routes`` carries them out, one
consumer-group member per stage, with the changelog reader for takeovers and the
driver; ``assignor`` is the groups' sticky assignment; ``writes`` an owner's write
groups and fencing; ``output`` the one ordered producer every state write and output
goes through; ``internals`` every private member of aiokafka the worker uses. Imports
the core (``core.ownership``) and the settings, never Faust, the reports or the commands.
"""
