"""The images (issue 14): `scripts/build-images` builds the coordinator and agent images from the
Dockerfile on a Debian base it makes with debootstrap (cached between runs), pushes them to a
registry on 127.0.0.1 and pins their digests (`--pin`, into a file of the test's own); their
contents are checked with skopeo and umoci (non-root user, command, files, no server libraries
in the agent's), and podman runs them: the coordinator image against the test PostgreSQL, and an
agent from the agent image that joins it, seen through DescribeGroups.

Needs root and Debian's buildah, podman, runc, skopeo, umoci, debootstrap and docker-registry
(scripts/lib/setup.sh installs them); without them these tests fail, they never skip. The audit
image is built by the script only (PySpark and Java: too slow for the suite). Time here: about
45 s with the base and the wheels cached (~/.cache/connect-group-coordinator/images, kept
between runs on a machine), under 2 minutes without."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.k8s import K8S, render
from tests.support.client import describe, put_connector
from tests.support.coordinator import Stubs, free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_IMAGES = REPO / "scripts" / "build-images"
REQUIREMENTS = REPO / "deploy" / "images" / "requirements"
PINNED = K8S / "components" / "pinned-images" / "kustomization.yaml"
TAG = "test"
IMAGES = {
    "coordinator": f"localhost/connect-group-coordinator:{TAG}",
    "agent": f"localhost/connect-group-coordinator-agent:{TAG}",
}
TOOLS = ("buildah", "podman", "runc", "skopeo", "umoci", "debootstrap", "docker-registry")
# Import names of what only the server or the audit export needs.
SERVER_ONLY = {
    "sqlalchemy",
    "alembic",
    "psycopg",
    "psycopg_binary",
    "prometheus_client",
    "grpc_health",
    "grpc_reflection",
    "mako",
    "pyspark",
    "py4j",
}
SITE = Path("opt/venv/lib/python3.11/site-packages")

pytestmark = pytest.mark.timeout(900)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {done.returncode}:\n"
            f"{_tail(done.stdout)}\n{_tail(done.stderr)}",
            pytrace=False,
        )
    return done


def _limit(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return 32768 if hard == resource.RLIM_INFINITY or hard > 32768 else hard


def podman_flags() -> list[str]:
    """What `podman run` needs here: runc (crun: "cgroups in hybrid mode not supported, drop
    all controllers from cgroupv2") and limits no higher than ours (podman's default nofile
    1048576 gets "setrlimit `RLIMIT_NOFILE`: Operation not permitted")."""
    nofile, nproc = _limit(resource.RLIMIT_NOFILE), _limit(resource.RLIMIT_NPROC)
    return [
        "--runtime",
        "runc",
        "--ulimit",
        f"nofile={nofile}:{nofile}",
        "--ulimit",
        f"nproc={nproc}:{nproc}",
        "--pull",
        "never",
        "--network",
        "host",
        # As the manifests run them (securityContext).
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]


@dataclass
class Unpacked:
    config: dict[str, Any]
    rootfs: Path
    compressed_bytes: int

    def site_packages(self) -> set[str]:
        return {canonicalize_name(p.name.split("-")[0]) for p in (self.rootfs / SITE).iterdir()}


def _tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: install Debian's {' '.join(TOOLS)} "
            "(./scripts/test does, through scripts/lib/setup.sh)",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("building images with buildah and debootstrap needs root", pytrace=False)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on 127.0.0.1 (Debian's docker-registry), for `--pin`; address/prefix."""
    _tools()
    folder = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {folder / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = (folder / "registry.log").open("w")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (folder / "registry.log").read_text()
                assert time.monotonic() < deadline, (folder / "registry.log").read_text()
                time.sleep(0.2)
        yield f"127.0.0.1:{port}/connect"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def built(registry: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """scripts/build-images for the coordinator and the agent, pushed to the local registry
    and pinned into a Component file of the test's own (not the repository's)."""
    pin_file = tmp_path_factory.mktemp("pinned") / "kustomization.yaml"
    started = time.monotonic()
    done = _run(
        BUILD_IMAGES,
        "--quiet",
        "--tag",
        TAG,
        "--pin",
        registry,
        "--tls-verify=false",
        "--pin-file",
        pin_file,
        "coordinator",
        "agent",
        timeout=840,
    )
    print(f"scripts/build-images coordinator agent: {time.monotonic() - started:.0f} s")
    print(_tail(done.stderr, 6))
    return {**IMAGES, "registry": registry, "pin_file": str(pin_file)}


@pytest.fixture(scope="module")
def unpacked(
    built: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Unpacked]]:
    """Each image as the registry got it (--pin pushed it), copied by skopeo into an OCI
    layout and unpacked by umoci."""
    out: dict[str, Unpacked] = {}
    root = tmp_path_factory.mktemp("images")
    for part, image in IMAGES.items():
        pushed = f"docker://{built['registry']}/{image.split('/', 1)[1]}"
        config = json.loads(
            _run("skopeo", "inspect", "--config", "--tls-verify=false", pushed).stdout
        )
        layout = root / f"{part}-oci"
        _run("skopeo", "copy", "--quiet", "--src-tls-verify=false", pushed, f"oci:{layout}:{TAG}")
        index = json.loads((layout / "index.json").read_text())
        manifest_digest = index["manifests"][0]["digest"].split(":", 1)[1]
        manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest).read_text())
        compressed = sum(layer["size"] for layer in manifest["layers"])
        rootfs = root / f"{part}-rootfs"
        _run("umoci", "raw", "unpack", "--image", f"{layout}:{TAG}", rootfs)
        out[part] = Unpacked(config["config"], rootfs, compressed)
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("part", ["coordinator", "agent"])
def test_an_image_runs_as_a_numeric_non_root_user_with_its_command(
    unpacked: dict[str, Unpacked], part: str
) -> None:
    image = unpacked[part]
    assert image.config["User"] == "10001:10001"
    assert not image.config.get("Entrypoint")
    command = {"coordinator": ["coordinator-svc", "serve"], "agent": ["worker-agent", "run"]}
    assert image.config["Cmd"] == command[part]
    env = dict(str(e).split("=", 1) for e in image.config["Env"])
    assert env["PATH"].startswith("/opt/venv/bin:")
    executable = image.rootfs / "opt" / "venv" / "bin" / command[part][0]
    assert executable.is_file()
    assert "app:x:10001:10001:" in (image.rootfs / "etc" / "passwd").read_text()
    assert (image.rootfs / "home" / "app").stat().st_uid == 10001
    # Debian bookworm's Python 3.11 under the virtualenv; no pip left to install anything.
    assert (image.rootfs / "usr" / "bin" / "python3.11").is_file()
    assert not (image.rootfs / "opt" / "venv" / "bin" / "pip").exists()
    assert not (image.rootfs / "src").exists()
    # Small: the pull size (compressed layers), well under what the single image was.
    assert image.compressed_bytes < {"coordinator": 100e6, "agent": 80e6}[part], (
        image.compressed_bytes
    )


