"""Cold start: each Lambda handler module imported by a fresh interpreter, against ``import boto3``.

A Lambda cold start pays the interpreter, the handler module's imports and its module-level setup (the
app, the store's client, the Powertools resolver). Each figure is the median CPU time of 10 fresh interpreters
importing a function's handler module as Lambda's runtime does, over the median of 10 running ``import
boto3`` (the AWS SDK, which any handler that talks to AWS was expected to pay), the two interleaved so both
see the same machine load.

Each function runs as the template deploys it: the CDK app is synthesized once (``tests.support.fidelity``), and a
function's interpreter gets exactly its resolved ``Environment.Variables`` plus what Lambda itself sets
(region, credentials, the function's name, ...; ``tests.support.fidelity.lambda_``), nothing from this machine's
environment. Its ``sys.path`` is the runtime's: the function's staged code, then each of its layers' ``python``
directories, then the runtime's packages (here the venv's). The store is the template's DynamoDB table with
no endpoint: importing must not touch the network, which a first, untimed import checks (any connection or
name lookup fails it).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common import Figure, millis, paired, scale

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.5
APP_PACKAGES = ["samples/bookings"]
"""The app layer's packages, as the stack's default ``app_packages`` context packs them."""
LOAD = """
import importlib, sys
module_name, _, attribute = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module_name), attribute)
assert callable(handler)
"""
OFFLINE = """
import socket
def _refuse(*args, **kwargs):
    raise AssertionError(f"the import reached for the network: {args!r}")
socket.socket.connect = socket.socket.connect_ex = socket.getaddrinfo = socket.create_connection = _refuse
"""
SERVE = """
import json, types
context = types.SimpleNamespace(function_name="bench", memory_limit_in_mb=int(sys.argv[3]), aws_request_id="bench",
                                invoked_function_arn="arn:aws:lambda:eu-west-1:123456789012:function:bench")
