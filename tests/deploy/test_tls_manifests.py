"""The TLS component (deploy/k8s/components/tls-cert-manager), offline.

Where it is rendered: the dev-tls overlay (on top of dev), prod with the sample workers and the
component (tests/deploy/conftest.py; both are also in every check of test_manifests.py), prod
without workers, and the base with both components listed beside it in another namespace.

cert-manager's objects are custom resources, for which `kubernetes-validate` has no schema (and
this repository vendors none): their structure is checked here against cert-manager.io/v1 as its
API reference describes it (fields, required ones, enumerations, durations), which catches
misspelt and missing fields but is not the CRD's full OpenAPI schema. Then how they fit the pods:
the Secrets the Certificates create are the ones mounted (as directories, never with subPath, so
renewals reach the files), the TLS variables name files in those mounts, the agents and the CLI
verify a name the server certificate carries, the server trusts the CA that issued the clients'
certificates, and no plaintext switch remains. tests/deploy/test_tls_rehearsal.py runs the
coordinator, its probes, an agent and the CLI with these settings.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from coordinator_svc.grpc_api.server import LIVENESS_SERVICE, READINESS_SERVICE
from tests.deploy.conftest import PROD_WITH_WORKERS_TLS, render_combination
from tests.deploy.k8s import (
    CERT_MANAGER_API,
    ISSUED_SECRET_KEYS,
    K8S,
    Obj,
    PodFacts,
    PodTemplate,
    Rendered,
    container_env,
    container_ports,
    is_cert_manager,
    load_example_secret,
    namespace_of,
    overlay_names,
    secret_data,
)
from tests.deploy.test_manifests import (
    AGENT,
    BIN,
    COORDINATOR,
    _admitted,
    _help,
    check_coordinator_probe_timing,
)

COMPONENT = K8S / "components" / "tls-cert-manager"
PROBE_SCRIPT = COMPONENT / "tls_health_probe.py"
ADMIN_POD = K8S / "examples" / "coordinator-admin-pod.yaml"
README = K8S / "README.md"

DEV_TLS = "dev-tls"
PROD_TLS_NO_WORKERS = "prod+tls-cert-manager"
BESIDE_THE_BASE = "base+sample-workers+tls-cert-manager"
# Renderings whose coordinator serves TLS, and which run the sample workers.
TLS_WITH_WORKERS = [DEV_TLS, PROD_WITH_WORKERS_TLS, BESIDE_THE_BASE]
TLS_ALL = [*TLS_WITH_WORKERS, PROD_TLS_NO_WORKERS]
CLIENT = ("coordinator-svc", "describe")

# --- cert-manager.io/v1, from its API reference -------------------------------------------------

CERTIFICATE_FIELDS = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses",
    "encodeUsagesInRequest", "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject",
    "nameConstraints", "otherNames", "privateKey", "renewBefore", "renewBeforePercentage",
    "revisionHistoryLimit", "secretName", "secretTemplate", "signatureAlgorithm", "subject",
    "uris", "usages",
}  # fmt: skip
SUBJECT_FIELDS = {
    "countries", "localities", "organizationalUnits", "organizations", "postalCodes",
    "provinces", "serialNumber", "streetAddresses",
}  # fmt: skip
ISSUER_TYPES = {"acme", "ca", "selfSigned", "vault", "venafi"}
CA_ISSUER_FIELDS = {"secretName", "crlDistributionPoints", "issuingCertificateURLs", "ocspServers"}
USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
}  # fmt: skip
KEY_SIZES: dict[str, set[int] | None] = {
    "RSA": {2048, 4096, 8192},
    "ECDSA": {256, 384, 521},
    "Ed25519": None,
}
PRIVATE_KEY_FIELDS = {"algorithm", "encoding", "rotationPolicy", "size"}
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_NAME = re.compile(
    r"(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
)
GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def go_duration_s(text: str) -> float:
    """Go's time.ParseDuration, for the positive durations cert-manager accepts."""
    assert re.fullmatch(rf"(?:{GO_DURATION_PART.pattern})+", text), f"not a Go duration: {text}"
    return sum(float(n) * GO_UNITS[u] for n, u in GO_DURATION_PART.findall(text))


