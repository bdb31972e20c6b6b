"""The connector lifecycle in the core (issue 28, DESIGN 3.20): lifecycle revisions, configs
handed to holders only, statuses reported entry by entry and derived on read.

The state machine at the end drives three honest workers and a careless one (it reports with
any token it ever saw, for any resource) through joins, installs, acknowledgements, leaves,
expiries, config changes and connector deletions, and checks after every step: a resource's
status names its current holder under its current grant, or is UNASSIGNED or RESTARTING; a
member's configs name only what it holds; a config change raises exactly its holders'
revisions; a group rebuilt from its records equals the live one (statuses included)."""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import ReportedState, StatusEntry
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import Resource
from coordinator_svc.core.lifecycle import held_connectors
from coordinator_svc.core.model import CONNECTOR_TASK, GroupState, MemberState, StatusState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.status import CUT_MARK, cut_trace, holder_of, views
from tests.core.harness import GroupHarness, rs, stable_group

SECRET = "hunter2"


def token_of(h: GroupHarness, member_id: str, resource: Resource) -> int:
    return h.member(member_id).tokens[resource]


def move(h: GroupHarness, w1: ResourceSet, w2: ResourceSet) -> None:
    """Install a new target: a connector without tasks is added first (an epoch bump to
    compute for), and given to w2."""
    h.put_connector(f"Z{h.group_epoch}", 0)
    state = h.state
    assert state is not None
    extra = rs(*(name for name in state.catalogue if name.startswith("Z")))
    h.compute("w1", {"w1": w1, "w2": w2 | extra})


def test_grants_raise_revisions_and_a_config_change_raises_its_holders_only() -> None:
    h = stable_group()  # w1: A, A-0, A-1; w2: B, B-0
    r1, r2 = h.member("w1").lifecycle_revision, h.member("w2").lifecycle_revision
    assert r1 >= 1 and r2 >= 1
    h.put_connector("A", 2, {"password": SECRET})
    assert h.member("w1").lifecycle_revision == r1 + 1
    assert h.member("w2").lifecycle_revision == r2
    assert h.keepalive("w1").lifecycle_revision == r1 + 1  # every answer carries it
    # The same config again changes nothing; a task count change alone raises nobody's.
    h.put_connector("A", 2, {"password": SECRET})
    assert h.member("w1").lifecycle_revision == r1 + 1
    h.put_connector("B", 2)
    assert h.member("w2").lifecycle_revision == r2
    put = h.logged_events(EventType.CONNECTOR_PUT)[-1]
    assert put.payload["holders_told"] == 0 and SECRET not in str(put.payload)


def test_a_config_change_tells_the_holder_of_a_task_and_a_pending_holder() -> None:
    h = stable_group()
    # Move A-1 to w2: w1 must first give it up (pending), w2 is granted it later.
    move(h, rs("A", "A-0"), rs("B", "B-0", "A-1"))
    h.keepalive("w1")
    assert TaskId("A", 1) in h.member("w1").pending_revocation.tasks
    before = h.member("w1").lifecycle_revision
    h.put_connector("A", 2, {"k": "v2"})
    assert h.member("w1").lifecycle_revision == before + 1


def test_configs_answer_what_the_member_holds_and_nothing_else() -> None:
    h = stable_group()
    h.put_connector("A", 2, {"password": SECRET})
    answer = h.configs("w1", known={"B": "anything"})
    assert answer.error_code == ErrorCode.NONE
    assert [c.connector for c in answer.connectors] == ["A"]
    assert answer.connectors[0].config == {"password": SECRET}
    digest = answer.connectors[0].config_digest
    assert h.configs("w1", known={"A": digest}).connectors[0].config is None
    assert answer.lifecycle_revision == h.member("w1").lifecycle_revision
    assert [c.connector for c in h.configs("w2").connectors] == ["B"]
    assert h.records_of_last_call == []  # a read writes nothing


