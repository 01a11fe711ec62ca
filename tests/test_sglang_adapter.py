"""Records from what SGLang returns (single, batched, n > 1), without sglang installed."""

from __future__ import annotations

import sys

import pytest

from specmeter.producers.sglang_adapter import records_from_outputs

from .support.sglang_meta_info import SGLANG_OUTPUTS


def _output(version: str, rid: str) -> dict:
    meta_info = dict(SGLANG_OUTPUTS[version][0], id=rid)
    return {"text": "...", "output_ids": [1, 2, 3], "meta_info": meta_info}


def test_single_output_dict():
    (record,) = records_from_outputs(_output("0.5.12", "r1"), batch_id="b", session_ids="s", producer_id="w0")
    assert (record.generation_id, record.accepted, record.proposed, record.verify) == ("r1", 361, 604, 151)
    assert record.producer_id == "w0" and record.sample_id is None


def test_batch_and_parallel_samples():
    # two prompts, n = 2: SGLang returns prompt-major lists of dicts
    outputs = [_output("0.5.9", f"r{i}") for i in range(4)]
    records = records_from_outputs(
        outputs, batch_id="b", session_ids=["s0", "s0", "s1", "s1"], sample_ids=["t0", "t1", "t0", "t1"]
    )
    assert [(r.session_id, r.sample_id, r.generation_id) for r in records] == [
        ("s0", "t0", "r0"),
        ("s0", "t1", "r1"),
        ("s1", "t0", "r2"),
        ("s1", "t1", "r3"),
    ]
    assert all(r.accept_histogram == [6, 9, 11, 14] for r in records)


def test_mismatched_lengths_and_missing_meta_info_are_clear():
    with pytest.raises(ValueError, match="2 outputs but 3 session ids"):
        records_from_outputs(
            [_output("0.5.4", "a"), _output("0.5.4", "b")], batch_id="b", session_ids=["s0", "s1", "s2"]
        )
    with pytest.raises(ValueError, match="meta_info"):
        records_from_outputs({"text": "x"}, batch_id="b", session_ids="s")


def test_adapter_does_not_import_sglang():
    assert "sglang" not in sys.modules


def test_run_and_weight_version_reach_every_record():
    """run_id is the caller's (a publisher's run); weight_version is each output's own
    ``meta_info["weight_version"]``."""
    outputs = [
        _output("0.5.12", "r0"),
        {"meta_info": {**_output("0.5.12", "r1")["meta_info"], "weight_version": 7}},
        {"meta_info": {k: v for k, v in _output("0.5.12", "r2")["meta_info"].items() if k != "weight_version"}},
    ]
    records = records_from_outputs(outputs, batch_id="b", session_ids="s", run_id="attempt-2")
    assert [(r.run_id, r.weight_version) for r in records] == [
        ("attempt-2", "step-000120"),
        ("attempt-2", "7"),
        ("attempt-2", None),
    ]
    assert records_from_outputs(outputs[:1], batch_id="b", session_ids="s")[0].run_id is None


@pytest.mark.kafka
def test_publish_outputs_publishes_in_the_publishers_run(kafka_bootstrap, unique_name):
    import asyncio

    from specmeter.producers import Publisher, PublisherSettings
    from specmeter.producers.sglang_adapter import publish_outputs
    from specmeter.schemas import decode_records_message

    from .support.kafka_helpers import create_topic, read_topic

    topic = unique_name("records")

    async def run():
        await create_topic(kafka_bootstrap, topic, 2)
        settings = PublisherSettings(
            bootstrap_servers=kafka_bootstrap, topic=topic, producer_id="w3", run_id="attempt-2"
        )
        async with Publisher(settings) as publisher:
            n = await publish_outputs(
                publisher, [_output("0.5.9", "r0"), _output("0.5.9", "r1")], batch_id="b", session_ids=["s0", "s1"]
            )
            await publisher.close_batch("b")
        messages = await read_topic(
            kafka_bootstrap,
            topic,
            until=lambda ms: sum(decode_records_message(m.value).marker is not None for m in ms) == 2,
        )
        return n, [decode_records_message(m.value) for m in messages]

    n, decoded = asyncio.run(run())
    records = [(r, d) for d in decoded for r in d.records]
    assert n == len(records) == 2
    for record, envelope in records:
        assert (record.run_id or envelope.run_id, record.producer_id or envelope.producer_id) == ("attempt-2", "w3")
        assert record.weight_version == "step-000120"
    assert [d.marker.run_id for d in decoded if d.marker] == ["attempt-2", "attempt-2"]


def test_tasks_reach_every_record_one_for_all_or_one_per_output():
    """Revision 4: the prompts' task is the caller's (SGLang does not know it): one for
    the whole call, or one per output for a batch of prompts from several datasets."""
    outputs = [_output("0.5.12", f"r{i}") for i in range(3)]
    records = records_from_outputs(outputs, batch_id="b", session_ids="s", tasks="gsm8k")
    assert [r.task for r in records] == ["gsm8k"] * 3
    records = records_from_outputs(outputs, batch_id="b", session_ids="s", tasks=["gsm8k", None, "chat"])
    assert [r.task for r in records] == ["gsm8k", None, "chat"]
    assert all(r.task is None for r in records_from_outputs(outputs, batch_id="b", session_ids="s"))
    with pytest.raises(ValueError, match=r"3 outputs but .* 2 tasks"):
        records_from_outputs(outputs, batch_id="b", session_ids="s", tasks=["gsm8k", "chat"])


def test_draft_lags_come_from_the_caller_one_for_all_or_one_per_output():
    """Revision 5: the draft's lag is the caller's (SGLang knows neither the policy's nor
    the draft's age): one for the whole call, or one per output; not an int >= 0 is refused."""
    import msgspec

    outputs = [_output("0.5.12", f"r{i}") for i in range(3)]
    records = records_from_outputs(outputs, batch_id="b", session_ids="s", draft_lags=2)
    assert [r.draft_lag for r in records] == [2] * 3
    records = records_from_outputs(outputs, batch_id="b", session_ids="s", draft_lags=[0, None, 5], tasks="chat")
    assert [(r.draft_lag, r.task) for r in records] == [(0, "chat"), (None, "chat"), (5, "chat")]
    assert all(r.draft_lag is None for r in records_from_outputs(outputs, batch_id="b", session_ids="s"))
    with pytest.raises(ValueError, match=r"3 outputs but .* 2 draft lags"):
        records_from_outputs(outputs, batch_id="b", session_ids="s", draft_lags=[0, 1])
    with pytest.raises(msgspec.ValidationError):
        records_from_outputs(outputs, batch_id="b", session_ids="s", draft_lags=-1)
