"""Tests of the PostgreSQL test infrastructure (fixtures and ThrowawayCluster)."""

from __future__ import annotations

import socket
import uuid

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.engine import make_url

from tests.support.pgcluster import (
    ThrowawayCluster,
    create_database,
    drop_database,
    libpq_url,
)


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def test_database_url_is_a_fresh_connectable_database(database_url: str) -> None:
    url = make_url(database_url)
    assert url.drivername == "postgresql+psycopg"
    assert url.database is not None and url.database.startswith("t_")
    with psycopg.connect(libpq_url(database_url)) as conn:
        row = conn.execute("SELECT current_database(), 1 + 1").fetchone()
        assert row == (url.database, 2)
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
        assert tables == (0,)


def test_database_url_works_with_sqlalchemy(database_url: str) -> None:
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE t (id int PRIMARY KEY)"))
            conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1), (2)"))
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT count(*) FROM t")).scalar_one() == 2
    finally:
        engine.dispose()


def test_fresh_databases_are_isolated(postgres_admin_url: str, database_url: str) -> None:
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.execute("CREATE TABLE only_here (id int)")
        conn.commit()
        assert conn.execute("SELECT to_regclass('only_here') IS NOT NULL").fetchone() == (True,)

    other_name = f"t_{uuid.uuid4().hex}"
    other_url = create_database(postgres_admin_url, other_name)
    try:
        assert other_url != database_url
        with psycopg.connect(libpq_url(other_url)) as conn:
            assert conn.execute("SELECT to_regclass('only_here') IS NULL").fetchone() == (True,)
    finally:
        drop_database(postgres_admin_url, other_name)

    with psycopg.connect(libpq_url(postgres_admin_url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (other_name,)
        ).fetchone()
        assert row == (0,)


def test_drop_database_disconnects_open_sessions(postgres_admin_url: str) -> None:
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    conn = psycopg.connect(libpq_url(url))
    try:
        drop_database(postgres_admin_url, name)  # WITH (FORCE): must not block on conn
    finally:
        conn.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(libpq_url(url)).close()


def test_throwaway_cluster_starts_and_stops_on_its_own(postgres_admin_url: str) -> None:
    # A second cluster, independent of the session's server.
    with ThrowawayCluster() as cluster:
        port = cluster.port
        data_dir = cluster.data_dir
        assert make_url(cluster.url).port == port
        assert make_url(cluster.url).port != make_url(postgres_admin_url).port
        assert (data_dir / "PG_VERSION").is_file()
        assert _port_accepts(port)
        with psycopg.connect(libpq_url(cluster.url)) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW max_connections").fetchone() == ("200",)
            assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
    assert not _port_accepts(port)
    assert not data_dir.exists()
    cluster.stop()  # idempotent


def test_invalid_database_names_are_refused(postgres_admin_url: str) -> None:
    with pytest.raises(ValueError):
        create_database(postgres_admin_url, 'x"; DROP DATABASE postgres; --')
