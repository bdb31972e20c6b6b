"""The .proto files as a contract: `buf lint` (STANDARD and COMMENTS, excepting only the three rules
the contract's names break on purpose, DESIGN 2.1) and `buf breaking` against the baseline image
committed in protos/baseline/, which fails on any wire- or generated-code-incompatible change."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.coordinator import REPO

PROTOS = REPO / "protos"
BASELINE = PROTOS / "baseline" / "connect-group-v1.binpb"
COMMON = "connect/group/v1/common.proto"
COORDINATOR = "connect/group/v1/coordinator.proto"
ADMIN = "connect/group/v1/admin.proto"
CLASSIC = "connect/group/v1/classic.proto"
#: The STANDARD rules the contract's names break (DESIGN 2.1), and nothing else.
CONTRACT_EXCEPTIONS = {
    "ENUM_VALUE_PREFIX": {COMMON},
    "ENUM_ZERO_VALUE_SUFFIX": {COMMON},
    "SERVICE_SUFFIX": {ADMIN, CLASSIC, COORDINATOR},
}


def run_buf(buf: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(buf), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def findings(output: str) -> list[dict[str, object]]:
    """buf's `--error-format json` output: one JSON object per line."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def copy_protos(tmp_path: Path) -> Path:
    """protos/ (the .proto files and buf.yaml, not the baseline) copied to `tmp_path/protos`."""
    out = tmp_path / "protos"
    shutil.copytree(PROTOS, out, ignore=shutil.ignore_patterns("baseline", "*.md"))
    return out


def edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not exactly once in {relative}"
    path.write_text(text.replace(old, new))


def configured_ignores(buf_yaml: str) -> dict[str, set[str]]:
    """The `lint.ignore_only` mapping of protos/buf.yaml (rule -> paths), read without a YAML
    library: rule keys are indented by four spaces under `ignore_only:`, paths by six."""
    block = buf_yaml.split("ignore_only:", 1)[1]
    out: dict[str, set[str]] = {}
    rule = ""
    for line in block.splitlines()[1:]:
        if m := re.match(r"^    ([A-Z_]+):", line):
            rule = m.group(1)
            out[rule] = set()
        elif m := re.match(r"^      - (\S+)", line):
            out[rule].add(m.group(1))
        elif line.strip() and not line.startswith("    "):
            break
    return out


