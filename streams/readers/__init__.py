"""What reads a worker's output from outside: the metrics topic, never as a group member.

``consume`` gives a trainer each batch's newest BatchMetrics once
(``consume_metrics``, re-exported by ``specmeter.streams``) and their scalars;
``topic_lookup`` makes sure a reader never creates the topic it names. Used by the
trainer, ``tail``, ``advise`` and the examples. Imports ``specmeter.schemas`` and
aiokafka's consumer, without a group and committing nothing; never the worker, the
core's stages or the commands.
"""
