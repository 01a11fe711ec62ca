"""A publisher's start asks the records topic's partition count from the first broker of the
cluster that answers (``_publisher.first_answer``): a broker that is away (killed,
restarting) stays in the cluster's metadata for a while, and asking only one picked at
random failed the start while the other two of three answered (the group chaos on a
three-broker cluster found it). The rule is tested over a client whose brokers answer or
not as told; ``tests/test_publisher.py`` starts publishers on a real broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka.errors import NoBrokersAvailable, NodeNotReadyError

from specmeter.producers._publisher import first_answer


class _Client:
    """Brokers 1, 2 and 3 in the metadata; those in ``away`` do not answer."""

    def __init__(self, away: set[int]) -> None:
        self.away, self.asked = away, []
        brokers = [SimpleNamespace(nodeId=n) for n in (1, 2, 3)]
        self.cluster = SimpleNamespace(brokers=lambda: brokers)

    async def send(self, node: int, request: object) -> tuple[int, object]:
        self.asked.append(node)
        if node in self.away:
            raise NodeNotReadyError(f"broker {node} is away")
        return node, request


@pytest.mark.parametrize("away", [{1}, {2}, {3}, {1, 2}, {2, 3}, {1, 3}])
def test_a_broker_away_does_not_fail_the_start_while_another_answers(away):
    for _ in range(20):  # whatever order the brokers are asked in
        client = _Client(away)
        node, _ = asyncio.run(first_answer(client, "metadata"))
        assert node not in away and client.asked[-1] == node and set(client.asked[:-1]) <= away


def test_no_broker_answering_raises_the_last_error():
    with pytest.raises(NodeNotReadyError):
        asyncio.run(first_answer(_Client({1, 2, 3}), "metadata"))
    client = _Client(set())
    client.cluster = SimpleNamespace(brokers=lambda: [])
    with pytest.raises(NoBrokersAvailable):
        asyncio.run(first_answer(client, "metadata"))