def test_buf_lint_passes_on_the_contract(buf: Path) -> None:
    result = run_buf(buf, "lint", "--error-format", "json", cwd=PROTOS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_excepts_exactly_the_rules_the_contract_names_break(buf: Path) -> None:
    plain = json.dumps({"version": "v2", "lint": {"use": ["STANDARD", "COMMENTS"]}})
    result = run_buf(buf, "lint", "--config", plain, "--error-format", "json", cwd=PROTOS)
    assert result.returncode != 0, "without exceptions the contract's names must break lint"
    broken: dict[str, set[str]] = {}
    for finding in findings(result.stdout):
        broken.setdefault(str(finding["type"]), set()).add(str(finding["path"]))
    assert broken == CONTRACT_EXCEPTIONS, result.stdout
    assert configured_ignores((PROTOS / "buf.yaml").read_text()) == CONTRACT_EXCEPTIONS


@pytest.mark.parametrize(
    ("relative", "old", "new", "rule"),
    [
        pytest.param(
            ADMIN,
            "message ListGroupsRequest {\n",
            "message ListGroupsRequest {\n  // Bad name.\n  string groupFilter = 3;\n",
            "FIELD_LOWER_SNAKE_CASE",
            id="camelCase-field",
        ),
        pytest.param(
            ADMIN,
            "message ListGroupsRequest {\n",
            "message ListGroupsRequest {\n  string group_filter = 3;\n",
            "COMMENT_FIELD",
            id="uncommented-field",
        ),
    ],
)
def test_buf_lint_fails_on_a_badly_written_copy(
    buf: Path, tmp_path: Path, relative: str, old: str, new: str, rule: str
) -> None:
    root = copy_protos(tmp_path)
    edit(root, relative, old, new)
    result = run_buf(buf, "lint", "--error-format", "json", cwd=root)
    assert result.returncode != 0
    assert {f["type"] for f in findings(result.stdout)} == {rule}, result.stdout


def test_the_exceptions_do_not_cover_a_new_file(buf: Path, tmp_path: Path) -> None:
    root = copy_protos(tmp_path)
    (root / "connect/group/v1/extra.proto").write_text(
        "// An extra file.\n"
        'syntax = "proto3";\n\n'
        "package connect.group.v1;\n\n"
        'option go_package = "example.com/connectgroup/gen/go/connect/group/v1;groupv1";\n'
        "option java_multiple_files = true;\n"
        'option java_package = "io.connectgroup.v1";\n\n'
        "// A service named like the contract's.\n"
        "service ConnectGroupExtra {\n"
        "  // Does nothing.\n"
        "  rpc Ping(PingRequest) returns (PingResponse);\n"
        "}\n\n"
        "// Ping.\nmessage PingRequest {}\n\n// Pong.\nmessage PingResponse {}\n"
    )
    result = run_buf(buf, "lint", "--error-format", "json", cwd=root)
    assert {f["type"] for f in findings(result.stdout)} == {"SERVICE_SUFFIX"}, result.stdout


def test_buf_breaking_passes_against_the_committed_baseline(buf: Path) -> None:
    assert BASELINE.is_file(), "run scripts/update-proto-baseline and commit its output"
    result = run_buf(
        buf, "breaking", str(PROTOS), "--against", str(BASELINE), "--error-format", "json", cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr


def breaking(buf: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return run_buf(
        buf, "breaking", str(root), "--against", str(BASELINE), "--error-format", "json", cwd=REPO
    )


@pytest.mark.parametrize(
    ("relative", "old", "new", "rules"),
    [
        pytest.param(
            COMMON,
            "  int32 task = 2;\n}",
            "  int32 task = 3;\n}",
            {"FIELD_NO_DELETE"},
            id="renumber-field",
        ),
        pytest.param(
            COORDINATOR, "optional string url = 9;", "", {"FIELD_NO_DELETE"}, id="delete-field"
        ),
        pytest.param(
            COORDINATOR,
            "int32 heartbeat_interval_ms = 5;",
            "int64 heartbeat_interval_ms = 5;",
            {"FIELD_SAME_TYPE"},
            id="retype-field",
        ),
        pytest.param(
            COMMON,
            "FENCED_MEMBER_EPOCH = 110;",
            "",
            {"ENUM_VALUE_NO_DELETE"},
            id="delete-enum-value",
        ),
        pytest.param(
            COMMON,
            "COMPUTE_ASSIGNMENT = 10001;",
            "COMPUTE_ASSIGNMENT = 10099;",
            {"ENUM_VALUE_NO_DELETE"},
            id="renumber-enum-value",
        ),
        pytest.param(
            ADMIN,
            "rpc DescribeGroups(",
            "rpc DescribeGroup(",
            {"RPC_NO_DELETE"},
            id="rename-rpc",
        ),
    ],
)
def test_buf_breaking_fails_on_a_deliberately_broken_copy(
    buf: Path, tmp_path: Path, relative: str, old: str, new: str, rules: set[str]
) -> None:
    root = copy_protos(tmp_path)
    edit(root, relative, old, new)
    result = breaking(buf, root)
    assert result.returncode != 0, "buf breaking accepted an incompatible change"
    found = {str(f["type"]) for f in findings(result.stdout)}
    assert rules <= found, result.stdout + result.stderr


def test_buf_breaking_accepts_a_compatible_addition(buf: Path, tmp_path: Path) -> None:
    root = copy_protos(tmp_path)
    edit(
        root,
        ADMIN,
        "message ListGroupsRequest {\n",
        "message ListGroupsRequest {\n  // Only groups whose id starts with this.\n"
        "  optional string prefix = 3;\n",
    )
    for command in (["lint"], ["breaking", "--against", str(BASELINE)]):
        args: Sequence[str] = [*command, "--error-format", "json"]
        result = run_buf(buf, *args, cwd=root)
        assert result.returncode == 0, f"buf {command[0]}: {result.stdout}{result.stderr}"
