"""The Kubernetes manifests (deploy/k8s): every overlay renders with `kubectl kustomize`, every
object validates offline against the Kubernetes schemas (`kubernetes-validate --strict`), and the
objects are wired to each other and to the programs they run: probes, Services, selectors, the
agent's coordinator address, Secrets and ConfigMaps, environment variables each program reads,
the audit CronJob's command line, and the Dockerfile that builds the image. Without the TLS
component the coordinator and the agents talk plaintext, on purpose and said so; with it, see
test_tls_manifests.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
import yaml

from audit_export.cli import EXIT_VIOLATIONS
from coordinator_svc.grpc_api.server import (
    LIVENESS_SERVICE,
    READINESS_SERVICE,
)
from tests.deploy.conftest import (
    PROD_WITH_MONITORING,
    PROD_WITH_WORKERS,
    PROD_WITH_WORKERS_TLS,
    render_combination,
)
from tests.deploy.k8s import (
    K8S,
    REPO,
    Obj,
    PodFacts,
    PodTemplate,
    Rendered,
    argv,
    container_env,
    container_ports,
    is_custom_resource,
    labels_match,
    load_example_secret,
    overlay_names,
    render,
    secret_data,
)
from worker_agent import cli as agent_cli

OVERLAYS = overlay_names()
# Every overlay, plus prod with the sample worker component added the way README says, with the
# TLS component too, and with the monitoring component.
ALL = [*OVERLAYS, PROD_WITH_WORKERS, PROD_WITH_WORKERS_TLS, PROD_WITH_MONITORING]
# The renderings that run the sample workers.
WITH_WORKERS = [
    *(o for o in OVERLAYS if o.startswith("dev")),
    PROD_WITH_WORKERS,
    PROD_WITH_WORKERS_TLS,
]
# The Kubernetes versions the manifests support (README: 1.29, for native sidecars) up to the
# newest release the README names, and the newest schemas installed.
K8S_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", None)
BIN = Path(sys.executable).parent
# The image names in the base, which overlays retarget: one per part (Dockerfile targets). Every
# image of ours contains IMAGE.
IMAGE = "connect-group-coordinator"
IMAGES = {
    "connect-group-coordinator": "coordinator",
    "connect-group-coordinator-agent": "agent",
    "connect-group-coordinator-audit": "audit",
}
PINNED_IMAGES = K8S / "components" / "pinned-images" / "kustomization.yaml"

COORDINATOR = ("coordinator-svc", "serve")
AGENT = ("worker-agent", "run")
SAMPLE_WORKER = ("python", "-m", "examples.sample_worker")
AUDIT_EXPORT = ("coordinator-audit-export",)
MIGRATE = ("coordinator-svc", "migrate")


def test_the_overlays_are_dev_and_prod_at_least() -> None:
    assert {"dev", "prod"} <= set(OVERLAYS), OVERLAYS


def test_the_readme_names_the_kubernetes_versions_validated_here() -> None:
    readme = (K8S / "README.md").read_text()
    assert "Kubernetes 1.29 or newer" in readme  # native sidecars
    for version in K8S_VERSIONS:
        if version:
            assert version.removesuffix(".0") in readme, version


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "latest")
@pytest.mark.parametrize("overlay", ALL)
def test_every_object_validates_offline_against_the_kubernetes_schemas(
    rendered: dict[str, Rendered], overlay: str, version: str | None, tmp_path: Path
) -> None:
    _validate_offline(rendered[overlay], version, tmp_path)


def _validate_offline(r: Rendered, version: str | None, tmp_path: Path) -> None:
    # Custom resources have no schema here: test_tls_manifests.py checks cert-manager's,
    # test_monitoring.py the Prometheus Operator's. Everything else must have one.
    checked = [o for o in r.objects if not is_custom_resource(o)]
    path = tmp_path / f"{r.name}.yaml"
    path.write_text(yaml.safe_dump_all(checked, sort_keys=False))
    tool = BIN / "kubernetes-validate"
    assert tool.exists(), f"{tool} missing: `pip install -e '.[dev]'` installs kubernetes-validate"
    cmd = [str(tool), "--strict", *(["-k", version] if version else []), str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    passed = re.findall(r"passed for resource (\S+)", output)
    # Every object was checked against a schema (none skipped as unknown).
    assert len(passed) == len(checked), output
    assert len(checked) >= 12


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_coordinator_runs_two_or_more_replicas_each_advertising_its_own_pod_ip(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    [(template, container)] = r.pods_running(*COORDINATOR)
    owner = template.owner
    assert owner["kind"] == "Deployment"
    assert owner["spec"]["replicas"] >= 2
    ns = template.namespace
    env = _env_without_secrets(r, container, ns)
    grpc_port = container_ports(container)["grpc"]
    # The Downward API: each pod names itself, so NOT_COORDINATOR points at the owning pod.
    assert env["COORDINATOR_ADVERTISED_ADDRESS"] == f"10.1.2.3:{grpc_port}"
    assert env["COORDINATOR_PORT"] == str(grpc_port)
    assert env["COORDINATOR_NODE_ID"] == "coordinator-abc"
    downward = {e["name"]: e.get("valueFrom", {}).get("fieldRef") for e in container["env"]}
    assert downward["POD_IP"] == {"fieldPath": "status.podIP"}
    assert downward["POD_NAME"] == {"fieldPath": "metadata.name"}
    # A takeover must be quicker than the agents' self-fencing (session timeout minus the larger
    # of the heartbeat interval and a fifth of it), so workers carry on through it.
    session, heartbeat = int(env["SESSION_TIMEOUT_MS"]), int(env["HEARTBEAT_INTERVAL_MS"])
    fence_after = session - max(heartbeat, session // 5)
    assert int(env["LEASE_MS"]) + 2 * heartbeat <= fence_after, env
    # Two Services: the one clients dial, and a headless one for reaching a named pod.
    service = r.get("Service", "coordinator", ns)
    headless = r.get("Service", "coordinator-headless", ns)
    assert service["spec"].get("clusterIP") != "None"
    assert headless["spec"]["clusterIP"] == "None"
    assert template.spec["subdomain"] == "coordinator-headless"
    assert labels_match(headless["spec"]["selector"], template.labels)


def _env_without_secrets(r: Rendered, container: Obj, ns: str) -> dict[str, str]:
    """The environment when the overlay leaves the Secret to the operator: the example's."""
    example = load_example_secret()
    secrets = {example["metadata"]["name"]: secret_data(example), **r.secrets(ns)}
    return container_env(
        container, PodFacts("coordinator-abc", ns, "10.1.2.3"), r.configmaps(ns), secrets
    )


def _probes(container: Obj) -> list[tuple[str, Obj]]:
    return [
        (kind, container[kind])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if kind in container
    ]


