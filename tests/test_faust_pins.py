"""What ``streams/_internals.py`` relies on of Faust's and aiokafka's private internals: these
tests fail when the installed release changes it, so the room is looked at again."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from specmeter.streams._internals import AIOKAFKA_PINNED, FAUST_PINNED, check_pins, table_manager

#: faust-streaming's ``TableManager.on_start`` as ``TablelessManager.on_start`` copies it (less the sleep)
_COPIED_ON_START = '''
async def on_start(self) -> None:
    """Call when table manager is starting."""
    await self.sleep(1.0)
    if not self.should_stop:
        await self._update_channels()
        await self.recovery.start()
'''


def test_the_installed_releases_are_the_pinned_ones():
    import aiokafka
    import faust

    assert faust.__version__ == FAUST_PINNED, "read streams/_internals.py against this faust-streaming, then re-pin"
    assert aiokafka.__version__ == AIOKAFKA_PINNED, "read streams/_internals.py against this aiokafka, then re-pin"


def test_faust_table_manager_on_start_is_the_one_copied():
    from faust.tables import TableManager

    source = textwrap.dedent(inspect.getsource(TableManager.on_start))
    assert source.strip() == _COPIED_ON_START.strip(), (
        f"faust-streaming's TableManager.on_start changed since {FAUST_PINNED}: update TablelessManager"
    )
    assert inspect.iscoroutinefunction(TableManager._update_channels)


def test_the_tableless_manager_is_faust_s_less_the_pause():
    from faust.tables import TableManager

    manager = table_manager(on_streams_resumed=lambda: None)
    assert issubclass(manager, TableManager)
    assert "sleep" not in inspect.getsource(manager.on_start)


def test_faust_recovery_calls_on_actives_ready_after_resuming_the_partitions():
    """``on_actives_ready`` pauses Faust's delivery of the input: it must come after Faust
    resumed the partitions, or Faust would deliver them."""
    from faust.tables.recovery import Recovery

    source = inspect.getsource(Recovery._resume_streams)  # the path of an app without tables
    resumed = source.find("consumer.resume_partitions(")
    ready = source.find("self.tables.on_actives_ready()")
    assert 0 <= resumed < ready, f"Recovery._resume_streams changed since faust-streaming {FAUST_PINNED}"


def test_the_commit_and_the_metadata_request_are_where_they_were():
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.metadata import MetadataRequest
    from faust.transport.consumer import Consumer

    assert inspect.iscoroutinefunction(Consumer._commit)
    assert list(inspect.signature(Consumer._commit).parameters) == ["self", "offsets"]
    assert inspect.iscoroutinefunction(AIOKafkaAdminClient._send_request)
    assert "allow_auto_topic_creation" in inspect.signature(MetadataRequest).parameters
    from aiokafka.consumer.fetcher import Fetcher

    # set_fetch_wait: the fetcher keeps the wait as an attribute and reads it for every request
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    assert "self._fetch_max_wait_ms," in inspect.getsource(Fetcher._get_actions_per_node)
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    # stop_fetching: a coroutine run in Faust's consumer thread, on the aiokafka consumer there
    assert inspect.iscoroutinefunction(AIOKafkaConsumerThread.call_thread)
    assert "_consumer" in inspect.getsource(AIOKafkaConsumerThread._ensure_consumer)
    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer

    # message_appender: send's own hand-over to the accumulator, with the timeout it passes
    send = inspect.getsource(AIOKafkaProducer.send)
    assert "await self._message_accumulator.add_message(" in send
    assert "self._request_timeout_ms / 1000" in send
    assert inspect.iscoroutinefunction(MessageAccumulator.add_message)
    check_pins()  # and what the worker checks at start holds


def test_a_faust_without_a_private_member_fails_at_start_up_with_a_clear_error():
    class Changed:  # a TableManager whose private method was renamed
        recovery = None
        should_stop = False
        on_actives_ready = None

    with pytest.raises(RuntimeError, match=r"TableManager._update_channels missing.*must be updated"):
        check_pins(Changed)
