"""`coordinator-svc`, the entry point: the argument parser, the checks of its flags, and `main`,
which dispatches to a command and turns its failures into messages and exit codes. The commands
live elsewhere: `serve` and `migrate` in `serve`, the operator commands (describe, list-groups,
connectors, configs) in `admin_client`."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence

from connect_protocol.configs import GROUP_CONFIGS, IntConfig, cross_key_problem
from connect_protocol.env import env_default
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_GRPC_MESSAGE_BYTES
from connect_protocol.safe_text import mask_urls_in, printable
from connect_protocol.tls import (
    TlsConfigError,
    add_client_tls_arguments,
    client_tls,
    plaintext_problem,
)

from .acl_admin import acl_cmd, add_acl_parser
from .admin_client import (
    PlaintextRefused,
    alter_configs_cmd,
    delete_connector_cmd,
    delete_group_cmd,
    describe,
    features_cmd,
    list_groups,
    put_connector_cmd,
    remove_member_cmd,
    restart_cmd,
    target_state_cmd,
)
from .core.model import GroupConfigDefaults
from .core.principals import MappingRulesError, PrincipalSource, parse_mapping_rules
from .core.validation import MAX_NAME_LENGTH, MAX_URL_LENGTH
from .grpc_api.connection_age import (
    DEFAULT_MAX_CONNECTION_AGE_GRACE_MS,
    DEFAULT_MAX_CONNECTION_AGE_MS,
    MAX_CHANNEL_ARG,
    MIN_MAX_CONNECTION_AGE_GRACE_MS,
    MIN_MAX_CONNECTION_AGE_MS,
)
from .retention_admin import (
    add_audit_exports_parser,
    add_retention_flags,
    audit_exports_cmd,
    retention_problem,
)
from .serve import migrate, serve
from .settings_admin import add_settings_parser, settings_cmd

DEFAULT_PORT = 9093
DEFAULT_DATABASE_URL = "sqlite:///coordinator.db"
MAX_MESSAGE_BYTES_ENV = "COORDINATOR_MAX_MESSAGE_BYTES"
#: What the `coordinator` extra installs (the base distribution is the agent's).
SERVER_LIBRARIES = frozenset(
    {
        "sqlalchemy",
        "alembic",
        "psycopg",
        "prometheus_client",
        "grpc_health",
        "grpc_reflection",
        "cryptography",
    }
)


_env = env_default


def _add_max_message_bytes(p: argparse.ArgumentParser, what: str) -> None:
    # The environment's value stays a string so that argparse converts it like the flag's and
    # reports a bad one as a usage error rather than a traceback.
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=os.environ.get(MAX_MESSAGE_BYTES_ENV, DEFAULT_MAX_MESSAGE_BYTES),
        help=f"largest gRPC message {what} sends or accepts, in bytes; raise it when a "
        "PrepareAssignment (every member and the whole catalogue) or an answer to describe "
        f"exceeds it ({MAX_MESSAGE_BYTES_ENV}; default %(default)s)",
    )


def _message_bytes_problem(args: argparse.Namespace) -> str | None:
    """Why --max-message-bytes is unusable, or None (gRPC takes 1 .. 2**31-1)."""
    if not 0 < args.max_message_bytes <= MAX_GRPC_MESSAGE_BYTES:
        return (
            f"--max-message-bytes ({MAX_MESSAGE_BYTES_ENV}) must be between 1 and "
            f"{MAX_GRPC_MESSAGE_BYTES}, not {args.max_message_bytes}"
        )
    return None


def _defaults_problem(args: argparse.Namespace) -> str | None:
    """Why the server's default group configurations are unusable, or None: each within its
    row's bounds, and together within the rules between keys (a member must be able to
    heartbeat before its session expires; AlterGroupConfigs holds groups to the same rules)."""
    for row in GROUP_CONFIGS:
        problem = row.flag_problem(getattr(args, row.field))
        if problem is not None:
            return problem
    values = {row.name: str(getattr(args, row.field)) for row in GROUP_CONFIGS}
    problem = cross_key_problem(values, lambda row, value: f"{row.flag} ({value}, {row.env})")
    return None if problem is None else f"{problem}; lower the one or raise the other"


def _add_group_configs(p: argparse.ArgumentParser) -> None:
    """One flag per group configuration (`connect_protocol.configs.GROUP_CONFIGS`): the
    server's default for groups that do not set it."""
    for row in GROUP_CONFIGS:
        p.add_argument(
            row.flag,
            type=int if isinstance(row, IntConfig) else str,
            default=_env(row.env, row.default),
            help=f"group default for {row.name}: {row.doc} ({row.env})",
        )


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the coordinator",
        description="Run the coordinator. Every flag can also be set by the environment "
        "variable named in its help.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--host",
        default=_env("COORDINATOR_HOST", None),
        help="address to listen on; default: 0.0.0.0 with TLS, 127.0.0.1 without "
        "(COORDINATOR_HOST)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=_env("COORDINATOR_PORT", DEFAULT_PORT),
        help="gRPC port (COORDINATOR_PORT)",
    )
    p.add_argument(
        "--database-url",
        default=_env("DATABASE_URL", DEFAULT_DATABASE_URL),
        help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db; the default is "
        "an embedded SQLite file for trying it out (DATABASE_URL)",
    )
    p.add_argument(
        "--advertised-address",
        default=_env("COORDINATOR_ADVERTISED_ADDRESS", ""),
        help="host:port that FindCoordinator and NOT_COORDINATOR name; default: this "
        "host and --port (COORDINATOR_ADVERTISED_ADDRESS)",
    )
    p.add_argument(
        "--node-id",
        default=_env("COORDINATOR_NODE_ID", ""),
        help="this process's identity in leases; default: host, pid and a random "
        "suffix (COORDINATOR_NODE_ID)",
    )
    _add_group_configs(p)
    defaults = GroupConfigDefaults()
    p.add_argument(
        "--assignment-error-backoff-ms",
        type=int,
        default=_env("ASSIGNMENT_ERROR_BACKOFF_MS", defaults.assignment_error_backoff_ms),
        help="wait before asking again after an assignor reports an error "
        "(ASSIGNMENT_ERROR_BACKOFF_MS)",
    )
    p.add_argument(
        "--max-group-size",
        type=int,
        default=_env("MAX_GROUP_SIZE", defaults.max_group_size),
        help="members per group (MAX_GROUP_SIZE)",
    )
    p.add_argument(
        "--lease-ms",
        type=int,
        default=_env("LEASE_MS", 5_000),
        help="length of a group ownership lease; renewed every quarter of it (a failed "
        "renewal is retried every twentieth, while the lease lasts). Keep it well "
        "under the session timeout minus two heartbeat intervals, so a standby takes a crashed "
        "owner's groups over before agents fence themselves (LEASE_MS; default 5000)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_env("METRICS_PORT", 0),
        help="Prometheus metrics port, 0 = off (METRICS_PORT)",
    )
    p.add_argument(
        "--metrics-host",
        default=_env("METRICS_HOST", None),
        help="address the metrics endpoint listens on; default: --host (METRICS_HOST)",
    )
    _add_limits(p)
    _add_classic(p)
    _add_server_security(p)
    add_retention_flags(p)
    p.add_argument(
        "--max-workers",
        type=int,
        default=_env("GRPC_MAX_WORKERS", 32),
        help="threads for calls that may wait for a group or the database; steady heartbeats "
        "are answered on the gRPC event loop (GRPC_MAX_WORKERS)",
    )
    _add_max_message_bytes(p, "the server")
    p.add_argument(
        "--no-migrate",
        action="store_true",
        default=_env("NO_MIGRATE", "") not in ("", "0", "false"),
        help="do not upgrade the schema on start (NO_MIGRATE=1)",
    )
    p.add_argument(
        "--wait-for-schema",
        nargs="?",
        type=_wait_for_schema,
        const=math.inf,
        default=_env("WAIT_FOR_SCHEMA", None),
        metavar="SECONDS",
        help="do not migrate; if the schema is behind this code's head, wait (checking every "
        "second, logging every 5 s) until a migration Job has brought it there, then start; "
        "give up with exit code 2 after SECONDS if given (WAIT_FOR_SCHEMA=forever or seconds). "
        "Without it, serve migrates itself, or with --no-migrate refuses to start (exit 2)",
    )
    p.add_argument(
        "--allow-newer-schema",
        action="store_true",
        default=_env("ALLOW_NEWER_SCHEMA", "") not in ("", "0", "false"),
        help="a schema ahead of this code's head (a newer release migrated the database) does "
        "not make readiness NOT_SERVING: for a rollback onto a schema the previous release is "
        "known to run on (ALLOW_NEWER_SCHEMA=1)",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=_env("SHUTDOWN_GRACE_S", 5.0),
        help="how long in-flight requests may finish on SIGTERM (SHUTDOWN_GRACE_S)",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="(LOG_LEVEL)")


