"""The ``dormant`` command.

* ``dormant serve``: the HTTP API on this machine (``serving.local``).
* ``dormant erase --scope user --id ID [--tenant T]`` runs ``app.erase`` and prints its report (JSON).
* ``dormant purge [--tenant T]`` deletes the sessions past the app's ``retention``, in the app and every
  tenant of it (as the scheduled sweeper does), or in one tenant, and prints their ids (JSON).
* ``dormant migrate-table --from OLD --to NEW [--endpoint URL] [--region R]`` copies a DynamoDB table of an
  earlier layout (release 0.1's) into a new table of this release's, and prints the counts (JSON)
  (``stores.dynamodb.migrate``; docs/dynamodb.md, Migration). Run it again to resume or to catch up.

Every command names the app as the handlers do: ``--app module:attr`` (default ``DORMANT_APP``, else
the Bookings sample) on ``--store URL`` (default ``DORMANT_STORE``, else ``sqlite:///data/dormant.db``).
``erase`` and ``purge`` need the store to exist (a mistyped path is an error, not a new empty
database; ``serve`` makes a missing SQLite store, folders too, and says so on stderr); their ``--tenant`` is
the caller's ``sub`` the HTTP API keeps that tenant's data under
(``{app}@{tenant}``); without it the app's own name is used, as by a program that runs the app itself.
They exit 0 when done, 2 on bad input or configuration (the message names the field), 1 when the store
failed, and 3 when ``erase`` removed everything from the store but its report's ``residue`` says the
store's files may still hold it (SQLite: another connection held the write-ahead log, erase again once
the file is idle; PostgreSQL: always, until an operator runs ``VACUUM FULL``); the report is printed
all the same, and the residue on stderr.

Its imports are deferred to the command that needs them, so ``dormant --help`` loads no AWS library.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from .app import App
    from .serving.idempotency import Idempotency
    from .serving.local import LocalAPI, Page
    from .serving.runtime import Served
    from .stores.base import SessionStore

__all__ = ["main"]

DEFAULT_WORKERS = 4
"""``dormant serve``'s worker processes: a worker mostly waits (on the model, on the store), so the CPUs do
not bound it; four let three slow runs go on while the fourth answers everyone else."""

SERVE_EPILOG = """The API (JSON in and out) is the one API Gateway serves on AWS, through the same handler code:
{routes}
The session inspector, a web page over the same API, is at / (open it in a browser on this machine).
A run that waits for answers is resumed by the request that answers it (on AWS, Step Functions does).
Requests run side by side in --workers processes (each its own app and store connection, taking one
request at a time, as a Lambda instance does), so a slow run holds up no one else. A long-poll
(GET /sessions/{{id}}/events?wait=S) holds no worker: the server re-asks for it. A worker that dies is
replaced at once; if none can be started again, the server exits 1.

