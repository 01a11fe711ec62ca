"""Dead letters folded in the log like outages (issue 33): a producer bug that makes
every record invalid wrote one WARNING line per record. Now the first of a reason is
said at once, then one line per reason and minute with the count; every record still
reaches the dead-letter topic."""

from __future__ import annotations

import asyncio
import logging
import re

import msgspec
import pytest

from specmeter.schemas import DeadLetter
from specmeter.streams.report.dead_letters import DeadLetterLog


def letter(reason: str = "invalid", partition: int = 0, offset: int = 0, batch_id: str | None = "b") -> DeadLetter:
    return DeadLetter(
        reason=reason,
        detail="Expected `int` >= 0 - at `$.accepted`",
        raw=b"x",
        source_topic="records",
        source_partition=partition,
        source_offset=offset,
        batch_id=batch_id,
        rejected_at=0.0,
    )


def folded(lines: list[tuple[int, str]], reason: str) -> int:
    """Dead letters of ``reason`` the lines account for: 1 per first line, N per folded one."""
    total = 0
    for level, line in lines:
        assert level == logging.WARNING, line
        if f"reason={reason} " not in line:
            continue
        more = re.search(r"dead-lettered (\d+) more ", line)
        total += int(more.group(1)) if more else 1
    return total


def test_the_first_of_a_reason_is_said_then_one_line_a_minute_with_the_count(said):
    logger, said_lines = said
    log = DeadLetterLog(interval_s=60, logger=logger)
    for i in range(10_000):  # a hundred a second for 100 s, on four partitions
        log.letter(letter(partition=i % 4, offset=i), i / 100)
        log.tick(i / 100)
    lines = [text for _, text in said_lines]
    assert len(lines) == 2, lines  # the first, and the count after a minute
    assert lines[0].startswith("dead-lettered reason=invalid partition=0 offset=0 batch='b'"), lines[0]
    assert "Expected `int` >= 0" in lines[0] and "folded into one line a minute" in lines[0]
    assert lines[1].startswith("dead-lettered 6000 more reason=invalid in the last 60 s, from partitions 0,1,2,3")
    assert "latest: partition=0 offset=6000" in lines[1], lines[1]
    log.flush(100.0)  # at shutdown: what is folded is said
    assert len(said_lines) == 3 and folded(said_lines, "invalid") == 10_000, said_lines


def test_reasons_are_folded_apart_and_a_quiet_reason_is_said_at_once_again(said):
    logger, lines = said
    log = DeadLetterLog(interval_s=60, logger=logger)
    log.letter(letter("invalid"), 0.0)
    log.letter(letter("late"), 1.0)
    log.letter(letter("late"), 2.0)
    assert [text.split()[1] for _, text in lines] == ["reason=invalid", "reason=late"]
    log.tick(60.0)  # invalid: nothing folded, quiet for a minute: forgotten
    assert len(lines) == 2
    log.tick(61.0)
    assert lines[-1][1].startswith("dead-lettered 1 more reason=late in the last 60 s"), lines[-1]
    log.letter(letter("invalid", offset=7), 62.0)  # back after a quiet minute: said at once
    assert lines[-1][1].startswith("dead-lettered reason=invalid partition=0 offset=7"), lines[-1]
    log.flush(63.0)
    assert folded(lines, "invalid") == 2 and folded(lines, "late") == 2, lines


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_thousand_invalid_records_are_ten_thousand_dead_letters_and_a_few_log_lines(deployment):
    from specmeter.producers import Publisher, PublisherSettings

    from .support.kafka_helpers import read_topic

    records = 10_000
    d = deployment
    worker = d.start_worker()
    d.wait_ready(worker)

    async def publish() -> None:
        settings = PublisherSettings(bootstrap_servers=d.bootstrap, topic=d.topics.records, producer_id="buggy")
        async with Publisher(settings) as publisher:
            for i in range(records):  # what a producer bug gives: every record invalid
                invalid = {"type": "record", "batch_id": "dl-1", "session_id": f"s{i}", "generation_id": "g"}
                publisher.publish_raw(
                    msgspec.msgpack.encode({**invalid, "accepted": -1}), session_id=f"s{i}", batch_id="dl-1"
                )
                if i % 1000 == 999:
                    await publisher.flush()
            await publisher.close_batch("dl-1", None, 1)

    asyncio.run(publish())
    letters = asyncio.run(
        read_topic(d.bootstrap, d.topics.deadletter, until=lambda ms: len(ms) >= records, timeout_s=240)
    )
    assert len(letters) == records, "every invalid record is on the dead-letter topic"
    [closed] = [m for m in d.metrics(until=lambda ms: bool(ms), timeout_s=60) if m.batch_id == "dl-1"][-1:]
    assert closed.invalid_record_count == records
    d.stop(worker)  # SIGTERM: the folded count is said before it exits
    log = d.logs[0].read_text(errors="replace")
    lines = [(logging.WARNING, line) for line in log.splitlines() if "dead-lettered" in line]
    assert 1 <= len(lines) <= 8, lines[:20]  # per partition at most, not per record
    assert all(" WARNING " in line for _, line in lines), lines[:20]  # the worker's one log format
    assert folded(lines, "invalid") == records, lines