_WAIT_FOREVER = ("forever", "true", "yes", "on", "inf")
_WAIT_NOT = ("0", "false", "no", "off")


def _wait_for_schema(value: str) -> float | None:
    """--wait-for-schema's value: seconds (> 0), or `forever`; `0`/`false` (from the
    environment): do not wait."""
    text = value.strip().lower()
    if text in _WAIT_FOREVER:
        return math.inf
    if text in _WAIT_NOT:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"expected seconds (> 0) or 'forever', not {value!r} (WAIT_FOR_SCHEMA)"
        )
    return seconds


#: The limits of `serve`: flag, environment variable, GroupConfigDefaults field, what it bounds.
LIMIT_FLAGS = (
    (
        "--max-id-length",
        "MAX_ID_LENGTH",
        "max_id_length",
        "characters of a group, member, instance or connector id (at most 249)",
    ),
    ("--max-url-length", "MAX_URL_LENGTH", "max_url_length", "characters of a member's url"),
    ("--max-groups", "MAX_GROUPS", "max_groups", "groups in the database (all coordinators')"),
    (
        "--max-groups-per-principal",
        "MAX_GROUPS_PER_PRINCIPAL",
        "max_groups_per_principal",
        "groups one principal may create (0: only --max-groups applies; groups created "
        "before this limit existed count only against --max-groups)",
    ),
    (
        "--max-describe-groups",
        "MAX_DESCRIBE_GROUPS",
        "max_describe_groups",
        "group ids one DescribeGroups may name (the ids after it are answered with an error "
        "entry, unread)",
    ),
    (
        "--max-connectors-per-group",
        "MAX_CONNECTORS_PER_GROUP",
        "max_connectors_per_group",
        "connectors in one group's catalogue",
    ),
    (
        "--max-tasks-per-group",
        "MAX_TASKS_PER_GROUP",
        "max_tasks_per_group",
        "tasks of all connectors of one group",
    ),
    (
        "--max-config-bytes-per-connector",
        "MAX_CONFIG_BYTES_PER_CONNECTOR",
        "max_config_bytes_per_connector",
        "bytes of one connector's config (keys and values, UTF-8)",
    ),
    (
        "--max-config-bytes-per-group",
        "MAX_CONFIG_BYTES_PER_GROUP",
        "max_config_bytes_per_group",
        "bytes of all connector configs of one group",
    ),
    (
        "--max-assignor-metadata-bytes",
        "MAX_ASSIGNOR_METADATA_BYTES",
        "max_assignor_metadata_bytes",
        "bytes of a member's client assignor metadata",
    ),
    (
        "--max-assignor-state-bytes",
        "MAX_ASSIGNOR_STATE_BYTES",
        "max_assignor_state_bytes",
        "bytes of an installed assignor state plus its per-member metadata",
    ),
)