# --- renderings ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(
    rendered: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Rendered]:
    """Every rendering with the TLS component."""
    assert DEV_TLS in overlay_names(), "the dev-tls overlay is gone"
    out = {name: rendered[name] for name in (DEV_TLS, PROD_WITH_WORKERS_TLS)}
    [prod_ns] = [o["metadata"]["name"] for o in rendered["prod"].all("Namespace")]
    for name, namespace, resources, components in (
        (PROD_TLS_NO_WORKERS, prod_ns, ["overlays/prod"], ["components/tls-cert-manager"]),
        # As an operator who lists both components in an overlay of their own beside the base:
        # the namespace is set after the components, which must not depend on it.
        (
            BESIDE_THE_BASE,
            "team-a",
            ["base"],
            ["components/sample-workers", "components/tls-cert-manager"],
        ),
    ):
        folder = tmp_path_factory.mktemp(name.replace("+", "-"))
        text, objects = render_combination(folder, namespace, resources, components)
        out[name] = Rendered(name, text, objects, folder)
    return out


def _secrets(r: Rendered, ns: str) -> dict[str, dict[str, str]]:
    """The Secrets a pod in `ns` finds: rendered, issued by cert-manager, and the database
    Secret the operator creates (the example's)."""
    example = load_example_secret()
    return {
        example["metadata"]["name"]: secret_data(example),
        **{name: dict.fromkeys(keys, "") for name, keys in r.issued_secrets(ns).items()},
        **r.secrets(ns),
    }


def _env(r: Rendered, template: PodTemplate, container: Obj) -> dict[str, str]:
    ns = template.namespace
    facts = PodFacts(f"{template.owner['metadata']['name']}-0", ns, "10.0.0.9")
    return container_env(container, facts, r.configmaps(ns), _secrets(r, ns))


def _mounted_file(template: PodTemplate, container: Obj, path: str) -> tuple[Obj, str]:
    """The volume that `path` is read from in `container`, and the file's key in it. The mount
    must be a whole directory: with subPath the kubelet never updates the file."""
    for mount in container.get("volumeMounts") or []:
        root = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(root):
            where = f"{template.owner_ref} {container['name']} {mount['mountPath']}"
            assert "subPath" not in mount and "subPathExpr" not in mount, (
                f"{where}: mounted with subPath, so a renewed certificate never reaches {path}"
            )
            assert mount.get("readOnly") is True, where
            [volume] = [v for v in template.spec["volumes"] if v["name"] == mount["name"]]
            return volume, path[len(root) :]
    raise AssertionError(f"{template.owner_ref} {container['name']}: {path} is in no mount")


def _issued_file(r: Rendered, template: PodTemplate, container: Obj, path: str) -> tuple[Obj, str]:
    """The Certificate whose Secret holds the file at `path`, and the file's key."""
    volume, key = _mounted_file(template, container, path)
    assert "secret" in volume, f"{path}: volume {volume['name']} is not a Secret"
    secret = volume["secret"]["secretName"]
    assert not volume["secret"].get("items"), f"{volume['name']}: items would pin the keys"
    assert volume["secret"].get("optional") is not True, volume["name"]
    [certificate] = [
        c
        for c in r.all("Certificate")
        if namespace_of(c) == template.namespace and c["spec"]["secretName"] == secret
    ]
    assert key in ISSUED_SECRET_KEYS, f"{path}: cert-manager writes no {key!r}"
    return certificate, key


def _certificates(r: Rendered) -> dict[str, Obj]:
    return {c["metadata"]["name"]: c for c in r.all("Certificate") if is_cert_manager(c)}


def _server_certificate(r: Rendered) -> tuple[PodTemplate, Obj, Obj, dict[str, str]]:
    [(template, container)] = r.pods_running(*COORDINATOR)
    env = _env(r, template, container)
    certificate, key = _issued_file(r, template, container, env["COORDINATOR_TLS_CERT"])
    assert key == "tls.crt"
    return template, container, certificate, env


# --- cert-manager's objects -------------------------------------------------------------------


