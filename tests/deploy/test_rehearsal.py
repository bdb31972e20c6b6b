"""A rehearsal of the dev overlay's topology without Kubernetes.

From the rendered manifests: the migration Job, the coordinator Deployment's replicas (two
`coordinator-svc serve` processes on one PostgreSQL), its Service (a round-robin proxy), and the
worker StatefulSet's pods (each a `worker-agent run` sidecar process beside a sample worker
process). Commands, flags and environment variables are the manifests' (ConfigMaps, Secrets and
the Downward API resolved as the kubelet does); only addresses and ports are local: the database
URL is the test's, each pod's IP is 127.0.0.1, each port a free one. Probes are the manifests'
probes, run against the processes.

Then what the StatefulSet does on a rolling update (pods replaced one by one in reverse ordinal
order, each SIGTERMed, waited for, started again under the same name and waited for until ready)
must leave the group epoch and every assignment unchanged, with no change of owner in the
coordinator's events; and killing the coordinator that owns the group must let the other take
over while the workers carry on.
"""

from __future__ import annotations

import copy
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2

from tests.deploy.k8s import (
    Obj,
    PodFacts,
    PodTemplate,
    Rendered,
    container_env,
    container_ports,
)
from tests.deploy.local import (
    LocalContainer,
    LocalPod,
    ServiceProxy,
    image_env,
    json_events,
    local_argv,
    run_probe,
    wait_for,
)
from tests.deploy.test_manifests import AGENT, COORDINATOR, MIGRATE, resolve_service
from tests.support.client import from_cat, names
from tests.support.coordinator import Stubs, free_port

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
    ) -> LocalPod:
        home = self.tmp / name
        home.mkdir(exist_ok=True)
        containers = []
        for c in template.containers:
            env = container_env(c, PodFacts(name, self.ns, "127.0.0.1"), configmaps, self.secrets)
            env = {**image_env(home), **env, **{k: v for k, v in extra_env.items() if k in env}}
            containers.append(LocalContainer(c["name"], local_argv(c), env, c))
        grace = float(template.spec.get("terminationGracePeriodSeconds", 30))
        pod = LocalPod(name, containers, self.tmp, grace)
        self.stack.callback(pod.close)
        return pod

    def migrate(self) -> None:
        pod = self._pod(self.job_t, "coordinator-migrate-x7k2p", self.r.configmaps(self.ns), {})
        pod.start()
        # A Job's pod runs to completion.
        codes = {name: proc.wait(120) for name, proc in pod.procs.items()}
        assert codes == {"migrate": 0}, pod.tail()

    def start_coordinators(self) -> None:
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
            self.coordinators[name] = pod
            self.coordinator_ports[name] = local
            self.coordinator_address[name] = f"127.0.0.1:{local[ports['grpc']]}"
            pod.start()
        for name in self.coordinators:
            self.wait_ready(self.coordinators[name], self.coord_c, self.coordinator_ports[name])

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
        overrides = {
            "WORKER_AGENT_COORDINATOR": ",".join(coordinators),
            "WORKER_AGENT_STATUS_PORT": str(local_status),
            # In the pod it listens on the pod's addresses for the kubelet; here the loopback.
            "WORKER_AGENT_STATUS_HOST": "127.0.0.1",
        }
        url = env["SAMPLE_WORKER_STATUS_URL"]
        assert url.endswith(f":{status_port}"), url
        overrides["SAMPLE_WORKER_STATUS_URL"] = url.removesuffix(str(status_port)) + str(
            local_status
        )
        pod = self._pod(self.worker_t, name, configmaps, overrides)
        self.group = env["WORKER_AGENT_GROUP"]
        self.workers[name] = pod
        self.worker_ports[name] = {status_port: local_status}
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

    def events(self, after_id: int = 0) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT id, event_type, member_id, group_epoch, payload FROM events "
                    "WHERE group_id = :g AND id > :after ORDER BY id"
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


def test_dev_topology_survives_a_rolling_restart_and_the_loss_of_the_owning_coordinator(
    rehearsal: Rehearsal,
) -> None:
    rh = rehearsal
    # The migration Job first (README: upgrade = migrations first), then the Deployment.
    rh.migrate()
    rh.start_coordinators()
    # Prometheus scrapes each replica where the pod annotations say.
    annotations = rh.coord_t.metadata["annotations"]
    for name, ports in rh.coordinator_ports.items():
        port = ports[int(annotations["prometheus.io/port"])]
        url = f"http://127.0.0.1:{port}{annotations['prometheus.io/path']}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert b"coordinator_groups" in resp.read(), name
    rh.start_service()
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
        codes = pod.terminate()
        assert codes == {"worker": 0, "worker-agent": 0}, f"{pod.name}: {codes}\n{pod.tail()}"
        stopped = json_events(pod.log_lines("worker"), "worker_running")[-1]
        assert stopped["connectors"] == [] and stopped["tasks"] == [], pod.tail()
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
    mark = rh.last_event_id()
    rh.coordinators[owner].kill()
    assert rh.service is not None
    rh.service.set_endpoints([rh.coordinator_address[survivor]])  # the Endpoints controller
    wait_for(
        "the survivor to own the group", lambda: rh.lease_owner() == survivor, 30, rh.diagnostics
    )
    assert rh.owner_address() == rh.coordinator_address[survivor]
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