def test_configs_exclude_pending_revocation_and_refuse_stale_epochs_without_removal() -> None:
    h = stable_group()
    move(h, rs("A-0"), rs("B", "B-0", "A", "A-1"))
    h.keepalive("w1")
    member = h.member("w1")
    assert member.pending_revocation and "A" in member.pending_revocation.connectors
    assert [c.connector for c in h.configs("w1").connectors] == ["A"]  # via A-0 only
    move(h, rs(), rs("B", "B-0", "A", "A-0", "A-1"))
    h.ack("w1")
    assert h.configs("w1").connectors == ()
    stale = h.configs("w1", member_epoch=h.member("w1").member_epoch + 5)
    assert stale.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert h.has_member("w1") and h.records_of_last_call == []
    unknown = h.configs("nobody", member_epoch=3)
    assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_member_moved_by_an_install_may_ask_at_its_old_epoch() -> None:
    h = stable_group()
    old = h.member("w1").member_epoch
    move(h, rs("A", "A-0", "A-1"), rs("B", "B-0"))  # w1 moved epoch-only
    assert h.member("w1").member_epoch > old
    assert h.configs("w1", member_epoch=old).error_code == ErrorCode.NONE


def test_reports_count_per_entry_and_only_under_the_grants_token() -> None:
    h = stable_group()
    token = token_of(h, "w1", "A")
    answer = h.report(
        "w1",
        StatusEntry("A", token, ReportedState.RUNNING),
        StatusEntry(TaskId("A", 0), token, ReportedState.FAILED, "Traceback " + SECRET),
        StatusEntry("B", token_of(h, "w2", "B"), ReportedState.RUNNING),
        StatusEntry(TaskId("A", 1), token + 1, ReportedState.RUNNING),
    )
    codes = [r.error_code for r in answer.results]
    assert codes == [0, 0, ErrorCode.NOT_RESOURCE_OWNER, ErrorCode.NOT_RESOURCE_OWNER]
    state = h.state
    assert state is not None
    shown = {(v.connector, v.task): v for v in views(state)}
    assert shown[("A", CONNECTOR_TASK)].state is StatusState.RUNNING
    assert shown[("A", 0)].state is StatusState.FAILED
    assert shown[("A", 1)].state is StatusState.UNASSIGNED
    assert shown[("B", CONNECTOR_TASK)].state is StatusState.UNASSIGNED
    (event,) = h.last_events(EventType.STATUS_CHANGED)
    assert SECRET not in str(event.payload)
    assert [c["state"] for c in event.payload["changes"]] == ["RUNNING", "FAILED"]
    failed = state.resource_status("A", 0)
    assert failed is not None and failed.trace_digest == event.payload["changes"][1]["trace_digest"]
    assert failed.trace_digest.startswith("sha256:")  # unkeyed here: the core tests have no key
    assert state.status_counts == {StatusState.RUNNING: 1, StatusState.FAILED: 1}
    # The same report again writes nothing.
    h.report("w1", StatusEntry("A", token, ReportedState.RUNNING))
    assert h.records_of_last_call == []
    assert h.dump() == h.rebuilt()


def test_a_rebalance_writes_no_status_and_the_new_holder_reads_unassigned() -> None:
    h = stable_group()
    h.report("w1", StatusEntry("A", token_of(h, "w1", "A"), ReportedState.RUNNING))
    move(h, rs("A-0", "A-1"), rs("B", "B-0", "A"))
    writes = []
    for _ in range(3):
        h.ack("w1")
        writes += h.records_of_last_call
        h.ack("w2")
        writes += h.records_of_last_call
    assert "A" in h.member("w2").assigned.connectors
    assert not any(type(r).__name__ == "StatusRecord" for r in writes)
    state = h.state
    assert state is not None
    view = {(v.connector, v.task): v for v in views(state)}[("A", CONNECTOR_TASK)]
    assert view.state is StatusState.UNASSIGNED and view.worker_id == "w2"
    # The old holder's token does not count for the new holder, nor for itself now.
    old = h.report("w1", StatusEntry("A", 1, ReportedState.FAILED))
    assert old.results[0].error_code == ErrorCode.NOT_RESOURCE_OWNER


