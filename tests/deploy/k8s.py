"""Reading the Kubernetes manifests the way the cluster would, for the deployment tests.

- `render(path)`: `kubectl kustomize` of a kustomization, parsed.
- `Rendered`: one overlay's objects, indexed, with its ConfigMaps and Secrets decoded.
- `pod_templates()`: every pod template (Deployment, StatefulSet, Job, CronJob, ...).
- `container_env()`: a container's environment as the kubelet builds it: `envFrom` first, then
  `env` in order, values from ConfigMaps, Secrets and the Downward API, `$(VAR)` expanded against
  what is defined so far (`$$` escapes), unknown references left as they are.
- cert-manager: `is_cert_manager()` tells its objects (no schema for them offline), and
  `Rendered.issued_secrets()` the Secrets its Certificates will create.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS_DIR = K8S / "overlays"
EXAMPLE_SECRET = K8S / "examples" / "coordinator-database-secret.yaml"

Obj = dict[str, Any]


def overlay_names() -> list[str]:
    """Every overlay: each folder of deploy/k8s/overlays with a kustomization.yaml."""
    return sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").is_file())


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not installed, and the deployment tests render the manifests with "
            "`kubectl kustomize`: install kubectl (it is on these machines at /usr/bin/kubectl)",
            pytrace=False,
        )
    return path


def render(path: Path) -> tuple[str, list[Obj]]:
    """`kubectl kustomize PATH`: the YAML text and its objects."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} failed:\n{done.stderr}", pytrace=False)
    objects = [o for o in yaml.safe_load_all(done.stdout) if o is not None]
    return done.stdout, objects


# What cert-manager writes into a Certificate's Secret (with a CA or self-signed issuer).
ISSUED_SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt")
CERT_MANAGER_API = "cert-manager.io/v1"


def is_cert_manager(obj: Obj) -> bool:
    """An object of cert-manager's API group (Issuer, ClusterIssuer, Certificate, ...)."""
    return str(obj.get("apiVersion", "")).split("/")[0] in (
        "cert-manager.io",
        "acme.cert-manager.io",
    )


PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1"


def is_prometheus_operator(obj: Obj) -> bool:
    """An object of the Prometheus Operator's API group (ServiceMonitor, PrometheusRule, ...)."""
    return str(obj.get("apiVersion", "")).split("/")[0] == "monitoring.coreos.com"


def is_custom_resource(obj: Obj) -> bool:
    """An object of a custom resource the manifests use (no schema of Kubernetes' own)."""
    return is_cert_manager(obj) or is_prometheus_operator(obj)


def namespace_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "default")


def secret_data(secret: Obj) -> dict[str, str]:
    """A Secret's keys and values (`data` decoded, `stringData` as is)."""
    out = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    out.update(secret.get("stringData") or {})
    return out


def load_example_secret() -> Obj:
    docs = [d for d in yaml.safe_load_all(EXAMPLE_SECRET.read_text()) if d is not None]
    assert len(docs) == 1 and docs[0]["kind"] == "Secret", EXAMPLE_SECRET
    return docs[0]


@dataclass
class PodTemplate:
    """A pod template and the object that owns it."""

    owner: Obj
    namespace: str
    metadata: Obj
    spec: Obj

    @property
    def owner_ref(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}"

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.metadata.get("labels") or {})

    @property
    def containers(self) -> list[Obj]:
        """Every container of the pod: its init containers (native sidecars among them:
        `restartPolicy: Always`) first, then its main containers."""
        return list(self.spec.get("initContainers") or []) + self.main_containers

    @property
    def main_containers(self) -> list[Obj]:
        return list(self.spec.get("containers") or [])

    @property
    def sidecars(self) -> list[Obj]:
        """Native sidecars (Kubernetes 1.29+): init containers with `restartPolicy: Always`,
        started before the main containers and stopped after them."""
        return [c for c in self.spec.get("initContainers") or [] if is_sidecar(c)]

    def container(self, name: str) -> Obj:
        for c in self.containers:
            if c["name"] == name:
                return c
        raise AssertionError(f"{self.owner_ref} has no container {name!r}")


