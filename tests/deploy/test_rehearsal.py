"""A rehearsal of the dev overlay's topology without Kubernetes.

From the rendered manifests: the migration Job, the coordinator Deployment's replicas (two
`coordinator-svc serve` processes on one PostgreSQL), its Service (a round-robin proxy), and the
worker StatefulSet's pods (each a `worker-agent run` native sidecar beside a sample worker that
takes the agent's webhook). Commands, flags, environment variables, preStop hooks and grace
periods are the manifests' (ConfigMaps, Secrets and the Downward API resolved as the kubelet
does); only addresses and ports are local: the database URL is the test's (the coordinators
reach it through a TCP proxy the test can cut), each pod's IP is 127.0.0.1, each port a free
one. Probes are the manifests' probes, run against the processes; pods start and stop their
containers as the kubelet does (tests/deploy/local.py).

In order:
- an upgrade: the database has the previous release's schema; the coordinators, started with the
  migration Job as one `kubectl apply` would, wait for it (not ready, no gRPC server yet) and
  start serving once it has run; only once every replica serves does the first classic worker
  join (the order deploy/k8s/README.md gives for the release that brings classic groups: the
  migration Job, the whole rollout, then the first classic join), and its group is stored as a
  classic group;
- the StatefulSet's rolling update (pods replaced one by one in reverse ordinal order, each
  deleted, waited for, started again under the same name and waited for until ready) leaves the
  group epoch and every assignment unchanged, with no change of owner in the coordinator's
  events; and each deletion goes in the order the manifests promise: the worker's preStop hook
  has the agent revoke its work through the webhook (the worker stops it) and leave, then the
  worker gets SIGTERM and exits, then the agent;
- killing the coordinator that owns the group lets the other take over while the workers carry
  on;
- the next upgrade runs the migration Job again (kubectl re-creates it once its TTL removed the
  last one): a no-op beside a serving coordinator;
- the database away for less than the lease leaves readiness SERVING; for longer, it turns
  NOT_SERVING and back by itself, while liveness stays SERVING throughout.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from connect.group.v1 import admin_pb2, classic_pb2, classic_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from coordinator_svc.store.migrate import alembic_config, code_revisions
from tests.deploy.k8s import (
    Obj,
    PodFacts,
    PodTemplate,
    Rendered,
    container_env,
    container_ports,
    is_sidecar,
)
from tests.deploy.local import (
    LocalContainer,
    LocalPod,
    ServiceProxy,
    grpc_probe,
    image_env,
    json_events,
    local_argv,
    run_probe,
    wait_for,
)
from tests.deploy.test_manifests import (
    AGENT,
    COORDINATOR,
    MIGRATE,
    SAMPLE_WORKER,
    resolve_service,
)
from tests.support.client import from_cat, names
from tests.support.coordinator import Stubs, free_port
from tests.support.tcp_proxy import TcpProxy

Resources = tuple[frozenset[str], frozenset[tuple[str, int]]]
CATALOGUE = {"orders-sink": 4, "audit-source": 2}


class Rehearsal:
    """The dev overlay as local processes."""

    def __init__(self, r: Rendered, database_url: str, tmp: Path, stack: ExitStack) -> None:
        self.r, self.tmp, self.stack = r, tmp, stack
        self.database_url = database_url
        self.engine = sa.create_engine(database_url)
        stack.callback(self.engine.dispose)
        [(self.coord_t, self.coord_c)] = r.pods_running(*COORDINATOR)
        [(self.job_t, self.job_c)] = r.pods_running(*MIGRATE)
        [(self.worker_t, self.agent_c)] = r.pods_running(*AGENT)
        [(_t, self.worker_c)] = r.pods_running(*SAMPLE_WORKER)
        self.ns = self.coord_t.namespace
        assert self.worker_t.namespace == self.ns
        # The only change to the manifests' data: the database is the test's.
        self.secrets = r.secrets(self.ns)
        [ref] = [
            e["valueFrom"]["secretKeyRef"]
            for e in self.coord_c["env"]
            if e["name"] == "DATABASE_URL"
        ]
        self.secrets[ref["name"]][ref["key"]] = database_url
        # The coordinators reach the database through a proxy the test can cut.
        url = sa.make_url(database_url)
        self.db_proxy = TcpProxy(f"{url.host or '127.0.0.1'}:{url.port or 5432}")
        stack.callback(self.db_proxy.close)
        proxy_host, _, proxy_port = self.db_proxy.address.rpartition(":")
        self.coordinator_database_url = url.set(
            host=proxy_host, port=int(proxy_port)
        ).render_as_string(hide_password=False)
        self.coordinators: dict[str, LocalPod] = {}
        self.coordinator_ports: dict[str, dict[int, int]] = {}
        self.coordinator_address: dict[str, str] = {}
        self.workers: dict[str, LocalPod] = {}
        self.worker_ports: dict[str, dict[int, int]] = {}
        self.service: ServiceProxy | None = None
        self.group = ""

    # --- pods --------------------------------------------------------------------------------

    def _pod(
        self,
        template: PodTemplate,
        name: str,
        configmaps: dict[str, dict[str, str]],
        extra_env: dict[str, str],
        port_map: dict[int, int] | None = None,
    ) -> LocalPod:
        """A pod of `template` named `name`: `extra_env` overrides variables the containers
        have; `port_map` (container port -> local port) is applied to the preStop hooks'
        loopback URLs and to the sidecars' startup probes."""
        home = self.tmp / name
        home.mkdir(exist_ok=True)
        port_map = port_map or {}
        containers = []
        for c in template.containers:
            env = container_env(c, PodFacts(name, self.ns, "127.0.0.1"), configmaps, self.secrets)
            env = {**image_env(home), **env, **{k: v for k, v in extra_env.items() if k in env}}
            hook = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec")
            pre_stop = None
            if hook:
                args = [str(a) for a in hook["command"]]
                for container_port, local in port_map.items():
                    args = [
                        a.replace(f"127.0.0.1:{container_port}", f"127.0.0.1:{local}") for a in args
                    ]
                pre_stop = local_argv({"name": f"{c['name']} preStop", "command": args})
            containers.append(
                LocalContainer(c["name"], local_argv(c), env, c, is_sidecar(c), pre_stop)
            )
        grace = float(template.spec.get("terminationGracePeriodSeconds", 30))

        def started(c: LocalContainer) -> bool:
            probe = c.spec.get("startupProbe")
            return probe is None or run_probe(probe, port_map, container_ports(c.spec))

        pod = LocalPod(name, containers, self.tmp, grace, started=started)
        self.stack.callback(pod.close)
        return pod

    def migrate(self, pod_name: str) -> LocalPod:
        """One run of the migration Job (its pod `pod_name`), to completion."""
        pod = self._pod(self.job_t, pod_name, self.r.configmaps(self.ns), {})
        pod.start()
        codes = {name: proc.wait(120) for name, proc in pod.procs.items()}
        assert codes == {"migrate": 0}, pod.tail()
        return pod

    def schema(self) -> tuple[str, ...]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
            return tuple(sorted(rows))

    def start_coordinators(self, wait: bool = True) -> None:
        replicas = self.coord_t.owner["spec"]["replicas"]
        assert replicas >= 2
        ports = container_ports(self.coord_c)
        for i in range(replicas):
            name = f"coordinator-6d5f8c7b9-{'abcdefgh'[i]}x{i}q"
            local = {ports["grpc"]: free_port(), ports["metrics"]: free_port()}
            configmaps = copy.deepcopy(self.r.configmaps(self.ns))
            for cm in configmaps.values():
                # The ports the pod would listen on, as local ones.
                if cm.get("COORDINATOR_PORT") == str(ports["grpc"]):
                    cm["COORDINATOR_PORT"] = str(local[ports["grpc"]])
                if cm.get("METRICS_PORT") == str(ports["metrics"]):
                    cm["METRICS_PORT"] = str(local[ports["metrics"]])
            pod = self._pod(self.coord_t, name, configmaps, {})
            # In the pod it listens on every address (COORDINATOR_HOST=0.0.0.0); here the loopback.
            pod.containers[0].env["COORDINATOR_HOST"] = "127.0.0.1"
            pod.containers[0].env["DATABASE_URL"] = self.coordinator_database_url
            self.coordinators[name] = pod
            self.coordinator_ports[name] = local
            self.coordinator_address[name] = f"127.0.0.1:{local[ports['grpc']]}"
            pod.start()
        if wait:
            self.wait_coordinators_ready()

    def wait_coordinators_ready(self) -> None:
        for name in self.coordinators:
            self.wait_ready(self.coordinators[name], self.coord_c, self.coordinator_ports[name])

    def unanswered_s(self, name: str) -> float:
        """coordinator_database_unanswered_seconds of `name`, from its metrics port."""
        port = self.coordinator_ports[name][container_ports(self.coord_c)["metrics"]]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("coordinator_database_unanswered_seconds "):
                    return float(line.split()[1])
        raise AssertionError("no coordinator_database_unanswered_seconds")

    def env_of_coordinator(self) -> dict[str, str]:
        return next(iter(self.coordinators.values())).containers[0].env

    def coordinator_probe(self, name: str, kind: str) -> bool:
        return run_probe(
            self.coord_c[kind], self.coordinator_ports[name], container_ports(self.coord_c)
        )

    def wait_ready(self, pod: LocalPod, container: Obj, port_map: dict[int, int]) -> None:
        named = container_ports(container)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in container:
                wait_for(
                    f"{pod.name} {kind}",
                    lambda kind=kind: run_probe(container[kind], port_map, named),
                    timeout_s=30,
                    diagnostics=pod.tail,
                )

    def start_service(self) -> None:
        """The Service the agents dial, with the ready coordinators as its endpoints."""
        self.service = ServiceProxy(list(self.coordinator_address.values()))
        self.stack.callback(self.service.close)

    def worker_pod(self, ordinal: int) -> LocalPod:
        sts = self.worker_t.owner
        name = f"{sts['metadata']['name']}-{ordinal}"
        if name in self.workers:
            return self.workers[name]
        assert self.service is not None
        status_port = container_ports(self.agent_c)["status"]
        local_status = free_port()
        configmaps = copy.deepcopy(self.r.configmaps(self.ns))
        env = container_env(
            self.agent_c, PodFacts(name, self.ns, "127.0.0.1"), configmaps, self.secrets
        )
        coordinators = []
        for address in env["WORKER_AGENT_COORDINATOR"].split(","):
            service, _port = resolve_service(self.r, address.strip(), self.ns)
            assert service["metadata"]["name"] == "coordinator", address
            coordinators.append(self.service.address)
        # The worker's webhook: where the worker listens is where the agent POSTs.
        worker_env = container_env(
            self.worker_c, PodFacts(name, self.ns, "127.0.0.1"), configmaps, self.secrets
        )
        listen = worker_env["SAMPLE_WORKER_LISTEN"]
        webhook_port = int(listen.rpartition(":")[2])
        assert env["WORKER_AGENT_WEBHOOK"].startswith(f"http://{listen}/"), (env, listen)
        local_webhook = free_port()
        metrics_port = container_ports(self.agent_c)["agent-metrics"]
        assert env["WORKER_AGENT_METRICS_PORT"] == str(metrics_port)
        local_metrics = free_port()
        overrides = {
            "WORKER_AGENT_COORDINATOR": ",".join(coordinators),
            "WORKER_AGENT_STATUS_PORT": str(local_status),
            # In the pod it listens on the pod's addresses for the kubelet; here the loopback.
            "WORKER_AGENT_STATUS_HOST": "127.0.0.1",
            # In the pod, on the pod's addresses for Prometheus; here the loopback.
            "WORKER_AGENT_METRICS_PORT": str(local_metrics),
            "WORKER_AGENT_METRICS_HOST": "127.0.0.1",
            "WORKER_AGENT_WEBHOOK": env["WORKER_AGENT_WEBHOOK"].replace(
                listen, f"127.0.0.1:{local_webhook}"
            ),
            "SAMPLE_WORKER_LISTEN": f"127.0.0.1:{local_webhook}",
        }
        url = worker_env["SAMPLE_WORKER_STATUS_URL"]
        assert url.endswith(f":{status_port}"), url
        overrides["SAMPLE_WORKER_STATUS_URL"] = url.removesuffix(str(status_port)) + str(
            local_status
        )
        port_map = {
            status_port: local_status,
            webhook_port: local_webhook,
            metrics_port: local_metrics,
        }
        pod = self._pod(self.worker_t, name, configmaps, overrides, port_map)
        self.group = env["WORKER_AGENT_GROUP"]
        self.workers[name] = pod
        self.worker_ports[name] = port_map
        return pod

    def wait_worker_ready(self, pod: LocalPod) -> None:
        self.wait_ready(pod, self.agent_c, self.worker_ports[pod.name])

    # --- the group ---------------------------------------------------------------------------

    def owner_address(self) -> str:
        assert self.service is not None
        stubs = Stubs(self.service.address)
        try:
            resp = stubs.admin.FindCoordinator(
                admin_pb2.FindCoordinatorRequest(group_id=self.group), timeout=5
            )
        finally:
            stubs.close()
        assert resp.error_code == 0, resp
        return f"{resp.host}:{resp.port}"

    def admin(self, method: str, request: Any) -> Any:
        """An admin call through the Service, sent on to the owner if it answers
        NOT_COORDINATOR (as `coordinator-svc describe` does)."""
        assert self.service is not None
        for address in (self.service.address, self.owner_address()):
            stubs = Stubs(address)
            try:
                resp = getattr(stubs.admin, method)(request, timeout=10)
            finally:
                stubs.close()
            if resp.error_code != 16:
                return resp
        raise AssertionError(f"{method}: NOT_COORDINATOR from the owner too")

    def describe(self) -> Any:
        stubs = Stubs(self.owner_address())
        try:
            resp = stubs.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[self.group]), timeout=10
            )
        finally:
            stubs.close()
        group = resp.groups[0]
        assert group.error_code == 0, group
        return group

    def put_connector(self, name: str, tasks: int) -> None:
        resp = self.admin(
            "PutConnector",
            admin_pb2.PutConnectorRequest(group_id=self.group, connector=name, task_count=tasks),
        )
        assert resp.error_code == 0, resp

    def classic_join(self, group: str) -> Any:
        """A classic worker's first JoinGroup (no member id yet), through the Service."""
        assert self.service is not None
        channel = grpc.insecure_channel(self.service.address)
        try:
            request = classic_pb2.JoinGroupRequest(
                group_id=group,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=60_000,
                protocol_type="connect",
                protocols=[
                    classic_pb2.JoinGroupRequestProtocol(
                        name="compatible",
                        metadata=classic_pb2.ConnectWorkerMetadata(
                            version=1, url="http://127.0.0.1:8083"
                        ),
                    )
                ],
            )
            return classic_pb2_grpc.ConnectGroupClassicStub(channel).JoinGroup(request, timeout=10)
        finally:
            channel.close()

    def group_type(self, group: str) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT group_type FROM groups WHERE group_id = :g"), {"g": group}
            ).scalar()
        return None if found is None else str(found)

    def events(self, after_id: int = 0) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT id, occurred_at, event_type, member_id, group_epoch, payload "
                    "FROM events WHERE group_id = :g AND id > :after ORDER BY id"
                ),
                {"g": self.group, "after": after_id},
            ).mappings()
            return [dict(row) for row in rows]

    def last_event_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM events")).scalar())

    def lease_owner(self) -> str:
        with self.engine.connect() as conn:
            owner = conn.execute(
                sa.text("SELECT owner_id FROM group_leases WHERE group_id = :g"), {"g": self.group}
            ).scalar()
        return str(owner)

    def assignments(self) -> dict[str, Resources]:
        return {m.instance_id: from_cat(m.current_assignment) for m in self.describe().members}

    def converged(self, catalogue: dict[str, int]) -> dict[str, Resources] | None:
        """Per member (by its instance id, the pod name: member ids are random per process)
        its assignment, once the group is STABLE with every catalogue resource on exactly one
        live worker pod, and each sample worker runs exactly its member's share."""
        group = self.describe()
        if group.state != "STABLE" or {m.instance_id for m in group.members} != set(self.workers):
            return None
        shares = {m.instance_id: from_cat(m.current_assignment) for m in group.members}
        everything = sorted(n for share in shares.values() for n in names(share))
        expected = sorted(
            [*catalogue, *(f"{c}-{t}" for c, n in catalogue.items() for t in range(n))]
        )
        if everything != expected:
            return None
        for name, pod in self.workers.items():
            if names(self.worker_runs(pod)) != names(shares[name]):
                return None
        return shares

    def worker_runs(self, pod: LocalPod) -> Resources:
        """What the sample worker of `pod` says it runs (its latest `worker_running` line)."""
        lines = json_events(pod.log_lines("worker"), "worker_running")
        if not lines:
            return frozenset(), frozenset()
        last = lines[-1]
        tasks = set()
        for t in last["tasks"]:
            connector, _, n = t.rpartition("-")
            tasks.add((connector, int(n)))
        return frozenset(last["connectors"]), frozenset(tasks)

    def diagnostics(self) -> str:
        parts = []
        try:
            from coordinator_svc.describe_view import render_group

            parts.append(render_group(self.describe(), now_ms=int(time.time() * 1000)))
        except Exception as error:  # diagnostics must not hide the failure
            parts.append(f"(describe failed: {error})")
        for pod in [*self.coordinators.values(), *self.workers.values()]:
            parts.append(pod.tail())
        return "\n".join(parts)