#: Limits where 0 means "no limit of this kind".
_MAY_BE_ZERO = frozenset({"--max-groups-per-principal"})


def _add_limits(p: argparse.ArgumentParser) -> None:
    limits = p.add_argument_group(
        "limits",
        "A request over one of these is refused with POLICY_VIOLATION (over a rate: "
        "THROTTLING_QUOTA_EXCEEDED; over a length: INVALID_REQUEST) and changes nothing. Ids "
        "can be at most 249 characters and install error messages are at most 4096 (the "
        "database's columns).",
    )
    defaults = GroupConfigDefaults()
    for flag, env, field_name, what in LIMIT_FLAGS:
        limits.add_argument(
            flag,
            type=int,
            default=_env(env, getattr(defaults, field_name)),
            help=f"most {what} ({env})",
        )
    limits.add_argument(
        "--max-joins-per-s",
        type=float,
        default=_env("MAX_JOINS_PER_S", 2_000.0),
        help="joins (epoch-0 heartbeats) per second per principal, bursts of five times it; "
        "0 = unlimited (MAX_JOINS_PER_S)",
    )
    limits.add_argument(
        "--max-group-creations-per-s",
        type=float,
        default=_env("MAX_GROUP_CREATIONS_PER_S", 100.0),
        help="group creations per second per principal, bursts of five times it; 0 = "
        "unlimited (MAX_GROUP_CREATIONS_PER_S)",
    )
    limits.add_argument(
        "--max-member-calls-per-s",
        type=float,
        default=_env("MAX_MEMBER_CALLS_PER_S", 2_000.0),
        help="ConnectGroupConfigs and ConnectGroupReportStatus calls per second per principal, "
        "together, bursts of five times it; 0 = unlimited (MAX_MEMBER_CALLS_PER_S)",
    )
    limits.add_argument(
        "--status-trace-max-bytes",
        type=int,
        default=_env("STATUS_TRACE_MAX_BYTES", GroupConfigDefaults().status_trace_max_bytes),
        help="bytes of a reported status trace kept per resource; a longer one is cut "
        "(STATUS_TRACE_MAX_BYTES)",
    )