@dataclass
class Rendered:
    """One rendered overlay."""

    name: str
    text: str
    objects: list[Obj]
    path: Path | None = None
    _by_key: dict[tuple[str, str, str], Obj] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for obj in self.objects:
            key = (obj["kind"], namespace_of(obj), obj["metadata"]["name"])
            assert key not in self._by_key, f"{self.name}: {key} rendered twice"
            self._by_key[key] = obj

    def all(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def find(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        if namespace is not None:
            return self._by_key.get((kind, namespace, name))
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) <= 1, f"{self.name}: several {kind}/{name}; name the namespace"
        return found[0] if found else None

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        obj = self.find(kind, name, namespace)
        assert obj is not None, f"overlay {self.name}: no {kind}/{name} rendered"
        return obj

    def configmaps(self, namespace: str) -> dict[str, dict[str, str]]:
        return {
            o["metadata"]["name"]: {k: str(v) for k, v in (o.get("data") or {}).items()}
            for o in self.all("ConfigMap")
            if namespace_of(o) == namespace
        }

    def secrets(self, namespace: str) -> dict[str, dict[str, str]]:
        return {
            o["metadata"]["name"]: secret_data(o)
            for o in self.all("Secret")
            if namespace_of(o) == namespace
        }

    def issued_secrets(self, namespace: str) -> dict[str, tuple[str, ...]]:
        """The Secrets the rendered cert-manager Certificates in `namespace` will create, with
        their keys: present once cert-manager has issued them, never in the rendered YAML."""
        return {
            o["spec"]["secretName"]: ISSUED_SECRET_KEYS
            for o in self.all("Certificate")
            if is_cert_manager(o) and namespace_of(o) == namespace
        }

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The labels of `namespace` as the API server has them: those the overlay renders on the
        Namespace, plus kubernetes.io/metadata.name, which it sets on every namespace."""
        ns = self.find("Namespace", namespace)
        labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        labels["kubernetes.io/metadata.name"] = namespace
        return labels

    def pod_templates(self) -> list[PodTemplate]:
        return list(_pod_templates(self.objects))

    def pod_template(self, kind: str, name: str) -> PodTemplate:
        for t in self.pod_templates():
            if t.owner["kind"] == kind and t.owner["metadata"]["name"] == name:
                return t
        raise AssertionError(f"overlay {self.name}: no pod template of {kind}/{name}")

    def pods_running(self, *command: str) -> list[tuple[PodTemplate, Obj]]:
        """(template, container) for every container whose command starts with `command`."""
        return [
            (t, c)
            for t in self.pod_templates()
            for c in t.containers
            if tuple(argv(c)[: len(command)]) == command
        ]


def is_sidecar(container: Obj) -> bool:
    """A native sidecar: an init container that restarts (`restartPolicy: Always`)."""
    return container.get("restartPolicy") == "Always"


def _pod_templates(objects: list[Obj]) -> Iterator[PodTemplate]:
    for obj in objects:
        kind = obj["kind"]
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            template = obj["spec"]["template"]
        elif kind == "CronJob":
            template = obj["spec"]["jobTemplate"]["spec"]["template"]
        elif kind == "Pod":
            template = obj
        else:
            continue
        yield PodTemplate(obj, namespace_of(obj), template.get("metadata") or {}, template["spec"])


def argv(container: Obj) -> list[str]:
    """The container's command line (the image sets no ENTRYPOINT, so `command` is required)."""
    return [str(a) for a in (container.get("command") or [])] + [
        str(a) for a in (container.get("args") or [])
    ]


def container_ports(container: Obj) -> dict[str | int, int]:
    """Port name or number -> container port number."""
    out: dict[str | int, int] = {}
    for p in container.get("ports") or []:
        out[int(p["containerPort"])] = int(p["containerPort"])
        if "name" in p:
            out[str(p["name"])] = int(p["containerPort"])
    return out


def labels_match(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) or a plain map against labels."""
    if "matchLabels" in selector or "matchExpressions" in selector:
        match_labels = selector.get("matchLabels") or {}
        expressions = selector.get("matchExpressions") or []
    else:
        match_labels, expressions = selector, []
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in expressions:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# --- the kubelet's view of a container's environment -----------------------------------------

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are substituted, `$$` is a literal `$`,
    anything else stays as written."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REFERENCE.sub(one, value)


@dataclass(frozen=True)
class PodFacts:
    """What the Downward API tells a pod about itself."""

    name: str
    namespace: str
    ip: str


def container_env(
    container: Obj,
    pod: PodFacts,
    configmaps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The environment the kubelet gives `container` (a missing ConfigMap, Secret or key is an
    AssertionError: the pod would not start)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            assert name in configmaps, f"{container['name']}: no ConfigMap {name!r}"
            data = configmaps[name]
        else:
            name = source["secretRef"]["name"]
            assert name in secrets, f"{container['name']}: no Secret {name!r}"
            data = secrets[name]
        for key, value in data.items():
            env[prefix + key] = value
    fields = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "status.podIP": pod.ip,
        "status.podIPs": pod.ip,
    }
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        ref = item.get("valueFrom") or {}
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            assert path in fields, f"{container['name']}: fieldRef {path} not emulated"
            env[name] = fields[path]
        elif "configMapKeyRef" in ref or "secretKeyRef" in ref:
            is_cm = "configMapKeyRef" in ref
            r = ref["configMapKeyRef" if is_cm else "secretKeyRef"]
            store = configmaps if is_cm else secrets
            what = "ConfigMap" if is_cm else "Secret"
            assert r["name"] in store, f"{container['name']}: no {what} {r['name']!r}"
            assert r["key"] in store[r["name"]], (
                f"{container['name']}: {what} {r['name']!r} has no key {r['key']!r}"
            )
            env[name] = store[r["name"]][r["key"]]
        else:
            raise AssertionError(f"{container['name']}: env {name}: {ref} not emulated")
    return env