Identity is a development stand-in for the Cognito authorizer: the X-Dormant-Principal header (the
token's sub), X-Dormant-Tenant (its tenant claim) and X-Dormant-Groups (a comma list: cognito:groups),
else --principal, --tenant and --groups. Without a tenant the principal is its own tenant, as a token
without the tenant claim is on AWS. Deleting a session and erasing a person need the admin group
($DORMANT_ADMIN_GROUP, default admins), which a request naming no caller is in unless --groups says otherwise.
A machine client is X-Dormant-Client (its client id) with X-Dormant-Scopes (its access token's scopes,
space-separated), calling the routes under /clients as on AWS; --machine-clients maps each to its tenant.
Only loopback clients are served (any other gets 403): nothing here authenticates anyone.

Stores: sqlite:///relative.db, sqlite:////absolute.db, memory:, postgresql://...,
dynamodb://table?endpoint=http://127.0.0.1:8001 (DynamoDB Local: the table is created if missing; the
environment's AWS credentials and region are used, and dummy ones where it has none, for an endpoint on
this machine only)."""


def main(argv: Sequence[str] | None = None) -> int:
    from .serving.routes import ROUTES

    parser = argparse.ArgumentParser(prog="dormant", description="Agents whose sessions sleep between turns.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    serve = commands.add_parser(
        "serve",
        help="serve the HTTP API locally, through the Lambda handlers",
        description="Serve the HTTP API on this machine, through the handler code that runs on Lambda.",
        epilog=SERVE_EPILOG.format(routes="\n".join(f"  {method} {path}" for method, path, _ in ROUTES)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .serving.runtime import DEFAULT_APP, DEFAULT_STORE

    serve.add_argument(
        "--app", default=os.environ.get("DORMANT_APP") or DEFAULT_APP, help=f"module:attr (default {DEFAULT_APP})"
    )
    serve.add_argument(
        "--store",
        default=os.environ.get("DORMANT_STORE") or DEFAULT_STORE,
        help=f"a store URL (default $DORMANT_STORE, else {DEFAULT_STORE}: under the current directory)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="the port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--principal", default="local", help="the caller of a request without X-Dormant-Principal (default local)"
    )
    serve.add_argument(
        "--tenant", help="the tenant of a request without X-Dormant-Tenant (default: the principal is its own tenant)"
    )
    serve.add_argument(
        "--groups",
        help="the groups (comma list) of a request naming neither X-Dormant-Groups nor X-Dormant-Principal "
        "(default: the admin group, $DORMANT_ADMIN_GROUP or admins: who runs the server may delete and erase)",
    )
    serve.add_argument(
        "--machine-clients",
        type=_machine_clients,
        metavar="JSON_OR_FILE",
        help='each machine client\'s tenant, {"client id": "tenant"} ("": its own), as JSON or a file of it; a client '
        "not listed is refused, as deployed (default $DORMANT_MACHINE_CLIENTS; none: each client its own tenant)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        help=f"processes serving requests side by side, each one at a time (default {DEFAULT_WORKERS}; 1 with a"
        " memory: store; 1 serves in this process)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let pages of this origin (e.g. http://localhost:5173) call the API from a browser, with the CORS "
        "headers the deployed API gives (-c cors_origins=); repeat for more (default: none)",
    )
    serve.add_argument("--quiet", action="store_true", help="do not log each request on stderr")
    serve.add_argument(
        "--sweep-every",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="run the sweeper this often: repair, purge, hand on turns whose runner stopped (default 60; 0: never)",
    )
    serve.set_defaults(run=_serve)
    for name, help, run in (
        ("erase", "remove one person's shared state and every session bound to them", _erase),
        ("purge", "delete the sessions past the app's retention", _purge),
    ):
        sub = commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        sub.add_argument("--app", default=serve.get_default("app"), help=f"module:attr (default {DEFAULT_APP})")
        sub.add_argument("--store", default=serve.get_default("store"), help="the URL of an existing store")
        sub.add_argument("--tenant", help="the tenant (the API caller's sub) whose data it is")
        sub.set_defaults(run=_operate, operation=run)
        if name == "erase":
            sub.add_argument("--scope", required=True, help="user, patient, practice, org or team")
            sub.add_argument("--id", required=True, help="the id the scope is bound to")
    migrate = commands.add_parser(
        "migrate-table",
        help="copy a DynamoDB table of an earlier layout into a new table of this release's",
        description="Copy a DynamoDB table made by an earlier release (its local index and listing entries cannot "
        "change in place) into a new table of this release's layout, converting what changed. Resumable: run it "
        "again after a stop, or to copy what changed since (nothing is written twice).",
    )
    migrate.add_argument("--from", dest="source", required=True, metavar="TABLE", help="the table to copy")
    migrate.add_argument("--to", dest="target", required=True, metavar="TABLE", help="the new table (made if missing)")
    migrate.add_argument("--endpoint", help="a DynamoDB endpoint URL (DynamoDB Local); default AWS's")
    migrate.add_argument("--region", help="the AWS region (default: the environment's)")
    migrate.add_argument(
        "--listing-shards", type=_count, help="the new table's listing shards, >= 1 (default: the old one's)"
    )
    migrate.add_argument(
        "--pending-shards", type=_count, help="the new table's pending shards, >= 1 (default: the old one's)"
    )
    migrate.add_argument("--no-create", action="store_true", help="require the new table to exist")
    migrate.set_defaults(run=_migrate_table)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


def _port(text: str) -> int:
    """``--port``: 0 (a free one) to 65535; anything else is argparse's usage error (exit 2), not a traceback."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 0 to 65535, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 0 to 65535, not {port}")
    return port