#: The classic protocol's flags (DESIGN 3.19): flag, environment variable, GroupConfigDefaults
#: field, what it is. Kafka's names: group.min/max.session.timeout.ms,
#: group.initial.rebalance.delay.ms, and its constant CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS.
CLASSIC_FLAGS = (
    (
        "--classic-min-session-timeout-ms",
        "CLASSIC_MIN_SESSION_TIMEOUT_MS",
        "classic_min_session_timeout_ms",
        "the shortest session timeout a classic member may ask for (else INVALID_SESSION_TIMEOUT)",
    ),
    (
        "--classic-max-session-timeout-ms",
        "CLASSIC_MAX_SESSION_TIMEOUT_MS",
        "classic_max_session_timeout_ms",
        "the longest session timeout a classic member may ask for (else INVALID_SESSION_TIMEOUT)",
    ),
    (
        "--classic-initial-rebalance-delay-ms",
        "CLASSIC_INITIAL_REBALANCE_DELAY_MS",
        "classic_initial_rebalance_delay_ms",
        "how long an empty classic group's first join phase waits for more members, extended "
        "by this as members arrive, up to the rebalance timeout (0: no wait)",
    ),
    (
        "--classic-new-member-join-timeout-ms",
        "CLASSIC_NEW_MEMBER_JOIN_TIMEOUT_MS",
        "classic_new_member_join_timeout_ms",
        "how long a new classic member's parked JoinGroup keeps it in the group without a "
        "heartbeat (a parked call cannot heartbeat, and a lost client is not noticed)",
    ),
)


def _add_classic(p: argparse.ArgumentParser) -> None:
    classic = p.add_argument_group(
        "classic groups",
        "Groups served by Kafka's JoinGroup/SyncGroup protocol (ConnectGroupClassic). Each "
        "member chooses its own session and rebalance timeouts, within these bounds.",
    )
    defaults = GroupConfigDefaults()
    for flag, env, field_name, what in CLASSIC_FLAGS:
        classic.add_argument(
            flag,
            type=int,
            default=_env(env, getattr(defaults, field_name)),
            help=f"{what} ({env})",
        )


def _classic_problem(args: argparse.Namespace) -> str | None:
    low, high = args.classic_min_session_timeout_ms, args.classic_max_session_timeout_ms
    if not 1 <= low <= high <= MAX_CHANNEL_ARG:
        return (
            "--classic-min-session-timeout-ms and --classic-max-session-timeout-ms must be "
            f"1 <= min <= max <= {MAX_CHANNEL_ARG}, not {low} and {high}"
        )
    if not 0 <= args.classic_initial_rebalance_delay_ms <= MAX_CHANNEL_ARG:
        return (
            f"--classic-initial-rebalance-delay-ms must be between 0 and {MAX_CHANNEL_ARG}, "
            f"not {args.classic_initial_rebalance_delay_ms}"
        )
    if not 1 <= args.classic_new_member_join_timeout_ms <= MAX_CHANNEL_ARG:
        return (
            f"--classic-new-member-join-timeout-ms must be between 1 and {MAX_CHANNEL_ARG}, "
            f"not {args.classic_new_member_join_timeout_ms}"
        )
    return None


def _limits_problem(args: argparse.Namespace) -> str | None:
    if not 1 <= args.max_id_length <= MAX_NAME_LENGTH:
        return f"--max-id-length must be between 1 and {MAX_NAME_LENGTH} (the database's column)"
    if not 1 <= args.max_url_length <= MAX_URL_LENGTH:
        return f"--max-url-length must be between 1 and {MAX_URL_LENGTH}"
    for flag, _env_name, _field, _what in LIMIT_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        lowest = 0 if flag in _MAY_BE_ZERO else 1
        if value < lowest:
            return f"{flag} must be at least {lowest}, not {value}"
    if args.status_trace_max_bytes < 256:
        return f"--status-trace-max-bytes must be at least 256, not {args.status_trace_max_bytes}"
    for flag in ("max_joins_per_s", "max_group_creations_per_s", "max_member_calls_per_s"):
        if getattr(args, flag) < 0:
            return f"--{flag.replace('_', '-')} must be >= 0 (0: unlimited)"
    return None


