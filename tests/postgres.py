"""A real PostgreSQL server for the tests (a pytest plugin, registered by conftest.py).

``postgres_dsn`` (session): the URL of a server on which the tests may create databases. It is
``BLADE_TEST_POSTGRES_DSN`` when that is set (a superuser, or a role with CREATEDB and
CREATEROLE: one test makes a role that may only read and write rows); otherwise a
private cluster started from the installed binaries (``initdb`` and ``pg_ctl`` on PATH or under
/usr/lib/postgresql/*/bin): as the ``postgres`` user when the tests run as root (initdb refuses
root), in a folder under /tmp that belongs to it, listening on 127.0.0.1 only, on a free port,
with a random password, stopped and removed when the session ends.

Under pytest-xdist each worker process starts its own cluster, lazily, when its first PostgreSQL
test runs (about 2-4 s): no cross-process teardown to coordinate, and a worker that crashes
takes only its own server down.

``postgres_url`` (function): a fresh, empty database on that server for one test (CREATE
DATABASE from template0, dropped afterwards), so tests never see each other's rows.

A server that cannot be started or reached FAILS the tests that need it, with the reason: it
is never a skip.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

ENV = "BLADE_TEST_POSTGRES_DSN"
_counter = itertools.count()


def find_binary(name: str) -> str | None:
    """``name`` on PATH, else in the newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Cluster:
    """A private PostgreSQL cluster: its folder, port and superuser URL."""

    folder: Path
    port: int
    url: str
    pg_ctl: str
    user: str | None  # the OS user the server runs as (None: this process's user)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(  # from its own folder: the postgres user may not enter ours
            command, cwd=self.folder, capture_output=True, text=True, timeout=120, check=False
        )

    def restart(self) -> None:
        """Restart the server (as an upgrade or a failover does): every session ends."""
        data, log = str(self.folder / "data"), str(self.folder / "log")
        # the log file, as at the start: a server writing to our pipe would hold it open
        done = self._run(self.pg_ctl, "-D", data, "-l", log, "-m", "fast", "-w", "restart")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed: {(done.stderr or done.stdout).strip()}")

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def _reap_orphans(pg_ctl: str, user: str | None) -> None:
    """Stop and remove the clusters of test sessions that died without stopping theirs (a
    killed pytest): each folder names the pid of the process that started it."""
    for folder in glob.glob("/tmp/blade-pg-*"):
        try:
            pid = int((Path(folder) / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue  # its session still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        Cluster(Path(folder), 0, "", pg_ctl, user).stop()


def start_cluster(*, durable: bool = False) -> Cluster:
    """Start a private cluster (see the module's doc), or raise RuntimeError saying why not.

    The tests' cluster runs with ``fsync=off`` (its data need not survive a crash of the OS);
    ``durable=True`` keeps PostgreSQL's defaults, as a benchmark of commits needs."""
    initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise RuntimeError(
            "PostgreSQL server binaries (initdb, pg_ctl) are not on PATH nor under "
            f"/usr/lib/postgresql/*/bin: install them (apt-get install -y postgresql) or set {ENV}"
        )
    user: str | None = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = "postgres"
        if shutil.which("runuser") is None:
            raise RuntimeError("running as root, and runuser is missing to start PostgreSQL")
        try:
            import pwd

            account = pwd.getpwnam(user)
        except KeyError:
            raise RuntimeError(
                "running as root and there is no 'postgres' user to run the server as "
                f"(installing the postgresql package creates it), or set {ENV}"
            ) from None
    _reap_orphans(pg_ctl, user)
    folder = Path(tempfile.mkdtemp(prefix="blade-pg-", dir="/tmp"))
    (folder / "owner.pid").write_text(str(os.getpid()))
    if user is not None:
        os.chown(folder, account.pw_uid, account.pw_gid)
    password = secrets.token_hex(16)
    pwfile = folder / "pw"
    pwfile.write_text(password + "\n")
    if user is not None:
        os.chown(pwfile, account.pw_uid, account.pw_gid)
    pwfile.chmod(0o600)
    superuser = "postgres"
    cluster = Cluster(folder, 0, "", pg_ctl, user)
    done = cluster._run(
        initdb,
        "-D",
        str(folder / "data"),
        "-U",
        superuser,
        f"--pwfile={pwfile}",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
    )
    pwfile.unlink()
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    failure = ""
    for _ in range(5):  # a free port may be taken between the probe and the start: try another
        port = _free_port()
        options = f"-k {folder} -c listen_addresses=127.0.0.1 -p {port} -c max_connections=200"
        if not durable:  # test data: a crash of the OS may lose it
            options += " -c fsync=off -c full_page_writes=off"
        done = cluster._run(
            pg_ctl,
            "-D",
            str(folder / "data"),
            "-l",
            str(folder / "log"),
            "-o",
            options,
            "-w",
            "start",
        )
        if done.returncode == 0:
            cluster.port = port
            cluster.url = (
                f"postgresql://{superuser}:{quote(password, safe='')}@127.0.0.1:{port}/postgres"
            )
            return cluster
        log = folder / "log"
        failure = log.read_text(errors="replace")[-2000:] if log.exists() else done.stderr
    shutil.rmtree(folder, ignore_errors=True)
    raise RuntimeError(f"pg_ctl could not start PostgreSQL: {failure.strip()}")


def database_url(server_url: str, name: str) -> str:
    """``server_url`` with its database replaced by ``name``."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A server URL on which tests create their own databases (see the module's doc)."""
    given = os.environ.get(ENV)
    if given:
        yield given
        return
    try:
        cluster = start_cluster()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"PostgreSQL is needed for this test and could not be started: {error}")
    try:
        yield cluster.url
    finally:
        cluster.stop()


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """A server URL to work on: ``dsn``, else a private durable cluster's for the block (the
    benchmarks' servers)."""
    if dsn:
        yield dsn
        return
    cluster = start_cluster(durable=True)
    try:
        yield str(cluster.url)
    finally:
        cluster.stop()


@contextlib.contextmanager
def temporary_database(server_url: str, name: str) -> Iterator[str]:
    """A new empty database ``name`` on the server, its URL; dropped afterwards (the tests'
    databases and the benchmarks' alike)."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield database_url(server_url, name)
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin,
        ):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_dsn: str) -> Iterator[str]:
    """A fresh empty database for this test, dropped after it."""
    import psycopg

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"blade_test_{worker}_{os.getpid()}_{next(_counter)}"
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(temporary_database(postgres_dsn, name))
        except psycopg.Error as error:
            pytest.fail(f"cannot create a test database on the PostgreSQL server: {error}")
        yield url
