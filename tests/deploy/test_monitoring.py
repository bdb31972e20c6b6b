"""The optional monitoring component (deploy/k8s/components/monitoring), rendered into prod with
the sample workers:

- its custom resources (ServiceMonitor, PodMonitor, PrometheusRule: monitoring.coreos.com/v1,
  which kubernetes-validate has no schema for) are validated against the Prometheus Operator's
  schemas as the npm package @kubernetes-models/prometheus-operator ships them (6.0.0, pinned by
  tests/deploy/prometheus_operator/package-lock.json; generated from the operator's API types,
  the source its CRDs' openAPIV3Schema is generated from): types, required fields, enums and
  patterns (durations, ...), by its validators; unknown fields, which those validators let
  through but `kubectl apply --validate=strict` refuses, by walking the package's type
  declarations;
- the ServiceMonitor finds the coordinators' metrics port through a Service, the PodMonitor the
  agents' metrics port on the worker pods, and the `job` labels the rules and the dashboard name
  are theirs;
- every alert expression and every dashboard query parses (`promtool check rules`, Debian's
  prometheus package), and each alert fires on the series it is about and not on others
  (`promtool test rules`);
- every coordinator and agent metric the rules and the dashboard use is one a running
  coordinator or a running agent (joined to that coordinator) exports (their /metrics), with
  label values the code produces; the others are Prometheus's and kube-state-metrics' (the names
  in EXTERNAL).
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from connect_protocol.errors import ErrorCode
from coordinator_svc.core.model import GroupStatus
from coordinator_svc.metrics import LEASE_CHANGES, STATUS_STATES
from coordinator_svc.store.schema import RESOURCE_STATES
from tests.deploy.conftest import PROD_WITH_MONITORING
from tests.deploy.k8s import (
    K8S,
    REPO,
    Obj,
    Rendered,
    container_ports,
    is_prometheus_operator,
    kubectl,
    labels_match,
    render,
)
from tests.deploy.local import wait_for
from tests.support.agents import AgentProcess
from tests.support.coordinator import CoordinatorProcess, free_port
from worker_agent import metrics as agent_metrics
from worker_agent.classic.membership import ClassicPhase
from worker_agent.membership import Membership, Phase

COMPONENT = REPO / "deploy" / "k8s" / "components" / "monitoring"
SCHEMAS = Path(__file__).parent / "prometheus_operator"
STAMP = SCHEMAS / "node_modules" / ".installed-from.sha256"
TYPES = SCHEMAS / "node_modules" / "@kubernetes-models"

#: Metrics the rules and the dashboard use that no process of this project exports: Prometheus's
#: own `up`, and kube-state-metrics' (its stable job, cronjob and pod metrics).
EXTERNAL = {
    "up",
    "kube_job_failed",
    "kube_job_status_failed",
    "kube_job_status_start_time",
    "kube_cronjob_status_last_successful_time",
    "kube_pod_status_ready",
    "kube_pod_init_container_status_restarts_total",
}


# --- the rendering ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def monitored(rendered: dict[str, Rendered]) -> Rendered:
    return rendered[PROD_WITH_MONITORING]


def _one(r: Rendered, kind: str) -> Obj:
    [obj] = [o for o in r.all(kind) if is_prometheus_operator(o)]
    return obj


def _rules(r: Rendered) -> list[Obj]:
    return [rule for g in _one(r, "PrometheusRule")["spec"]["groups"] for rule in g["rules"]]


def _dashboard(r: Rendered) -> Obj:
    [cm] = [o for o in r.all("ConfigMap") if "grafana_dashboard" in o["metadata"].get("labels", {})]
    [text] = cm["data"].values()
    dashboard: Obj = json.loads(text)
    return dashboard


def _dashboard_queries(dashboard: Obj) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets") or []:
            out.append(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def _as_promql(query: str) -> str:
    """A dashboard query as Prometheus sees it once Grafana has filled its variables in;
    `label_values(metric, label)` (Grafana's) as the series it reads."""
    query = query.replace("$__rate_interval", "5m").replace("$namespace", "connect")
    m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query.strip())
    return m.group(1) if m else query


