"""Issue 12, fuzzing: thousands of hostile requests per RPC against a real `coordinator-svc
serve` on 127.0.0.1 and PostgreSQL, while a healthy group heartbeats beside the fuzzed ones.

Per RPC (all of ConnectGroupCoordinator, ConnectGroupClassic and ConnectGroupAdmin), two kinds
of request (`tests/support/hostile.py`): well-formed messages with hostile field values, and
raw bodies (random or mutated encodings); then well-formed requests of every RPC mixed, which
drives the fuzzed groups deeper (joins, assignments computed and installed, revocations, catalogue
changes). Every answer must be gRPC OK with an in-band code the RPC documents (never
UNKNOWN_SERVER_ERROR), INVALID_ARGUMENT exactly for an undecodable body, or RESOURCE_EXHAUSTED
for a message over the server's limit; the server's log must gain no traceback and no error line.
After each test: the healthy group never got an error nor went unanswered, and the database
holds its invariants (one holder per resource, member epochs <= group epoch, no orphan rows, no
leases of groups that do not exist).

Examples are derandomized (the same draws every run) and sent in batches of concurrent calls.
The tests share one coordinator, in this order (a Prepare or an Install gets further once
heartbeats have made members and assignor members to name; a pause, restart, resume or stop,
while the catalogues hold connectors that members hold and have reported on (a restart before
the stops, which it is refused for; all before DeleteConnector's examples empty the catalogues);
a SyncGroup, once JoinGroups have handed out member ids and generations). A JoinGroup or
SyncGroup may be held for its phase (parked): those are sent with a short deadline, which may
pass (DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.harness import Batch, FuzzTarget, batches
from tests.support import hostile

ORDER = (
    "PutConnector",
    "AlterGroupConfigs",
    "ConnectGroupHeartbeat",
    "ConnectGroupPrepareAssignment",
    "ConnectGroupInstallAssignment",
    "ConnectGroupConfigs",
    "ConnectGroupReportStatus",
    "PauseConnector",
    "RestartConnector",
    "ResumeConnector",
    "StopConnector",
    "DeleteConnector",
    "RemoveMember",
    "DeleteGroup",
    "ListGroups",
    "DescribeGroups",
    "FindCoordinator",
    "ListAcls",
    "AddAcl",
    "RemoveAcl",
    "DescribeFeatures",
    "UpdateFeatures",
    "JoinGroup",
    "SyncGroup",
    "Heartbeat",
    "LeaveGroup",
)

#: Batches per test; a batch holds 1-12 requests (about 6 on average).
EXAMPLES = {"message": 130, "raw": 110, "mixed": 200}
#: Requests each test must at least have sent of its RPC.
AT_LEAST = {"message": 500, "raw": 400}
#: RPCs whose request has no field: hypothesis runs out of distinct messages (only the batch
#: sizes differ) long before the examples are spent; their raw bodies are fuzzed in full.
NO_FIELDS = {"DescribeFeatures": 50}
#: RPCs fuzzed with fewer examples: Resume- and StopConnector take the very request
#: PauseConnector does (a group and a connector; the same generator and validation), so a
#: third of its examples each covers what differs (their handler's paths). DeleteGroup's request
#: is a group and a flag: a third of the examples covers it.
FEWER = {"ResumeConnector": 3, "StopConnector": 3, "DeleteGroup": 3}


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def test_every_rpc_is_fuzzed() -> None:
    assert sorted(ORDER) == sorted(hostile.RPCS)
    assert len(hostile.RPCS) == 26


@pytest.mark.parametrize(
    ("rpc", "kind"), [(rpc, kind) for rpc in ORDER for kind in ("message", "raw")]
)
def test_hostile_requests_get_allowed_answers(fuzz_target: FuzzTarget, rpc: str, kind: str) -> None:
    examples = EXAMPLES[kind] // FEWER.get(rpc, 1)

    @fuzz_settings(examples)
    @given(batch=batches(fuzz_target.world, [rpc], kind, most=12))
    def fuzz(batch: Batch) -> None:
        fuzz_target.exchange(batch)

    sent = fuzz_target.sent[rpc]
    fuzz_target.begin()
    fuzz()
    print(f"{rpc}, {kind}: {fuzz_target.sent[rpc] - sent} requests")
    least = NO_FIELDS.get(rpc, AT_LEAST[kind]) if kind == "message" else AT_LEAST[kind]
    least //= FEWER.get(rpc, 1)
    assert fuzz_target.sent[rpc] - sent >= least
    fuzz_target.check_afterwards()


def test_mixed_hostile_requests_of_every_rpc(fuzz_target: FuzzTarget) -> None:
    @fuzz_settings(EXAMPLES["mixed"])
    @given(batch=batches(fuzz_target.world, ORDER, "message", most=12))
    def fuzz(batch: Batch) -> None:
        fuzz_target.exchange(batch)

    sent = sum(fuzz_target.sent.values())
    fuzz_target.begin()
    fuzz()
    print(f"mixed: {sum(fuzz_target.sent.values()) - sent} requests")
    assert sum(fuzz_target.sent.values()) - sent >= 3 * EXAMPLES["mixed"]
    fuzz_target.check_afterwards()