def test_the_agent_image_has_none_of_the_servers_libraries(
    unpacked: dict[str, Unpacked],
) -> None:
    agent = unpacked["agent"].site_packages()
    assert {"grpcio", "protobuf", "worker-agent", "connect-protocol", "examples"} <= agent
    assert not {canonicalize_name(n) for n in SERVER_ONLY} & agent, sorted(agent)
    coordinator = unpacked["coordinator"].site_packages()
    assert {"sqlalchemy", "alembic", "psycopg", "prometheus-client"} <= coordinator
    assert not {"pyspark", "py4j"} & coordinator
    assert (unpacked["coordinator"].rootfs / SITE / "coordinator_svc" / "_migrations").is_dir()


def _podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


class Container:
    """`podman run -d` on the host's network; its logs and exit code on the way out."""

    def __init__(self, image: str, *command: str) -> None:
        self.name = f"cgc-test-{uuid.uuid4().hex[:10]}"
        started = _podman("run", "-d", "--name", self.name, *podman_flags(), image, *command)
        if started.returncode != 0:
            _podman("rm", "--force", self.name)
            pytest.fail(f"podman could not run {image}:\n{started.stderr}", pytrace=False)

    def running(self) -> bool:
        state = _podman("inspect", "--format", "{{.State.Running}}", self.name)
        return state.stdout.strip() == "true"

    def logs(self) -> str:
        done = _podman("logs", self.name)
        return _tail(done.stdout + done.stderr)

    def stop(self, grace_s: int = 30) -> int:
        _podman("stop", "--time", str(grace_s), self.name, timeout=grace_s + 30)
        code = _podman("inspect", "--format", "{{.State.ExitCode}}", self.name)
        return int(code.stdout.strip())

    def remove(self) -> None:
        _podman("rm", "--force", self.name)