def test_the_component_adds_monitors_rules_and_a_dashboard_to_prod(
    monitored: Rendered, rendered: dict[str, Rendered]
) -> None:
    kinds = sorted(o["kind"] for o in monitored.objects if is_prometheus_operator(o))
    assert kinds == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    assert not [o for o in rendered["prod"].objects if is_prometheus_operator(o)]  # optional
    ns = {o["metadata"]["namespace"] for o in monitored.objects if is_prometheus_operator(o)}
    assert ns == {"connect"}
    dashboard = _dashboard(monitored)
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel
    # One stable name for the dashboard's ConfigMap: the Grafana sidecar would load an old
    # hashed one too.
    [cm] = [o for o in monitored.all("ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]]
    assert cm["metadata"]["name"] == "connect-group-coordinator-dashboard"


def test_the_service_monitor_scrapes_every_coordinator_through_a_service(
    monitored: Rendered,
) -> None:
    monitor = _one(monitored, "ServiceMonitor")
    ns = monitor["metadata"]["namespace"]
    services = [
        s
        for s in monitored.all("Service")
        if s["metadata"]["namespace"] == ns
        and labels_match(monitor["spec"]["selector"], s["metadata"].get("labels") or {})
    ]
    assert len(services) == 1, [s["metadata"]["name"] for s in services]
    [service] = services
    # Not-ready replicas are scraped too: they say why they are not ready.
    assert service["spec"].get("publishNotReadyAddresses") is True
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in ports
    [(template, container)] = monitored.pods_running("coordinator-svc", "serve")
    assert labels_match(service["spec"]["selector"], template.labels)
    target = ports[endpoint["port"]]["targetPort"]
    metrics = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert metrics.get(target, target) == int(
        template.metadata["annotations"]["prometheus.io/port"]
    )
    # The rules and the dashboard name the scrape jobs as they are labelled: the Service's name
    # for the coordinators, the one the PodMonitor sets for the agents.
    jobs = {service["metadata"]["name"], _pod_monitor_job(monitored)}
    for rule in _rules(monitored):
        for job in re.findall(r'\bjob="([^"]+)"', rule["expr"]):
            assert job in jobs, rule["alert"]
    for query in _dashboard_queries(_dashboard(monitored)):
        for job in re.findall(r'\bjob="([^"]+)"', query):
            assert job in jobs, query


def _pod_monitor_job(r: Rendered) -> str:
    """The `job` label the PodMonitor gives its targets (a relabeling that sets it)."""
    [endpoint] = _one(r, "PodMonitor")["spec"]["podMetricsEndpoints"]
    [job] = [
        rule["replacement"]
        for rule in endpoint.get("relabelings") or []
        if rule.get("targetLabel") == "job" and not rule.get("sourceLabels")
    ]
    return str(job)


def test_the_pod_monitor_scrapes_every_worker_agent_on_its_metrics_port(
    monitored: Rendered,
) -> None:
    """The worker pods, by the label every worker pod carries for the coordinator's
    NetworkPolicy; the agent sidecar's named port, on which the agent serves /metrics (its
    flags); Prometheus admitted there by the workers' NetworkPolicy (test_manifests)."""
    monitor = _one(monitored, "PodMonitor")
    assert "namespaceSelector" not in monitor["spec"]  # its own namespace: the workers'
    [(template, agent)] = monitored.pods_running("worker-agent", "run")
    assert template.namespace == monitor["metadata"]["namespace"]
    assert labels_match(monitor["spec"]["selector"], template.labels)
    assert "connect-coordinator/client" in monitor["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    # A port of the agent (a native sidecar: an init container), and of no other container, so
    # that nothing else of the pod is scraped as the agent.
    assert endpoint["port"] in container_ports(agent)
    others = [c for c in template.containers if c is not agent]
    assert all(endpoint["port"] not in container_ports(c) for c in others)
    assert agent in template.sidecars
    configmaps = monitored.configmaps(template.namespace)
    [config] = [
        configmaps[ref["configMapRef"]["name"]]
        for ref in agent.get("envFrom") or []
        if "configMapRef" in ref
    ]
    assert config["WORKER_AGENT_METRICS_PORT"] == str(container_ports(agent)[endpoint["port"]])
    # No pod but the workers': the coordinators and the jobs are not selected.
    selected = [
        t for t in monitored.pod_templates() if labels_match(monitor["spec"]["selector"], t.labels)
    ]
    assert [t.owner_ref for t in selected] == [template.owner_ref]


# --- the Prometheus Operator's schemas ------------------------------------------------------


@pytest.fixture(scope="session")
def operator_schemas() -> Path:
    """`npm ci` in tests/deploy/prometheus_operator when node_modules is missing or older than
    its lock file (as tests/clients does for the Node.js client)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "node and npm are required to validate the Prometheus Operator objects (their "
            "schemas come from @kubernetes-models/prometheus-operator)",
            pytrace=False,
        )
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((SCHEMAS / name).read_bytes())
    wanted = digest.hexdigest()
    with open(SCHEMAS / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = STAMP.read_text().strip() if STAMP.exists() else ""
        if have != wanted:
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=SCHEMAS,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0:
                pytest.fail(f"`npm ci` in {SCHEMAS} failed:\n{done.stdout}\n{done.stderr}")
            STAMP.write_text(wanted + "\n")
    return SCHEMAS


def _validate(schemas: Path, objects: list[Obj]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node
    done = subprocess.run(
        [node, str(schemas / "validate.mjs")],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=schemas,
    )
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


class DeclaredFields:
    """The fields the package's TypeScript declarations (.d.ts) give each type: what the
    schemas allow, for the unknown-field check its validators do not make."""

    _IMPORT = re.compile(r'^import \{ ([^}]+) \} from "([^"]+)";', re.M)
    _PROPERTY = re.compile(r'^    "([^"]+)"\??: (.+?);?$')

    def __init__(self, root: Path) -> None:
        self.root = root

    @cache  # noqa: B019 - a few dozen files, for the test session
    def interface(self, path: Path) -> tuple[dict[str, str], dict[str, Path]] | None:
        """(field -> type, type name -> file) of the interface `path` declares; None for a
        type alias (a string, a number: nothing to walk)."""
        text = path.read_text()
        imports: dict[str, Path] = {}
        for names, spec in self._IMPORT.findall(text):
            if spec.startswith("."):
                target = (path.parent / spec).with_suffix("").with_suffix(".d.ts")
            elif spec.startswith("@kubernetes-models/"):
                target = self.root / (spec.removeprefix("@kubernetes-models/") + ".d.ts")
            else:
                continue
            if not target.exists():
                continue  # @kubernetes-models/base: TypeMeta, Model (apiVersion, kind)
            for name in names.split(","):
                imports[name.strip()] = target
        m = re.search(
            r"^export interface (\w+)(?: extends ([^{]+))? \{\n(.*?)^\}", text, re.M | re.S
        )
        if m is None:
            return None
        fields: dict[str, str] = {}
        for parent in (m.group(2) or "").split(","):
            parent = parent.strip()
            if parent in imports:
                inherited = self.interface(imports[parent])
                if inherited:
                    fields.update(inherited[0])
        for line in m.group(3).splitlines():
            prop = self._PROPERTY.match(line)
            if prop:
                fields[prop.group(1)] = prop.group(2).strip()
        return fields, imports

    def unknown(self, obj: Any, path: Path, where: str = "") -> Iterator[str]:
        """The paths of `obj`'s fields that the type declared in `path` does not have."""
        declared = self.interface(path)
        if declared is None or not isinstance(obj, dict):
            return
        fields, imports = declared
        for key, value in obj.items():
            if key not in fields:
                yield f"{where}/{key}"
                continue
            kind = fields[key]
            array = re.fullmatch(r"Array<(\w+)>", kind)
            if array and array.group(1) in imports and isinstance(value, list):
                for i, item in enumerate(value):
                    yield from self.unknown(item, imports[array.group(1)], f"{where}/{key}/{i}")
            elif kind in imports:
                yield from self.unknown(value, imports[kind], f"{where}/{key}")


def test_the_custom_resources_validate_against_the_operators_schemas(
    monitored: Rendered, operator_schemas: Path
) -> None:
    objects = [o for o in monitored.objects if is_prometheus_operator(o)]
    results = _validate(operator_schemas, objects)
    assert [r["kind"] for r in results] == [o["kind"] for o in objects]
    assert all(not r["errors"] for r in results), results
    declared = DeclaredFields(TYPES)
    v1 = TYPES / "prometheus-operator" / "monitoring.coreos.com" / "v1"
    for obj in objects:
        unknown = list(declared.unknown(obj, v1 / f"{obj['kind']}.d.ts"))
        assert not unknown, f"{obj['kind']}/{obj['metadata']['name']}: unknown fields {unknown}"


def test_the_schema_checks_catch_mistakes(monitored: Rendered, operator_schemas: Path) -> None:
    """The two checks above do refuse what the operator would: a malformed duration, a rule
    without an expression, a field that does not exist."""
    monitor, rule = _one(monitored, "ServiceMonitor"), _one(monitored, "PrometheusRule")
    bad_interval = json.loads(json.dumps(monitor))
    bad_interval["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    no_expr = json.loads(json.dumps(rule))
    del no_expr["spec"]["groups"][0]["rules"][0]["expr"]
    pods = _one(monitored, "PodMonitor")
    no_selector = json.loads(json.dumps(pods))
    del no_selector["spec"]["selector"]
    bad_timeout = json.loads(json.dumps(pods))
    bad_timeout["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"] = "10 s"
    results = _validate(operator_schemas, [bad_interval, no_expr, no_selector, bad_timeout])
    assert all(r["errors"] for r in results), results
    v1 = TYPES / "prometheus-operator" / "monitoring.coreos.com" / "v1"
    # A ServiceMonitor's field in a PodMonitor, a misspelt one in its endpoint.
    wrong_field = json.loads(json.dumps(pods))
    wrong_field["spec"]["endpoints"] = []
    wrong_field["spec"]["podMetricsEndpoints"][0]["portName"] = "agent-metrics"
    unknown = sorted(DeclaredFields(TYPES).unknown(wrong_field, v1 / "PodMonitor.d.ts"))
    assert unknown == ["/spec/endpoints", "/spec/podMetricsEndpoints/0/portName"], unknown
    misspelt = json.loads(json.dumps(rule))
    misspelt["spec"]["groups"][0]["rules"][0]["annotation"] = {}
    misspelt["spec"]["groups"][0]["interval_s"] = 30
    unknown = sorted(DeclaredFields(TYPES).unknown(misspelt, v1 / "PrometheusRule.d.ts"))
    assert unknown == ["/spec/groups/0/interval_s", "/spec/groups/0/rules/0/annotation"], unknown


# --- promtool --------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: `apt-get install prometheus` (scripts/lib/setup.sh "
            "installs it)",
            pytrace=False,
        )
    return path


def _rule_file(groups: list[Obj], path: Path) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_every_alert_expression_and_dashboard_query_parses(
    monitored: Rendered, tmp_path: Path
) -> None:
    groups = _one(monitored, "PrometheusRule")["spec"]["groups"]
    queries = [_as_promql(q) for q in _dashboard_queries(_dashboard(monitored))]
    # The dashboard's queries as recording rules: promtool parses them the same way.
    dashboard = [
        {
            "name": "dashboard",
            "rules": [{"record": f"q{i}", "expr": q} for i, q in enumerate(queries)],
        }
    ]
    path = _rule_file(groups + dashboard, tmp_path / "rules.yaml")
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(len(g["rules"]) for g in groups) + len(queries)
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout


def _series(name: str, values: str, **labels: str) -> Obj:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


POD = {"namespace": "connect", "pod": "coordinator-a", "job": "coordinator-headless"}
OTHER = {"namespace": "connect", "pod": "coordinator-b", "job": "coordinator-headless"}
WORKER_0 = {"namespace": "connect", "pod": "connect-worker-0", "job": "worker-agent"}
WORKER_1 = {"namespace": "connect", "pod": "connect-worker-1", "job": "worker-agent"}
VIOLATION_JOB = {"namespace": "connect", "job_name": "coordinator-audit-export-29100000"}
CRASHED_JOB = {"namespace": "connect", "job_name": "coordinator-audit-export-29100001"}
OLD_JOB = {"namespace": "connect", "job_name": "coordinator-audit-export-29000000"}
#: The reasons kube-state-metrics knows for a failed Job (each a series, 1 for the Job's).
KSM_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "Evicted")


def _failed_job(job: dict[str, str], reason: str | None) -> list[Obj]:
    """A failed Job as kube-state-metrics shows it: kube_job_failed, and kube_job_status_failed
    for each reason it knows (all 0 when the Job's reason is another, PodFailurePolicy)."""
    out = [
        _series("kube_job_failed", "1x22", condition="true", **job),
        _series("kube_job_failed", "0x22", condition="false", **job),
        _series("kube_job_status_start_time", "300x22", **job),
    ]
    for known in KSM_REASONS:
        out.append(
            _series(
                "kube_job_status_failed", "1x22" if known == reason else "0x22", reason=known, **job
            )
        )
    return out


def _alert_tests() -> list[Obj]:
    """promtool unit tests: each alert fires on the series it is about (and not before its
    `for`), and not on healthy series."""
    sev_w, sev_c = {"severity": "warning"}, {"severity": "critical"}
    ns = {"namespace": "connect"}
    minutes = [
        {
            "interval": "1m",
            "input_series": [
                _series("up", "1 1 0x20", **POD),
                _series("up", "1x22", **OTHER),
                _series("coordinator_ready", "1 1 0x20", **POD),
                _series("coordinator_ready", "1 0x20", **OTHER),
                _series("coordinator_database_unanswered_seconds", "0 0 60+60x20", **POD),
                _series("coordinator_database_unanswered_seconds", "0+1x22", **OTHER),
                # A group RECONCILING longer and longer (past 2 rebalance timeouts at minute
                # 5); one ASSIGNING past 2 for two minutes only, then settled; the other
                # replica's groups just inside their timeouts.
                _series(
                    "coordinator_rebalance_oldest_timeout_ratio",
                    "0 0.5 1 1.5 2 2.5 3 3.5 4 4.5 5 5.5 6x10",
                    state="RECONCILING",
                    **POD,
                ),
                _series(
                    "coordinator_rebalance_oldest_timeout_ratio",
                    "3 3 0x20",
                    state="ASSIGNING",
                    **POD,
                ),
                _series(
                    "coordinator_rebalance_oldest_timeout_ratio",
                    "1.9x22",
                    state="RECONCILING",
                    **OTHER,
                ),
                _series(
                    "coordinator_rebalance_oldest_seconds",
                    "0+30x22",
                    state="RECONCILING",
                    **POD,
                ),
                _series("coordinator_groups", "1x22", state="RECONCILING", **POD),
                _series("coordinator_groups", "3x22", state="STABLE", **OTHER),
                _series(
                    "coordinator_rebalances_total",
                    "0 0 1 1x20",
                    reason="member session expired",
                    **POD,
                ),
                _series("coordinator_rebalances_total", "0+1x22", reason="member joined", **POD),
                # The coordinator's fenced answers alone do not make ConnectMembersFenced: it
                # is the agents' count.
                _series(
                    "coordinator_errors_total",
                    "0 0 3x20",
                    rpc="ConnectGroupHeartbeat",
                    code="FENCED_MEMBER_EPOCH",
                    **POD,
                ),
                _series(
                    "coordinator_errors_total",
                    "0+5x22",
                    rpc="ConnectGroupHeartbeat",
                    code="NOT_COORDINATOR",
                    **POD,
                ),
                _series(
                    "coordinator_errors_total",
                    "0 0 2x20",
                    rpc="InstallAssignment",
                    code="INVALID_ASSIGNMENT",
                    **POD,
                ),
                _series(
                    "coordinator_assignment_computations_total", "0 0 1x20", result="failed", **POD
                ),
                _series(
                    "coordinator_assignment_computations_total",
                    "0+1x22",
                    result="installed",
                    **POD,
                ),
                # One incident of lost leases (a database outage): not flapping.
                _series(
                    "coordinator_group_lease_changes_total", "0 0 0 40x19", change="lost", **POD
                ),
                _series(
                    "coordinator_group_lease_changes_total", "0+3x22", change="acquired", **OTHER
                ),
                # The agents: worker 0 fenced itself once; worker 1's webhook fails every
                # revocation, worker 0's failed one assignment (retried: fine).
                _series(
                    "worker_agent_self_fenced_total",
                    "0 0 1x20",
                    reason="session_timeout",
                    **WORKER_0,
                ),
                _series(
                    "worker_agent_self_fenced_total",
                    "0x22",
                    reason="FENCED_MEMBER_EPOCH",
                    **WORKER_0,
                ),
                _series(
                    "worker_agent_listener_calls_total",
                    "0 0 0+2x20",
                    event="revoked",
                    result="failed",
                    **WORKER_1,
                ),
                _series(
                    "worker_agent_listener_calls_total",
                    "0 0 1x20",
                    event="assigned",
                    result="failed",
                    **WORKER_0,
                ),
                _series(
                    "worker_agent_listener_calls_total",
                    "0+5x22",
                    event="revoked",
                    result="ok",
                    **WORKER_0,
                ),
                # The audit export: a violation (PodFailurePolicy), a crash (retried, then
                # BackoffLimitExceeded), and an older run that succeeded.
                *_failed_job(VIOLATION_JOB, None),
                *_failed_job(CRASHED_JOB, "BackoffLimitExceeded"),
                _series("kube_job_failed", "0x22", condition="true", **OLD_JOB),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "5m",
                    "alertname": "ConnectCoordinatorDown",
                    "exp_alerts": [],  # down for 3 minutes only
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectCoordinatorDown",
                    "exp_alerts": [{"exp_labels": {**sev_w, **POD}}],
                },
                {"eval_time": "10m", "alertname": "ConnectCoordinatorAbsent", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "ConnectCoordinatorNotReady",
                    "exp_alerts": [
                        {"exp_labels": {**sev_w, **POD}},
                        {"exp_labels": {**sev_w, **OTHER}},
                    ],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectCoordinatorNoneReady",
                    "exp_alerts": [{"exp_labels": {**sev_c, **ns}}],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectCoordinatorDatabaseUnreachable",
                    "exp_alerts": [
                        {"exp_labels": {**sev_c, "namespace": "connect", "pod": "coordinator-a"}}
                    ],
                },
                {
                    # Past 2 at minute 5, for a minute: pending at 5, firing from 6; the
                    # ASSIGNING spike of minutes 0-1 fired at 1 and is gone.
                    "eval_time": "5m",
                    "alertname": "ConnectGroupStuckRebalancing",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "1m",
                    "alertname": "ConnectGroupStuckRebalancing",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                **sev_w,
                                "namespace": "connect",
                                "pod": "coordinator-a",
                                "state": "ASSIGNING",
                            }
                        }
                    ],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectGroupStuckRebalancing",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                **sev_w,
                                "namespace": "connect",
                                "pod": "coordinator-a",
                                "state": "RECONCILING",
                            }
                        }
                    ],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectMembersRemoved",
                    "exp_alerts": [
                        {"exp_labels": {**sev_w, **ns, "reason": "member session expired"}}
                    ],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectMembersFenced",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns, "reason": "session_timeout"}}],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectAgentListenerFailing",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                **sev_w,
                                **ns,
                                "pod": "connect-worker-1",
                                "event": "revoked",
                            }
                        }
                    ],
                },
                {
                    "eval_time": "20m",
                    "alertname": "ConnectCoordinatorLeaseFlapping",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectAssignmentFailures",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns}}],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectAssignmentsRejected",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns, "code": "INVALID_ASSIGNMENT"}}],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectAuditViolationsFound",
                    "exp_alerts": [{"exp_labels": {**sev_c, "condition": "true", **VIOLATION_JOB}}],
                },
                {
                    "eval_time": "10m",
                    "alertname": "ConnectAuditExportFailed",
                    "exp_alerts": [
                        {"exp_labels": {**sev_w, "reason": "BackoffLimitExceeded", **CRASHED_JOB}}
                    ],
                },
            ],
        },
        {
            # Leases lost at minutes 7, 17 and 27: three of the 5-minute windows by minute 30,
            # two by minute 25; then no replica scraped at all.
            "interval": "1m",
            "input_series": [
                _series(
                    "coordinator_group_lease_changes_total",
                    "0x7 2x9 3x9 5x13",
                    change="lost",
                    **POD,
                ),
                _series("up", "0x40", **POD),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "25m",
                    "alertname": "ConnectCoordinatorLeaseFlapping",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "30m",
                    "alertname": "ConnectCoordinatorLeaseFlapping",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns}}],
                },
                {
                    "eval_time": "20m",
                    "alertname": "ConnectCoordinatorAbsent",
                    "exp_alerts": [{"exp_labels": sev_c}],
                },
            ],
        },
        {
            # FAILED resources, as each replica counts those of the groups it owns, scraped
            # every 15 s. In `connect` from 2m15s on, their group moving from one replica to
            # the other at 10m (neither counts it for two scrapes: the move does not restart the
            # clock): true from the evaluation at 3m, firing 15 minutes later. In `connect2`
            # FAILED from 1m to 14m, then recovered: 13 minutes (plus the minute's window) is
            # not 15. RUNNING ones never matter.
            "interval": "15s",
            "input_series": [
                _series("coordinator_resource_statuses", "0x8 1x30 0x200", state="FAILED", **POD),
                _series("coordinator_resource_statuses", "0x41 1x200", state="FAILED", **OTHER),
                _series("coordinator_resource_statuses", "7x240", state="RUNNING", **POD),
                _series(
                    "coordinator_resource_statuses",
                    "0x3 1x52 0x200",
                    state="FAILED",
                    **{**POD, "namespace": "connect2"},
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "17m", "alertname": "ConnectResourcesFailed", "exp_alerts": []},
                {
                    "eval_time": "18m",
                    "alertname": "ConnectResourcesFailed",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns}}],
                },
                {
                    "eval_time": "40m",
                    "alertname": "ConnectResourcesFailed",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns}}],
                },
            ],
        },
        {
            # Automatic restarts spent: in `connect` from 2m on (firing 5 minutes after the
            # evaluation at 2m); in `connect2` for 3 minutes only (an operator restarted it).
            "interval": "15s",
            "input_series": [
                _series("coordinator_auto_restarts_exhausted", "0x8 2x100", **POD),
                _series(
                    "coordinator_auto_restarts_exhausted",
                    "0x8 1x12 0x100",
                    **{**POD, "namespace": "connect2"},
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": "ConnectAutoRestartsExhausted", "exp_alerts": []},
                {
                    "eval_time": "8m",
                    "alertname": "ConnectAutoRestartsExhausted",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns}}],
                },
            ],
        },
        {
            # Event retention: export `nightly` stopped recording runs (its age grows past 36
            # hours), `hourly` records one every hour; both reported by two replicas.
            "interval": "1h",
            "input_series": [
                *(
                    _series(
                        "coordinator_audit_export_registration_age_seconds",
                        "0+3600x40",
                        export="nightly",
                        **pod,
                    )
                    for pod in (POD, OTHER)
                ),
                _series(
                    "coordinator_audit_export_registration_age_seconds",
                    "1800x40",
                    export="hourly",
                    **POD,
                ),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "35h",
                    "alertname": "ConnectAuditExportRegistrationStale",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "37h",
                    "alertname": "ConnectAuditExportRegistrationStale",
                    "exp_alerts": [{"exp_labels": {**sev_w, **ns, "export": "nightly"}}],
                },
            ],
        },
        {
            # The audit export's last success 37 hours ago.
            "interval": "1h",
            "input_series": [
                _series(
                    "kube_cronjob_status_last_successful_time",
                    "0x40",
                    cronjob="coordinator-audit-export",
                    namespace="connect",
                ),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "30h",
                    "alertname": "ConnectAuditExportNotSucceeding",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "37h",
                    "alertname": "ConnectAuditExportNotSucceeding",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                **sev_w,
                                "cronjob": "coordinator-audit-export",
                                "namespace": "connect",
                            }
                        }
                    ],
                },
            ],
        },
    ]
    return minutes


