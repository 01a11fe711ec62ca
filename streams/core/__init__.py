"""The exact core: records in, partials and BatchMetrics out, the same in the stream and offline.

Pure: no Kafka, no asyncio, no clock (times come in as arguments), no Faust. Stage 1
(``stage1``) deduplicates a records partition's batches in the dedup state (``state``,
or its Rust twin ``_native``, chosen in ``cores``); stage 2 (``stage2``) adds up a
batch's partials and ``merge`` derives every ratio once. ``layout`` says where their
state lives, ``ownership`` which changelog records count, ``expired`` which batches
are gone for good; ``offline`` drives the same calls over a dump (``specmeter
aggregate``). Imports ``specmeter.schemas`` and nothing else of specmeter.
"""
