"""ExecHookListener against real subprocesses."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from connect_protocol.resources import ResourceSet
from worker_agent.hooks import ExecHookListener
from worker_agent.listener import ListenerFailed, RebalanceEvent

EVENT = RebalanceEvent.from_resources(
    "revoked",
    ResourceSet.of(["orders-sink"], [("orders-sink", 1), ("orders-sink", 0)]),
    group_id="demo",
    member_id="worker-1",
    member_epoch=12,
)

RECORD = """
import json, os, sys
out = sys.argv[1]
data = sys.stdin.buffer.read()
env = {k: v for k, v in os.environ.items() if k.startswith(("WORKER_AGENT_", "EXTRA_"))}
with open(out, "w") as f:
    json.dump({"stdin": data.decode(), "env": env}, f)
"""


def python_hook(script: str, *args: str, timeout_s: float = 10.0, **kw: object) -> ExecHookListener:
    return ExecHookListener([sys.executable, "-c", script, *args], timeout_s=timeout_s, **kw)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody reaped does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_hook_receives_the_event_json_on_stdin_and_its_kind_in_env(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    python_hook(RECORD, str(out)).on_revoked(EVENT)
    recorded = json.loads(out.read_text())
    assert recorded["stdin"].endswith("\n")
    assert recorded["stdin"].count("\n") == 1
    assert json.loads(recorded["stdin"]) == {**EVENT.to_json(), "release": "batch"}
    assert recorded["env"] == {
        "WORKER_AGENT_EVENT": "revoked",
        "WORKER_AGENT_GROUP_ID": "demo",
        "WORKER_AGENT_MEMBER_ID": "worker-1",
        "WORKER_AGENT_MEMBER_EPOCH": "12",
    }


def test_assigned_events_say_assigned_and_extra_env_is_passed(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assigned = RebalanceEvent.from_resources(
        "assigned", ResourceSet.of(["a"]), group_id="g", member_id="m", member_epoch=3
    )
    python_hook(RECORD, str(out), env={"EXTRA_SETTING": "x"}).on_assigned(assigned)
    recorded = json.loads(out.read_text())
    assert json.loads(recorded["stdin"])["event"] == "assigned"
    assert recorded["env"]["WORKER_AGENT_EVENT"] == "assigned"
    assert recorded["env"]["EXTRA_SETTING"] == "x"


def test_hook_inherits_the_agent_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXTRA_FROM_AGENT", "inherited")
    out = tmp_path / "out.json"
    python_hook(RECORD, str(out)).on_revoked(EVENT)
    assert json.loads(out.read_text())["env"]["EXTRA_FROM_AGENT"] == "inherited"


def test_non_zero_exit_raises_with_the_code_and_stderr_tail() -> None:
    script = "import sys; sys.stderr.write('x' * 5000 + 'connector would not stop'); sys.exit(3)"
    with pytest.raises(ListenerFailed) as failed:
        python_hook(script).on_revoked(EVENT)
    assert failed.value.exit_code == 3
    assert not failed.value.timed_out
    assert "exited with 3" in str(failed.value)
    assert "connector would not stop" in str(failed.value)
    assert failed.value.stderr_tail.endswith("connector would not stop")
    assert len(failed.value.stderr_tail) < 2100  # a tail, not all 5000 bytes


def test_a_hook_killed_by_a_signal_says_so() -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    with pytest.raises(ListenerFailed, match="killed by signal 15") as failed:
        python_hook(script).on_assigned(EVENT)
    assert failed.value.exit_code == -15


def test_a_hanging_hook_is_killed_with_its_process_group_and_reaped(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The hook starts a grandchild, reports both pids, then hangs.
    script = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open({str(pids)!r}, "w") as f:
    f.write(f"{{__import__('os').getpid()}} {{child.pid}}")
sys.stderr.write("stuck stopping orders-sink\\n"); sys.stderr.flush()
time.sleep(60)
"""
    started = time.monotonic()
    with pytest.raises(ListenerFailed) as failed:
        python_hook(script, timeout_s=0.8).on_revoked(EVENT)
    elapsed = time.monotonic() - started
    assert 0.8 <= elapsed < 5.0
    assert failed.value.timed_out
    assert failed.value.exit_code == -9
    assert "still running after 0.8 s" in str(failed.value)
    assert "stuck stopping orders-sink" in str(failed.value)
    hook_pid, grandchild_pid = (int(p) for p in pids.read_text().split())
    assert not Path(f"/proc/{hook_pid}").exists()  # killed and reaped
    deadline = time.monotonic() + 2.0
    while alive(grandchild_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(grandchild_pid)


def test_a_missing_executable_raises_listener_failed(tmp_path: Path) -> None:
    hook = ExecHookListener([str(tmp_path / "no-such-hook")])
    with pytest.raises(ListenerFailed, match="could not start"):
        hook.on_revoked(EVENT)


def test_a_hook_that_ignores_a_large_event_on_stdin_still_succeeds() -> None:
    big = RebalanceEvent.from_resources(
        "assigned",
        ResourceSet.of(["c"], [("c", i) for i in range(20000)]),
        group_id="g",
        member_id="m",
        member_epoch=2,
    )
    python_hook("pass", timeout_s=5.0).on_assigned(big)  # would block on a full pipe


def test_a_background_process_left_by_the_hook_does_not_hold_it_up(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    script = f"""
import subprocess, sys
d = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
open({str(pid_file)!r}, "w").write(str(d.pid))
"""
    started = time.monotonic()
    python_hook(script, timeout_s=5.0).on_assigned(EVENT)
    assert time.monotonic() - started < 4.0
    daemon = int(pid_file.read_text())
    assert alive(daemon)  # success leaves what the hook started alone
    os.kill(daemon, 9)


def test_exec_hook_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        ExecHookListener([])
    with pytest.raises(ValueError):
        ExecHookListener(["true"], timeout_s=0)