def test_every_alert_fires_on_what_it_is_about(monitored: Rendered, tmp_path: Path) -> None:
    groups = json.loads(json.dumps(_one(monitored, "PrometheusRule")["spec"]["groups"]))
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # their templates are checked by `check rules`
    _rule_file(groups, tmp_path / "rules.yaml")
    tests = _alert_tests()
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for r in _rules(monitored)}, "an alert without a unit test"
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    done = subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- the metric names, against a running coordinator ---------------------------------------------

_KEYWORDS = {
    # aggregation operators, which may come before their `by (...)` rather than their "("
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """Every metric an expression selects, with its label matchers (`=` and `=~`, as written:
    a regular expression stays one)."""
    text = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries' steps
    out = []
    pattern = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?")
    pos = 0
    while m := pattern.search(text, pos):
        pos = m.end() if not m.group(3) else m.end() - 1
        name, matchers, call = m.group(1), m.group(2), m.group(3)
        before = text[: m.start()].rstrip()
        if call or name.lower() in _KEYWORDS:
            if name in ("by", "without", "on", "ignoring", "group_left", "group_right") and call:
                pos = text.index(")", m.end()) + 1  # a label list, not metrics
            continue
        if before.count("{") > before.count("}"):
            continue  # a label name inside a selector (read with its metric)
        labels = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers or ""))
        out.append((name, labels))
    return out


