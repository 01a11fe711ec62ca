"""Stage 1 without Kafka: the open-generation limit, its accounting, its restore,
and resident memory under a flood (measured in a child process); on each core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from specmeter.schemas import BatchMarker, GenerationRecord, RecordBatch, decode_records_message, encode_records_message
from specmeter.streams.core.stage1 import PartitionProcessor


def _record(batch: str, i: int, producer: str = "p0") -> GenerationRecord:
    """Records of two tasks and of none, of two draft lags and of none; every fifth with
    a histogram that contradicts its verify count (2 steps, not 3: SPEC §3.5)."""
    return GenerationRecord(
        batch_id=batch,
        session_id=f"s{i}",
        generation_id="g",
        accepted=i % 7,
        proposed=8,
        verify=3,
        completion=(i % 7) + 3,
        accept_histogram=[1, 1] if i % 5 == 0 else None,
        producer_id=producer,
        task=("gsm8k", "chat", None)[i % 3],
        draft_lag=(10, None, 2, 0)[i % 4],
    )


def _messages(batch: str, n: int, per_message: int, start_offset: int = 0, first: int = 0):
    out = []
    for k in range(0, n, per_message):
        records = [_record(batch, first + i) for i in range(k, min(n, k + per_message))]
        out.append((start_offset + len(out), encode_records_message(RecordBatch(records=records))))
    return out


def _letter_records(letter) -> int:
    return len(decode_records_message(letter.raw).records)


def test_flooded_batch_closes_early_as_incomplete_and_its_state_is_dropped(core):
    p = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=1000
    )
    small = p.process(_messages("small", 10, 10), now_ms=1)
    assert not small.partials and p.open_generations == 10
    flood = p.process(_messages("flood", 5000, 100, start_offset=1), now_ms=2)
    (partial,) = flood.partials
    assert partial.batch_id == "flood" and partial.close_reason == "incomplete"
    # cut exactly at the limit: 10 generations of "small" + 990 of "flood"
    assert partial.record_count == 990 and partial.unique_generation_count == 990
    letters = flood.dead_letters
    assert {d.reason for d in letters} == {"overflow"} and all(d.batch_id == "flood" for d in letters)
    assert "--max-open-generations" in letters[0].detail
    # conservation: every record is in the partial or in exactly one dead letter
    assert partial.record_count + sum(_letter_records(d) for d in letters) == 5000
    assert p.counters.dead_letters == {"overflow": len(letters)}
    assert p.open_generations == 10 and set(p.batches) == {(None, "small")}
    # the other batch is untouched and closes normally
    marker = BatchMarker(batch_id="small", producer_id="p0", records_sent=10, expected_producers=1)
    closed = p.process([(100, encode_records_message(marker))], now_ms=3)
    assert [(x.batch_id, x.close_reason, x.record_count) for x in closed.partials] == [("small", "markers", 10)]
    # a marker of the flooded batch is dead-lettered too, never applied
    late_marker = BatchMarker(batch_id="flood", producer_id="p0", records_sent=5000, expected_producers=1)
    effects = p.process([(101, encode_records_message(late_marker))], now_ms=4)
    assert [d.reason for d in effects.dead_letters] == ["overflow"] and not effects.partials


def test_overflow_survives_a_restart_and_its_stale_deltas_are_deleted(core):
    p = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=500
    )
    changelog: dict[bytes, bytes | None] = {}
    for chunk in (_messages("flood", 300, 100), _messages("flood", 900, 100, start_offset=3, first=300)):
        effects = p.process(chunk, now_ms=1)
        changelog.update(effects.changelog)
        live = {k: v for k, v in changelog.items() if v is not None}
        # deleted once the overflow that justifies it is acknowledged, never with it (issue 30)
        assert not [k for k, v in effects.changelog if v is None and b"\x1fd\x1fflood" in k]
        changelog.update((key, None) for key in effects.verified_deletions)
    live = {k: v for k, v in changelog.items() if v is not None}
    assert not [k for k in live if b"\x1fd\x1fflood" in k], "the dropped batch's deltas must be deleted"
    restored = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=500
    )
    restored.restore(live.items(), now_ms=2)
    assert (None, "flood") in restored.overflowed and restored.open_generations == 0
    effects = restored.process(_messages("flood", 5, 5, start_offset=20, first=5000), now_ms=3)
    assert [d.reason for d in effects.dead_letters] == ["overflow"] and not effects.partials


def test_the_early_close_does_not_depend_on_chunking(core):
    """A crash re-chunks the input; the partial at the limit must come out the same."""
    messages = _messages("flood", 3000, 50)
    partials = []
    for chunk_size in (1, 7, len(messages)):
        p = PartitionProcessor(
            0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=1234
        )
        out = []
        for k in range(0, len(messages), chunk_size):
            out += p.process(messages[k : k + chunk_size], now_ms=5).partials
        (partial,) = out
        partials.append(partial)
    assert partials[0] == partials[1] == partials[2]


_FLOOD = textwrap.dedent("""
    import json, sys
    from specmeter.schemas import GenerationRecord, RecordBatch, encode_records_message
    from specmeter.streams.core.stage1 import PartitionProcessor

    def rss_kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1])

    limit, total = int(sys.argv[1]), int(sys.argv[2])
    p = PartitionProcessor(0, source_topic="t", batch_timeout_ms=10**9, grace_ms=10**9, max_open_generations=limit)
    before = rss_kib("VmRSS")
    offset = 0
    for k in range(0, total, 200):
        records = [GenerationRecord(batch_id="flood", session_id=f"session-{i:09d}", generation_id="g", accepted=3,
                                    proposed=8, verify=3, completion=6, producer_id="p0")
                   for i in range(k, k + 200)]
        # effects dropped, as sent
        p.process([(offset, encode_records_message(RecordBatch(records=records)))], now_ms=1)
        offset += 1
    print(json.dumps({"growth_kib": rss_kib("VmHWM") - before, "held": p.open_generations}))