@pytest.mark.parametrize("name", TLS_ALL)
def test_cert_manager_objects_are_well_formed_cert_manager_io_v1(
    tls: dict[str, Rendered], name: str
) -> None:
    r = tls[name]
    objects = [o for o in r.objects if is_cert_manager(o)]
    assert {o["kind"] for o in objects} == {"Issuer", "Certificate"}, name
    secret_names: set[tuple[str, str]] = set()
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert obj["apiVersion"] == CERT_MANAGER_API, where
        assert set(obj) <= {"apiVersion", "kind", "metadata", "spec"}, where
        assert DNS_1123_SUBDOMAIN.fullmatch(obj["metadata"]["name"]), where
        assert obj["metadata"].get("namespace"), f"{where}: namespaced, but no namespace"
        spec = obj["spec"]
        if obj["kind"] == "Issuer":
            assert len(spec) == 1 and set(spec) <= ISSUER_TYPES, f"{where}: {sorted(spec)}"
            if "ca" in spec:
                assert spec["ca"].get("secretName") and set(spec["ca"]) <= CA_ISSUER_FIELDS
            if "selfSigned" in spec:
                assert set(spec["selfSigned"] or {}) <= {"crlDistributionPoints"}, where
            continue
        assert set(spec) <= CERTIFICATE_FIELDS, f"{where}: {set(spec) - CERTIFICATE_FIELDS}"
        # Required by the CRD, and by cert-manager's webhook: some name to put in it.
        assert isinstance(spec.get("secretName"), str) and spec["secretName"], where
        assert DNS_1123_SUBDOMAIN.fullmatch(spec["secretName"]), where
        ref = spec.get("issuerRef") or {}
        assert ref.get("name") and set(ref) <= {"name", "kind", "group"}, where
        assert ref.get("group", "cert-manager.io") == "cert-manager.io", where
        assert ref.get("kind", "Issuer") in ("Issuer", "ClusterIssuer"), where
        assert any(
            spec.get(f) for f in ("commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses")
        ), f"{where}: no subject and no subject alternative name"
        assert len(spec.get("commonName", "")) <= 64, where
        for dns in spec.get("dnsNames") or []:
            assert DNS_NAME.fullmatch(dns), f"{where}: dnsNames {dns!r}"
        assert set(spec.get("subject") or {}) <= SUBJECT_FIELDS, where
        assert set(spec.get("usages") or []) <= USAGES, f"{where}: {spec.get('usages')}"
        key = spec.get("privateKey") or {}
        assert set(key) <= PRIVATE_KEY_FIELDS, where
        algorithm = key.get("algorithm", "RSA")
        sizes = KEY_SIZES[algorithm]
        assert sizes is None or key.get("size", min(sizes)) in sizes, where
        assert key.get("encoding", "PKCS1") in ("PKCS1", "PKCS8"), where
        assert key.get("rotationPolicy", "Always") in ("Never", "Always"), where
        duration = go_duration_s(spec.get("duration", "2160h"))
        assert duration >= 3600, f"{where}: cert-manager's minimum duration is 1h"
        if "renewBefore" in spec:
            renew = go_duration_s(spec["renewBefore"])
            assert 300 <= renew < duration, f"{where}: renewBefore {spec['renewBefore']}"
        key_ = (namespace_of(obj), spec["secretName"])
        assert key_ not in secret_names, f"{where}: two Certificates write {key_}"
        secret_names.add(key_)
    # No rendered Secret has the name of one cert-manager manages: they would fight over it.
    rendered_secrets = {(namespace_of(s), s["metadata"]["name"]) for s in r.all("Secret")}
    assert not secret_names & rendered_secrets


@pytest.mark.parametrize("name", TLS_ALL)
def test_certificates_chain_from_a_self_signed_root_through_one_ca_issuer(
    tls: dict[str, Rendered], name: str
) -> None:
    """The self-signed Issuer signs the CA certificate only; the CA Issuer, holding that CA's
    Secret, signs every server and client certificate, so that each Secret's ca.crt verifies
    the other side."""
    r = tls[name]
    issuers = {(namespace_of(i), i["metadata"]["name"]): i["spec"] for i in r.all("Issuer")}
    certificates = _certificates(r)
    cas = {
        (namespace_of(c), c["spec"]["secretName"]): c
        for c in certificates.values()
        if c["spec"].get("isCA")
    }
    assert len(cas) == 1, sorted(cas)
    leaves = [c for c in certificates.values() if not c["spec"].get("isCA")]
    assert len(leaves) >= 2
    leaf_issuers = set()
    for cert in certificates.values():
        ref = cert["spec"]["issuerRef"]
        issuer = issuers.get((namespace_of(cert), ref["name"]))
        assert issuer is not None, f"Certificate {cert['metadata']['name']}: no Issuer {ref}"
        if cert["spec"].get("isCA"):
            assert "selfSigned" in issuer, cert["metadata"]["name"]
            # The CA keeps its key through renewals, so what it signed before still verifies.
            assert cert["spec"]["privateKey"]["rotationPolicy"] == "Never"
        else:
            assert "ca" in issuer, f"{cert['metadata']['name']} is not signed by the CA"
            assert (namespace_of(cert), issuer["ca"]["secretName"]) in cas
            assert cert["spec"]["privateKey"]["rotationPolicy"] == "Always"
            leaf_issuers.add(ref["name"])
    assert len(leaf_issuers) == 1, leaf_issuers