def test_metric_selectors_reads_promql() -> None:
    assert metric_selectors(
        'sum by (namespace, reason) (increase(coordinator_rebalances_total{reason=~"a|b"}[15m]))'
        ' and on (namespace) time() - kube_job_status_start_time{job_name="x"} > 0'
    ) == [
        ("coordinator_rebalances_total", {"reason": "a|b"}),
        ("kube_job_status_start_time", {"job_name": "x"}),
    ]
    assert metric_selectors("changes((sum by (pod) (coordinator_groups))[30m:1m]) > 6") == [
        ("coordinator_groups", {})
    ]
    assert metric_selectors(
        'count_over_time((sum by (namespace) (increase(c_total{change="lost"}[5m])) > 0)'
        "[30m:5m]) >= 3 unless histogram_quantile(0.99, sum by (le, reason) (rate(h_bucket[5m])))"
    ) == [("c_total", {"change": "lost"}), ("h_bucket", {})]


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created", ""),
}


def _families(text: str) -> dict[str, set[str]]:
    """An exposition's families: family name -> the sample names it exports (from the # TYPE
    lines, so labelled families that have no sample yet count too)."""
    families: dict[str, set[str]] = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):
        base = name.removesuffix("_total") if kind == "counter" else name
        families[base] = {base + s for s in SUFFIXES.get(kind, ("",))}
    return families


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return None