@pytest.fixture
def rehearsal(
    rendered: dict[str, Rendered], database_url: str, tmp_path: Path
) -> Iterator[Rehearsal]:
    with ExitStack() as stack:
        yield Rehearsal(rendered["dev"], database_url, tmp_path, stack)


CHANGES_OF_OWNER = {
    "GROUP_EPOCH_BUMPED",
    "TARGET_INSTALLED",
    "MEMBER_SESSION_EXPIRED",
    "MEMBER_FENCED",
    "REVOCATION_TIMED_OUT",
    "REVOCATION_REQUESTED",
    "HOLD_RELEASED",
    "SCHEDULED_REBALANCE_SET",
}


def _ts(entry: dict[str, Any]) -> datetime:
    """A JSON log line's time (connect_protocol.logs: UTC, milliseconds)."""
    return datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00"))


def _log_line(lines: list[str], prefix: str) -> dict[str, Any]:
    found = [e for e in json_events_any(lines) if str(e.get("msg", "")).startswith(prefix)]
    assert found, f"no log line starting {prefix!r}:\n" + "\n".join(lines[-20:])
    return found[-1]


def json_events_any(lines: list[str]) -> list[dict[str, Any]]:
    """Every JSON object line."""
    out = []
    for line in lines:
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def check_deletion_order(
    rh: Rehearsal, pod: LocalPod, member_id: str, codes: dict[str, int]
) -> None:
    """One worker pod's deletion went as the manifests promise: the worker's preStop hook
    (`worker-agent leave`) returned 0 after the agent had revoked the work through the webhook
    (the worker stopped it) and left; then the worker got SIGTERM and exited; then the agent
    (a sidecar) got its SIGTERM; nothing was killed."""
    assert codes == {"worker": 0, "worker-agent": 0}, f"{pod.name}: {codes}\n{pod.tail()}"
    assert pod.hook_codes == {"worker": 0}, f"{pod.name}: preStop {pod.hook_codes}\n{pod.tail()}"
    assert pod.when("preStop worker done") <= pod.when("SIGTERM worker")
    assert pod.when("exited worker") <= pod.when("SIGTERM worker-agent")
    assert not [w for _, w in pod.timeline if w.startswith("SIGKILL")], pod.timeline
    worker = pod.log_lines("worker")
    agent = pod.log_lines("worker-agent")
    # The worker stopped everything on the agent's revocation (the webhook), not on SIGTERM.
    last = json_events(worker, "worker_running")[-1]
    assert last["connectors"] == [] and last["tasks"] == [], pod.tail()
    assert last["reason"] == "revoked", last
    stopped = _ts(json_events(worker, "worker_stopped")[-1])
    # ... before the agent left ...
    left = _ts(_log_line(agent, "agent stopped: member"))
    assert stopped <= left, (stopped, left)
    [member_left] = [
        e for e in rh.events() if e["event_type"] == "MEMBER_LEFT" and e["member_id"] == member_id
    ]
    assert member_left["payload"]["static"], member_left
    left_at = member_left["occurred_at"]
    # ... and before the worker exited.
    exited = _ts(json_events(worker, "worker_exit")[-1])
    assert stopped <= left_at <= exited, (stopped, left_at, exited)
    assert stopped <= left <= exited, (stopped, left, exited)