@pytest.mark.parametrize("overlay", ALL)
def test_probes_point_at_ports_their_containers_expose(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    checked = 0
    for template in rendered[overlay].pod_templates():
        for container in template.containers:
            ports = container_ports(container)
            for kind, probe in _probes(container):
                where = f"{template.owner_ref} {container['name']} {kind}"
                if "grpc" in probe:
                    port = probe["grpc"]["port"]
                    assert isinstance(port, int) and port in ports, where
                elif "httpGet" in probe or "tcpSocket" in probe:
                    port = (probe.get("httpGet") or probe["tcpSocket"])["port"]
                    assert port in ports, f"{where}: port {port!r} not in {sorted(map(str, ports))}"
                else:
                    assert "exec" in probe, where
                checked += 1
    assert checked >= 3


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_coordinator_probes_are_native_grpc_health_checks_of_services_it_serves(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """Native gRPC probes without TLS; with TLS, which the kubelet's gRPC probe cannot speak,
    exec probes (checked in detail in test_tls_manifests.py)."""
    r = rendered[overlay]
    [(template, container)] = r.pods_running(*COORDINATOR)
    probes = dict(_probes(container))
    assert {"readinessProbe", "livenessProbe"} <= set(probes)
    if "COORDINATOR_TLS_CERT" in _env_without_secrets(r, container, template.namespace):
        # The kubelet's gRPC probe would fail the TLS handshake: exec probes (their details
        # are checked in test_tls_manifests.py).
        assert all(set(p) & {"grpc", "exec"} == {"exec"} for p in probes.values()), probes
        return
    for kind, probe in probes.items():
        assert "grpc" in probe, f"{kind} is not a native gRPC probe"
        assert probe["grpc"]["port"] == container_ports(container)["grpc"]
    # Readiness: the database within a lease and the schema at head. Liveness (and start-up):
    # the server answers; never the database, so an outage restarts nothing.
    assert probes["readinessProbe"]["grpc"]["service"] == READINESS_SERVICE
    assert probes["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    assert probes["startupProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    check_coordinator_probe_timing(r, template, container)


def check_coordinator_probe_timing(r: Rendered, template: PodTemplate, container: Obj) -> None:
    """Liveness tolerates a busy Python process (a slow answer is not a dead one); the startup
    probe allows for the wait for the migration Job (WAIT_FOR_SCHEMA) and the Deployment's
    progress deadline too."""
    live, startup = container["livenessProbe"], container["startupProbe"]
    assert live["timeoutSeconds"] >= 5 and live["failureThreshold"] >= 6, live
    assert live["periodSeconds"] * live["failureThreshold"] >= 60, live
    env = _env_without_secrets(r, container, template.namespace)
    wait_s = float(env["WAIT_FOR_SCHEMA"])
    assert startup["periodSeconds"] * startup["failureThreshold"] >= wait_s + 20, (startup, wait_s)
    assert template.owner["spec"]["progressDeadlineSeconds"] > wait_s


@pytest.mark.parametrize("overlay", ALL)
def test_services_select_pods_that_exist_and_target_ports_they_expose(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    services = r.all("Service")
    assert services
    for service in services:
        name, ns = service["metadata"]["name"], service["metadata"].get("namespace", "default")
        selector = service["spec"].get("selector")
        assert selector, f"Service {name} selects nothing"
        selected = [
            t for t in r.pod_templates() if t.namespace == ns and labels_match(selector, t.labels)
        ]
        assert selected, f"Service {name} selects no pod template"
        assert not any(t.owner["kind"] in ("Job", "CronJob") for t in selected), name
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for t in selected:
                exposed = [container_ports(c) for c in t.containers]
                assert any(target in p for p in exposed), (
                    f"Service {name} port {port['port']}: no container of {t.owner_ref} "
                    f"exposes {target!r}"
                )
    for sts in r.all("StatefulSet"):
        governing = r.get("Service", sts["spec"]["serviceName"], sts["metadata"]["namespace"])
        assert governing["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("overlay", ALL)
def test_workload_and_disruption_budget_selectors_match_their_pods(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    templates = r.pod_templates()
    for t in templates:
        if t.owner["kind"] in ("Deployment", "StatefulSet"):
            assert labels_match(t.owner["spec"]["selector"], t.labels), t.owner_ref
        if any(IMAGE in c["image"] for c in t.containers):
            assert t.spec.get("serviceAccountName"), f"{t.owner_ref} runs as the default SA"
        name = t.spec.get("serviceAccountName")
        if name:
            assert r.find("ServiceAccount", name, t.namespace), f"{t.owner_ref}: no SA {name}"
    pdbs = r.all("PodDisruptionBudget")
    for pdb in pdbs:
        ns = pdb["metadata"]["namespace"]
        selected = [
            t
            for t in templates
            if t.namespace == ns and labels_match(pdb["spec"]["selector"], t.labels)
        ]
        assert len(selected) == 1, f"PDB {pdb['metadata']['name']} selects {len(selected)}"
        assert selected[0].owner["kind"] in ("Deployment", "StatefulSet")
        # A pod that is not ready serves nothing: never let it block a drain.
        assert pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow", pdb
    covered = {
        t.owner_ref
        for t in templates
        for pdb in pdbs
        if labels_match(pdb["spec"]["selector"], t.labels)
    }
    for template, _ in r.pods_running(*COORDINATOR) + r.pods_running(*AGENT):
        assert template.owner_ref in covered, f"{template.owner_ref} has no PodDisruptionBudget"


def _agent_coordinators(r: Rendered) -> list[tuple[PodTemplate, list[str]]]:
    out = []
    for template, container in r.pods_running(*AGENT):
        ns = template.namespace
        env = container_env(
            container, PodFacts("connect-worker-0", ns, "10.0.0.9"), r.configmaps(ns), r.secrets(ns)
        )
        value = env.get("WORKER_AGENT_COORDINATOR", "127.0.0.1:9093")
        args = argv(container)
        if "--coordinator" in args:
            value = args[args.index("--coordinator") + 1]
        out.append((template, [a.strip() for a in value.split(",") if a.strip()]))
    return out


def resolve_service(r: Rendered, address: str, client_ns: str) -> tuple[Obj, Obj]:
    """The Service and its port that `host:port` names from a pod in `client_ns` (cluster DNS:
    name, name.ns, name.ns.svc, name.ns.svc.cluster.local)."""
    host, _, port = address.rpartition(":")
    parts = host.split(".")
    name, ns = parts[0], parts[1] if len(parts) > 1 else client_ns
    assert len(parts) <= 2 or parts[2:] in (["svc"], ["svc", "cluster", "local"]), address
    service = r.find("Service", name, ns)
    assert service is not None, f"{address}: no Service {name} in namespace {ns}"
    [service_port] = [p for p in service["spec"]["ports"] if str(p["port"]) == port]
    return service, service_port


@pytest.mark.parametrize("overlay", WITH_WORKERS)
def test_worker_sidecar_coordinator_address_resolves_to_the_coordinator_service(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    agents = _agent_coordinators(r)
    assert agents, f"{overlay} runs no worker-agent"
    [(coordinator, coordinator_container)] = r.pods_running(*COORDINATOR)
    for template, addresses in agents:
        assert addresses
        for address in addresses:
            service, port = resolve_service(r, address, template.namespace)
            assert service["metadata"]["namespace"] == coordinator.namespace
            assert labels_match(service["spec"]["selector"], coordinator.labels), address
            target = port.get("targetPort", port["port"])
            grpc = container_ports(coordinator_container)["grpc"]
            assert container_ports(coordinator_container)[target] == grpc, address
            # ... and the coordinator's NetworkPolicy lets this worker in on that port.
            assert _admitted(r, coordinator, template, grpc), (
                f"{template.owner_ref} may not reach the coordinator on {grpc}"
            )


def _admitted(
    r: Rendered,
    server: PodTemplate,
    client: PodTemplate,
    port: int,
    client_namespace_labels: dict[str, str] | None = None,
) -> bool:
    """Whether the NetworkPolicies that select `server` let `client` pods in on `port`. The
    client's namespace has the labels the overlay gives it (`Rendered.namespace_labels`) plus
    `client_namespace_labels`."""
    ns_labels = {**r.namespace_labels(client.namespace), **(client_namespace_labels or {})}
    server_ports = {k: v for c in server.containers for k, v in container_ports(c).items()}
    policies = [
        p
        for p in r.all("NetworkPolicy")
        if p["metadata"]["namespace"] == server.namespace
        and labels_match(p["spec"]["podSelector"], server.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            ports = [server_ports.get(p["port"]) for p in rule.get("ports") or []]
            if rule.get("ports") and port not in ports:
                continue
            for peer in rule.get("from") or []:
                if "podSelector" not in peer:
                    continue
                same_ns = client.namespace == server.namespace
                ns_ok = (
                    "namespaceSelector" in peer
                    and labels_match(peer["namespaceSelector"], ns_labels)
                ) or ("namespaceSelector" not in peer and same_ns)
                if ns_ok and labels_match(peer["podSelector"], client.labels):
                    return True
    return False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_workers_admin_clients_and_the_scraper_only(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    [(coordinator, container)] = r.pods_running(*COORDINATOR)
    ports = container_ports(container)
    ns = coordinator.namespace

    def pod(labels: dict[str, str], namespace: str = ns) -> PodTemplate:
        return PodTemplate(
            {"kind": "Pod", "metadata": {"name": "x"}}, namespace, {"labels": labels}, {}
        )

    worker = pod({"connect-coordinator/client": "worker"})
    admin = pod({"connect-coordinator/client": "admin"})
    stranger = pod({"app": "something-else"})
    scraper = pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")
    assert _admitted(r, coordinator, worker, ports["grpc"])
    assert _admitted(r, coordinator, admin, ports["grpc"])
    assert not _admitted(r, coordinator, stranger, ports["grpc"])
    assert not _admitted(r, coordinator, worker, ports["metrics"])
    # From another namespace, the pod label is not enough: the namespace must be granted access
    # by its label (README, "Security").
    access = {"connect-coordinator/access": "true"}
    for client in (
        pod({"connect-coordinator/client": "worker"}, "elsewhere"),
        pod({"connect-coordinator/client": "admin"}, "elsewhere"),
    ):
        assert not _admitted(r, coordinator, client, ports["grpc"])
        assert _admitted(r, coordinator, client, ports["grpc"], access)
    assert not _admitted(
        r, coordinator, pod({"app": "something-else"}, "elsewhere"), ports["grpc"], access
    )
    assert _admitted(r, coordinator, scraper, ports["metrics"])
    assert not _admitted(r, coordinator, scraper, ports["grpc"])
    assert not _admitted(
        r, coordinator, pod({"app.kubernetes.io/name": "prometheus"}), ports["metrics"]
    )


@pytest.mark.parametrize("overlay", ALL)
def test_network_policies_admit_pods_of_named_namespaces_only(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """A pod label can be set by anyone who creates a pod, in any namespace: every ingress peer
    that selects pods also selects namespaces by a label (or leaves the namespaceSelector out,
    which means the policy's own namespace). Every pod of the image that listens on a port is
    isolated by a policy, and the worker pods admit no pod of the namespace (only Prometheus, from
    its own namespace, on the agent's metrics port)."""
    r = rendered[overlay]
    policies = r.all("NetworkPolicy")
    assert policies
    for policy in policies:
        name = policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress") or []:
            for peer in rule.get("from") or []:
                assert "ipBlock" not in peer, f"NetworkPolicy {name}: {peer}"
                selector = peer.get("namespaceSelector")
                if selector is not None:
                    assert selector.get("matchLabels") or selector.get("matchExpressions"), (
                        f"NetworkPolicy {name}: {peer} admits pods of every namespace"
                    )
                else:
                    assert "podSelector" in peer, f"NetworkPolicy {name}: {peer}"
    for template in r.pod_templates():
        listens = any(container_ports(c) for c in template.containers)
        ours = any(IMAGE in c["image"] for c in template.containers)
        if not (listens and ours):
            continue
        assert any(
            p["metadata"]["namespace"] == template.namespace
            and labels_match(p["spec"]["podSelector"], template.labels)
            and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
            for p in policies
        ), f"{template.owner_ref} is not isolated by any NetworkPolicy"
    for template, agent in r.pods_running(*AGENT):
        anyone = PodTemplate(
            {"kind": "Pod", "metadata": {"name": "x"}},
            template.namespace,
            {"labels": {"connect-coordinator/client": "admin"}},
            {},
        )
        for port in set(container_ports(agent).values()):
            assert not _admitted(r, template, anyone, port), f"{template.owner_ref}: {port}"


@pytest.mark.parametrize("overlay", ALL)
def test_coordinator_and_agents_speak_tls_or_plaintext_by_explicit_choice(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """The coordinator listens on the pod's addresses (the product's default is the loopback
    without TLS). Without TLS, plaintext is allowed explicitly (the product refuses a
    non-loopback address otherwise); with TLS, it is not. The agents follow the coordinator."""
    r = rendered[overlay]
    [(coordinator, container)] = r.pods_running(*COORDINATOR)
    env = _env_without_secrets(r, container, coordinator.namespace)
    assert env.get("COORDINATOR_HOST") in ("0.0.0.0", "::"), env.get("COORDINATOR_HOST")
    tls = "COORDINATOR_TLS_CERT" in env
    if tls:
        assert "COORDINATOR_ALLOW_PLAINTEXT" not in env
    else:
        assert env.get("COORDINATOR_ALLOW_PLAINTEXT") == "1"
        explicit = [e for e in container["env"] if e["name"] == "COORDINATOR_ALLOW_PLAINTEXT"]
        assert explicit, "set in the Deployment, where its comment says why"
    for template, agent in r.pods_running(*AGENT):
        ns = template.namespace
        agent_env = container_env(
            agent, PodFacts("connect-worker-0", ns, "10.0.0.9"), r.configmaps(ns), r.secrets(ns)
        )
        if tls:
            assert "WORKER_AGENT_TLS_CA" in agent_env, f"{template.owner_ref}: no TLS"
            assert "WORKER_AGENT_ALLOW_PLAINTEXT" not in agent_env
        else:
            assert "WORKER_AGENT_TLS_CA" not in agent_env
            assert agent_env.get("WORKER_AGENT_ALLOW_PLAINTEXT") == "1", template.owner_ref


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_annotations_name_the_metrics_port_the_coordinator_serves(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    [(template, container)] = r.pods_running(*COORDINATOR)
    annotations = template.metadata.get("annotations") or {}
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations.get("prometheus.io/path") == "/metrics"
    port = int(annotations["prometheus.io/port"])
    assert container_ports(container)["metrics"] == port
    env = _env_without_secrets(r, container, template.namespace)
    assert env["METRICS_PORT"] == str(port)


@pytest.mark.parametrize("overlay", WITH_WORKERS)
def test_agents_serve_metrics_on_a_port_of_their_own_that_only_the_scraper_reaches(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """The agent's /metrics listens on the pod's addresses on its own port (not the status
    endpoint's, which serves the assignment and POST /leave); the pod annotations name it; the
    workers' NetworkPolicy lets Prometheus in on that port and on nothing else."""
    r = rendered[overlay]
    [(template, agent)] = r.pods_running(*AGENT)
    ns = template.namespace
    env = container_env(
        agent, PodFacts("connect-worker-0", ns, "10.0.0.7"), r.configmaps(ns), r.secrets(ns)
    )
    ports = container_ports(agent)
    port = ports["agent-metrics"]
    assert env["WORKER_AGENT_METRICS_PORT"] == str(port)
    assert env["WORKER_AGENT_METRICS_HOST"] not in ("127.0.0.1", "localhost", "::1")
    assert port != ports["status"]
    annotations = template.metadata.get("annotations") or {}
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations.get("prometheus.io/path") == "/metrics"
    assert annotations.get("prometheus.io/port") == str(port)

    def pod(labels: dict[str, str], namespace: str = ns) -> PodTemplate:
        return PodTemplate(
            {"kind": "Pod", "metadata": {"name": "x"}}, namespace, {"labels": labels}, {}
        )

    scraper = pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")
    assert _admitted(r, template, scraper, port)
    assert not _admitted(r, template, scraper, ports["status"])
    assert not _admitted(r, template, pod({"app.kubernetes.io/name": "prometheus"}), port)
    assert not _admitted(r, template, pod({"connect-coordinator/client": "worker"}), port)
    assert not _admitted(r, template, pod({"connect-coordinator/client": "admin"}), port)


@pytest.mark.parametrize("overlay", ALL)
def test_secret_and_configmap_keys_used_exist(rendered: dict[str, Rendered], overlay: str) -> None:
    """Secrets the overlay renders must hold the keys used; one it leaves to the operator must be
    the example Secret (deploy/k8s/examples), which holds them; one a cert-manager Certificate
    of the overlay creates holds what cert-manager writes."""
    _check_keys_used_exist(rendered[overlay])


def _check_keys_used_exist(r: Rendered) -> None:
    example = load_example_secret()
    used = 0
    for template in r.pod_templates():
        ns = template.namespace
        secrets = {
            **{name: dict.fromkeys(keys, "x") for name, keys in r.issued_secrets(ns).items()},
            **r.secrets(ns),
        }
        if example["metadata"]["name"] not in secrets:
            secrets[example["metadata"]["name"]] = secret_data(example)
        for container in template.containers:
            # container_env fails on any missing ConfigMap, Secret or key.
            env = container_env(
                container, PodFacts("p-0", ns, "10.0.0.1"), r.configmaps(ns), secrets
            )
            used += len(env)
        for volume in template.spec.get("volumes") or []:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in r.configmaps(ns)
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert r.find("PersistentVolumeClaim", claim, ns), claim
    assert used
    # The database URL reaches the coordinator, the migration and the audit export.
    for command in (COORDINATOR, MIGRATE, AUDIT_EXPORT):
        [(_t, container)] = r.pods_running(*command)
        [ref] = [
            e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "DATABASE_URL"
        ]
        assert ref["key"] in secret_data(example), ref


def test_the_example_secret_is_a_database_url_the_coordinator_accepts() -> None:
    from coordinator_svc.store.migrate import normalize_url

    url = secret_data(load_example_secret())["database-url"]
    assert normalize_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize("overlay", ALL)
def test_every_container_of_the_image_is_non_root_read_only_and_bounded(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    uid = _dockerfile_uid()
    ours = 0
    for template in r.pod_templates():
        pod_sc = template.spec.get("securityContext") or {}
        for container in template.containers:
            resources = container.get("resources") or {}
            where = f"{template.owner_ref} {container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where
            if IMAGE not in container["image"]:
                continue
            ours += 1
            sc = container.get("securityContext") or {}
            assert pod_sc.get("runAsNonRoot") is True, where
            assert pod_sc.get("runAsUser") == uid, where
            assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            # Memory request = limit: never over its request, the last the kubelet evicts.
            assert _bytes(resources["requests"]["memory"]) == _bytes(
                resources["limits"]["memory"]
            ), where
        assert template.spec.get("automountServiceAccountToken") is False, template.owner_ref
    assert ours >= 3


@pytest.mark.parametrize("overlay", ALL)
def test_servers_are_burstable_without_a_cpu_limit_and_scheduled_with_priority_and_spread(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """README, "Scheduling and resources": the coordinator and the agent get no CPU limit (no
    CFS throttling of latency-sensitive servers: Burstable QoS, chosen over Guaranteed), a
    priority class above ordinary pods (the coordinator's above the workers'), and a hard spread
    over nodes (coordinators also over zones in prod)."""
    r = rendered[overlay]
    priority = {o["metadata"]["name"]: o["value"] for o in r.all("PriorityClass")}
    [(coordinator, container)] = r.pods_running(*COORDINATOR)
    servers = [(coordinator, container), *r.pods_running(*AGENT)]
    for template, c in servers:
        where = f"{template.owner_ref} {c['name']}"
        assert "cpu" not in c["resources"].get("limits", {}), f"{where}: a CPU limit throttles"
        assert c["resources"]["requests"]["cpu"], where
        name = template.spec.get("priorityClassName")
        assert name in priority, f"{where}: priority class {name!r} is not rendered"
        assert 0 < priority[name] < 1_000_000_000, (name, priority[name])
        hard = [
            t
            for t in template.spec.get("topologySpreadConstraints") or []
            if t["whenUnsatisfiable"] == "DoNotSchedule"
        ]
        keys = {t["topologyKey"] for t in hard}
        assert "kubernetes.io/hostname" in keys, f"{where}: no hard spread over nodes"
        for t in hard:
            assert t["maxSkew"] == 1 and labels_match(t["labelSelector"], template.labels), t
        if template is coordinator and overlay.startswith("prod"):
            assert "topology.kubernetes.io/zone" in keys, "prod: coordinators over zones"
    for template, _c in r.pods_running(*AGENT):
        assert (
            priority[template.spec["priorityClassName"]]
            < priority[coordinator.spec["priorityClassName"]]
        )
    # The batch pods: a priority class that exists too.
    for template in r.pod_templates():
        name = template.spec.get("priorityClassName")
        assert name is None or name in priority, f"{template.owner_ref}: {name}"


#: Budgeted tries of a revocation through the listener in the grace period (README, "Stopping a
#: worker"), the longest back-off between two (worker_agent.runtime: listener_max_backoff_s),
#: the leave's delivery (runtime.LEAVE_TIMEOUT_S), the worker's and the agent's exit.
HOOK_TRIES = 3
HOOK_BACKOFF_S = 5.0
LEAVE_S = 10.0
EXIT_S = 10.0


@pytest.mark.parametrize("overlay", WITH_WORKERS)
def test_worker_pods_use_static_membership_agent_readiness_and_a_long_enough_grace(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    [(template, agent)] = r.pods_running(*AGENT)
    [(same, worker)] = r.pods_running(*SAMPLE_WORKER)
    assert same.owner_ref == template.owner_ref
    assert template.owner["kind"] == "StatefulSet"
    # The agent is a native sidecar (started before the worker, stopped after it); the worker a
    # main container.
    assert agent in template.sidecars and worker in template.main_containers
    ns = template.namespace
    env = container_env(
        agent, PodFacts("connect-worker-2", ns, "10.0.0.7"), r.configmaps(ns), r.secrets(ns)
    )
    # The pod name, from the Downward API, is the static instance id; the member id is left
    # to the agent, a fresh random one per process (DESIGN 3.2: one id, one process).
    assert "WORKER_AGENT_MEMBER_ID" not in env
    assert env["WORKER_AGENT_INSTANCE_ID"] == "connect-worker-2"
    # The coordinator's connect protocol, said explicitly (../classic-protocol switches it); its
    # session timeout and heartbeat interval come from the coordinator, never from the pod.
    assert env["WORKER_AGENT_GROUP_PROTOCOL"] == "connect"
    assert "WORKER_AGENT_SESSION_TIMEOUT_MS" not in env
    assert "WORKER_AGENT_HEARTBEAT_INTERVAL_MS" not in env
    _agent_accepts(env)
    # Readiness: the agent's /ready, on the port its status endpoint listens on, reachable by
    # the kubelet (not only on the loopback). The worker starts once the endpoint answers.
    probe = agent["readinessProbe"]["httpGet"]
    assert probe["path"] == "/ready"
    status_port = container_ports(agent)[probe["port"]]
    assert env["WORKER_AGENT_STATUS_PORT"] == str(status_port)
    assert env["WORKER_AGENT_STATUS_HOST"] not in ("127.0.0.1", "localhost", "::1")
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["startupProbe"]["httpGet"]["path"] == "/healthz"
    # The worker takes the agent's webhook, on the pod's loopback, where it listens; it polls
    # the agent's status endpoint over the same loopback.
    worker_env = container_env(
        worker, PodFacts("connect-worker-2", ns, "10.0.0.7"), r.configmaps(ns), r.secrets(ns)
    )
    assert worker_env["SAMPLE_WORKER_MODE"] == "webhook"
    listen = worker_env["SAMPLE_WORKER_LISTEN"]
    assert listen.startswith("127.0.0.1:"), listen
    assert env["WORKER_AGENT_WEBHOOK"].startswith(f"http://{listen}/"), env["WORKER_AGENT_WEBHOOK"]
    assert int(listen.rpartition(":")[2]) not in container_ports(agent).values()
    assert worker_env["SAMPLE_WORKER_STATUS_URL"] == f"http://127.0.0.1:{status_port}"
    # Deletion: the worker's preStop hook has the agent revoke and leave, and waits for it; the
    # grace period covers it: the hook's wait is A tries of H seconds, A - 1 back-offs and the
    # leave; then the worker's and the agent's exit.
    hook = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["worker-agent", "leave"], hook
    options = dict(a.removeprefix("--").split("=", 1) for a in hook[2:])
    assert options["status-url"] == f"http://127.0.0.1:{status_port}", options
    hook_timeout = float(env["WORKER_AGENT_HOOK_TIMEOUT_S"])
    wait_s = float(options["timeout-s"])
    assert wait_s >= HOOK_TRIES * hook_timeout + (HOOK_TRIES - 1) * HOOK_BACKOFF_S + LEAVE_S
    grace = template.spec["terminationGracePeriodSeconds"]
    assert grace >= wait_s + EXIT_S, (grace, wait_s)
    # ... and the README's formula gives the same numbers.
    readme = (K8S / "README.md").read_text()
    assert f"--timeout-s={wait_s:g}" in readme and f"= {grace} s" in readme
    # The curl the manifest and the README offer instead sends the header the agent requires
    # of every state-changing request (`worker-agent leave` sends it: test_leave_cross_site).
    sample = (K8S / "components" / "sample-workers" / "statefulset.yaml").read_text()
    for text in (sample, readme):
        curls = [c for c in " ".join(text.split()).split("curl ")[1:] if "/leave" in c[:200]]
        assert curls and all("-H 'X-Worker-Agent: leave'" in c[:200] for c in curls), curls
    # A rolling restart must be back before the coordinator's session timeout expires the
    # departed static member (the coordinator's config, which the agent learns from it).
    [(coordinator, container)] = r.pods_running(*COORDINATOR)
    coordinator_env = _env_without_secrets(r, container, coordinator.namespace)
    assert int(coordinator_env["SESSION_TIMEOUT_MS"]) >= 10_000
    # One worker at a time.
    [pdb] = [
        p
        for p in r.all("PodDisruptionBudget")
        if labels_match(p["spec"]["selector"], template.labels)
    ]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert template.owner["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def _agent_accepts(env: dict[str, str]) -> None:
    """`worker-agent run` in this environment refuses nothing at start (what it checks before
    connecting: the group protocol and what that protocol cannot take)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_AGENT_")}
    given = {k: v for k, v in env.items() if k.startswith("WORKER_AGENT_")}
    with mock.patch.dict(os.environ, {**keep, **given}, clear=True):
        args = agent_cli._parser().parse_args(["run"])
    assert args.group_protocol in agent_cli.GROUP_PROTOCOLS, args.group_protocol
    assert args.protocol in agent_cli.PROTOCOLS, args.protocol
    assert agent_cli.group_protocol_problem(args) is None, agent_cli.group_protocol_problem(args)


# --- Kafka's classic protocol for the sample workers (components/classic-protocol) ---------------

# The component after sample-workers on prod (as deploy/k8s/README.md says), and on top of dev.
PROD_WITH_CLASSIC = "prod+sample-workers+classic-protocol"
DEV_WITH_CLASSIC = "dev+classic-protocol"
WITH_CLASSIC = [PROD_WITH_CLASSIC, DEV_WITH_CLASSIC]
CLASSIC_COMPONENT = K8S / "components" / "classic-protocol"


@pytest.fixture(scope="module")
def classic(
    rendered: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Rendered]:
    """The renderings with the classic-protocol component, written as temporary overlays."""
    [prod_ns] = {o["metadata"]["name"] for o in rendered["prod"].all("Namespace")}
    [dev_ns] = {o["metadata"]["name"] for o in rendered["dev"].all("Namespace")}
    out = {}
    for name, namespace, resources, components in (
        (
            PROD_WITH_CLASSIC,
            prod_ns,
            ["overlays/prod"],
            ["components/sample-workers", "components/classic-protocol"],
        ),
        (DEV_WITH_CLASSIC, dev_ns, ["overlays/dev"], ["components/classic-protocol"]),
    ):
        folder = tmp_path_factory.mktemp(name.replace("+", "-"))
        text, objects = render_combination(folder, namespace, resources, components)
        out[name] = Rendered(name, text, objects, folder)
    return out


@pytest.mark.parametrize("overlay", WITH_CLASSIC)
def test_the_classic_protocol_component_switches_the_agents_and_drops_static_membership(
    classic: dict[str, Rendered], overlay: str, tmp_path: Path
) -> None:
    r = classic[overlay]
    [(template, agent)] = r.pods_running(*AGENT)
    ns = template.namespace
    env = container_env(
        agent, PodFacts("connect-worker-2", ns, "10.0.0.7"), r.configmaps(ns), r.secrets(ns)
    )
    assert env["WORKER_AGENT_GROUP_PROTOCOL"] == "classic"
    assert env["WORKER_AGENT_PROTOCOL"] == "sessioned"  # connect.protocol, unchanged
    # Kafka Connect's defaults, within the coordinator's bounds for a classic session.
    session = int(env["WORKER_AGENT_SESSION_TIMEOUT_MS"])
    heartbeat = int(env["WORKER_AGENT_HEARTBEAT_INTERVAL_MS"])
    assert (session, heartbeat) == (10_000, 3_000)
    [(coordinator, container)] = r.pods_running(*COORDINATOR)
    coordinator_env = _env_without_secrets(r, container, coordinator.namespace)
    low = int(coordinator_env.get("CLASSIC_MIN_SESSION_TIMEOUT_MS", 6_000))
    high = int(coordinator_env.get("CLASSIC_MAX_SESSION_TIMEOUT_MS", 1_800_000))
    assert low <= session <= high, (low, session, high)
    # No static membership (the agent would refuse to start), no member id of the pod's, and
    # no POD_NAME left over from the instance id.
    assert "WORKER_AGENT_INSTANCE_ID" not in env
    assert "WORKER_AGENT_MEMBER_ID" not in env
    assert "POD_NAME" not in env
    _agent_accepts(env)
    # The rest of the pod is the sample workers' (the preStop leave, the probes, plaintext).
    [(_same, worker)] = r.pods_running(*SAMPLE_WORKER)
    assert worker["lifecycle"]["preStop"]["exec"]["command"][:2] == ["worker-agent", "leave"]
    assert agent["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert env["WORKER_AGENT_ALLOW_PLAINTEXT"] == "1"
    _check_every_variable_is_read(r)
    _check_keys_used_exist(r)
    _validate_offline(r, None, tmp_path)


def test_the_classic_protocol_component_is_documented() -> None:
    readme = (K8S / "README.md").read_text()
    assert "## Running Connect's classic protocol" in readme
    assert "components/classic-protocol" in readme
    text = (CLASSIC_COMPONENT / "kustomization.yaml").read_text()
    assert "kind: Component" in text
    sample = (K8S / "components" / "sample-workers" / "statefulset.yaml").read_text()
    assert "../classic-protocol" in sample and "rebalances as Connect does" in " ".join(
        sample.replace("#", " ").split()
    )


@cache
def _help(*command: str) -> str:
    """`command --help`, run from this environment's bin directory (the image's /opt/venv/bin)."""
    exe = sys.executable if command[0] == "python" else str(BIN / command[0])
    done = subprocess.run(
        [exe, *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        # The code of this checkout first (the environment may be an editable install of
        # another one).
        env={
            "PATH": str(BIN),
            "COLUMNS": "100",
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}",
        },
    )
    assert done.returncode == 0, f"{command} --help failed: {done.stderr}"
    return done.stdout


def _options(help_text: str) -> set[str]:
    out: set[str] = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            out.update(t.rstrip(",") for t in stripped.split() if t.startswith("--"))
    return out


# Read by something other than the program (the image, the JVM, Spark's launcher).
NOT_FOR_THE_PROGRAM = {"HOME", "SPARK_LOCAL_IP", "SPARK_LOCAL_DIRS"}


@pytest.mark.parametrize("overlay", ALL)
def test_every_variable_and_flag_given_to_a_program_is_one_it_reads(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """A misspelt variable would be ignored silently: each one must appear in `--help`."""
    _check_every_variable_is_read(rendered[overlay])


def _check_every_variable_is_read(r: Rendered) -> None:
    others = {"WORKER_AGENT_": "SAMPLE_WORKER_", "SAMPLE_WORKER_": "WORKER_AGENT_"}
    for command in (COORDINATOR, MIGRATE, AGENT, SAMPLE_WORKER, AUDIT_EXPORT):
        for template, container in r.pods_running(*command):
            help_text = _help(*_entry_point(command))
            ns = template.namespace
            secrets = {**r.secrets(ns), "coordinator-database": {"database-url": "x"}}
            env = container_env(
                container, PodFacts("p-0", ns, "10.0.0.1"), r.configmaps(ns), secrets
            )
            helpers = {
                name
                for name in env
                for e in container.get("env") or []
                if f"$({name})" in str(e.get("value", ""))
            }
            for name in set(env) - helpers - NOT_FOR_THE_PROGRAM:
                if any(name.startswith(o) for p, o in others.items() if p in help_text):
                    continue  # the sidecar's ConfigMap also carries the worker's settings
                assert re.search(rf"\b{name}\b", help_text), (
                    f"{template.owner_ref} {container['name']}: {name} is not read by "
                    f"{' '.join(command)}"
                )
            for flag in [a for a in argv(container)[len(command) :] if a.startswith("--")]:
                assert flag.split("=")[0] in _options(help_text), (
                    f"{template.owner_ref}: {flag} is not an option of {' '.join(command)}"
                )
    # The lifecycle hooks' commands too.
    for template in r.pod_templates():
        for container in template.containers:
            for hook in (container.get("lifecycle") or {}).values():
                command = [str(a) for a in hook.get("exec", {}).get("command", [])]
                if not command:
                    continue
                assert command[:2] == ["worker-agent", "leave"], command
                options = _options(_help(*command[:2]))
                for flag in [a for a in command[2:] if a.startswith("--")]:
                    assert flag.split("=")[0] in options, f"{template.owner_ref}: {command}"


def _entry_point(command: tuple[str, ...]) -> tuple[str, ...]:
    """How to run `command` here: console scripts from this environment, and for the audit
    export its declared entry point, or its module while pyproject does not declare it yet."""
    if command != AUDIT_EXPORT:
        return command
    if (BIN / command[0]).exists():
        return command
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    target = scripts.get(command[0], "audit_export.cli:main")
    module, _, func = target.partition(":")
    assert func == "main", target
    return ("python", "-m", module)


def test_the_audit_export_command_is_a_declared_entry_point_or_its_module_is() -> None:
    """The CronJob runs `coordinator-audit-export`. The image gets it from pyproject's
    [project.scripts]; until that is declared, its module must at least be the command."""
    help_text = _help(*_entry_point(AUDIT_EXPORT))
    assert help_text.startswith("usage: coordinator-audit-export"), help_text[:200]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_audit_cronjob_runs_the_export_locally_into_its_volume(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    r = rendered[overlay]
    [(template, container)] = r.pods_running(*AUDIT_EXPORT)
    cron = template.owner
    assert cron["kind"] == "CronJob"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    args = argv(container)
    output = args[args.index("--output") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in template.spec["volumes"]}
    assert output in mounts, f"--output {output} is not a mounted volume"
    claim = volumes[mounts[output]]["persistentVolumeClaim"]["claimName"]
    r.get("PersistentVolumeClaim", claim, template.namespace)
    env = _env_without_secrets(r, container, template.namespace)
    assert env["AUDIT_EXPORT_MASTER"].startswith("local[")  # Spark in local mode, in the pod
    # Spark needs a writable scratch directory on a read-only root filesystem: its local dirs
    # are an emptyDir, bounded, and the pod asks the scheduler for that much disk.
    scratch = env["SPARK_LOCAL_DIRS"]
    assert scratch in mounts and "emptyDir" in volumes[mounts[scratch]]
    size = _bytes(volumes[mounts[scratch]]["emptyDir"]["sizeLimit"])
    resources = container["resources"]
    assert _bytes(resources["requests"]["ephemeral-storage"]) >= size, resources
    assert _bytes(resources["limits"]["ephemeral-storage"]) >= size, resources
    limit = resources["limits"]["memory"]
    assert _bytes(limit) > _bytes(env["AUDIT_EXPORT_DRIVER_MEMORY"]) * 1.3, (limit, env)
    # A violation (exit 3, --fail-on-violations) is a finding: the Job fails at once, no retry.
    job = cron["spec"]["jobTemplate"]["spec"]
    assert "--fail-on-violations" in args
    assert template.spec["restartPolicy"] == "Never"  # what podFailurePolicy requires
    [rule] = [
        rule
        for rule in job["podFailurePolicy"]["rules"]
        if rule["action"] == "FailJob" and "onExitCodes" in rule
    ]
    codes = rule["onExitCodes"]
    assert codes["containerName"] == container["name"]
    assert codes["operator"] == "In" and codes["values"] == [EXIT_VIOLATIONS], codes
    assert job["backoffLimit"] >= 1  # other failures are retried


def _bytes(quantity: str) -> float:
    units = {"k": 1e3, "m": 2**20, "g": 2**30, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    quantity = str(quantity)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity)
    assert m, quantity
    return float(m.group(1)) * units.get(m.group(2), 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_coordinators_wait_for_the_migration_job_which_can_run_again_on_the_next_upgrade(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """One `kubectl apply -k` orders the migration by itself: the coordinators never migrate,
    they wait for the schema the Job brings; the Job, with a fixed name (kubectl apply cannot
    generate one), removes itself soon after it finished, so the next apply creates and runs
    it again (README, "Install and upgrade")."""
    r = rendered[overlay]
    [(template, container)] = r.pods_running(*MIGRATE)
    job = template.owner
    assert job["kind"] == "Job"
    assert template.spec["restartPolicy"] in ("Never", "OnFailure")
    assert argv(container) == list(MIGRATE)
    [(coordinator_t, coordinator)] = r.pods_running(*COORDINATOR)
    assert container["image"] == coordinator["image"]
    env = _env_without_secrets(r, coordinator, coordinator_t.namespace)
    wait_s = float(env["WAIT_FOR_SCHEMA"])
    # Waits at least as long as the Job may run, and its probes allow for that.
    assert wait_s >= job["spec"]["activeDeadlineSeconds"], (wait_s, job["spec"])
    check_coordinator_probe_timing(r, coordinator_t, coordinator)
    assert "generateName" not in job["metadata"]
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 600, job["spec"]
    # README: `kubectl apply -l app.kubernetes.io/component=migrate` applies the Job alone
    # (optional now); what it needs (its ServiceAccount) must carry the same label.
    selected = {
        (o["kind"], o["metadata"]["name"])
        for o in r.objects
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "migrate"
    }
    assert selected == {
        ("Job", job["metadata"]["name"]),
        ("ServiceAccount", template.spec["serviceAccountName"]),
    }, selected


def _pinned() -> dict[str, Obj]:
    """The images components/pinned-images pins: name -> its images: entry."""
    component = yaml.safe_load(PINNED_IMAGES.read_text())
    return {i["name"]: i for i in component.get("images") or []}


def test_overlays_set_image_replicas_config_and_resources_without_editing_the_base(
    rendered: dict[str, Rendered],
) -> None:
    dev, prod = rendered["dev"], rendered["prod"]
    [(dev_t, dev_c)] = dev.pods_running(*COORDINATOR)
    [(prod_t, prod_c)] = prod.pods_running(*COORDINATOR)
    assert dev_c["image"] != prod_c["image"]
    assert prod_t.owner["spec"]["replicas"] == 3
    assert dev_c["resources"] != prod_c["resources"]
    dev_env = dev.configmaps(dev_t.namespace)
    prod_env = prod.configmaps(prod_t.namespace)
    [dev_cfg] = [v for k, v in dev_env.items() if k.startswith("coordinator-config-")]
    [prod_cfg] = [v for k, v in prod_env.items() if k.startswith("coordinator-config-")]
    assert dev_cfg["SESSION_TIMEOUT_MS"] != prod_cfg["SESSION_TIMEOUT_MS"]
    assert prod_cfg.get("NO_MIGRATE") == "1" and "NO_MIGRATE" not in dev_cfg
    assert dev_t.namespace != prod_t.namespace


@pytest.mark.parametrize("overlay", ALL)
def test_every_container_runs_the_image_of_its_part(
    rendered: dict[str, Rendered], overlay: str
) -> None:
    """One image per part (the Dockerfile's targets): the coordinator's for the server and the
    migration, the agent's for the sidecar and the sample worker, the audit image for the
    export; each named once per overlay (one tag or digest)."""
    r = rendered[overlay]
    parts = {
        "connect-group-coordinator": [COORDINATOR, MIGRATE],
        "connect-group-coordinator-agent": [AGENT, SAMPLE_WORKER],
        "connect-group-coordinator-audit": [AUDIT_EXPORT],
    }
    for name, commands in parts.items():
        images = {c["image"] for command in commands for _t, c in r.pods_running(*command)}
        if not images and name.endswith("-agent"):
            continue  # no workers in this rendering
        assert len(images) == 1, (name, images)
        [image] = images
        repository = re.split(r"[@]|:(?=[^/]*$)", image)[0]
        assert repository.rsplit("/", 1)[-1] == name, (name, image)


def test_prod_runs_the_images_pinned_by_digest_or_else_the_registrys_tag(
    rendered: dict[str, Rendered],
) -> None:
    """prod includes components/pinned-images: an image it pins is run by digest (newName@
    digest, whatever tag the overlay names); the others by the overlay's registry and tag."""
    kustomization = yaml.safe_load((K8S / "overlays" / "prod" / "kustomization.yaml").read_text())
    assert "../../components/pinned-images" in kustomization["components"]
    pinned = _pinned()
    tags = {i["name"]: i for i in kustomization["images"]}
    seen = {
        c["image"]
        for t in rendered["prod"].pod_templates()
        for c in t.containers
        if IMAGE in c["image"]
    }
    assert len(seen) == 2  # the coordinator's and the audit export's (no workers in prod)
    for name in IMAGES:
        assert name in tags, f"prod retargets no image {name}"
        if name.endswith("-agent"):
            continue  # the agent runs in workers' pods, not in prod's
        if name in pinned:
            want = f"{pinned[name]['newName']}@{pinned[name]['digest']}"
        else:
            want = f"{tags[name]['newName']}:{tags[name]['newTag']}"
        assert want in seen, (name, want, seen)
        assert "/" in want


def test_a_pinned_digest_wins_over_prods_tag(tmp_path: Path) -> None:
    """What `scripts/build-images --pin` writes into components/pinned-images (a copy of the
    tree here) makes prod run the pushed digests: the component's images: run before the
    overlay's own."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    pins = {
        name: (f"registry.example.net/pinned/{name}", "sha256:" + f"{i:x}" * 64)
        for i, name in enumerate(IMAGES, start=10)
    }
    component = yaml.safe_load(PINNED_IMAGES.read_text())
    component["images"] = [
        {"name": name, "newName": new, "digest": digest} for name, (new, digest) in pins.items()
    ]
    (tree / "components" / "pinned-images" / "kustomization.yaml").write_text(
        yaml.safe_dump(component)
    )
    _text, objects = render(tree / "overlays" / "prod")
    r = Rendered("prod-pinned", _text, objects)
    images = {c["image"] for t in r.pod_templates() for c in t.containers}
    for name in ("connect-group-coordinator", "connect-group-coordinator-audit"):
        new, digest = pins[name]
        assert f"{new}@{digest}" in images, images
    assert not [i for i in images if i.endswith(":0.1.0")], images


# --- the Dockerfile ---------------------------------------------------------------------------


def _dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def _dockerfile_uid() -> int:
    users = re.findall(r"^USER\s+(\S+)", _dockerfile(), flags=re.M)
    assert users, "the Dockerfile sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), f"USER {uid}: use a numeric uid so that runAsNonRoot can check it"
    return int(uid)


def _stage(text: str, name: str) -> str:
    """The text of the Dockerfile stage `name` (from its FROM line to the next FROM)."""
    m = re.search(rf"^FROM\s+\S+\s+AS\s+{re.escape(name)}\s*$", text, flags=re.M | re.I)
    assert m, f"the Dockerfile has no stage {name!r}"
    rest = text[m.end() :]
    end = re.search(r"^FROM\s", rest, flags=re.M)
    return rest[: end.start()] if end else rest


def test_dockerfile_has_a_slim_non_root_target_per_image_the_manifests_run() -> None:
    text = _dockerfile()
    base = re.search(r"^ARG BASE=(\S+)", text, flags=re.M)
    assert base and "slim" in base.group(1)
    for target in IMAGES.values():
        stage = _stage(text, target)
        users = re.findall(r"^USER\s+(\S+)", stage, flags=re.M)
        assert users and users[-1].split(":")[0] == str(_dockerfile_uid()), (target, users)
    # Java and the JDBC drivers in the audit image only; the export looks for the jars where
    # those packages put them.
    audit = _stage(text, "audit")
    for package in ("libpostgresql-jdbc-java", "libxerial-sqlite-jdbc-java", "openjdk-17-jre"):
        assert package in audit, package
        assert package not in _stage(text, "coordinator") + _stage(text, "agent"), package
    source = (REPO / "audit_export" / "source.py").read_text()
    assert (
        "/usr/share/java/postgresql.jar" in source and "/usr/share/java/sqlite-jdbc.jar" in source
    )
    # Every command the manifests run is checked at build time, in the image that runs it.
    for command, stage in (
        ("coordinator-svc serve", "venv-coordinator"),
        ("coordinator-svc migrate", "venv-coordinator"),
        ("worker-agent run", "venv-agent"),
        ("examples.sample_worker", "venv-agent"),
        ("coordinator-audit-export", "venv-audit"),
    ):
        assert command in _stage(text, stage), (command, stage)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_dockerfile_copies_every_package_the_wheel_is_built_from() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {p.split("/")[0] for p in wheel["packages"]}
    needed |= {p.split("/")[0] for p in wheel.get("force-include", {})}
    copied = set(re.findall(r"^COPY\s+(?!--)(\S+)", _dockerfile(), flags=re.M))
    assert needed <= copied, needed - copied
    assert project["project"]["readme"] in " ".join(
        re.findall(r"^COPY .*", _dockerfile(), flags=re.M)
    )