@pytest.fixture
def exported_metrics(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, set[str]]:
    """What a running coordinator and a running agent, a member of a group of that coordinator,
    serve on /metrics: family name -> the sample names it exports."""
    workdir = tmp_path_factory.mktemp("exported-metrics")
    coordinator_port, agent_port = free_port(), free_port()
    log = workdir / "coordinator.log"
    coordinator = CoordinatorProcess(
        database_url,
        "--metrics-port",
        str(coordinator_port),
        "--metrics-host",
        "127.0.0.1",
        log_path=log,
    )
    agent = AgentProcess(
        "w1",
        coordinator.address,
        "metrics-group",
        workdir / "agent",
        extra_args=["--metrics-port", str(agent_port), "--metrics-host", "127.0.0.1"],
    )
    coordinator.start()
    try:
        agent.start()
        coordinator_text = wait_for(
            "the coordinator's metrics", lambda: _scrape(coordinator_port), 15, log.read_text
        )

        def joined() -> str | None:
            text = _scrape(agent_port)
            if text is None or not re.search(r"^worker_agent_member_epoch [1-9]", text, re.M):
                return None
            return text

        agent_text = wait_for("the agent to join", joined, 30, agent.log_tail)
    finally:
        agent.close()
        coordinator.close()
    coordinator_families = _families(coordinator_text)
    agent_families = _families(agent_text)
    assert coordinator_families and agent_families
    assert not set(coordinator_families) & set(agent_families)
    assert all(name.startswith("coordinator_") for name in coordinator_families)
    assert all(name.startswith("worker_agent_") for name in agent_families)
    return {**coordinator_families, **agent_families}