def test_a_revoking_member_may_report_under_the_token_it_reported_with() -> None:
    h = stable_group()
    token = token_of(h, "w1", "A")
    h.report("w1", StatusEntry("A", token, ReportedState.RUNNING))
    move(h, rs("A-0", "A-1"), rs("B", "B-0", "A"))
    h.keepalive("w1")
    assert "A" in h.member("w1").pending_revocation.connectors
    later = h.report("w1", StatusEntry("A", token, ReportedState.FAILED, "stopping failed"))
    assert later.results[0].error_code == ErrorCode.NONE
    wrong = h.report("w1", StatusEntry("A", token + 9, ReportedState.RUNNING))
    assert wrong.results[0].error_code == ErrorCode.NOT_RESOURCE_OWNER


def test_deleting_a_connector_deletes_its_statuses() -> None:
    h = stable_group()
    token = token_of(h, "w1", "A")
    h.report("w1", StatusEntry("A", token, ReportedState.RUNNING))
    h.delete_connector("A")
    state = h.state
    assert state is not None and "A" not in state.statuses
    assert not state.status_counts.get(StatusState.RUNNING)
    assert h.dump() == h.rebuilt()


def test_traces_are_cut_to_the_limit_on_a_character_boundary() -> None:
    trace = "é" * 5_000  # two bytes each
    cut = cut_trace(trace, 4_096)
    assert len(cut.encode()) <= 4_096 and cut.endswith(CUT_MARK.format(limit=4_096))
    assert cut_trace("short", 4_096) == "short"


# --- the state machine ------------------------------------------------------------------------

MEMBERS = ("w0", "w1", "w2")
CATALOGUE = {"A": 2, "B": 1}


def _resources() -> list[Resource]:
    out: list[Resource] = []
    for name, tasks in CATALOGUE.items():
        out.append(name)
        out.extend(TaskId(name, t) for t in range(tasks))
    return out


RESOURCES = _resources()
STATES = list(ReportedState)


