"""The Node worker's exec-hook runner (clients/node/exec_hook.js) on its own, where the
conformance suite does not reach: its command line is split as Python's `shlex.split` splits it,
a hook past its timeout has its whole process group killed (a child it started included), and a
failing hook's message (the FAILED trace) names the exit code and the end of its stderr with
config values masked."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tests.clients.conftest import NodeClient

EXEC_HOOK_JS = Path(__file__).resolve().parents[2] / "clients" / "node" / "exec_hook.js"

SCRIPT = """
const h = require(process.argv[1]);
const [what, arg] = [process.argv[2], JSON.parse(process.argv[3])];
const out = (x) => process.stdout.write(JSON.stringify(x) + '\\n');
const split = (s) => { try { return h.shellSplit(s); } catch (e) { return 'error'; } };
if (what === 'split') out(arg.map(split));
else {
  const body = { event: 'assigned', group_id: 'g', member_id: 'm', member_epoch: 7,
    connectors: ['A'], tasks: [], fencing_tokens: { connectors: { A: 3 }, tasks: [] },
    configs: { A: { digest: 'd', config: { password: 'hunter2-secret' } } } };
  h.runHook(h.shellSplit(arg.command), body, arg.timeoutMs).then(
    (r) => out({ ok: true, ...r }),
    (e) => out({ ok: false, message: e.message, stack: e.stack, timedOut: !!e.timedOut }),
  );
}
"""


def run(node: NodeClient, what: str, arg: object) -> object:
    done = subprocess.run(
        [node.node, "-e", SCRIPT, str(EXEC_HOOK_JS), what, json.dumps(arg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_command_is_split_as_shlex_splits_it(node_client: NodeClient) -> None:
    cases = [
        "python3 -S hook.py out.jsonl",
        "a 'b c' \"d e\" f\\ g",
        '\'it\'\'s\' "x\\"y" "a\\\\b" "$HOME" \'a\\b\'',
        "  leading   and trailing  ",
        "x#y # not a comment",
        '""',
    ]
    assert run(node_client, "split", cases) == [shlex.split(c) for c in cases]
    assert run(node_client, "split", ["'open", '"open', "end\\"]) == ["error"] * 3


def test_the_hook_gets_the_event_and_the_environment_and_exit_0_succeeds(
    node_client: NodeClient, tmp_path: Path
) -> None:
    out = tmp_path / "seen.json"
    code = (
        "import json,os,sys; e=json.load(sys.stdin); "
        f"json.dump({{'event': e, 'env': {{k: v for k, v in os.environ.items() "
        f"if k.startswith('WORKER_AGENT_')}}, 'pgid': os.getpgid(0), 'pid': os.getpid()}}, "
        f"open({str(out)!r}, 'w'))"
    )
    got = run(
        node_client,
        "run",
        {"command": shlex.join([sys.executable, "-c", code]), "timeoutMs": 10000},
    )
    assert got == {"ok": True, "stdout": "", "stderr": ""}, got
    seen = json.loads(out.read_text())
    assert seen["event"]["member_epoch"] == 7 and seen["event"]["connectors"] == ["A"]
    assert seen["env"] == {
        "WORKER_AGENT_EVENT": "assigned",
        "WORKER_AGENT_GROUP_ID": "g",
        "WORKER_AGENT_MEMBER_ID": "m",
        "WORKER_AGENT_MEMBER_EPOCH": "7",
    }
    assert seen["pgid"] == seen["pid"], "the hook runs in a process group of its own"


def test_a_failing_hook_names_its_exit_code_and_stderr_with_values_masked(
    node_client: NodeClient,
) -> None:
    code = "import sys; print('cannot start: password hunter2-secret refused', file=sys.stderr)"
    code += "; sys.exit(4)"
    got = run(
        node_client,
        "run",
        {"command": shlex.join([sys.executable, "-c", code]), "timeoutMs": 10000},
    )
    assert isinstance(got, dict) and got["ok"] is False, got
    assert "(assigned) exited with 4" in got["message"], got
    assert "stderr: cannot start: password *** refused" in got["message"], got
    assert "hunter2" not in got["message"].split("stderr:")[1]
    assert got["stack"] == got["message"]  # the trace is the message, not a JS stack
    missing = run(node_client, "run", {"command": "/nonexistent/hook", "timeoutMs": 10000})
    assert isinstance(missing, dict) and missing["ok"] is False
    assert "could not start" in missing["message"], missing


def test_a_hook_past_its_timeout_has_its_process_group_killed(
    node_client: NodeClient, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess,sys,time; "
        "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
        f"open({str(pid_file)!r},'w').write(str(c.pid)); time.sleep(60)"
    )
    started = time.monotonic()
    got = run(
        node_client, "run", {"command": shlex.join([sys.executable, "-c", code]), "timeoutMs": 1500}
    )
    assert time.monotonic() - started < 10
    assert isinstance(got, dict) and got["ok"] is False and got["timedOut"] is True, got
    assert "still running after 1.5 s; killed its process group" in got["message"], got
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, "the hook's child outlived the timeout"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its init) is gone for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1].startswith(("R", "S", "D"))