def _seconds(text: str) -> float:
    """``--sweep-every``: a finite number of seconds, >= 0 (0: never)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, not {text!r}") from None
    if not 0 <= seconds < float("inf"):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"seconds >= 0 (0: never), not {text}")
    return seconds


def _count(text: str) -> int:
    """A count that must be >= 1 (the shard counts: 0 is refused, not read as "the default")."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number >= 1, not {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f">= 1, not {count}")
    return count


def _operate(args: argparse.Namespace) -> int:
    """Run ``erase`` or ``purge`` on the app (as ``--tenant`` sees it), print the result as JSON, and exit
    with the code the module's docstring gives."""
    from .errors import ConfigurationError, DormantError, InputError
    from .serving.runtime import for_tenant, load_served
    from .stores.url import store_from_url

    try:
        store = store_from_url(args.store, create=False)
        try:
            app = load_served(args.app, store).app
            result = args.operation(for_tenant(app, args.tenant) if args.tenant is not None else app, args)
        finally:
            store.close()
    except (InputError, ConfigurationError) as exc:
        field = getattr(exc, "field", None)
        print(f"dormant {args.command}: {exc}" + (f" (field: {field})" if field else ""), file=sys.stderr)
        return 2
    except DormantError as exc:
        print(f"dormant {args.command}: the store failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    residue = result.get("residue")
    if residue is not None:  # done in the database, not gone from the disk: a script must not read it as 0
        print(f"dormant {args.command}: erased, but not gone from the store's files: {residue}", file=sys.stderr)
        return 3
    return 0


def _migrate_table(args: argparse.Namespace) -> int:
    """``dormant migrate-table``: the copy, its counts as JSON; exit 2 on configuration, 1 when DynamoDB failed."""
    from .errors import ConfigurationError, DormantError

    try:
        from .stores.dynamodb.admin import _client
        from .stores.dynamodb.migrate import migrate_table
        from .stores.url import _local_client, is_loopback_endpoint

        if args.endpoint and is_loopback_endpoint(args.endpoint):
            client = _local_client(args.endpoint, args.region)
        else:
            client = _client(args.endpoint, args.region)
        try:
            report = migrate_table(
                client,
                args.source,
                args.target,
                listing_shards=args.listing_shards,
                pending_shards=args.pending_shards,
                create=not args.no_create,
            )
        finally:
            client.close()
    except ConfigurationError as exc:
        print(f"dormant migrate-table: {exc}", file=sys.stderr)
        return 2
    except DormantError as exc:
        print(f"dormant migrate-table: DynamoDB failed: {exc} (run it again: it resumes)", file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict(), indent=2))
    return 0


def _erase(app: App, args: argparse.Namespace) -> dict[str, Any]:
    report = app.erase(scope=args.scope, scope_id=args.id)
    idempotency = _idempotency(args.store, app.store)
    if idempotency is not None:  # the API's answers kept for retries hold what the sessions held
        from .serving.http.idempotency import records

        for session_id in report.sessions:
            idempotency.forget(records(app, session_id))
    return dataclasses.asdict(report)


def _purge(app: App, args: argparse.Namespace) -> dict[str, Any]:
    from .serving.runtime import purge_tenants

    if app.retention_ms is None:
        print(f"dormant purge: app {app.name!r} has no retention: nothing expires", file=sys.stderr)
    purged = {app.name: app.sessions.purge()} if args.tenant else purge_tenants(app)
    return {"purged": {name: ids for name, ids in purged.items() if ids}}


_SERVE_NEEDS = ("aws_lambda_powertools", "aws_xray_sdk", "boto3", "botocore", "jmespath")
"""What ``dormant serve`` imports beyond dormant's own dependencies: the ``lambda`` extra (it serves through
the Lambda handlers). ``pip install dormant`` has it not; ``make demo`` and ``make serve`` install it."""


