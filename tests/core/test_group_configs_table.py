"""Group configurations are one typed table (issue 24 item 7, `connect_protocol.configs`): the
server's defaults, the `serve` flags and their environment variables, the bounds checks and the
rule between keys all derive from its rows."""

from __future__ import annotations

import dataclasses

import pytest

from connect_protocol.configs import (
    ASSIGNMENT_INTERVAL,
    ASSIGNOR_CONFIG_KEYS,
    ASSIGNOR_PRINCIPAL_LIST,
    ASSIGNOR_PRINCIPALS,
    CONFIG_KEYS,
    EVERY_GROUP_TYPE,
    GROUP_CONFIGS,
    GROUP_TYPE_CLASSIC,
    GROUP_TYPE_CONNECT,
    HEARTBEAT_INTERVAL,
    MIGRATION_POLICY,
    RESTART_FAILED_BACKOFF,
    RESTART_FAILED_MAX_ATTEMPTS,
    SCHEDULED_REBALANCE_MAX_DELAY,
    SESSION_TIMEOUT,
    IntConfig,
    applies_to,
    configs_of,
    cross_key_problem,
)
from coordinator_svc.cli import _defaults_problem, build_parser
from coordinator_svc.core.model import GroupConfigDefaults

SERVE = ["serve", "--database-url", "sqlite:///never.db"]


def test_every_row_has_a_server_default_field_with_the_rows_default() -> None:
    defaults = GroupConfigDefaults()
    fields = {f.name for f in dataclasses.fields(GroupConfigDefaults)}
    for row in GROUP_CONFIGS:
        assert row.field in fields, f"GroupConfigDefaults lacks {row.field} for {row.name}"
        assert getattr(defaults, row.field) == row.default, row.name
    assert set(defaults.as_map()) == set(CONFIG_KEYS)
    assert defaults.as_map()[ASSIGNMENT_INTERVAL.name] == "1000"


def test_the_typed_read_falls_back_to_the_servers_default() -> None:
    defaults = GroupConfigDefaults(session_timeout_ms=45_000)
    assert defaults.read(SESSION_TIMEOUT, {}) == 45_000
    assert defaults.read(SESSION_TIMEOUT, {SESSION_TIMEOUT.name: "5000"}) == 5_000
    assert defaults.read(SESSION_TIMEOUT, {SESSION_TIMEOUT.name: "soon"}) == 45_000
    principals = dataclasses.replace(defaults, assignor_principals="User:a, User:CN=b,O=c")
    assert principals.read(ASSIGNOR_PRINCIPAL_LIST, {}) == ("User:a", "User:CN=b,O=c")
    policy = dataclasses.replace(defaults, group_protocol_migration_policy="upgrade")
    assert policy.read(MIGRATION_POLICY, {}) == "upgrade"
    assert policy.read(MIGRATION_POLICY, {MIGRATION_POLICY.name: "disabled"}) == "disabled"
    assert policy.read(MIGRATION_POLICY, {MIGRATION_POLICY.name: "sideways"}) == "upgrade"


def test_only_integer_configurations_are_sent_to_assignors() -> None:
    assert ASSIGNOR_PRINCIPALS not in ASSIGNOR_CONFIG_KEYS
    assert ASSIGNMENT_INTERVAL.name in ASSIGNOR_CONFIG_KEYS


def test_serve_has_a_flag_and_an_environment_variable_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = build_parser().parse_args(SERVE)
    for row in GROUP_CONFIGS:
        assert getattr(args, row.field) == row.default, row.flag
    monkeypatch.setenv(ASSIGNMENT_INTERVAL.env, "250")
    assert ASSIGNMENT_INTERVAL.env == "ASSIGNMENT_INTERVAL_MS"
    assert build_parser().parse_args(SERVE).assignment_interval_ms == 250
    flagged = build_parser().parse_args([*SERVE, "--assignment-interval-ms", "0"])
    assert flagged.assignment_interval_ms == 0
    assert _defaults_problem(flagged) is None


@pytest.mark.parametrize("row", [r for r in GROUP_CONFIGS if isinstance(r, IntConfig)])
def test_serve_refuses_a_default_outside_the_rows_bounds(row: IntConfig) -> None:
    for value in (row.minimum - 1, row.maximum + 1):
        args = build_parser().parse_args([*SERVE, row.flag, str(value)])
        assert _defaults_problem(args) == (
            f"{row.flag} must be between {row.minimum} and {row.maximum}"
        )


def test_the_rule_between_keys_is_written_once_and_named_three_ways() -> None:
    values = {HEARTBEAT_INTERVAL.name: "500", SESSION_TIMEOUT.name: "500"}
    assert cross_key_problem(values) == (
        "heartbeat.interval.ms must be smaller than session.timeout.ms"
    )
    assert cross_key_problem(values, lambda row, value: f"{row.name} ({value})") == (
        "heartbeat.interval.ms (500) must be smaller than session.timeout.ms (500)"
    )
    assert cross_key_problem({HEARTBEAT_INTERVAL.name: "500"}) is None  # one key: not checked
    args = build_parser().parse_args([*SERVE, "--session-timeout-ms", "3000"])
    assert _defaults_problem(args) == (
        "--heartbeat-interval-ms (3000, HEARTBEAT_INTERVAL_MS) must be smaller than "
        "--session-timeout-ms (3000, SESSION_TIMEOUT_MS); lower the one or raise the other"
    )


def test_serve_refuses_a_bad_default_principal_list() -> None:
    args = build_parser().parse_args([*SERVE, "--assignor-principals", "alice"])
    problem = _defaults_problem(args)
    assert problem is not None
    assert problem.startswith("--assignor-principals (ASSIGNOR_PRINCIPALS): assignor.principals")


def test_the_readmes_configuration_table_lists_every_row() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for row in GROUP_CONFIGS:
        line = next((ln for ln in readme.splitlines() if ln.startswith(f"| `{row.name}` |")), "")
        assert f"`{row.flag}` (`{row.env}`)" in line, row.name
        assert f"| {row.type_name} |" in line, row.name
        assert f"| {row.default} |" in line or row.default == "", row.name


def test_each_row_names_the_group_types_it_applies_to() -> None:
    """DESIGN 3.19: connect groups read every configuration; a classic group's members choose
    their own timeouts, so only the leader's delay and who may lead apply to it (AlterGroupConfigs
    on a classic group refuses the others)."""
    assert configs_of(GROUP_TYPE_CONNECT) == GROUP_CONFIGS
    assert {row.name for row in configs_of(GROUP_TYPE_CLASSIC)} == {
        SCHEDULED_REBALANCE_MAX_DELAY.name,
        ASSIGNOR_PRINCIPAL_LIST.name,
        MIGRATION_POLICY.name,
        RESTART_FAILED_MAX_ATTEMPTS.name,  # the coordinator's automatic restarts (DESIGN 3.20)
        RESTART_FAILED_BACKOFF.name,
    }
    for row in GROUP_CONFIGS:
        assert row.group_types <= EVERY_GROUP_TYPE and applies_to(row, GROUP_TYPE_CONNECT)
    assert not applies_to(SESSION_TIMEOUT, GROUP_TYPE_CLASSIC)
    assert applies_to(ASSIGNOR_PRINCIPAL_LIST, GROUP_TYPE_CLASSIC)