def _label_values(name: str) -> dict[str, set[str]]:
    """The values the code gives each label of the metric `name` (a sample name)."""
    if name.startswith("worker_agent_"):
        stop_reasons = set(
            re.findall(r'return "([^"]+)"', inspect.getsource(Membership._stop_reason))
        )
        assert stop_reasons == set(agent_metrics.STOP_REASONS)
        phases = [p.value for p in Phase]
        phases += [p.value for p in ClassicPhase if p.value not in phases]
        assert phases == list(agent_metrics.PHASES)
        family = {
            "worker_agent_self_fenced_total": {"reason": set(agent_metrics.SELF_FENCE_REASONS)},
            "worker_agent_heartbeat_errors_total": {"code": {c.name for c in ErrorCode}},
            "worker_agent_heartbeat_failures_total": {"status": {c.name for c in grpc.StatusCode}},
            "worker_agent_listener_calls_total": {
                "event": set(agent_metrics.EVENTS),
                "result": {"ok", "failed"},
            },
            "worker_agent_listener_retries_total": {"event": set(agent_metrics.EVENTS)},
            "worker_agent_leaves_total": {"outcome": set(agent_metrics.LEAVE_OUTCOMES)},
            "worker_agent_phase": {"phase": set(agent_metrics.PHASES)},
            "worker_agent_resources": {"kind": {"connector", "task"}},
        }
        histogram = re.sub(r"_(bucket|sum|count)$", "", name)
        if histogram == "worker_agent_revocation_seconds":
            return {"reason": stop_reasons, "le": set()}
        return family.get(name, {})
    if name == "coordinator_resource_statuses":
        # Every state the store can hold, each always exported (0 when none).
        assert set(STATUS_STATES) == set(RESOURCE_STATES)
        return {"state": set(STATUS_STATES)}
    sources = "\n".join(p.read_text() for p in (REPO / "coordinator_svc").rglob("*.py"))
    reasons = set(re.findall(r'bump_epoch\(\s*"([^"]+)"', sources))
    rpcs = set(re.findall(r"^    def ([A-Z]\w+)\(\s*self,\s*request", sources, flags=re.M))
    return {
        "state": {s.value for s in GroupStatus},
        "code": {c.name for c in ErrorCode},
        "reason": reasons,
        "result": {"installed", "failed"},
        "rpc": rpcs,
        "change": set(LEASE_CHANGES),
    }


