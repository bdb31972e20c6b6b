"""Throwaway PostgreSQL clusters for tests, driven through subprocess.

``ThrowawayCluster`` runs ``initdb`` + ``pg_ctl`` from the newest
``/usr/lib/postgresql/*/bin`` into a fresh temporary directory, listens on a free
127.0.0.1 port with trust auth and durability switched off, and removes
everything on exit.  When running as root the server runs as the ``postgres``
user (via ``runuser``), because ``initdb`` refuses to run as root.

Failures raise ``RuntimeError`` with the command output and the server log tail;
nothing here ever skips a test.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

__all__ = [
    "ThrowawayCluster",
    "create_database",
    "database_url",
    "drop_database",
    "find_pg_bin_dir",
    "libpq_url",
    "sqlalchemy_url",
]

PG_ROOT = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"
_LOG_TAIL_LINES = 60
_START_ATTEMPTS = 3
_IDENTIFIER_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def find_pg_bin_dir(root: Path = PG_ROOT) -> Path:
    """Return the ``bin`` directory of the newest PostgreSQL under ``root``."""
    candidates: list[tuple[tuple[int, ...], Path]] = []
    for pg_ctl in root.glob("*/bin/pg_ctl"):
        version = pg_ctl.parent.parent.name
        try:
            key = tuple(int(part) for part in version.split("."))
        except ValueError:
            continue
        candidates.append((key, pg_ctl.parent))
    if not candidates:
        raise RuntimeError(
            f"no PostgreSQL server binaries found ({root}/*/bin/pg_ctl); "
            "install them with `apt-get install -y postgresql` (scripts/test does this)"
        )
    return max(candidates)[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class ThrowawayCluster:
    """A private PostgreSQL server in a temporary directory (a context manager).

    Attributes ``url`` (SQLAlchemy URL for the ``postgres`` database), ``port``
    and ``data_dir`` are valid between ``start()``/``__enter__`` and
    ``stop()``/``__exit__``.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        max_connections: int = 200,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        """``settings``: extra server settings (``-c name=value``), applied after the defaults
        and so overriding them, e.g. ``{"fsync": "on", "synchronous_commit": "on"}`` for a
        durable server (benchmarks). pg_ctl hands them to a shell, so values are limited to
        letters, digits and ``_.:/%+,=@-``."""
        self.bin_dir: Path = bin_dir if bin_dir is not None else find_pg_bin_dir()
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        for name, value in self.settings.items():
            if not re.fullmatch(r"[a-z_.]+", name) or not re.fullmatch(r"[\w.:/%+,=@-]*", value):
                raise ValueError(f"unsupported server setting {name}={value!r}")
        self._as_root = os.geteuid() == 0
        self._base_dir: Path | None = None
        self._port: int | None = None
        self._running = False

    # -- public API ---------------------------------------------------------

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError("ThrowawayCluster is not started")
        return self._base_dir

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "sock"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "postgres.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ThrowawayCluster is not started")
        return self._port

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database as the ``postgres`` superuser."""
        return f"postgresql+psycopg://{SERVER_USER}@127.0.0.1:{self.port}/postgres"

    def start(self) -> ThrowawayCluster:
        """Create the cluster and start the server; raises RuntimeError on failure."""
        if self._running:
            raise RuntimeError("ThrowawayCluster is already started")
        self._make_base_dir()
        try:
            self._initdb()
            self._start_server()
        except BaseException:
            self._remove_base_dir()
            raise
        self._running = True
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove the directory; idempotent."""
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.stop)
        errors: list[str] = []
        try:
            for mode in ("fast", "immediate"):
                proc = self._run_pg(
                    "pg_ctl",
                    "stop",
                    "-w",
                    "-t",
                    "60",
                    "-m",
                    mode,
                    "-D",
                    str(self.data_dir),
                    check=False,
                )
                if proc.returncode == 0:
                    break
                errors.append(
                    f"pg_ctl stop -m {mode} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
                )
            else:
                raise RuntimeError(
                    "could not stop the throwaway PostgreSQL server:\n"
                    + "\n".join(errors)
                    + f"\n--- server log tail ({self.log_file}) ---\n{_tail(self.log_file)}"
                )
        finally:
            self._remove_base_dir()
            self._port = None

    def __enter__(self) -> ThrowawayCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------

    def _make_base_dir(self) -> None:
        owner: tuple[int, int] | None = None
        if self._as_root:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(
                    f"running as root but there is no '{SERVER_USER}' user to run "
                    "PostgreSQL as (install the postgresql package)"
                ) from None
            owner = (entry.pw_uid, entry.pw_gid)
        # As root the server runs as `postgres`, which must be able to reach the
        # directory: use /tmp rather than a TMPDIR that may sit under /root.
        base = Path(tempfile.mkdtemp(prefix="pgcluster-", dir="/tmp" if owner else None))
        self._base_dir = base
        self.socket_dir.mkdir(mode=0o700)
        if owner is not None:
            for path in (base, self.socket_dir):
                os.chown(path, *owner)

    def _remove_base_dir(self) -> None:
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    def _initdb(self) -> None:
        self._run_pg(
            "initdb",
            "-A",
            "trust",
            "-U",
            SERVER_USER,
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
            "-D",
            str(self.data_dir),
        )

    def _start_server(self) -> None:
        last_error = ""
        for _attempt in range(_START_ATTEMPTS):
            port = _free_port()
            options = " ".join(
                [
                    f"-p {port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-k {self.socket_dir}",
                    "-c fsync=off",
                    "-c synchronous_commit=off",
                    "-c full_page_writes=off",
                    f"-c max_connections={self.max_connections}",
                    *(f"-c {name}={value}" for name, value in self.settings.items()),
                ]
            )
            proc = self._run_pg(
                "pg_ctl",
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                options,
                check=False,
            )
            if proc.returncode == 0:
                self._port = port
                return
            last_error = (
                f"pg_ctl start exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
                f"\n--- server log tail ({self.log_file}) ---\n{_tail(self.log_file)}"
            )
            # A lost race for the port is worth another try; anything else is not.
            if "could not bind" not in _tail(self.log_file):
                break
            time.sleep(0.2)
        raise RuntimeError(f"could not start a throwaway PostgreSQL server:\n{last_error}")

    def _run_pg(
        self, tool: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self._run_cmd([str(self.bin_dir / tool), *args], what=tool, check=check)

    def _run_cmd(
        self, cmd: Sequence[str], *, what: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", SERVER_USER, "--", *cmd] if self._as_root else list(cmd)
        # Keep PG* variables (PGDATA, PGPORT, ...) of the caller away from the server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        try:
            proc = subprocess.run(
                full,
                cwd=self.base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(
                f"{what} failed to run ({' '.join(full)}): {exc}"
                f"\n--- server log tail ---\n{_tail(self.log_file)}"
            ) from exc
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{what} exited {proc.returncode} ({' '.join(full)}):\n"
                f"{proc.stdout}{proc.stderr}"
                f"\n--- server log tail ({self.log_file}) ---\n{_tail(self.log_file)}"
            )
        return proc


# -- URL and database helpers -------------------------------------------------


def sqlalchemy_url(url: str) -> str:
    """Normalise a PostgreSQL URL to the ``postgresql+psycopg://`` SQLAlchemy form."""
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {parsed!r}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """Turn a SQLAlchemy URL (``postgresql+psycopg://...``) into a libpq/psycopg one."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def database_url(server_url: str, name: str) -> str:
    """The SQLAlchemy URL of database ``name`` on the server of ``server_url``."""
    return (
        make_url(sqlalchemy_url(server_url))
        .set(database=name)
        .render_as_string(hide_password=False)
    )


def _check_name(name: str) -> str:
    if not _IDENTIFIER_RE.match(name):
        raise ValueError(f"refusing unusual database name {name!r}")
    return name


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` via ``admin_url``; return its SQLAlchemy URL."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_check_name(name))))
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting any sessions (PG 13+)."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(_check_name(name))
            )
        )