""")


def _flood_growth_mib(core, limit: int, total: int) -> tuple[float, int]:
    env = dict(os.environ, SPECMETER_NO_NATIVE="1" if core.name == "python" else "")
    proc = subprocess.run(
        [sys.executable, "-c", _FLOOD, str(limit), str(total)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        env=env,
    )
    result = json.loads(proc.stdout)
    return result["growth_kib"] / 1024, result["held"]


def test_resident_memory_stays_bounded_under_a_flood_of_unique_keys(core):
    """1M unique generations into one never-closing batch with a 20k limit: peak
    resident growth stays near what 20k generations cost, far below what the
    flood would cost unbounded (measured in the same run at a 200k limit: every
    generation kept; 1M for the native core, whose generations are 4-5x smaller)."""
    control = 200_000 if core.name == "python" else 1_000_000
    bounded, held = _flood_growth_mib(core, 20_000, 1_000_000)
    unbounded, held_unbounded = _flood_growth_mib(core, 1_000_000, control)
    assert held <= 20_000 and held_unbounded == control
    assert unbounded > 30, f"the control did not grow ({unbounded:.1f} MiB): the measurement is broken"
    # 1M generations bounded must cost less than a fifth of the control's generations unbounded
    assert bounded < unbounded / 5, f"peak growth {bounded:.1f} MiB at the limit vs {unbounded:.1f} MiB unbounded"


def test_restore_sends_the_partials_and_publications_a_crash_may_have_lost(core):
    """A status (or stage-2 entry) that says "emitted" can be durable while the
    partial (or BatchMetrics) itself was not: restore sends the same message again."""
    from specmeter.streams.core.stage2 import BatchMerger

    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    changelog: dict[bytes, bytes | None] = {}
    marker = BatchMarker(batch_id="b", producer_id="p0", records_sent=20, expected_producers=1)
    effects = p.process([*_messages("b", 20, 10), (2, encode_records_message(marker))], now_ms=7)
    changelog.update(effects.changelog)
    (emitted,) = effects.partials  # ... and lost with the crash
    restored = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    again = restored.restore([(k, v) for k, v in changelog.items() if v is not None], now_ms=9)
    assert again.partials == [emitted]

    merger = BatchMerger(0, partitions_expected=1, batch_timeout_ms=60_000, grace_ms=60_000)
    merged = merger.process([(0, emitted)], now_ms=10)
    (published,) = merged.published
    fresh = BatchMerger(0, partitions_expected=1, batch_timeout_ms=60_000, grace_ms=60_000)
    assert fresh.restore([(k, v) for k, v in merged.changelog if v is not None]).published == [published]
    # and the repeated partial changes nothing at stage 2
    assert not fresh.process([(1, emitted)], now_ms=11).published


def test_an_overflowed_batch_partial_is_sent_again_on_restore(core):
    p = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=50
    )
    effects = p.process(_messages("flood", 200, 20), now_ms=1)
    (partial,) = effects.partials
    live = {}
    for key, value in effects.changelog:
        live[key] = value
    restored = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=50
    )
    again = restored.restore([(k, v) for k, v in live.items() if v is not None], now_ms=2)
    assert again.partials == [partial] and partial.close_reason == "incomplete"
    # after grace it is forgotten (stage 2 forgets the batch too): deleted, never sent again
    forgotten = restored.tick(now_ms=2 + 60_000).changelog
    (key,) = [k for k, v in forgotten if v is None and b"\x1fo\x1f" in k]
    late = PartitionProcessor(
        0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000, max_open_generations=50
    )
    assert not late.restore([(k, v) for k, v in live.items() if v is not None], now_ms=1 + 60_000).partials


def test_a_too_large_message_is_dead_lettered_with_a_bounded_copy(core):
    p = PartitionProcessor(
        3, core=core, source_topic="recs", batch_timeout_ms=60_000, grace_ms=60_000, max_message_bytes=1024
    )
    big = encode_records_message(GenerationRecord(batch_id="b", session_id="s" * 1_000_000, generation_id="g"))
    (letter,) = p.process([(41, big)], now_ms=1).dead_letters
    assert letter.reason == "too_large" and len(letter.raw) == 256 * 1024 and big.startswith(letter.raw)
    assert "recs partition 3 offset 41" in letter.detail and str(len(big)) in letter.detail


def test_a_timed_out_batch_whose_markers_arrive_within_grace_becomes_complete(core):
    """Producers stalled (a broker outage) past batch_timeout: the batch closes as
    timeout; when the rest and the markers arrive within grace, a new revision
    closes it by markers."""
    p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=1000, grace_ms=60_000)
    p.process(_messages("b", 10, 5), now_ms=0)
    (first,) = p.tick(now_ms=1500).partials
    assert first.close_reason == "timeout" and first.revision == 0
    marker = BatchMarker(batch_id="b", producer_id="p0", records_sent=15, expected_producers=1)
    later = p.process(
        [*_messages("b", 5, 5, start_offset=2, first=10), (3, encode_records_message(marker))], now_ms=2000
    )
    (second,) = later.partials
    assert second.close_reason == "markers" and second.revision == 1 and second.record_count == 15


def _replay_log(log: dict, writes) -> dict:
    log = dict(log)
    for key, value in writes:
        if value is None:
            log.pop(key, None)
        else:
            log[key] = value
    return log


def test_a_crash_anywhere_in_a_changelog_flush_recovers_the_same_partial(core):
    """Kill the worker after any prefix of a closing chunk's changelog writes reached the
    broker (and its partial did not): restore plus replay of the input from the durable
    checkpoint sends a partial equal to the one the uncrashed run sent, nothing counted late.
    (A status durable without its checkpoint used to leave the batch closed with its
    closing chunk replayed as late input and its partial never sent.)"""
    from specmeter.streams.core.stage1 import _digest

    marker = BatchMarker(batch_id="b", producer_id="p0", records_sent=30, expected_producers=1)
    messages = [*_messages("b", 30, 10), (3, encode_records_message(marker))]
    reference = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
    durable = _replay_log({}, reference.process(messages[:2], now_ms=1).changelog)
    closing = reference.process(messages[2:], now_ms=2)
    (want,) = closing.partials
    assert [t.key for t in want.tasks] == ["chat", "gsm8k", None] and want.inconsistent_generation_count == 6
    assert [lag.key for lag in want.draft_lags] == [0, 2, 10, None] and sum(want.tokens_per_verify_distribution) == 30
    for cut in range(len(closing.changelog) + 1):
        log = _replay_log(durable, closing.changelog[:cut])
        p = PartitionProcessor(0, core=core, source_topic="t", batch_timeout_ms=60_000, grace_ms=60_000)
        sent = list(p.restore(list(log.items()), now_ms=3).partials)
        sent += p.process([m for m in messages if m[0] > p.checkpoint], now_ms=4).partials
        assert sent, f"nothing sent after a crash at write {cut}"
        got = sent[-1]
        assert _digest(got) == _digest(want) and got.late_record_count == 0, cut