def test_every_metric_the_rules_and_dashboard_use_exists_with_the_label_values_it_has(
    monitored: Rendered, exported_metrics: dict[str, set[str]]
) -> None:
    exported = set().union(*exported_metrics.values())
    assert "coordinator_rebalances_total" in exported  # a labelled family without samples yet
    assert "worker_agent_revocation_seconds_bucket" in exported  # nothing revoked yet
    coordinator = _label_values("coordinator_rebalances_total")
    assert "member session expired" in coordinator["reason"]
    assert "ConnectGroupHeartbeat" in coordinator["rpc"]
    expressions = [r["expr"] for r in _rules(monitored)]
    expressions += [_as_promql(q) for q in _dashboard_queries(_dashboard(monitored))]
    used: set[str] = set()
    for expr in expressions:
        selectors = metric_selectors(expr)
        assert selectors, expr
        for name, labels in selectors:
            used.add(name)
            if name in EXTERNAL:
                continue
            assert name in exported, (
                f"{name} is not exported by the coordinator nor the agent ({expr})"
            )
            values = _label_values(name)
            for label, value in labels.items():
                if label in ("namespace", "pod", "job"):
                    continue  # the scrape's target labels
                assert label in values, f"{name}: label {label} is not one the code sets"
                for alternative in value.split("|"):
                    assert alternative in values[label], (
                        f"{name}{{{label}}}: {alternative!r} is not a value the code produces"
                    )
    # What the coordinator exports about groups, readiness and leases, and what the agents
    # export about their membership and their worker, is used somewhere.
    for family in (
        "coordinator_groups",
        "coordinator_ready",
        "coordinator_errors",
        "coordinator_rebalance_oldest_seconds",
        "coordinator_rebalance_oldest_timeout_ratio",
        "coordinator_group_lease_changes",
        "coordinator_rpc_latency_seconds",
        "coordinator_heartbeat_latency_seconds",
        "coordinator_resource_statuses",
        "worker_agent_heartbeats",
        "worker_agent_heartbeat_errors",
        "worker_agent_heartbeat_failures",
        "worker_agent_self_fenced",
        "worker_agent_listener_calls",
        "worker_agent_listener_retries",
        "worker_agent_revocation_seconds",
        "worker_agent_leaves",
        "worker_agent_member_epoch",
        "worker_agent_phase",
        "worker_agent_resources",
    ):
        assert exported_metrics[family] & used, family