def _add_server_security(p: argparse.ArgumentParser) -> None:
    tls = p.add_argument_group(
        "transport security",
        "Without --tls-cert the server speaks plaintext, which it does only on a loopback "
        "address unless --allow-plaintext is given (then it logs a warning). The files are "
        "re-read when they change (cert-manager rotation): new connections use the new "
        "certificate, open ones go on.",
    )
    tls.add_argument(
        "--tls-cert",
        default=_env("COORDINATOR_TLS_CERT", None),
        help="PEM certificate chain of the server (COORDINATOR_TLS_CERT)",
    )
    tls.add_argument(
        "--tls-key",
        default=_env("COORDINATOR_TLS_KEY", None),
        help="PEM private key of the server (COORDINATOR_TLS_KEY)",
    )
    tls.add_argument(
        "--tls-client-ca",
        default=_env("COORDINATOR_TLS_CLIENT_CA", None),
        help="PEM CA bundle; when set, every client must present a certificate it signed "
        "(mTLS), whose identity is the call's principal (COORDINATOR_TLS_CLIENT_CA)",
    )
    tls.add_argument(
        "--tls-crl",
        default=_env("COORDINATOR_TLS_CRL", None),
        help="certificate revocation lists (PEM, several in one file, or DER) of the client "
        "CAs: a client certificate they list (issuer and serial) is refused with "
        "UNAUTHENTICATED at its next call. Re-read when the file changes (an unusable new "
        "version keeps the previous CRLs); a CRL signed by a client CA must verify against "
        "it; needs --tls-client-ca (COORDINATOR_TLS_CRL)",
    )
    tls.add_argument(
        "--max-connection-age-ms",
        type=int,
        default=_env("COORDINATOR_MAX_CONNECTION_AGE_MS", DEFAULT_MAX_CONNECTION_AGE_MS),
        help="close every client connection after this long (+-10%%; the client reconnects "
        "with a new TLS handshake, so a removed client CA or an expired certificate is cut "
        f"off); 0: never, else at least {MIN_MAX_CONNECTION_AGE_MS} "
        "(COORDINATOR_MAX_CONNECTION_AGE_MS)",
    )
    tls.add_argument(
        "--max-connection-age-grace-ms",
        type=int,
        default=_env(
            "COORDINATOR_MAX_CONNECTION_AGE_GRACE_MS", DEFAULT_MAX_CONNECTION_AGE_GRACE_MS
        ),
        help="how long calls in flight on a connection past its age may finish before it is "
        f"closed. Rule: at least {MIN_MAX_CONNECTION_AGE_GRACE_MS} ms, the longest a call "
        "waits on the server with this project's clients: a call waits for its group until "
        "its caller's deadline (operator commands: --timeout, 10 s; agents: 5 s); raise it if "
        "your clients set longer deadlines (COORDINATOR_MAX_CONNECTION_AGE_GRACE_MS)",
    )
    tls.add_argument(
        "--allow-plaintext",
        action="store_true",
        default=_env("COORDINATOR_ALLOW_PLAINTEXT", "") not in ("", "0", "false"),
        help="serve plaintext on a non-loopback address (COORDINATOR_ALLOW_PLAINTEXT=1)",
    )
    auth = p.add_argument_group(
        "principals and authorization",
        "A caller's principal is User:<name>, the name taken from its client certificate "
        "(--principal-from) and mapped by --principal-mapping-rules; User:ANONYMOUS without "
        "mTLS. Member and instance ids are bound to the principal that created them, whether "
        "or not authorization is on.",
    )
    auth.add_argument(
        "--principal-from",
        choices=[s.value for s in PrincipalSource],
        default=_env("COORDINATOR_PRINCIPAL_FROM", PrincipalSource.SUBJECT.value),
        help="which field of the client certificate names the principal: the subject "
        "('CN=w1,O=example'), its common name, the first SAN URI (a SPIFFE id) or the first SAN "
        "DNS name (COORDINATOR_PRINCIPAL_FROM)",
    )
    auth.add_argument(
        "--principal-mapping-rules",
        default=_env("COORDINATOR_PRINCIPAL_MAPPING_RULES", "DEFAULT"),
        help="Kafka-style ssl.principal.mapping.rules: comma-separated "
        "RULE:pattern/replacement/[L|U] and DEFAULT, first match wins; a certificate no rule "
        "matches is refused with UNAUTHENTICATED (COORDINATOR_PRINCIPAL_MAPPING_RULES)",
    )
    auth.add_argument(
        "--authorization",
        choices=["none", "acl"],
        default=_env("COORDINATOR_AUTHORIZATION", "none"),
        help="acl: deny every call that no ACL allows (`coordinator-svc acl`); none: allow "
        "everything (COORDINATOR_AUTHORIZATION)",
    )
    auth.add_argument(
        "--describe-config-values",
        choices=["refuse", "allow"],
        default=_env("COORDINATOR_DESCRIBE_CONFIG_VALUES", "refuse"),
        help="with --authorization none: whether DescribeGroups shows connector config values "
        "to a caller that asks for them (include_config_values); with acl, the "
        "DESCRIBE_CONFIGS operation decides. Values are never shown unasked "
        "(COORDINATOR_DESCRIBE_CONFIG_VALUES)",
    )
    auth.add_argument(
        "--super-users",
        default=_env("COORDINATOR_SUPER_USERS", ""),
        help="';'-separated principals allowed everything, e.g. 'User:CN=admin,O=example' "
        "(COORDINATOR_SUPER_USERS)",
    )
    auth.add_argument(
        "--acl-refresh-ms",
        type=int,
        default=_env("COORDINATOR_ACL_REFRESH_MS", 2_000),
        help="how often the ACL table is checked for changes (COORDINATOR_ACL_REFRESH_MS)",
    )
    auth.add_argument(
        "--denial-event-interval-s",
        type=float,
        default=_env("COORDINATOR_DENIAL_EVENT_INTERVAL_S", 60.0),
        help="authenticated denials are written to the events table at most once per "
        "principal, operation and group per this interval (COORDINATOR_DENIAL_EVENT_INTERVAL_S)",
    )