def _serve(args: argparse.Namespace) -> int:
    from .errors import DormantError

    try:
        from .serving.local import PRINCIPAL_HEADER, Handler, LocalServer, Workers, can_fork
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _SERVE_NEEDS:
            raise  # not a missing extra: a bug, with its traceback
        print(
            f"dormant serve: needs the lambda extra ({exc.name} is not installed): run `make serve`, "
            "or `pip install -e '.[lambda]'` in this checkout (`pip install 'dormant[lambda]'` elsewhere)",
            file=sys.stderr,
        )
        return 2

    if args.machine_clients is not None:  # read by the handlers, in this process and in every worker
        from .serving.callers import MACHINE_CLIENTS

        os.environ[MACHINE_CLIENTS] = args.machine_clients
    count = args.workers if args.workers is not None else DEFAULT_WORKERS
    if count < 1:
        print(f"dormant serve: --workers is >= 1, not {count} (field: workers)", file=sys.stderr)
        return 2
    if count > 1 and urlsplit(args.store).scheme.lower() == "memory":
        if args.workers is not None:
            print("dormant serve: a memory: store lives in one process: serving with one worker", file=sys.stderr)
        count = 1
    if count > 1 and not can_fork():
        print("dormant serve: this platform cannot fork worker processes: serving with one worker", file=sys.stderr)
        count = 1
    for stop in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell starts background jobs with it ignored
        signal.signal(stop, signal.default_int_handler)
    gave_up: list[str] = []  # why the workers could not be started again: the server stops, exit 1
    servers: list[LocalServer] = []

    def give_up(why: str) -> None:
        gave_up.append(why)
        for server in servers:  # shutdown waits for serve_forever to return: not in the thread that called it
            threading.Thread(target=server.shutdown, name="dormant-give-up", daemon=True).start()

    made = _missing_sqlite(args.store)
    with contextlib.ExitStack() as stack:
        try:
            api = stack.enter_context(_local_api(args))  # the store made (schema, table) once, before the workers
            handler: Handler = api
            if count > 1:
                stack.close()  # each worker opens its own store: a connection must not cross a fork
                workers = Workers(functools.partial(_local_api, args), count, on_give_up=give_up)
                stack.callback(workers.close)
                handler = workers
            server = LocalServer(handler, args.host, args.port, log_requests=not args.quiet)
            servers.append(server)
            if count > 1:
                workers.inherited = server.forget  # a worker started in place of a dead one is forked from it
        except (DormantError, OSError) as exc:
            print(f"dormant serve: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        stop_sweeping = threading.Event()
        if args.sweep_every > 0:
            sweeper = threading.Thread(
                target=_sweeping,
                args=(args, api.served if count == 1 else None, stop_sweeping),
                name="dormant-sweeper",
                daemon=True,
            )
            sweeper.start()
            stack.callback(sweeper.join, 30)
            stack.callback(stop_sweeping.set)
        print(
            f"dormant serve: {args.app} on {_redacted(args.store)} at {server.url} "
            f"(caller without {PRINCIPAL_HEADER}: {args.principal}"
            f"{f' of tenant {args.tenant}' if args.tenant else ''}{f' in {args.groups}' if args.groups else ''}; "
            f"{count} worker{'s' if count > 1 else ''}; Ctrl-C stops)\n"
            f"dormant serve: the session inspector is at {server.url}/",
            flush=True,
        )
        if made is not None:  # made, not refused (a new user's first serve has no store); said, not silent
            print(f"dormant serve: {made}", file=sys.stderr, flush=True)
        try:
            if not gave_up:  # the workers may have given up before the server was there to stop
                server.serve_forever()
        except KeyboardInterrupt:
            print("dormant serve: stopping (requests in flight finish first)", file=sys.stderr, flush=True)
        if gave_up:
            print(f"dormant serve: stopping, exit 1: {gave_up[0]} (restart it)", file=sys.stderr, flush=True)
        try:
            server.close()
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            if count > 1:
                workers.close(timeout=0)
            print("dormant serve: stopped without waiting for requests in flight", file=sys.stderr)
            return 130
    return 1 if gave_up else 0


def _missing_sqlite(url: str) -> str | None:
    """What ``dormant serve`` is about to make for a SQLite store that is not there yet (the file, and any
    missing folders), said on stderr, so a typo in the path shows; ``None`` when the file exists."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite" or not url.startswith("sqlite:///") or parts.path in {"", "/"}:
        return None
    from pathlib import Path

    path = Path(parts.path[1:])
    if path.exists():
        return None
    folder = next((p for p in reversed(path.parents) if not p.exists()), None)
    made = f" and the folder {folder}" if folder is not None else ""
    return f"no store at {path}: made a new, empty one there{made}"


def _machine_clients(given: str) -> str:
    """``--machine-clients``: the JSON mapping, given as is or as a file of it; a usage error (exit 2) naming
    what is wrong with it, not a traceback."""
    from .errors import ConfigurationError
    from .serving.callers import parse_clients  # the handlers' own check of $DORMANT_MACHINE_CLIENTS

    text = given
    if not given.lstrip().startswith("{"):
        try:
            text = pathlib.Path(given).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"neither a JSON object nor a file that can be read: {exc}") from None
    try:
        parse_clients(text.strip())
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _default_groups(args: argparse.Namespace) -> str:
    """The groups of a request that names no caller: ``--groups``, else the admin group (``dormant serve``'s own
    user administers their machine; a request naming a principal names its groups too)."""
    from .serving.callers import admin_group

    return str(args.groups) if args.groups is not None else admin_group()


@contextlib.contextmanager
def _local_api(args: argparse.Namespace) -> Iterator[LocalAPI]:
    """The API ``dormant serve`` serves, on a store of its own, closed afterwards (one per worker process)."""
    from .serving.local import LocalAPI
    from .serving.runtime import load_served
    from .serving.workflow import join_local_turns
    from .stores.url import store_from_url

    store = store_from_url(args.store)
    try:
        served = load_served(args.app, store)
        yield LocalAPI(
            served,
            principal=args.principal,
            tenant=args.tenant,
            groups=[g.strip() for g in _default_groups(args).split(",") if g.strip()],
            pages=default_pages(),
            idempotency=_idempotency(args.store, store),
            cors_origins=args.cors_origin,
        )
    finally:
        join_local_turns()  # the turns this process runs commit before its store closes
        store.close()


def _sweeping(args: argparse.Namespace, served: Served | None, stop: threading.Event) -> None:
    """``dormant serve``'s sweeper, every ``--sweep-every`` seconds: what the scheduled sweeper does on AWS
    (repair pending commits, purge expired sessions, hand on turns whose runner is gone)."""
    from .serving.runtime import load_served
    from .serving.workflow import sweeper_handler
    from .stores.url import store_from_url

    store = None
    if served is None:  # the workers hold their own stores: this thread opens one too
        store = store_from_url(args.store)
        served = load_served(args.app, store)
    sweep = sweeper_handler(served)
    try:
        while not stop.wait(args.sweep_every):
            try:
                done = sweep({}, None)
            except Exception:  # a sweep that fails is tried again at the next one
                logging.getLogger("dormant.serve").exception("dormant serve: the sweep failed")
                continue
            if done["repaired"] or done["purged"] or done["turns"]:
                print(f"dormant serve: swept {json.dumps(done)}", file=sys.stderr, flush=True)
    finally:
        if store is not None:
            store.close()


def _idempotency(url: str, store: SessionStore) -> Idempotency | None:
    """``Idempotency-Key`` works as deployed on every store: Powertools' records in the DynamoDB table, in the
    SQLite or Postgres database's ``idempotency`` table, or beside a memory store."""
    from .serving.idempotency import idempotency_for

    return idempotency_for(store)


def default_pages() -> list[Page]:
    """The pages ``dormant serve`` adds beside the API (see ``serving.local``: the seam for non-API paths):
    the session inspector, at ``/`` and ``/inspect/...``."""
    from .inspector import page

    return [page]


def _redacted(url: str) -> str:
    """The store URL as printed: without a password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


if __name__ == "__main__":
    sys.exit(main())