def test_the_agents_exposition_is_one_promtool_accepts(tmp_path: Path) -> None:
    """The agent writes the text format itself (its image has no prometheus_client): promtool's
    linter reads it as Prometheus would, names and types included."""
    metrics = agent_metrics.AgentMetrics()
    metrics.heartbeat_errors.inc("NOT_COORDINATOR")
    metrics.revocations.observe(0.3, "revoked")
    metrics.self_fenced.inc("session_timeout")
    done = subprocess.run(
        [promtool(), "check", "metrics"],
        input=metrics.render(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _k8s_from(folder: Path) -> str:
    """deploy/k8s, relative to `folder` (kustomize takes no absolute paths)."""
    return os.path.relpath(K8S, folder)


def _readme_patch(readme: str) -> str:
    """The kustomization fragment deploy/k8s/README.md gives to change how long a resource may
    stay FAILED (the YAML block after its `failed-for-patch` marker)."""
    after = readme[readme.index("<!-- failed-for-patch -->") :]
    block = re.search(r"```yaml\n(.*?)```", after, flags=re.S)
    assert block is not None
    return block.group(1)


def test_the_readmes_patch_sets_how_long_a_resource_may_stay_failed(
    monitored: Rendered, tmp_path: Path
) -> None:
    """The README's patch, in an overlay of prod with the monitoring component, changes the
    rule's `for` and nothing else; on a rule file where the alert has moved, its `test` op makes
    kustomize refuse it rather than patch another rule."""
    [shipped] = [r for r in _rules(monitored) if r.get("alert") == "ConnectResourcesFailed"]
    assert shipped["for"] == "15m"
    fragment = _readme_patch((REPO / "deploy" / "k8s" / "README.md").read_text())
    patches = yaml.safe_load(fragment)["patches"]
    [wanted] = [op["value"] for op in yaml.safe_load(patches[0]["patch"]) if op["op"] == "replace"]
    assert wanted != shipped["for"]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources: [{_k8s_from(overlay)}/overlays/prod]\n"
        f"components: [{_k8s_from(overlay)}/components/sample-workers, "
        f"{_k8s_from(overlay)}/components/monitoring]\n" + fragment
    )
    _, objects = render(overlay)
    patched = Rendered("patched", "", objects, overlay)
    changed = [r for r in _rules(patched) if r.get("alert") == "ConnectResourcesFailed"]
    assert [r["for"] for r in changed] == [wanted]
    assert [{**r, "for": shipped["for"]} for r in changed] == [shipped]
    others = [r for r in _rules(patched) if r.get("alert") != "ConnectResourcesFailed"]
    assert others == [r for r in _rules(monitored) if r.get("alert") != "ConnectResourcesFailed"]

    # The same patch on a rule list where another alert is first in the group: refused.
    moved = tmp_path / "moved"
    moved.mkdir()
    rule = json.loads(json.dumps(_one(monitored, "PrometheusRule")))
    rule["metadata"].pop("namespace", None)
    rule["spec"]["groups"][1]["rules"].insert(0, {"alert": "Another", "expr": "vector(1)"})
    (moved / "rule.yaml").write_text(yaml.safe_dump(rule))
    (moved / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [rule.yaml]\n" + fragment
    )
    done = subprocess.run(
        [kubectl(), "kustomize", str(moved)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "test" in done.stderr.lower(), done.stdout + done.stderr


def test_the_readme_says_what_each_alert_means_and_what_to_do(monitored: Rendered) -> None:
    readme = (REPO / "deploy" / "k8s" / "README.md").read_text()
    table = readme[readme.index("### Alerts") :]
    table = table[: table.index("\n## ")]
    for rule in _rules(monitored):
        rows = [line for line in table.splitlines() if line.startswith(f"| `{rule['alert']}` |")]
        assert len(rows) == 1, f"README's alert table has no row for {rule['alert']}"
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        assert cells[1] == rule["labels"]["severity"], (rule["alert"], cells[1])
        assert len(cells) == 4 and all(cells), rows[0]