def _held(resource: Resource, held: ResourceSet) -> bool:
    if isinstance(resource, str):
        return resource in held.connectors
    return resource in held.tasks


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = GroupHarness()
        self.seen_tokens: set[int] = {1}
        self.version = 0

    @initialize()
    def catalogue(self) -> None:
        for name, tasks in CATALOGUE.items():
            self.h.put_connector(name, tasks, {"v": "0"})
        self.settle([0, 1, 2, 0, 1])  # most runs start from a formed group

    def joined(self) -> list[str]:
        state = self.h.state
        if state is None:
            return []
        return [m for m in MEMBERS if m in state.members]

    @rule(member=st.sampled_from(MEMBERS))
    def join(self, member: str) -> None:
        if member not in self.joined():
            self.h.join(member)

    @rule(member=st.sampled_from(MEMBERS))
    def leave(self, member: str) -> None:
        if member in self.joined():
            self.h.leave(member)

    @rule(member=st.sampled_from(MEMBERS))
    def ack(self, member: str) -> None:
        if member in self.joined():
            self.h.ack(member)
            self.seen_tokens.update(self.h.member(member).tokens.values())

    @rule(owners=st.lists(st.integers(0, 2), min_size=len(RESOURCES), max_size=len(RESOURCES)))
    def compute(self, owners: list[int]) -> None:
        joined = self.joined()
        state = self.h.state
        if not joined or state is None or state.meta.assignor_member_id is None:
            return
        prepared = self.h.prepare(state.meta.assignor_member_id)
        if prepared.error_code != ErrorCode.NONE:
            return
        shares: dict[str, list[Resource]] = {m: [] for m in joined}
        # Effective task counts (DESIGN 3.20: a STOPPED connector's tasks are not offered).
        catalogue = {c.name: c.task_count for c in prepared.catalogue}
        for resource, owner in zip(RESOURCES, owners, strict=True):
            name = resource if isinstance(resource, str) else resource.connector
            if name in catalogue and (isinstance(resource, str) or resource.task < catalogue[name]):
                shares[joined[owner % len(joined)]].append(resource)
        targets = {
            m: ResourceSet.of(
                [r for r in rs_ if isinstance(r, str)], [r for r in rs_ if not isinstance(r, str)]
            )
            for m, rs_ in shares.items()
        }
        self.h.install(state.meta.assignor_member_id, targets)

    @rule(
        member=st.sampled_from(MEMBERS),
        index=st.integers(0, len(RESOURCES) - 1),
        state=st.sampled_from(STATES),
        honest=st.booleans(),
        pick=st.integers(0, 50),
    )
    def report(
        self, member: str, index: int, state: ReportedState, honest: bool, pick: int
    ) -> None:
        if member not in self.joined():
            return
        m = self.h.member(member)
        held = sorted(m.tokens.items(), key=str)
        if honest and held:
            resource, token = held[index % len(held)]
        else:
            resource = RESOURCES[index]
            tokens = sorted(self.seen_tokens)
            token = tokens[pick % len(tokens)]
        if state is ReportedState.STOPPED and not isinstance(resource, str):
            state = ReportedState.FAILED
        answer = self.h.report(member, StatusEntry(resource, token, state, f"trace {pick}"))
        assert answer.error_code == ErrorCode.NONE, answer
        counted = answer.results[0].error_code == ErrorCode.NONE
        event("report counted" if counted else "report refused")
        held_now = m.tokens.get(resource) == token
        spec = self.h.state.catalogue.get(  # type: ignore[union-attr]
            resource if isinstance(resource, str) else resource.connector
        )
        exists = spec is not None and (
            isinstance(resource, str) or resource.task < spec.effective_task_count
        )
        if held_now and exists:
            assert counted
        if not exists:  # a deleted connector's, or a STOPPED one's task (DESIGN 3.20)
            assert not counted
        if not _held(resource, m.assigned) and not _held(resource, m.pending_revocation):
            assert not counted

    @rule()
    def reconfigure(self) -> None:
        state = self.h.state
        assert state is not None
        before = {m: state.members[m].lifecycle_revision for m in self.joined()}
        holders = {
            holder.member_id
            for task in range(-1, CATALOGUE["A"])
            if (holder := holder_of(state, "A", task)) is not None
        }
        self.version += 1
        self.h.put_connector("A", CATALOGUE["A"], {"v": str(self.version)})
        for member_id, revision in before.items():
            after = self.h.member(member_id).lifecycle_revision
            assert after == revision + (1 if member_id in holders else 0), member_id

    @rule()
    def delete_and_restore_b(self) -> None:
        self.h.delete_connector("B")
        self.h.put_connector("B", CATALOGUE["B"], {"v": "0"})

    @rule(owners=st.lists(st.integers(0, 2), min_size=len(RESOURCES), max_size=len(RESOURCES)))
    def settle(self, owners: list[int]) -> None:
        """Every member joined, a target computed, and everyone acknowledging until settled."""
        for member in MEMBERS:
            self.join(member)
        for _ in range(2):
            for member in self.joined():
                self.ack(member)
        self.compute(owners)
        for _ in range(3):
            for member in self.joined():
                self.ack(member)

    @rule(ms=st.sampled_from([100, 600, 1_200]))
    def sleep(self, ms: int) -> None:
        self.h.sleep(ms)

    @invariant()
    def statuses_name_their_holder(self) -> None:
        state = self.h.state
        if state is None:
            return
        for view in views(state):
            holder = holder_of(state, view.connector, view.task)
            if view.state in (StatusState.UNASSIGNED, StatusState.RESTARTING):
                continue
            assert holder is not None and view.worker_id == holder.member_id, view
            stored = state.resource_status(view.connector, view.task)
            assert stored is not None and stored.member_id == holder.member_id
            resource: Resource = (
                view.connector if view.task == CONNECTOR_TASK else TaskId(view.connector, view.task)
            )
            token = holder.tokens.get(resource)
            assert token is None or token == stored.token  # None: pending revocation
            event(f"a status {view.state.value} read")

    @invariant()
    def configs_name_only_held_connectors(self) -> None:
        state: GroupState | None = self.h.state
        if state is None:
            return
        for member_id in self.joined():
            member = state.members[member_id]
            if member.state is MemberState.LEFT:
                continue
            answer = self.h.configs(member_id)
            assert answer.error_code == ErrorCode.NONE, answer
            named = [c.connector for c in answer.connectors]
            assert named == [c for c in held_connectors(member) if c in state.catalogue]

    @invariant()
    def rebuilt_equals_live(self) -> None:
        assert self.h.dump() == self.h.rebuilt()


LifecycleMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_lifecycle_machine = LifecycleMachine.TestCase
