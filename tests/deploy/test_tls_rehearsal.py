"""The TLS component's settings with real processes (the dev-tls overlay, without Kubernetes and
without cert-manager).

What cert-manager would write is made by a test CA from the rendered objects: the CA from the
isCA Certificate, and for every other Certificate a certificate with its common name (the whole
subject), DNS names and usages, in a folder per Secret holding tls.crt, tls.key and ca.crt. Each
process gets its container's environment as the kubelet builds it, with the mount paths of its
Secret and ConfigMap volumes mapped to local folders; only addresses, ports and the database (an
SQLite file) are local.

Then: the coordinator's exec probes, run as the kubelet runs them, pass; an admin with the admin
example pod's environment creates a connector; an agent with the StatefulSet's environment joins
through 127.0.0.1, an address in no certificate (as a pod IP is), and gets the work (it is
ready); `describe` shows it. Authorization is on, with the principals README gives the admin and
the workers as the only super users: a principal other than README's would be refused, and the
connector never created or the agent never ready.
"""

from __future__ import annotations

import copy
import datetime
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.deploy.k8s import (
    Obj,
    PodFacts,
    PodTemplate,
    Rendered,
    container_env,
    container_ports,
    is_cert_manager,
)
from tests.deploy.local import (
    LocalContainer,
    LocalPod,
    image_env,
    local_argv,
    run_probe,
    wait_for,
)
from tests.deploy.test_manifests import AGENT, COORDINATOR
from tests.deploy.test_tls_manifests import ADMIN_POD, DEV_TLS
from tests.support.coordinator import free_port

EKU = {
    "server auth": ExtendedKeyUsageOID.SERVER_AUTH,
    "client auth": ExtendedKeyUsageOID.CLIENT_AUTH,
}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue_secrets(r: Rendered, folder: Path) -> dict[str, Path]:
    """What cert-manager writes for the rendered Certificates: Secret name -> folder."""
    certificates = [c for c in r.all("Certificate") if is_cert_manager(c)]
    [ca_spec] = [c["spec"] for c in certificates if c["spec"].get("isCA")]
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_spec["commonName"])])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    out = {}
    for cert in certificates:
        spec = cert["spec"]
        secret = folder / spec["secretName"]
        secret.mkdir(parents=True)
        if spec.get("isCA"):
            key, pem = ca_key, ca_pem
        else:
            key = ec.generate_private_key(ec.SECP256R1())
            builder = (
                x509.CertificateBuilder()
                .subject_name(
                    x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec["commonName"])])
                )
                .issuer_name(ca_name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(_now() - datetime.timedelta(minutes=5))
                .not_valid_after(_now() + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(
                    x509.ExtendedKeyUsage([EKU[u] for u in spec["usages"] if u in EKU]),
                    critical=False,
                )
            )
            if spec.get("dnsNames"):
                builder = builder.add_extension(
                    x509.SubjectAlternativeName([x509.DNSName(d) for d in spec["dnsNames"]]),
                    critical=False,
                )
            pem = builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        (secret / "tls.crt").write_bytes(pem)
        (secret / "tls.key").write_bytes(_pem_key(key))
        (secret / "ca.crt").write_bytes(ca_pem)
        out[spec["secretName"]] = secret
    return out


class Mounts:
    """A container's volume mounts as local folders: Secrets from `secrets`, ConfigMaps written
    out from the rendered data, anything else an empty folder."""

    def __init__(
        self,
        template: PodTemplate,
        container: Obj,
        secrets: dict[str, Path],
        configmaps: dict[str, dict[str, str]],
        folder: Path,
    ) -> None:
        volumes = {v["name"]: v for v in template.spec.get("volumes") or []}
        self.paths: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "secret" in volume:
                local = secrets[volume["secret"]["secretName"]]
            else:
                local = folder / f"{container['name']}-{mount['name']}"
                local.mkdir(parents=True, exist_ok=True)
                if "configMap" in volume:
                    for key, value in configmaps[volume["configMap"]["name"]].items():
                        (local / key).write_text(value)
            self.paths[mount["mountPath"].rstrip("/")] = local

    def local(self, value: str) -> str:
        for path, local in self.paths.items():
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path) :]
        return value

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {k: self.local(v) for k, v in env.items()}


