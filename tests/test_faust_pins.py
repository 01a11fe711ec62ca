"""What ``streams/delivery/internals.py`` relies on of aiokafka's private internals, and the
worker's Faust boot strategy: these tests fail when the installed release changes it, so
the room is looked at again."""

from __future__ import annotations

import inspect

import pytest

from specmeter.streams.delivery import internals
from specmeter.streams.delivery.internals import AIOKAFKA_PINNED, FAUST_PINNED, check_pins
from specmeter.streams.worker.app import boot_strategy


def test_the_installed_releases_are_the_pinned_ones():
    import aiokafka
    import faust

    assert faust.__version__ == FAUST_PINNED, (
        "read streams/delivery/internals.py against this faust-streaming, then re-pin"
    )
    assert aiokafka.__version__ == AIOKAFKA_PINNED, (
        "read streams/delivery/internals.py against this aiokafka, then re-pin"
    )


def test_the_metadata_request_the_fetch_wait_and_the_appender_are_where_they_were():
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.consumer.fetcher import Fetcher
    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer
    from aiokafka.protocol.metadata import MetadataRequest

    assert inspect.iscoroutinefunction(AIOKafkaAdminClient._send_request)
    # delete_consumer_group: the request to a node, and the DeleteGroups request it sends there
    from aiokafka.protocol.admin import DeleteGroupsRequest

    assert inspect.iscoroutinefunction(AIOKafkaAdminClient._send_request_to_node)
    assert list(inspect.signature(AIOKafkaAdminClient._send_request_to_node).parameters)[1:3] == ["node_id", "request"]
    assert list(inspect.signature(DeleteGroupsRequest).parameters) == ["group_names"]
    assert "allow_auto_topic_creation" in inspect.signature(MetadataRequest).parameters
    # set_fetch_wait: the fetcher keeps the wait as an attribute and reads it for every request
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    assert "self._fetch_max_wait_ms," in inspect.getsource(Fetcher._get_actions_per_node)
    # message_appender: send's own hand-over to the accumulator, with the timeout it passes
    send = inspect.getsource(AIOKafkaProducer.send)
    assert "await self._message_accumulator.add_message(" in send
    assert "self._request_timeout_ms / 1000" in send
    assert inspect.iscoroutinefunction(MessageAccumulator.add_message)
    # stop_without_sending: the sender's own close cancels its task, and stop then finds it done
    from aiokafka.producer.sender import Sender

    assert inspect.iscoroutinefunction(Sender.close) and "self._sender_task.cancel()" in inspect.getsource(Sender.close)
    assert "return_when=asyncio.FIRST_COMPLETED" in inspect.getsource(AIOKafkaProducer.stop)
    # group_generation, group_member: the group coordinator keeps both of the last join
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    coordinator = inspect.getsource(GroupCoordinator)
    assert "self.generation = " in coordinator and "self.member_id = " in coordinator
    check_pins()  # and what the worker checks at start holds


def test_faust_runs_no_kafka_client_of_its_own():
    """The boot strategy leaves Faust its lifecycle, timers and web server: no consumer (the
    routes are the group members), no producer, no tables, no sensors."""
    from types import SimpleNamespace

    strategy = boot_strategy()(SimpleNamespace())  # an app it never needs to look at for these
    assert strategy.kafka_consumer() == [] and strategy.kafka_producer() == []
    assert strategy.tables() == [] and strategy.kafka_conductor() == [] and strategy.sensors() == []


def test_an_aiokafka_without_a_private_member_fails_at_start_up_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(internals, "_fetcher_source", lambda: "class Fetcher: pass")
    with pytest.raises(RuntimeError, match=r"Fetcher._fetch_max_wait_ms missing.*must be updated"):
        check_pins()


def test_no_private_member_of_a_library_outside_its_one_room():
    """Issue 45: the demo deleted its groups through aiokafka's ``_send_request_to_node``;
    every private member is ``delivery/internals.py``'s (and the producer library's
    publisher, which may not import the stream side), so no ``noqa: SLF001`` elsewhere."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "streams"
    rooms = {root / "delivery" / "internals.py"}
    elsewhere = [str(p) for p in root.rglob("*.py") if p not in rooms and "SLF001" in p.read_text()]
    assert elsewhere == []