answer = handler(json.loads(open(sys.argv[2]).read()), context)
assert answer["statusCode"] < 500, answer
"""
FIRST_REQUESTS = {"sessions": "create_session.json", "commit": "commit.json"}
"""The functions that never run an agent, and a first request of each (a sample event of its route)."""


@dataclass(frozen=True)
class Function:
    """One function as deployed: its handler, its staged code (the working directory), its environment and its
    ``MemorySize`` (what its context's ``memory_limit_in_mb`` says)."""

    name: str
    handler: str
    code_dir: Path
    env: dict[str, str]
    memory_mb: int


def fresh_interpreter(args: list[str], function: Function) -> float:
    """CPU time (user + system) of ``python <args>`` in a new process, in the function's directory and environment.

    CPU, not wall time: importing is CPU-bound, and on a shared machine the wall time mostly measures
    the other processes (the floor's own wall time varied 3x under load, its CPU time hardly at all).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=function.code_dir,
        env=function.env,
        timeout=120,
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"functions/{function.name}: python {args[0]} ... failed:\n{done.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def deployed(scratch: Path) -> dict[str, Function]:
    """Each function of the synthesized stack, with its template environment and the runtime's path.

    Synthesis needs the infra extra (``aws-cdk-lib``, ``cdk-nag``) and node; without them the section fails.
    ``PYTHONPYCACHEPREFIX`` (a cache under ``scratch``) is the bench's: a deployed layer ships its .pyc, so the
    sources are compiled once, by the untimed first import, and no figure includes compiling them.
    """
    if shutil.which("node") is None:
        raise SystemExit("bench cold_start synthesizes the CDK app, which needs node on the PATH (the CDK runs on it)")
    try:
        import aws_cdk  # noqa: F401  (starts node)
        import cdk_nag  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            "bench cold_start synthesizes the CDK app to give each function its template environment: it needs "
            f"the infra extra (pip install -e '.[infra]', which make setup installs): {exc}"
        ) from exc
    from tests.support.fidelity.deployment import STACK, synthesize
    from tests.support.fidelity.lambda_ import LambdaService
    from tests.support.fidelity.template import Names, Template

    raw = synthesize(scratch / "cdk.out", {})
    template = Template(raw, Names(stack=STACK), scratch / "cdk.out")
    functions = template.functions()
    layers = {
        logical: layer_dir(template.layer_source(logical), scratch / "layers" / logical)
        for f in functions.values()
        for logical in f.layers
    }
    service = LambdaService(functions, layers, {}, scratch)  # only for its environment(): nothing is started
    found = {}
    for name, function in sorted(functions.items()):
        env = service.environment(function)
        env["PYTHONPATH"] = ":".join([str(function.code_dir), *(str(layers[logical]) for logical in function.layers)])
        env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
        found[name] = Function(name, function.handler, function.code_dir, env, function.memory)
    return found


def layer_dir(source: Path, target: Path) -> Path:
    """A layer's ``/opt/python``: the library layer's ``python`` directory; the app layer made of its packages."""
    if (source / "python").is_dir():
        return source / "python"
    target.mkdir(parents=True, exist_ok=True)
    for package in APP_PACKAGES:
        link = target / Path(package).name
        if not link.exists():
            link.symlink_to(ROOT / package, target_is_directory=True)
    return target


def run() -> list[Figure]:
    runs = scale(10, 2)
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as scratch:
        functions = deployed(Path(scratch))
        for name, function in functions.items():
            # The untimed first import compiles the sources and checks that nothing in it reaches for the
            # network (the template's store has no endpoint here).
            fresh_interpreter(["-c", OFFLINE + LOAD, function.handler], function)
            ours, floor = paired(importing(function), boto3_floor(function), runs)
            figures.append(
                Figure(
                    "cold_start",
                    f"cold import of functions/{name}",
                    millis(ours),
                    millis(floor) + " (import boto3)",
                    ours / floor,
                    TARGET,
                    "lower",
                )
            )
            if name in FIRST_REQUESTS:
                first_request(function, functions["sessions"], runs, Path(scratch))
    return figures


def importing(function: Function) -> Callable[[int], float]:
    return lambda n: fresh_interpreter(["-c", LOAD, function.handler], function)


def boto3_floor(function: Function) -> Callable[[int], float]:
    return lambda n: fresh_interpreter(["-c", "import boto3"], function)


def on_sqlite(function: Function, db: Path) -> Function:
    """``function`` serving a SQLite file instead of the template's table (no Idempotency-Key in these events)."""
    env = {**function.env, "DORMANT_STORE": f"sqlite:///{db}"}
    env.pop("DORMANT_IDEMPOTENCY_TABLE", None)
    return Function(function.name, function.handler, function.code_dir, env, function.memory_mb)


def first_request(function: Function, sessions: Function, runs: int, scratch: Path) -> None:
    """Print what the import leaves to the first request: the app, and the validators its route builds.

    Printed for reference, not judged: on AWS the first request also makes the store's client and its
    first calls, which no local figure measures fairly. The store is a SQLite file holding the sample
    session (``create_session.json``, created through ``functions/sessions``), copied afresh for each run, so
    the figure is the library's work. The import alone is measured again, interleaved, so both see the same
    machine.
    """
    template, db = scratch / "first-request.db", scratch / "served.db"
    local = on_sqlite(function, db)
    if not template.exists():
        serve(on_sqlite(sessions, db), "create_session.json")
        shutil.copyfile(db, template)

    def served(n: int) -> float:
        shutil.copyfile(template, db)
        return serve(local, FIRST_REQUESTS[function.name])

    both, imported = paired(served, importing(local), runs)
    print(
        f"  (for reference) functions/{function.name} imported and serving its first request "
        f"({FIRST_REQUESTS[function.name]}): {millis(both)}, the import alone {millis(imported)}: the request adds "
        f"{millis(both - imported)}"
    )


def serve(function: Function, event: str) -> float:
    event_path = str(ROOT / "events" / "api" / event)
    return fresh_interpreter(["-c", LOAD + SERVE, function.handler, event_path, str(function.memory_mb)], function)