# --- the coordinator ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", TLS_ALL)
def test_coordinator_serves_tls_and_requires_client_certificates_from_its_certificate(
    tls: dict[str, Rendered], name: str
) -> None:
    r = tls[name]
    template, container, certificate, env = _server_certificate(r)
    key_cert, key = _issued_file(r, template, container, env["COORDINATOR_TLS_KEY"])
    assert (key_cert, key) == (certificate, "tls.key")
    ca_cert, key = _issued_file(r, template, container, env["COORDINATOR_TLS_CLIENT_CA"])
    assert key == "ca.crt"  # the CA that issued the clients' certificates (chain test above)
    assert ca_cert["spec"]["issuerRef"] == certificate["spec"]["issuerRef"]
    spec = certificate["spec"]
    assert "server auth" in spec["usages"]
    # The names of the Services that select the coordinator, as a client in the namespace dials
    # them; and the fixed name every client verifies.
    for service in r.all("Service"):
        if service["spec"].get("selector", {}).items() <= template.labels.items():
            assert service["metadata"]["name"] in spec["dnsNames"], service["metadata"]["name"]
    assert "COORDINATOR_ALLOW_PLAINTEXT" not in env
    assert env["COORDINATOR_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("name", TLS_ALL)
def test_coordinator_probes_check_health_over_tls_with_the_components_script(
    tls: dict[str, Rendered], name: str
) -> None:
    """The kubelet's gRPC probe cannot do TLS: every probe is the component's exec probe, the
    script mounted from its ConfigMap (the file in the repository, unchanged), verifying a name
    the server certificate carries and presenting that certificate (so it needs client auth)."""
    r = tls[name]
    template, container, certificate, _e = _server_certificate(r)
    assert "client auth" in certificate["spec"]["usages"]
    probes = {k: container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    for kind, probe in probes.items():
        assert set(probe) & {"grpc", "httpGet", "tcpSocket"} == set(), kind
        command = probe["exec"]["command"]
        assert command[0] == "python", command
        volume, key = _mounted_file(template, container, command[1])
        configmap = r.configmaps(template.namespace)[volume["configMap"]["name"]]
        assert configmap[key] == PROBE_SCRIPT.read_text(), f"{kind}: not the component's script"
        options = dict(a.removeprefix("--").split("=", 1) for a in command[2:])
        assert set(options) <= {"server-name", "service", "timeout-s"}, options
        assert options["server-name"] in certificate["spec"]["dnsNames"]
        # The same health service names as the native probes: readiness for readiness,
        # liveness (never the database) for liveness and start-up.
        want = READINESS_SERVICE if kind == "readinessProbe" else LIVENESS_SERVICE
        assert options.get("service") == want, (kind, options)
        # A Python process starts within the timeout, and the probe's own deadline is shorter.
        assert probe["timeoutSeconds"] >= 3
        assert float(options.get("timeout-s", 3)) < probe["timeoutSeconds"]
    # Tolerant of a busy process; the start-up allows for the wait for the migration Job.
    check_coordinator_probe_timing(r, template, container)


# --- the agents ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TLS_WITH_WORKERS)
def test_agents_present_the_fleet_certificate_and_verify_the_coordinators_fixed_name(
    tls: dict[str, Rendered], name: str
) -> None:
    r = tls[name]
    _t, _c, server, _e = _server_certificate(r)
    agents = r.pods_running(*AGENT)
    assert agents
    for template, container in agents:
        env = _env(r, template, container)
        cert, key = _issued_file(r, template, container, env["WORKER_AGENT_TLS_CERT"])
        assert key == "tls.crt"
        assert _issued_file(r, template, container, env["WORKER_AGENT_TLS_KEY"]) == (
            cert,
            "tls.key",
        )
        ca, key = _issued_file(r, template, container, env["WORKER_AGENT_TLS_CA"])
        assert key == "ca.crt" and ca["spec"]["issuerRef"] == server["spec"]["issuerRef"]
        spec = cert["spec"]
        assert "client auth" in spec["usages"] and "server auth" not in spec["usages"]
        # The common name is the fleet's principal; the coordinator's certificate is not it.
        assert spec["commonName"] and cert is not server
        # FindCoordinator answers with a pod IP: the agent verifies the fixed name instead.
        assert env["WORKER_AGENT_TLS_SERVER_NAME"] in server["spec"]["dnsNames"]
        assert "WORKER_AGENT_ALLOW_PLAINTEXT" not in env


@pytest.mark.parametrize("name", TLS_ALL)
def test_no_container_is_left_with_a_plaintext_switch(tls: dict[str, Rendered], name: str) -> None:
    r = tls[name]
    for template in r.pod_templates():
        for container in template.containers:
            env = _env(r, template, container)
            left = [k for k in env if k.endswith("ALLOW_PLAINTEXT")]
            assert not left, f"{template.owner_ref} {container['name']}: {left}"


def test_the_component_fits_prod_without_workers_and_beside_the_base(
    tls: dict[str, Rendered], rendered: dict[str, Rendered]
) -> None:
    """Its StatefulSet patch matches nothing without the sample workers (no error, nothing
    invented), and its objects take the namespace of the overlay that lists it."""
    no_workers = tls[PROD_TLS_NO_WORKERS]
    assert not no_workers.all("StatefulSet")
    assert (
        len(no_workers.objects)
        == len(rendered["prod"].objects)
        + len([o for o in tls[DEV_TLS].objects if is_cert_manager(o)])
        + 1
    )  # + the probe's ConfigMap
    beside = tls[BESIDE_THE_BASE]
    assert {namespace_of(o) for o in beside.objects if is_cert_manager(o)} == {"team-a"}
    [(template, _c)] = beside.pods_running(*AGENT)
    assert template.namespace == "team-a"


@pytest.mark.parametrize("name", [PROD_TLS_NO_WORKERS, BESIDE_THE_BASE])
def test_the_other_renderings_validate_offline(
    tls: dict[str, Rendered], name: str, tmp_path: Path
) -> None:
    """dev-tls and prod+sample-workers+tls are validated with every overlay
    (test_manifests.py); these two here, at the newest schemas."""
    _validate([o for o in tls[name].objects if not is_cert_manager(o)], tmp_path)


def _validate(objects: list[Obj], tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    done = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert len(re.findall(r"passed for resource", output)) == len(objects), output


# --- operators ----------------------------------------------------------------------------------


@cache
def _admin_pod() -> Obj:
    [pod] = [d for d in yaml.safe_load_all(ADMIN_POD.read_text()) if d]
    return pod


def test_the_admin_example_pod_uses_the_admin_certificate_and_passes_the_network_policy(
    tls: dict[str, Rendered], tmp_path: Path
) -> None:
    r = tls[DEV_TLS]
    pod = _admin_pod()
    _validate([pod], tmp_path)
    [(coordinator, coordinator_container)] = r.pods_running(*COORDINATOR)
    template = PodTemplate(pod, coordinator.namespace, pod["metadata"], pod["spec"])
    [container] = template.containers
    env = _env(r, template, container)
    cert, key = _issued_file(r, template, container, env["COORDINATOR_CLIENT_TLS_CERT"])
    assert key == "tls.crt" and cert["metadata"]["name"] == "coordinator-admin-client"
    assert _issued_file(r, template, container, env["COORDINATOR_CLIENT_TLS_KEY"]) == (
        cert,
        "tls.key",
    )
    assert _issued_file(r, template, container, env["COORDINATOR_CLIENT_TLS_CA"])[1] == "ca.crt"
    assert "client auth" in cert["spec"]["usages"]
    _t, _c, server, _e = _server_certificate(r)
    assert env["COORDINATOR_CLIENT_TLS_SERVER_NAME"] in server["spec"]["dnsNames"]
    assert _admitted(r, coordinator, template, container_ports(coordinator_container)["grpc"])
    # Like every pod of the image: non-root, read-only, no token, bounded.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"]["memory"]
    # The CLI reads these variables.
    help_text = _help(*CLIENT)
    for variable in env:
        assert re.search(rf"\b{variable}\b", help_text), f"{variable}: not read by describe"


# --- the README ---------------------------------------------------------------------------------


def test_readme_names_the_principals_the_client_certificates_carry(
    tls: dict[str, Rendered],
) -> None:
    """Principals by subject (the coordinator's default): `User:` and the RFC 4514 subject, which
    is `CN=<commonName>` for these certificates (no other subject field)."""
    readme = README.read_text()
    for cert in _certificates(tls[DEV_TLS]).values():
        spec = cert["spec"]
        if spec.get("isCA"):
            continue
        assert not spec.get("subject"), "the principals below assume a subject of CN only"
        principal = f"User:CN={spec['commonName']}"
        assert principal in readme, f"README does not name {principal}"
    assert "tls-cert-manager" in readme and "connect-coordinator/access" in readme
