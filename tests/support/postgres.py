"""PostgreSQL for the tests: a private cluster in a temporary directory, on a free loopback
port, removed when the test (or the session) is done however it ends.

``PostgresServer`` runs ``initdb`` in a directory of its own (trust authentication,
superuser ``postgres``), then the server on a port from ``free_port``; ``stop`` (``pg_ctl
stop -m immediate``: a crash) keeps the cluster, so ``start`` brings the same server back
on the same port; ``close`` stops it and removes the directory.  Neither a system cluster
nor its configuration is ever touched.

As root (initdb and postgres refuse to run as root) the cluster belongs to the
``postgres`` user and every program runs as that user.  The server is started directly
rather than through ``pg_ctl start`` (which detaches it): it is the test process's child,
tied to it with ``die_with_test`` (reaper.py), so even a killed pytest leaves no server
behind; a test's own server is also caught by the reaper after the test.

Fixtures (a test module uses them by importing them, as tests/support/systemd_units.py's):

* ``postgres``: a fresh database (``test_<uuid>``) of its own for each test, on a cluster the
  session shares (a cluster costs seconds to make): its url;
* ``postgres_server``: a cluster of the test's own, for a test that stops and restarts it.

Both skip the test when the PostgreSQL server programs or psycopg are not installed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.support.ports import HANG_GUARD_SECONDS, LOOPBACK, free_port, wait_until
from tests.support.reaper import die_with_test

PROGRAMS = ("initdb", "postgres", "pg_ctl")
NOT_INSTALLED = ("PostgreSQL's server programs (initdb, postgres, pg_ctl) were not found in "
                 "$POSTGRES_BINDIR, /usr/lib/postgresql/<version>/bin or on PATH: "
                 "`apt-get install postgresql` to run the PostgreSQL results store's tests")
USER = "postgres"  # the cluster's superuser, and the system user running it as root
PASSWORD_USERS = "password_users"  # the role whose members need their password


def find_postgres_bindir() -> Path | None:
    """The directory of initdb, postgres and pg_ctl: $POSTGRES_BINDIR, Debian's newest
    /usr/lib/postgresql/<version>/bin, or where initdb is on PATH."""
    candidates = [os.environ.get("POSTGRES_BINDIR")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda path: [int(part) if part.isdigit() else 0
                                           for part in Path(path).parent.name.split(".")],
                         reverse=True)
    initdb = shutil.which("initdb")
    candidates.append(os.path.dirname(initdb) if initdb else None)
    for candidate in filter(None, candidates):
        if all(os.access(Path(candidate) / program, os.X_OK) for program in PROGRAMS):
            return Path(candidate)
    return None


def _account() -> dict:
    """How the cluster's programs run: as the ``postgres`` user when we are root (Popen's
    ``user``, ``group`` and ``extra_groups``), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(USER)  # KeyError: no such user
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class PostgresServer:
    """A PostgreSQL cluster the test owns, on one port across ``stop`` and ``start``."""

    host = LOOPBACK

    def __init__(self, *, bindir: Path | None = None, port: int | None = None):
        bindir = bindir or find_postgres_bindir()
        if bindir is None:
            raise FileNotFoundError(NOT_INSTALLED)
        self.bindir = Path(bindir)
        self.account = _account()
        self.port = port or free_port()
        self.root: Path | None = None  # made by the first start, removed by close
        self.process: subprocess.Popen | None = None
        self._fresh = False  # initdb made the cluster: start adds PASSWORD_USERS

    # -- where things are --------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        """The ``postgres`` database, as its superuser (trust: no password)."""
        return self.database_url("postgres")

    def database_url(self, database: str, user: str = USER) -> str:
        return f"postgresql://{user}@{self.host}:{self.port}/{database}"

    def output(self) -> str:
        """What the server logged so far (for an assertion message)."""
        return self.log.read_text(errors="replace") if self.root and self.log.exists() else ""

    def _run(self, *command, timeout: float = 120) -> subprocess.CompletedProcess:
        """One of the cluster's programs, as the cluster's user, to completion."""
        return subprocess.run([str(self.bindir / command[0]), *map(str, command[1:])],
                              capture_output=True, text=True, cwd=self.root, timeout=timeout,
                              env=self._env(), preexec_fn=die_with_test(), **self.account)

    def _env(self) -> dict:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C",
                "TZ": "UTC"}

    # -- life ----------------------------------------------------------------------------------
    def _initdb(self) -> None:
        # Not pytest's tmp_path: its base directory is root's alone (0700), where the
        # postgres user could not reach its cluster.
        self.root = Path(tempfile.mkdtemp(prefix="pg-test-"))
        if self.account:
            os.chown(self.root, self.account["user"], self.account["group"])
        done = self._run("initdb", "-D", self.data, "--auth=trust", "-U", USER, "-E", "UTF8",
                         "--no-locale", "--no-sync")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stdout}{done.stderr}")
        # Trust, but the members of PASSWORD_USERS (``create_user`` with a password) log in
        # with their password over TCP (a superuser is not taken for a member).
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all +{PASSWORD_USERS} {LOOPBACK}/32 scram-sha-256\n"
            f"host all all {LOOPBACK}/32 trust\n")
        self._fresh = True

    def start(self) -> PostgresServer:
        """Start (making the cluster the first time), and return once it accepts
        connections; after ``stop``, the same cluster on the same port."""
        import psycopg

        if self.running():
            return self
        try:
            if self.root is None:
                self._initdb()
            with self.log.open("ab") as log:  # the server keeps its own descriptor
                self.process = subprocess.Popen(
                    [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                     "-k", str(self.root), "-c", f"listen_addresses={LOOPBACK}",
                     # A test cluster: nothing of it must outlive the machine.
                     "-c", "fsync=off", "-c", "full_page_writes=off"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=self._env(),
                    preexec_fn=die_with_test(), **self.account)

            def ready() -> bool:
                if self.process.poll() is not None:
                    raise RuntimeError(f"postgres exited ({self.process.returncode}): "
                                       f"{self.output()[-3000:]}")
                try:
                    psycopg.connect(self.url, connect_timeout=5).close()
                except psycopg.OperationalError:  # not listening, or still starting
                    return False
                return True

            if not wait_until(ready, 60, interval=0.05):
                raise RuntimeError(f"postgres did not accept connections: "
                                   f"{self.output()[-3000:]}")
            if self._fresh:
                self.execute(f"CREATE ROLE {PASSWORD_USERS} NOLOGIN")
                self._fresh = False
        except BaseException:
            self.close()
            raise
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``: its clients are cut
        off, as by a crash); the cluster stays for ``start``.  If pg_ctl fails, the server
        is killed.  A no-op when it is not running."""
        if self.process is None:
            return
        try:
            if self.running():
                stopped = self._run("pg_ctl", "stop", "-D", self.data, "-m", "immediate",
                                    "-w", "-t", int(HANG_GUARD_SECONDS),
                                    timeout=HANG_GUARD_SECONDS + 10)
                if stopped.returncode != 0:
                    print(f"pg_ctl stop failed ({stopped.returncode}), killing postgres: "
                          f"{stopped.stdout}{stopped.stderr}")
            self.process.wait(HANG_GUARD_SECONDS)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"stopping postgres failed ({exc}), killing it")
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(HANG_GUARD_SECONDS)
            self.process = None

    def close(self) -> None:
        """Stop the server and remove the cluster (idempotent)."""
        try:
            self.stop()
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- databases -----------------------------------------------------------------------------
    def execute(self, *statements, database: str = "postgres") -> None:
        """Run statements (str or psycopg.sql) in ``database`` as the superuser, each on its
        own (CREATE DATABASE cannot run in a transaction)."""
        import psycopg

        with psycopg.connect(self.database_url(database), autocommit=True,
                             connect_timeout=10) as db:
            for statement in statements:
                db.execute(statement)

    def create_user(self, password: str | None = None) -> str:
        """A new role that may log in (``user_<uuid>``, no privileges): its name.  With a
        ``password``, it must give it (scram-sha-256); without, trust."""
        from psycopg import sql

        name = f"user_{uuid.uuid4().hex}"
        statement = sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name))
        if password is not None:
            statement += sql.SQL(" PASSWORD {} IN ROLE {}").format(
                sql.Literal(password), sql.Identifier(PASSWORD_USERS))
        self.execute(statement)
        return name

    def create_database(self) -> str:
        """A new, empty database (``test_<uuid>``): its name."""
        from psycopg import sql

        name = f"test_{uuid.uuid4().hex}"
        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        """Drop it, cutting off whatever is still connected to it."""
        from psycopg import sql

        self.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def require_postgres() -> Path:
    """The server programs' directory and psycopg, or the test is skipped saying why."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install "
                        "'edge-ldp[postgresql]' to run the PostgreSQL results store's tests")
    bindir = find_postgres_bindir()
    if bindir is None:
        pytest.skip(NOT_INSTALLED)
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            pytest.skip(f"running as root, and there is no {USER!r} user to run PostgreSQL "
                        "as (initdb and postgres refuse to run as root)")
    return bindir


@pytest.fixture(scope="session")
def postgres_cluster():
    """The cluster the session's tests share (each in a database of its own: ``postgres``)."""
    with PostgresServer(bindir=require_postgres()) as server:
        yield server


@pytest.fixture
def postgres(postgres_cluster):
    """The url of a fresh, empty database of the test's own on a real PostgreSQL, as its
    superuser; dropped after the test (connections still open to it are cut off)."""
    name = postgres_cluster.create_database()
    yield postgres_cluster.database_url(name)
    postgres_cluster.drop_database(name)


@pytest.fixture
def postgres_server():
    """A cluster of the test's own (to stop and start again), removed after the test."""
    with PostgresServer(bindir=require_postgres()) as server:
        yield server