class TlsRehearsal:
    def __init__(self, r: Rendered, tmp: Path, stack: ExitStack) -> None:
        self.r, self.tmp, self.stack = r, tmp, stack
        self.secrets = issue_secrets(r, tmp / "secrets")
        [(self.coord_t, self.coord_c)] = r.pods_running(*COORDINATOR)
        [(self.worker_t, self.agent_c)] = r.pods_running(*AGENT)
        self.ns = self.coord_t.namespace
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def pod(self, name: str, containers: list[LocalContainer], grace: float = 30) -> LocalPod:
        pod = LocalPod(name, containers, self.tmp, grace)
        self.stack.callback(pod.close)
        return pod

    def coordinator(self, principals: list[str]) -> tuple[LocalPod, dict[str, str], Mounts]:
        ports = container_ports(self.coord_c)
        configmaps = copy.deepcopy(self.r.configmaps(self.ns))
        for cm in configmaps.values():
            if cm.get("COORDINATOR_PORT") == str(ports["grpc"]):
                cm["COORDINATOR_PORT"] = str(self.port)
            if cm.get("METRICS_PORT") == str(ports["metrics"]):
                cm["METRICS_PORT"] = "0"
        # The only change to the manifests' data: the database is an SQLite file, which the
        # migration Job has brought to the schema's head (the coordinator waits for that).
        secrets = self.r.secrets(self.ns)
        url = f"sqlite:///{self.tmp / 'coordinator.db'}"
        for data in secrets.values():
            if "database-url" in data:
                data["database-url"] = url
        done = subprocess.run(
            local_argv({"name": "migrate", "command": ["coordinator-svc", "migrate"]}),
            env={**image_env(self.tmp / "home"), "DATABASE_URL": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        env = container_env(
            self.coord_c, PodFacts("coordinator-abc", self.ns, "127.0.0.1"), configmaps, secrets
        )
        mounts = Mounts(self.coord_t, self.coord_c, self.secrets, configmaps, self.tmp)
        env = {**image_env(self.tmp / "home"), **mounts.env(env)}
        # Here the loopback, not the pod's addresses; and the ACLs on, with only these allowed.
        env["COORDINATOR_HOST"] = "127.0.0.1"
        env["COORDINATOR_AUTHORIZATION"] = "acl"
        env["COORDINATOR_SUPER_USERS"] = ";".join(principals)
        pod = self.pod(
            "coordinator-abc",
            [LocalContainer("coordinator", local_argv(self.coord_c), env, self.coord_c)],
        )
        return pod, env, mounts

    def exec_probe(
        self, probe: Obj, env: dict[str, str], mounts: Mounts
    ) -> subprocess.CompletedProcess[str]:
        command = [mounts.local(str(a)) for a in probe["exec"]["command"]]
        assert command[0] == "python"
        return subprocess.run(
            [sys.executable, *command[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=probe["timeoutSeconds"],
        )

    def admin_env(self) -> dict[str, str]:
        [pod] = [d for d in yaml.safe_load_all(ADMIN_POD.read_text()) if d]
        template = PodTemplate(pod, self.ns, pod["metadata"], pod["spec"])
        [container] = template.containers
        env = container_env(container, PodFacts("coordinator-admin", self.ns, "127.0.0.1"), {}, {})
        mounts = Mounts(template, container, self.secrets, {}, self.tmp)
        return {**image_env(self.tmp / "home"), **mounts.env(env)}

    def admin(self, *args: str) -> str:
        done = subprocess.run(
            [*local_argv({"name": "admin", "command": ["coordinator-svc", *args]})],
            env=self.admin_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"coordinator-svc {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def agent(self) -> tuple[LocalPod, dict[int, int]]:
        name = f"{self.worker_t.owner['metadata']['name']}-0"
        configmaps = self.r.configmaps(self.ns)
        env = container_env(self.agent_c, PodFacts(name, self.ns, "127.0.0.1"), configmaps, {})
        mounts = Mounts(self.worker_t, self.agent_c, self.secrets, configmaps, self.tmp)
        env = {**image_env(self.tmp / "home"), **mounts.env(env)}
        status = container_ports(self.agent_c)["status"]
        local_status = free_port()
        metrics = container_ports(self.agent_c)["agent-metrics"]
        local_metrics = free_port()
        # No worker beside it here: the agent logs its events instead of POSTing them.
        env.pop("WORKER_AGENT_WEBHOOK", None)
        env.update(
            {
                # A pod IP in the cluster, the loopback here: in neither case in the certificate.
                "WORKER_AGENT_COORDINATOR": self.address,
                "WORKER_AGENT_STATUS_PORT": str(local_status),
                "WORKER_AGENT_STATUS_HOST": "127.0.0.1",
                "WORKER_AGENT_METRICS_PORT": str(local_metrics),
                "WORKER_AGENT_METRICS_HOST": "127.0.0.1",
            }
        )
        self.group = env["WORKER_AGENT_GROUP"]
        grace = float(self.worker_t.spec["terminationGracePeriodSeconds"])
        pod = self.pod(
            name,
            [LocalContainer("worker-agent", local_argv(self.agent_c), env, self.agent_c)],
            grace,
        )
        return pod, {status: local_status, metrics: local_metrics}


@pytest.fixture
def rehearsal(rendered: dict[str, Rendered], tmp_path: Path) -> Iterator[TlsRehearsal]:
    with ExitStack() as stack:
        yield TlsRehearsal(rendered[DEV_TLS], tmp_path, stack)


def test_dev_tls_coordinator_probes_admin_and_agent_work_with_the_certificates_principals(
    rehearsal: TlsRehearsal,
) -> None:
    rh = rehearsal
    certificates = {c["metadata"]["name"]: c["spec"] for c in rh.r.all("Certificate")}
    # README: principals by subject, `User:CN=<common name>`.
    admin = f"User:CN={certificates['coordinator-admin-client']['commonName']}"
    workers = f"User:CN={certificates['connect-worker-client']['commonName']}"
    pod, env, mounts = rh.coordinator([admin, workers])
    pod.start()
    c = rh.coord_c
    wait_for(
        "the startup probe",
        lambda: rh.exec_probe(c["startupProbe"], env, mounts).returncode == 0,
        30,
        pod.tail,
        interval_s=0.2,
    )
    for kind in ("readinessProbe", "livenessProbe"):
        done = rh.exec_probe(c[kind], env, mounts)
        assert done.returncode == 0, f"{kind}: {done.stdout}{done.stderr}\n{pod.tail()}"

    agent, ports = rh.agent()
    rh.admin("put-connector", "--coordinator", rh.address, "--tasks", "2", rh.group, "orders-sink")
    agent.start()
    wait_for(
        "the agent to be ready",
        lambda: run_probe(rh.agent_c["readinessProbe"], ports, container_ports(rh.agent_c)),
        30,
        lambda: f"{agent.tail()}\n{pod.tail()}",
    )
    shown = rh.admin("describe", "--coordinator", rh.address, rh.group)
    assert "connect-worker-0" in shown and "orders-sink" in shown, shown
    assert agent.alive() and pod.alive()
