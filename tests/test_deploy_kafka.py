"""The compose file's Kafka is the shape production has (issue 21.1): three KRaft
nodes, topics at replication factor 3 with min.insync.replicas=2, and a worker that
knows every broker."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "deploy" / "compose.yaml"
NODES = ("kafka", "kafka-2", "kafka-3")


def test_compose_kafka_is_a_replicated_three_node_cluster():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    envs = {name: services[name]["environment"] for name in NODES}
    assert sorted(env["KAFKA_NODE_ID"] for env in envs.values()) == ["1", "2", "3"]
    (cluster_id,) = {env["CLUSTER_ID"] for env in envs.values()}
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16  # a Kafka Uuid
    voters = "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
    for name, env in envs.items():
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters, name
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3" and env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert services[name]["healthcheck"]["test"], name
    for client in ("worker", "loadgen"):
        assert services[client]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == ",".join(f"{n}:9092" for n in NODES)
    assert {n: {"condition": "service_healthy"} for n in NODES}.items() <= services["worker"]["depends_on"].items()
    # the worker asks for the cluster's replication factor: no flag overrides it here
    assert "--replication-factor" not in services["worker"]["command"]