def _server_security_problem(args: argparse.Namespace) -> str | None:
    """Why the serve command's TLS and authorization flags cannot work, or None. Resolves
    --host, --metrics-host and the parsed mapping rules into `args`."""
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together (COORDINATOR_TLS_CERT, COORDINATOR_TLS_KEY)"
    if args.tls_client_ca and not args.tls_cert:
        return "--tls-client-ca needs --tls-cert and --tls-key: mTLS is TLS with client certs"
    problem = _revocation_problem(args)
    if problem is not None:
        return problem
    if args.host is None:
        args.host = "0.0.0.0" if args.tls_cert else "127.0.0.1"
    if args.metrics_host is None:
        args.metrics_host = args.host
    if not args.tls_cert:
        problem = plaintext_problem(
            f"{args.host}:{args.port}", args.allow_plaintext, "--allow-plaintext"
        )
        if problem is not None:
            return (
                problem.replace("Configure TLS", "Configure TLS (--tls-cert, --tls-key)")
                + " (COORDINATOR_ALLOW_PLAINTEXT=1)"
            )
    try:
        args.mapping_rules = parse_mapping_rules(args.principal_mapping_rules)
    except MappingRulesError as error:
        return f"--principal-mapping-rules: {error}"
    args.super_user_set = frozenset(u.strip() for u in args.super_users.split(";") if u.strip())
    for user in args.super_user_set:
        if not user.startswith("User:"):
            return f"--super-users: a principal looks like 'User:<name>', not {user!r}"
    if not 100 <= args.acl_refresh_ms <= 3_600_000:
        return "--acl-refresh-ms must be between 100 and 3600000"
    if not 1.0 <= args.denial_event_interval_s <= 86_400:
        return "--denial-event-interval-s must be between 1 and 86400"
    return None


def _revocation_problem(args: argparse.Namespace) -> str | None:
    """Why --tls-crl or the connection age flags cannot work, or None (the CRLs themselves are
    parsed when the server starts: an unusable one exits with 2 too)."""
    if args.tls_crl:
        if not args.tls_client_ca:
            return "--tls-crl needs --tls-client-ca: CRLs revoke client certificates"
        if not os.access(args.tls_crl, os.R_OK) or not os.path.isfile(args.tls_crl):
            return f"--tls-crl: cannot read the file {args.tls_crl!r} (COORDINATOR_TLS_CRL)"
    age, grace = args.max_connection_age_ms, args.max_connection_age_grace_ms
    if age != 0 and not MIN_MAX_CONNECTION_AGE_MS <= age <= MAX_CHANNEL_ARG:
        return (
            f"--max-connection-age-ms must be 0 (never) or between {MIN_MAX_CONNECTION_AGE_MS} "
            f"and {MAX_CHANNEL_ARG}, not {age}"
        )
    if not MIN_MAX_CONNECTION_AGE_GRACE_MS <= grace <= MAX_CHANNEL_ARG:
        return (
            f"--max-connection-age-grace-ms must be between {MIN_MAX_CONNECTION_AGE_GRACE_MS} "
            f"(the longest a call waits on the server with this project's clients) and "
            f"{MAX_CHANNEL_ARG}, not {grace}"
        )
    return None