def test_the_coordinator_image_serves_and_an_agent_from_its_image_joins(
    built: dict[str, str], database_url: str
) -> None:
    port, metrics_port, status_port = free_port(), free_port(), free_port()
    address = f"127.0.0.1:{port}"
    coordinator = Container(
        built["coordinator"],
        "coordinator-svc",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--database-url",
        database_url,
        "--session-timeout-ms",
        "6000",
        "--heartbeat-interval-ms",
        "500",
    )
    agent: Container | None = None
    stubs = Stubs(address)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert coordinator.running(), coordinator.logs()
            try:
                created = put_connector(stubs, "imaged", "orders", 2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise AssertionError(coordinator.logs()) from None
                time.sleep(0.3)
        assert created.error_code == 0, created
        agent = Container(
            built["agent"],
            "worker-agent",
            "run",
            "--coordinator",
            address,
            "--group",
            "imaged",
            "--member-id",
            "image-agent-1",
            "--status-port",
            str(status_port),
            "--rebalance-timeout-ms",
            "5000",
        )
        deadline = time.monotonic() + 60
        group = describe(stubs, "imaged")
        while time.monotonic() < deadline:
            group = describe(stubs, "imaged")
            member = next((m for m in group.members if m.member_id == "image-agent-1"), None)
            if member is not None and group.state == "STABLE" and member.current_assignment.tasks:
                break
            assert agent.running(), agent.logs()
            time.sleep(0.2)
        assert group.state == "STABLE", f"{group}\n{agent.logs()}"
        owned = next(m for m in group.members if m.member_id == "image-agent-1")
        assert set(owned.current_assignment.connectors) == {"orders"}
        assert {(t.connector, t.task) for t in owned.current_assignment.tasks} == {
            ("orders", 0),
            ("orders", 1),
        }
        # SIGTERM (podman stop): the agent stops its work, leaves the group and exits 0.
        assert agent.stop() == 0, agent.logs()
        assert all(m.member_id != "image-agent-1" for m in describe(stubs, "imaged").members)
        assert coordinator.stop() == 0, coordinator.logs()
    finally:
        stubs.close()
        if agent is not None:
            agent.remove()
        coordinator.remove()


# --- without building: the pins and the component -----------------------------------------------


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (REQUIREMENTS / f"{name}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (version,) = [s.version for s in req.specifier if s.operator == "=="]
            pins[canonicalize_name(req.name)] = version
    return pins


@pytest.mark.parametrize(
    "part,extra", [("agent", None), ("coordinator", "coordinator"), ("audit", "audit")]
)
def test_the_pinned_requirements_satisfy_pyproject(part: str, extra: str | None) -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins(part)
    wanted = [Requirement(r) for r in project["dependencies"]]
    if extra:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not pinned in {part}.txt: scripts/build-images --lock"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
    if part == "agent":
        assert not {canonicalize_name(n) for n in SERVER_ONLY} & set(pins)
    build = _pins("build")
    assert "hatchling" in build


PIN_ENTRY = re.compile(
    r"^  - name: (\S+)\n    newName: (\S+)\n    digest: (sha256:[0-9a-f]{64})$", re.M
)


def _prod_with(component: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """prod rendered from a copy of deploy/k8s whose pinned-images Component is `component`,
    prod including it as someone will (or does already)."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    overlay = copy / "overlays" / "prod" / "kustomization.yaml"
    if "components/pinned-images" not in overlay.read_text():
        overlay.write_text(
            overlay.read_text() + "\ncomponents:\n  - ../../components/pinned-images\n"
        )
    shutil.copy(component, copy / "components" / "pinned-images" / "kustomization.yaml")
    return render(copy / "overlays" / "prod")[1]


def _images_of(objects: list[dict[str, Any]], kind: str, name: str) -> set[str]:
    obj = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    spec = obj["spec"]["template"]["spec"]
    return {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}


def test_the_checked_in_pinned_images_component_is_valid(tmp_path: Path) -> None:
    text = PINNED.read_text()
    assert "kind: Component" in text
    assert len(PIN_ENTRY.findall(text)) == text.count("- name:"), "each: name, newName, digest"
    _prod_with(PINNED, tmp_path)


def test_the_script_pins_the_digests_it_pushed_and_prod_takes_them(
    built: dict[str, str], tmp_path: Path
) -> None:
    pin_file = Path(built["pin_file"])
    pins = {name: (new, digest) for name, new, digest in PIN_ENTRY.findall(pin_file.read_text())}
    registry = built["registry"]
    assert set(pins) == {"connect-group-coordinator", "connect-group-coordinator-agent"}
    for name, (new_name, digest) in pins.items():
        assert new_name == f"{registry}/{name}"
        pushed = json.loads(
            _run("skopeo", "inspect", "--tls-verify=false", f"docker://{new_name}:{TAG}").stdout
        )
        assert pushed["Digest"] == digest
        # What a node pulls: the pinned reference itself.
        _run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{new_name}@{digest}")
    coordinator = "{}@{}".format(*pins["connect-group-coordinator"])
    objects = _prod_with(pin_file, tmp_path)
    assert _images_of(objects, "Deployment", "coordinator") == {coordinator}
    assert _images_of(objects, "Job", "coordinator-migrate") == {coordinator}


def test_build_images_explains_itself() -> None:
    done = subprocess.run(
        [str(BUILD_IMAGES), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    for word in ("coordinator", "agent", "audit", "--pin", "--cache-dir", "debootstrap"):
        assert word in done.stdout