def scraped(port: int, name: str, **labels: str) -> float:
    """The sum of the samples of `name` with `labels` that /metrics on `port` serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


CLASSIC_GROUP = "rehearsal-classic"
MEMBER_ID_REQUIRED = 79


def test_dev_topology_upgrades_rolls_loses_its_owner_and_rides_out_a_database_outage(
    rehearsal: Rehearsal,
) -> None:
    rh = rehearsal
    # --- an upgrade: the previous release's schema, new coordinators, the migration Job -------
    head, _known = code_revisions()
    alembic_command.upgrade(alembic_config(rh.database_url), "0003")
    assert rh.schema() != (head,)
    # One `kubectl apply`: the Deployment's pods and the Job start together. The coordinators
    # wait for the schema (WAIT_FOR_SCHEMA): alive, not started (no gRPC server, so the startup
    # probe fails), never migrating themselves.
    rh.start_coordinators(wait=False)
    for name, pod in rh.coordinators.items():
        wait_for(
            f"{name} to wait for the schema",
            lambda pod=pod: json_events(pod.log_lines("coordinator"), "schema_wait"),
            15,
            pod.tail,
        )
        assert pod.alive(), pod.tail()
        assert not rh.coordinator_probe(name, "startupProbe")
    assert rh.schema() != (head,)
    job = rh.migrate("coordinator-migrate-x7k2p")
    assert "Running upgrade" in "\n".join(job.log_lines("migrate")), job.tail()
    assert rh.schema() == (head,)
    rh.wait_coordinators_ready()
    for pod in rh.coordinators.values():
        assert json_events(pod.log_lines("coordinator"), "schema_ready"), pod.tail()
    # Prometheus scrapes each replica where the pod annotations say.
    annotations = rh.coord_t.metadata["annotations"]
    for name, ports in rh.coordinator_ports.items():
        port = ports[int(annotations["prometheus.io/port"])]
        url = f"http://127.0.0.1:{port}{annotations['prometheus.io/path']}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert b"coordinator_groups" in resp.read(), name
    rh.start_service()
    # The first classic join, once the whole rollout is done (every replica of the new release
    # serving): MEMBER_ID_REQUIRED with a member id to join with, its group stored as classic.
    assert rh.group_type(CLASSIC_GROUP) is None
    joined = rh.classic_join(CLASSIC_GROUP)
    assert joined.error_code == MEMBER_ID_REQUIRED and joined.member_id, joined
    assert rh.group_type(CLASSIC_GROUP) == "classic"
    replicas = rh.worker_t.owner["spec"]["replicas"]
    pods = [rh.worker_pod(i) for i in range(replicas)]
    assert replicas >= 3
    for name, tasks in CATALOGUE.items():
        rh.put_connector(name, tasks)
    # podManagementPolicy: Parallel: every pod at once.
    for pod in pods:
        pod.start()
    for pod in pods:
        rh.wait_worker_ready(pod)
    before = wait_for("the group to converge", lambda: rh.converged(CATALOGUE), 30, rh.diagnostics)
    epoch = rh.describe().group_epoch
    pod_of = {m.member_id: m.instance_id for m in rh.describe().members}  # ids before the roll
    assert all(names(share) for share in before.values()), before  # everyone has work
    mark = rh.last_event_id()

    # --- the StatefulSet's rolling update: highest ordinal first, one at a time ---------------
    for pod in reversed(pods):
        member_of = {m.instance_id: m.member_id for m in rh.describe().members}
        codes = pod.terminate()
        check_deletion_order(rh, pod, member_of[pod.name], codes)
        pod.start()
        rh.wait_worker_ready(pod)
        # The next pod is replaced once this one is ready: it has its own work back.
        wait_for(
            f"{pod.name} to run its work again",
            lambda pod=pod: names(rh.worker_runs(pod)) == names(before[pod.name]),
            15,
            rh.diagnostics,
        )
    after = wait_for("the group to converge", lambda: rh.converged(CATALOGUE), 30, rh.diagnostics)
    events = rh.events(mark)
    kinds = [e["event_type"] for e in events]
    assert rh.describe().group_epoch == epoch, f"{kinds}\n{rh.diagnostics()}"
    assert after == before
    moved = [e for e in events if e["event_type"] in CHANGES_OF_OWNER]
    assert not moved, f"the rolling restart moved work: {moved}"
    # It did go through the static-membership path: each pod left with -2 and came back.
    left = [e for e in events if e["event_type"] == "MEMBER_LEFT"]
    assert sorted(pod_of[e["member_id"]] for e in left) == sorted(before), kinds
    assert all(e["payload"]["static"] for e in left), left
    back = [e for e in events if e["event_type"] in ("MEMBER_REJOINED", "STATIC_MEMBER_REPLACED")]
    pod_of.update({m.member_id: m.instance_id for m in rh.describe().members})  # the new ids
    assert sorted(pod_of[e["member_id"]] for e in back) == sorted(before), kinds

    # --- the owning coordinator dies ---------------------------------------------------------
    owner = rh.lease_owner()
    assert owner in rh.coordinators, (
        f"lease owner {owner!r} is not a pod name (COORDINATOR_NODE_ID)"
    )
    assert rh.owner_address() == rh.coordinator_address[owner]  # the Downward API address
    [survivor] = [n for n in rh.coordinators if n != owner]
    metrics_of = {
        name: ports[int(annotations["prometheus.io/port"])]
        for name, ports in rh.coordinator_ports.items()
    }
    leases = "coordinator_group_lease_changes_total"
    acquired = scraped(metrics_of[survivor], leases, change="acquired")
    mark = rh.last_event_id()
    rh.coordinators[owner].kill()
    assert rh.service is not None
    rh.service.set_endpoints([rh.coordinator_address[survivor]])  # the Endpoints controller
    wait_for(
        "the survivor to own the group", lambda: rh.lease_owner() == survivor, 30, rh.diagnostics
    )
    assert rh.owner_address() == rh.coordinator_address[survivor]
    # The survivor counts the takeover (the dead owner lost nothing it could count).
    assert scraped(metrics_of[survivor], leases, change="acquired") >= acquired + 1
    assert scraped(metrics_of[survivor], leases, change="lost") == 0
    # The workers carry on: nobody fenced itself, nothing moved, everyone stays ready.
    heartbeat_s = (
        int(
            next(
                v["HEARTBEAT_INTERVAL_MS"]
                for v in rh.r.configmaps(rh.ns).values()
                if "HEARTBEAT_INTERVAL_MS" in v
            )
        )
        / 1000
    )
    time.sleep(3 * heartbeat_s)
    for pod in pods:
        assert pod.alive(), pod.tail()
        for kind in ("readinessProbe", "livenessProbe"):
            assert run_probe(
                rh.agent_c[kind], rh.worker_ports[pod.name], container_ports(rh.agent_c)
            ), f"{pod.name} {kind} fails\n{pod.tail()}"
        agent_log = "\n".join(pod.log_lines("worker-agent"))
        assert "fencing itself" not in agent_log, pod.tail()
        # ... as its metrics say too, where the pod annotations point Prometheus.
        agent_metrics = rh.worker_ports[pod.name][
            int(rh.worker_t.metadata["annotations"]["prometheus.io/port"])
        ]
        assert scraped(agent_metrics, "worker_agent_self_fenced_total") == 0, pod.tail()
        assert scraped(agent_metrics, "worker_agent_phase", phase="MEMBER") == 1, pod.tail()
        assert names(rh.worker_runs(pod)) == names(before[pod.name]), pod.tail()
    assert rh.describe().group_epoch == epoch
    assert (
        wait_for("the group to converge", lambda: rh.converged(CATALOGUE), 15, rh.diagnostics)
        == before
    )
    kinds = [e["event_type"] for e in rh.events(mark)]
    assert not set(kinds) & CHANGES_OF_OWNER, kinds
    # ... and they follow the new owner: a new connector is placed and started.
    catalogue = {**CATALOGUE, "payments-source": 2}
    rh.put_connector("payments-source", 2)
    final = wait_for(
        "the new connector to run", lambda: rh.converged(catalogue), 30, rh.diagnostics
    )
    for member, (connectors, tasks) in before.items():
        assert connectors <= final[member][0] and tasks <= final[member][1], (member, final)

    # --- the next upgrade runs the migration Job again --------------------------------------
    mark = rh.last_event_id()
    job = rh.migrate("coordinator-migrate-q9z4m")
    assert rh.schema() == (head,)
    assert "Running upgrade" not in "\n".join(job.log_lines("migrate")), job.tail()
    for kind in ("readinessProbe", "livenessProbe"):
        assert rh.coordinator_probe(survivor, kind), kind
    assert rh.converged(catalogue) == final
    kinds = [e["event_type"] for e in rh.events(mark)]
    assert not set(kinds) & CHANGES_OF_OWNER, kinds

    # --- the database goes away ----------------------------------------------------------------
    lease_s = int(rh.env_of_coordinator()["LEASE_MS"]) / 1000

    def fresh() -> bool:  # the database has just answered the readiness probe
        return rh.unanswered_s(survivor) < 0.2

    # Shorter than the lease: readiness stays SERVING throughout.
    wait_for("a fresh answer from the database", fresh, 10, rh.diagnostics, interval_s=0.05)
    rh.db_proxy.cut("freeze")
    outage_ends = time.monotonic() + lease_s / 3
    while time.monotonic() < outage_ends:
        assert rh.coordinator_probe(survivor, "readinessProbe"), rh.diagnostics()
        time.sleep(0.1)
    rh.db_proxy.restore()
    assert rh.coordinator_probe(survivor, "readinessProbe")
    # Longer: NOT_SERVING once the lease has passed without an answer, SERVING again by itself
    # once the database is back; liveness SERVING all along (it never restarts a coordinator
    # for the database's sake).
    address = rh.coordinator_address[survivor]
    wait_for("a fresh answer from the database", fresh, 10, rh.diagnostics, interval_s=0.05)
    rh.db_proxy.cut("freeze")
    cut_at = time.monotonic()
    wait_for(
        "readiness NOT_SERVING",
        lambda: not rh.coordinator_probe(survivor, "readinessProbe"),
        lease_s + 5,
        rh.diagnostics,
    )
    assert time.monotonic() - cut_at >= lease_s - 0.5, "NOT_SERVING before a lease had passed"
    assert rh.coordinator_probe(survivor, "livenessProbe")
    assert grpc_probe(address, "liveness")
    rh.db_proxy.restore()
    wait_for(
        "readiness SERVING again",
        lambda: rh.coordinator_probe(survivor, "readinessProbe"),
        lease_s + 10,
        rh.diagnostics,
    )
    assert rh.coordinators[survivor].alive()
    # Its leases lapsed during the outage: counted as lost once it learns so (its renewal or
    # the workers' next heartbeats, now that the database answers).
    wait_for(
        "the lapsed leases counted as lost",
        lambda: scraped(metrics_of[survivor], leases, change="lost") >= 1,
        lease_s + 10,
        rh.diagnostics,
    )
    lines = rh.coordinators[survivor].log_lines("coordinator")
    changes = [e["serving"] for e in json_events(lines, "readiness")]
    assert changes[-2:] == [False, True], changes
