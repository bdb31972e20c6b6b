"""The commands that run against the coordinator's database: `serve` (store, group manager, gRPC
server, metrics, signals and graceful shutdown) and `migrate` (schema upgrade). Their heavy
libraries (SQLAlchemy, grpc, ...) are imported only when a command runs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING

from connect_protocol import logs
from connect_protocol.configs import GROUP_CONFIGS

from .core.model import GroupConfigDefaults

if TYPE_CHECKING:
    from .grpc_api.tls import ServerTls
    from .runtime.event_pruner import EventPruner
    from .store import SqlStore

log = logging.getLogger("coordinator")


def serve(args: argparse.Namespace) -> int:
    from .core.principals import PrincipalMapper, PrincipalSource
    from .grpc_api.server import CoordinatorServer
    from .grpc_api.tls import ServerTls
    from .metrics import Metrics
    from .runtime import gc_pauses
    from .runtime.authorizer import Authorizer
    from .runtime.features import FeatureLevels
    from .runtime.groups import GroupManager
    from .runtime.quotas import PrincipalQuotas
    from .runtime.readiness import ReadinessMonitor
    from .store import SecretMissing, SqlStore, stored_sets
    from .store.migrate import code_revisions

    logs.configure(args.log_level)
    host = args.host
    advertised = args.advertised_address or (
        f"{host if host not in ('0.0.0.0', '::', '[::]') else socket.getfqdn()}:{args.port}"
    )
    node_id = args.node_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    defaults = GroupConfigDefaults(
        **{row.field: getattr(args, row.field) for row in GROUP_CONFIGS},
        assignment_error_backoff_ms=args.assignment_error_backoff_ms,
        max_group_size=args.max_group_size,
        max_message_bytes=args.max_message_bytes,
        max_id_length=args.max_id_length,
        max_url_length=args.max_url_length,
        max_groups=args.max_groups,
        max_groups_per_principal=args.max_groups_per_principal,
        max_describe_groups=args.max_describe_groups,
        max_connectors_per_group=args.max_connectors_per_group,
        max_tasks_per_group=args.max_tasks_per_group,
        max_config_bytes_per_connector=args.max_config_bytes_per_connector,
        max_config_bytes_per_group=args.max_config_bytes_per_group,
        max_assignor_metadata_bytes=args.max_assignor_metadata_bytes,
        max_assignor_state_bytes=args.max_assignor_state_bytes,
        status_trace_max_bytes=args.status_trace_max_bytes,
        classic_min_session_timeout_ms=args.classic_min_session_timeout_ms,
        classic_max_session_timeout_ms=args.classic_max_session_timeout_ms,
        classic_initial_rebalance_delay_ms=args.classic_initial_rebalance_delay_ms,
        classic_new_member_join_timeout_ms=args.classic_new_member_join_timeout_ms,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("shutting down", extra=logs.fields(event="shutdown", signal=signum))
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = SqlStore(
        args.database_url, owner_id=node_id, advertised_address=advertised, lease_ms=args.lease_ms
    )
    head, known = code_revisions()
    try:
        revisions = _prepare_schema(args, store, head, known, stop)
    except BaseException:
        store.close()
        raise
    if isinstance(revisions, int):
        store.close()
        return revisions
    try:
        defaults = dataclasses.replace(defaults, config_digest_key=store.config_digest_key())
    except SecretMissing as error:
        store.close()
        print(f"coordinator-svc serve: {error}", file=sys.stderr)
        return 2
    stored_set_form = store.stored_set_form()
    stored_sets.use_ranges(stored_set_form == "ranges")
    if stored_set_form != "ranges":
        log.warning(
            "large resource sets are stored task by task (stored_set_form %s): once every "
            "coordinator of this database runs this release, switch with `coordinator-svc "
            "settings set stored_set_form ranges` and restart them",
            stored_set_form,
            extra=logs.fields(event="stored_set_form", stored_set_form=stored_set_form),
        )
    metrics = Metrics()
    manager = GroupManager(store, defaults, metrics)
    tls = (
        ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca or None, args.tls_crl or None)
        if args.tls_cert
        else None
    )
    _warn_about_security(args, tls)
    features = FeatureLevels(store.features)
    authorizer = Authorizer(
        store.acls,
        metrics,
        enabled=args.authorization == "acl",
        super_users=args.super_user_set,
        refresh_s=args.acl_refresh_ms / 1000,
        denial_interval_s=args.denial_event_interval_s,
        refreshers={"the feature levels": features.refresh},
    )
    try:
        authorizer.start()
        server = CoordinatorServer(
            manager,
            f"{host}:{args.port}",
            args.max_workers,
            max_message_bytes=defaults.max_message_bytes,
            tls=tls,
            principal_mapper=PrincipalMapper(
                PrincipalSource(args.principal_from), args.mapping_rules
            ),
            authorizer=authorizer,
            features=features,
            describe_config_values=args.describe_config_values == "allow",
            quotas=PrincipalQuotas(
                join_rate=args.max_joins_per_s,
                creation_rate=args.max_group_creations_per_s,
                member_call_rate=args.max_member_calls_per_s,
            ),
            max_connection_age_ms=args.max_connection_age_ms,
            max_connection_age_grace_ms=args.max_connection_age_grace_ms,
        )
    except BaseException:
        authorizer.stop()
        store.close()
        raise
    port = server.port
    readiness = ReadinessMonitor(
        store.schema_revisions,
        head=head,
        known=known,
        lease_s=args.lease_ms / 1000,
        on_change=server.set_serving,
        allow_newer_schema=args.allow_newer_schema,
        on_tick=lambda answer, unanswered_s: metrics.observe_readiness(
            answer.serving, unanswered_s
        ),
    )
    # Only once nothing can refuse the start any more (a bad certificate or CRL returns 2
    # above): a process that `main` returns from keeps no collector callback of a server that
    # never ran (the tests call it in-process).
    gc_pauses.tune()
    gc_observer = gc_pauses.observe(metrics.gc_pauses)
    manager.start()
    server.start()
    readiness.start(revisions)
    pruner = _start_event_pruner(args, store)
    metrics.watch_retention(pruner.stats if pruner is not None else lambda: None)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_host)
    log.info(
        "coordinator serving",
        extra=logs.fields(
            event="serving",
            address=f"{host}:{port}",
            advertised=advertised,
            node_id=node_id,
            database=_redact(args.database_url),
            metrics_port=args.metrics_port or None,
            metrics_host=args.metrics_host if args.metrics_port else None,
            max_message_bytes=defaults.max_message_bytes,
            tls="mtls" if tls is not None and tls.mutual else "tls" if tls else "plaintext",
            authorization=args.authorization,
            stored_set_form=stored_set_form,
            group_version=features.group_version,
        ),
    )
    while not stop.wait(1.0):
        pass
    readiness.stop()
    server.set_serving(False)
    server.stop(args.shutdown_grace_s)
    if pruner is not None:
        pruner.stop()
    authorizer.stop()
    manager.stop()
    store.close()
    gc_pauses.stop_observing(gc_observer)
    log.info("stopped", extra=logs.fields(event="stopped"))
    return 0


def _start_event_pruner(args: argparse.Namespace, store: SqlStore) -> EventPruner | None:
    """The event pruner, started when --event-retention-ms is set (DESIGN 3.20)."""
    if args.event_retention_ms <= 0:
        return None
    from .runtime.event_pruner import EventPruner, RetentionPolicy

    policy = RetentionPolicy(
        retention_ms=args.event_retention_ms,
        without_export=args.prune_events_without_export,
        rows_per_s=args.event_prune_rows_per_s,
        interval_s=args.event_prune_interval_ms / 1000,
    )
    log.info(
        "event retention: events older than %d ms are pruned once no audit export needs them",
        policy.retention_ms,
        extra=logs.fields(
            event="event_retention",
            retention_ms=policy.retention_ms,
            without_export=policy.without_export,
            rows_per_s=policy.rows_per_s,
        ),
    )
    pruner = EventPruner(store.retention, policy)
    pruner.start()
    return pruner


#: --wait-for-schema: how often the schema is read, and how often the wait is logged.
SCHEMA_POLL_S = 1.0
SCHEMA_WAIT_LOG_S = 5.0


def _prepare_schema(
    args: argparse.Namespace,
    store: SqlStore,
    head: str,
    known: frozenset[str],
    stop: threading.Event,
) -> tuple[str, ...] | int:
    """Bring the schema to where `serve` may start, by the flags: migrate it (the default), wait
    for a migration Job (--wait-for-schema), or refuse (--no-migrate, exit 2) when it is behind
    this code's head. A schema *ahead* of the code (a newer release migrated the database during
    a rolling upgrade, or this is a rollback) is never touched and does not stop the start:
    the process serves, with readiness NOT_SERVING unless --allow-newer-schema. Returns the
    revisions found, or an exit code."""
    from .runtime.readiness import SchemaStatus, classify_schema

    if args.wait_for_schema is not None:
        return _wait_for_schema(store, head, known, args.wait_for_schema, stop)
    revisions = store.schema_revisions()
    schema = classify_schema(revisions, head, known)
    if schema.status is SchemaStatus.AHEAD:
        _log_schema_ahead(schema.describe(), args.allow_newer_schema)
        return revisions
    if schema.status is SchemaStatus.BEHIND:
        if args.no_migrate:
            where = "not migrated at all" if not revisions else f"at revision {','.join(revisions)}"
            print(
                f"coordinator-svc serve: the database schema is {where}, not at {head}: run "
                "`coordinator-svc migrate` first (or start with --wait-for-schema)",
                file=sys.stderr,
            )
            return 2
        store.migrate()
        log.info("schema is up to date", extra=logs.fields(event="migrated", schema=head))
        return store.schema_revisions()
    return revisions


def _wait_for_schema(
    store: SqlStore, head: str, known: frozenset[str], timeout_s: float, stop: threading.Event
) -> tuple[str, ...] | int:
    """--wait-for-schema: read the schema every SCHEMA_POLL_S (an unreachable database is waited
    for too) until it is at head, or ahead of it; log every SCHEMA_WAIT_LOG_S; exit code 2 after
    `timeout_s`, 0 on SIGTERM."""
    from .runtime.readiness import SchemaStatus, classify_schema
    from .store import StoreUnavailable

    started = time.monotonic()
    next_log = started
    limit = "no time limit" if timeout_s == math.inf else f"giving up after {timeout_s:g} s"
    while True:
        try:
            revisions = store.schema_revisions()
        except StoreUnavailable as error:
            problem = str(error).strip().splitlines()[0]
        else:
            schema = classify_schema(revisions, head, known)
            if schema.status is SchemaStatus.AT_HEAD:
                log.info(
                    "%s: starting after waiting %.1f s",
                    schema.describe(),
                    time.monotonic() - started,
                    extra=logs.fields(event="schema_ready", schema=head),
                )
                return revisions
            if schema.status is SchemaStatus.AHEAD:
                _log_schema_ahead(schema.describe(), allowed=False)
                return revisions
            problem = schema.describe()
        now = time.monotonic()
        waited = now - started
        if waited >= timeout_s:
            message = f"gave up waiting for the schema after {waited:.0f} s: {problem}"
            extra = logs.fields(event="schema_wait_timeout", problem=problem)
            log.error("%s", message, extra=extra)
            print(f"coordinator-svc serve: {message}", file=sys.stderr)
            return 2
        if now >= next_log:
            log.info(
                "waiting for the schema: %s; %.0f s so far, %s",
                problem,
                waited,
                limit,
                extra=logs.fields(event="schema_wait", problem=problem, waited_s=round(waited)),
            )
            next_log = now + SCHEMA_WAIT_LOG_S
        if stop.wait(min(SCHEMA_POLL_S, timeout_s - waited)):
            log.info("stopped while waiting for the schema", extra=logs.fields(event="stopped"))
            return 0


def _log_schema_ahead(described: str, allowed: bool) -> None:
    consequence = (
        "--allow-newer-schema: readiness ignores it"
        if allowed
        else "readiness stays NOT_SERVING until the schema and the code agree"
    )
    log.warning(
        "%s: starting without migrating; %s",
        described,
        consequence,
        extra=logs.fields(event="schema_ahead"),
    )


def _warn_about_security(args: argparse.Namespace, tls: ServerTls | None) -> None:
    """Log what the flags leave open: plaintext off loopback, ACLs without client
    certificates (every caller is then User:ANONYMOUS)."""
    from connect_protocol.tls import is_loopback

    if tls is None and not is_loopback(args.host):
        log.warning(
            "serving PLAINTEXT on %s (--allow-plaintext): anyone on the network can read and "
            "send requests, connector configs included; configure --tls-cert/--tls-key",
            args.host,
            extra=logs.fields(event="plaintext_serving", host=args.host),
        )
    if args.authorization == "acl" and (tls is None or not tls.mutual):
        log.warning(
            "authorization is on without client certificates (--tls-client-ca): every caller "
            "is User:ANONYMOUS, so ACLs can only tell callers apart by nothing",
            extra=logs.fields(event="acl_without_mtls"),
        )


def _redact(url: str) -> str:
    """The database URL as logged: its password and secret query parameters masked."""
    from connect_protocol.safe_text import mask_url

    return mask_url(url)


def migrate(args: argparse.Namespace) -> int:
    from .store.migrate import upgrade_to_head

    logs.configure("INFO")
    upgrade_to_head(args.database_url)
    log.info(
        "schema is up to date",
        extra=logs.fields(event="migrated", database=_redact(args.database_url)),
    )
    return 0
