"""A throwaway PostgreSQL server for tests and benchmarks: started on demand, gone afterwards.

``throwaway_postgres()`` runs ``initdb`` and ``pg_ctl`` from the PostgreSQL installed on the machine,
so the Postgres store is proven against the real server without any set-up beyond its binaries::

    with throwaway_postgres() as url:           # postgresql://postgres@127.0.0.1:<port>/postgres
        store = postgres_store(url)

The cluster lives in a temporary directory, listens on 127.0.0.1 only (plus a Unix socket inside that
directory), trusts every local connection, and is stopped and deleted when the block ends. PostgreSQL
refuses to run as root, so under root the server commands run as the ``postgres`` OS user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dormant.errors import ConfigurationError, StoreError

__all__ = ["find_postgres_bin", "throwaway_postgres"]

_SERVER_USER = "postgres"
_START_ATTEMPTS = 3  # a free port can be taken by someone else between choosing it and binding it
_COMMAND_TIMEOUT = 120  # seconds for initdb or pg_ctl: a hung one fails the run instead of stalling it


def find_postgres_bin() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: from PATH, else the newest /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb:
        directory = Path(initdb).resolve().parent
        if (directory / "pg_ctl").exists():
            return directory
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    raise ConfigurationError("PostgreSQL server binaries not found: no initdb on PATH nor in /usr/lib/postgresql")


@contextmanager
def throwaway_postgres(*, durable: bool = False, startup_timeout: float = 30.0) -> Iterator[str]:
    """Start a private PostgreSQL cluster and yield its URL; stop it and delete its files afterwards.

    ``durable=False`` (the default) turns off ``fsync``, ``synchronous_commit`` and ``full_page_writes``:
    the cluster dies with the block, so flushing to disk buys nothing, and on a small VM the flushes
    would dominate every commit. Raises ``ConfigurationError`` when no server can be run here (no
    binaries, or running as root without a ``postgres`` user), ``StoreError`` with the server's log
    when one was found but did not start.
    """
    bin_dir = find_postgres_bin()
    run_as = _server_user()
    base = Path(tempfile.mkdtemp(prefix="dormant-pg-"))
    try:
        if run_as is not None:
            os.chown(base, run_as.pw_uid, run_as.pw_gid)
        data, log = base / "data", base / "server.log"
        # No locale to trip over; no fsync of files that are about to be deleted.
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
        _run(
            [*initdb, "--no-locale", "--no-sync"],
            run_as,
            cwd=base,
            what="initdb",
        )
        port = _start(bin_dir, data, log, base, run_as, durable=durable, startup_timeout=startup_timeout)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            _stop(bin_dir, data, run_as, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def throwaway_schema(url: str, prefix: str) -> Iterator[str]:
    """A new, empty schema (``prefix`` and a random suffix) on the server of ``url``, dropped afterwards; the URL
    yielded puts it first on the search_path, so each test or benchmark run has tables of its own."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield make_conninfo(url, options=f"-c search_path={schema}")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _server_user() -> pwd.struct_passwd | None:
    """The OS user to run the server as: ``postgres`` under root (initdb refuses root), else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        user = pwd.getpwnam(_SERVER_USER)
    except KeyError:
        raise ConfigurationError(
            f"running as root, and PostgreSQL refuses root: create a {_SERVER_USER!r} OS user to run it as"
        ) from None
    if shutil.which("runuser") is None:
        raise ConfigurationError("running as root, and runuser (to run PostgreSQL as another user) is not on PATH")
    return user


def _start(
    bin_dir: Path,
    data: Path,
    log: Path,
    base: Path,
    run_as: pwd.struct_passwd | None,
    *,
    durable: bool,
    startup_timeout: float,
) -> int:
    settings = {
        "listen_addresses": "'127.0.0.1'",
        "unix_socket_directories": f"'{base}'",
        "max_connections": "200",
        "fsync": "on" if durable else "off",
        "synchronous_commit": "on" if durable else "off",
        "full_page_writes": "on" if durable else "off",
    }
    conf = data / "postgresql.conf"
    original = conf.read_text()
    failure = ""
    for _attempt in range(_START_ATTEMPTS):
        port = _free_port()
        conf.write_text(original + "".join(f"\n{key} = {value}" for key, value in {**settings, "port": port}.items()))
        started = _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", str(int(startup_timeout)), "start"],
            run_as,
            cwd=base,
            what="pg_ctl start",
            check=False,
        )
        if started.returncode == 0 and _accepts_connections(port, startup_timeout):
            return port
        failure = f"{started.stdout}{started.stderr}\n--- server log ---\n{_tail(log)}"
        _stop(bin_dir, data, run_as, base)
        if "already in use" not in failure:
            break
    raise StoreError(f"the throwaway PostgreSQL server did not start:\n{failure}")


def _stop(bin_dir: Path, data: Path, run_as: pwd.struct_passwd | None, base: Path) -> None:
    """Stop the cluster; "immediate" is enough for data that is about to be deleted."""
    if not (data / "postmaster.pid").exists():
        return
    stopped = _run(
        [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
        run_as,
        cwd=base,
        what="pg_ctl stop",
        check=False,
    )
    if stopped.returncode != 0 and (data / "postmaster.pid").exists():
        with contextlib.suppress(OSError, ValueError, IndexError):  # its first line is the postmaster's pid
            os.kill(int((data / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)


def _run(
    command: Sequence[str], run_as: pwd.struct_passwd | None, *, cwd: Path, what: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    argv = ["runuser", "-u", run_as.pw_name, "--", *command] if run_as is not None else list(command)
    # LC_ALL=C keeps initdb and pg_ctl from tripping over a locale the machine does not have.
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    try:
        result = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=_COMMAND_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        raise StoreError(f"{what} did not finish within {_COMMAND_TIMEOUT} s: {exc.stdout!r}{exc.stderr!r}") from exc
    if check and result.returncode != 0:
        raise StoreError(f"{what} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _accepts_connections(port: int, timeout: float) -> bool:
    """pg_ctl -w waits for the server to say it is ready; this checks the TCP port really answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"