def _client_security_problem(args: argparse.Namespace) -> str | None:
    """Why an operator command's TLS flags cannot work, or None; sets `args.tls`."""
    try:
        args.tls = client_tls(args)
    except TlsConfigError as error:
        return str(error)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coordinator-svc",
        description="A KIP-848-style group coordinator for Kafka-Connect-style worker groups.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    m = sub.add_parser(
        "migrate",
        help="upgrade the database schema to the latest version",
        description="Run `alembic upgrade head` against --database-url.",
    )
    m.add_argument(
        "--database-url",
        default=_env("DATABASE_URL", DEFAULT_DATABASE_URL),
        help="SQLAlchemy URL (DATABASE_URL)",
    )

    add_acl_parser(sub, _env("DATABASE_URL", DEFAULT_DATABASE_URL))
    add_settings_parser(sub, _env("DATABASE_URL", DEFAULT_DATABASE_URL))
    add_audit_exports_parser(sub, _env("DATABASE_URL", DEFAULT_DATABASE_URL))

    def client(
        name: str,
        help_text: str,
        parent: argparse._SubParsersAction[argparse.ArgumentParser] = sub,
        description: str | None = None,
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(
            name, help=help_text, description=description or help_text
        )
        p.add_argument(
            "--coordinator",
            default=_env("COORDINATOR", f"127.0.0.1:{DEFAULT_PORT}"),
            help="coordinator host:port (COORDINATOR)",
        )
        p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
        _add_max_message_bytes(p, "this command")
        add_client_tls_arguments(p, "COORDINATOR_CLIENT_", "the command")
        return p

    d = client(
        "describe",
        "show groups: epochs, per member current vs target assignment, "
        "pending revocations, the scheduled rebalance",
    )
    d.add_argument("groups", nargs="+", metavar="GROUP")
    d.add_argument(
        "--show-config-values",
        action="store_true",
        help="show connector config values (needs DESCRIBE_CONFIGS, or a server started with "
        "--describe-config-values allow); by default values read [hidden]",
    )
    d.add_argument(
        "--no-follow",
        dest="follow",
        action="store_false",
        help="do not ask the owning coordinator when this one is not it",
    )
    _add_output(d)
    st = client(
        "status",
        "show each connector and task of groups with its state (RUNNING, FAILED with its "
        "trace, PAUSED, STOPPED, RESTARTING, UNASSIGNED) and the worker that runs it",
        description="Show each connector and task of the groups with the state its holder "
        "last reported under its current grant (UNASSIGNED until it has), the worker running "
        "it and, for FAILED, the trace it reported: Connect's GET /connectors/NAME/status "
        "for every connector of a group. Needs DESCRIBE on each group.",
    )
    st.add_argument("groups", nargs="+", metavar="GROUP")
    st.add_argument(
        "--no-follow",
        dest="follow",
        action="store_false",
        help="do not ask the owning coordinator when this one is not it",
    )
    _add_output(st)
    client("list-groups", "list every group with its state, epoch and member count")
    pc = client("put-connector", "create or update a connector in a group's catalogue")
    pc.add_argument("group")
    pc.add_argument("connector")
    pc.add_argument("--tasks", type=int, required=True, help="number of tasks")
    pc.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    dc = client("delete-connector", "remove a connector and its tasks")
    dc.add_argument("group")
    dc.add_argument("connector")
    _add_lifecycle(client)
    _add_removal(client)
    ac = client("alter-configs", "set or unset a group's configurations")
    ac.add_argument("group")
    ac.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ac.add_argument("--unset", action="append", default=[], metavar="KEY")
    _add_features(sub, client)
    return parser


def _add_lifecycle(client: Callable[..., argparse.ArgumentParser]) -> None:
    """pause, resume, stop and restart (DESIGN 3.20, KIP-875, KIP-745): ALTER on the group."""
    for name, help_, description in (
        (
            "pause",
            "pause a connector and its tasks (they stay assigned; nothing moves)",
            "Set the connector's target state to PAUSED (PauseConnector): its holders are "
            "told and pause it and its tasks, which stay assigned and counted for balance; "
            "the group epoch is not bumped. Pending automatic restarts are cancelled.",
        ),
        (
            "resume",
            "resume a paused or stopped connector",
            "Set the connector's target state to STARTED (ResumeConnector). Resuming a "
            "STOPPED connector brings its tasks back (a rebalance); a PAUSED one moves nothing.",
        ),
        (
            "stop",
            "stop a connector: it stays assigned reporting STOPPED, its tasks leave",
            "Set the connector's target state to STOPPED (StopConnector, KIP-875): the "
            "connector stays assigned and reports STOPPED, its tasks leave the group (a "
            "rebalance); its task count is kept for resume.",
        ),
    ):
        p = client(name, help_, description=description)
        p.add_argument("group")
        p.add_argument("connector")
    r = client(
        "restart",
        "restart a connector, its tasks, or one task (Connect's restart API)",
        description="Request a restart (RestartConnector, KIP-745): of the connector, with "
        "--include-tasks of its tasks too, or of the one --task; --only-failed skips what is "
        "not FAILED. Each selected resource's restart count rises and it reads RESTARTING "
        "until its holder reports; its holder stops and starts it in place (nothing moves). "
        "Prints the plan: each resource, its restart count and the worker restarting it.",
    )
    r.add_argument("group")
    r.add_argument("connector")
    r.add_argument("--task", type=int, default=None, help="restart only this task (its index)")
    r.add_argument("--include-tasks", action="store_true", help="the connector's tasks too")
    r.add_argument("--only-failed", action="store_true", help="only what reads FAILED")


def _add_removal(client: Callable[..., argparse.ArgumentParser]) -> None:
    """delete-group (DELETE on the group) and remove-member (ALTER), DESIGN 3.20."""
    dg = client(
        "delete-group",
        "delete a group with no members (its events are kept)",
        description="Delete a group and all its state (DeleteGroup); its events are kept and "
        "a GROUP_DELETED event is recorded. Refused (NON_EMPTY_GROUP) while it has a member "
        "(a static member that left too), work held for a removed member, a classic state "
        "other than EMPTY, or connectors without --with-catalogue. A group created again "
        "under the id continues its epochs and fencing tokens. Needs DELETE on the group.",
    )
    dg.add_argument("group")
    dg.add_argument(
        "--with-catalogue",
        action="store_true",
        help="delete the group's connectors with it (without it, a group with connectors is "
        "refused)",
    )
    rm = client(
        "remove-member",
        "remove a member for good (as a fence: its work is held, then placed)",
        description="Remove one member of either protocol (RemoveMember), for a worker that "
        "is gone for good: what it held goes to nobody for a session timeout (by when a "
        "worker cut off has stopped it), then is placed; the group rebalances. Name it by "
        "member id or by --instance-id. Needs ALTER on the group.",
    )
    rm.add_argument("group")
    rm.add_argument("member", nargs="?", default=None, help="the member id")
    rm.add_argument("--instance-id", default=None, help="a static member's instance id")
    rm.add_argument("--reason", default="", help="why, for the MEMBER_REMOVED event")


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="text (a readable view, the default) or json (one object per group per line, "
        "DescribeGroups' field names)",
    )


def _add_features(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    client: Callable[..., argparse.ArgumentParser],
) -> None:
    """`features describe|update` (DESIGN 3.19 "Feature flag"), through DescribeFeatures and
    UpdateFeatures: DESCRIBE and ALTER on the cluster when the coordinator authorizes."""
    features = sub.add_parser(
        "features",
        help="show or set the cluster's feature levels (group.version)",
        description="Show or set the cluster's feature levels, held in the coordinators' "
        "database: every coordinator applies a change within its --acl-refresh-ms. "
        "group.version 1 (the default) serves the connect protocol; at 0 no new member is "
        "admitted with it (members already admitted are served, the classic protocol always "
        "is), so groups move to the classic protocol as their workers restart.",
    )
    features_sub = features.add_subparsers(dest="features_command", required=True)
    client(
        "describe",
        "show each feature's level in force and the levels this coordinator supports "
        "(needs DESCRIBE on the cluster)",
        features_sub,
    )
    update = client(
        "update",
        "set a feature's level (needs ALTER on the cluster)",
        features_sub,
        "Set a feature's level through UpdateFeatures (recorded as a FEATURE_UPDATED event "
        "naming the caller). Any level within the supported range may be set, lowering "
        "included; the coordinator called applies it at once, the others within their "
        "--acl-refresh-ms.",
    )
    update.add_argument("--feature", required=True, help="the feature, e.g. group.version")
    update.add_argument("--level", type=int, required=True, help="the level to set")
    update.add_argument(
        "--validate-only",
        action="store_true",
        help="only check the change (authorization, feature, level); change nothing",
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": serve,
    "migrate": migrate,
    "describe": describe,
    "status": describe,
    "list-groups": list_groups,
    "put-connector": put_connector_cmd,
    "delete-connector": delete_connector_cmd,
    "pause": target_state_cmd,
    "resume": target_state_cmd,
    "stop": target_state_cmd,
    "restart": restart_cmd,
    "delete-group": delete_group_cmd,
    "remove-member": remove_member_cmd,
    "alter-configs": alter_configs_cmd,
    "features": features_cmd,
    "acl": acl_cmd,
    "settings": settings_cmd,
    "audit-exports": audit_exports_cmd,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(args, "max_message_bytes"):  # serve and the operator commands
        problem = _message_bytes_problem(args)
        if problem is not None:
            print(f"coordinator-svc {args.command}: {problem}", file=sys.stderr)
            return 2
    if hasattr(args, "allow_plaintext") and args.command != "serve":
        problem = _client_security_problem(args)
        if problem is not None:
            print(f"coordinator-svc {args.command}: {problem}", file=sys.stderr)
            return 2
    if args.command == "serve":
        problem = (
            _defaults_problem(args)
            or _limits_problem(args)
            or _classic_problem(args)
            or _server_security_problem(args)
            or retention_problem(args)
        )
        if problem is not None:
            print(f"coordinator-svc serve: {problem}", file=sys.stderr)
            return 2
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] not in SERVER_LIBRARIES:
            raise
        print(
            f"coordinator-svc {args.command}: the coordinator's libraries are not installed "
            f"(no module {error.name!r}); install them with "
            "pip install 'connect-group-coordinator[coordinator]'",
            file=sys.stderr,
        )
        return 2
    except (PlaintextRefused, TlsConfigError) as error:  # TLS files unusable at start: 2
        print(f"coordinator-svc {args.command}: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the CLI reports, it does not dump a traceback on bad input
        if os.environ.get("COORDINATOR_DEBUG"):
            raise
        shown = printable(mask_urls_in(str(error)))  # it may echo a server's text or a URL
        print(f"coordinator-svc {args.command}: {type(error).__name__}: {shown}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
