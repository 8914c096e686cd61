"""The bootstrap of one function's sandbox (run as ``python -I -S worker.py CONFIG``; never imported by tests).

What Lambda's Python runtime does, in order: build ``sys.path`` (the function's code, then each layer's
``python`` directory, then the runtime's packages: here the venv's site-packages), import the handler
module once (init), then serve invocations one at a time. Before the handler is imported, botocore's
``BaseClient._make_api_call`` is wrapped so every AWS call the function makes (boto3 or botocore, its own
or a library's) is authorized against the function's policy statements (``iam``), and recorded.

Invocations arrive as JSON lines on stdin; results and call records go out as JSON lines on the descriptor
named by the second argument (stdout and stderr are the function's log, as on Lambda).

The function's ``MemorySize`` is enforced as Lambda enforces it, on the sandbox's peak resident memory (runtime,
init and every invocation so far: ``VmHWM``, the kernel's high-water mark, one read of ``/proc/self/status`` a
look). It is looked at after init, before every AWS call and at the end of every invocation; a sandbox past its
size is killed (``SIGKILL``) after telling the harness, which reports ``Runtime.OutOfMemory`` (``_Memory``).
Between two looks a hard ``RLIMIT_DATA`` stops a runaway allocation (``_Memory.limit``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

HOLD_LIMIT_S = 60.0
"""The longest a sandbox stays held after a call (``hold_after``) when the harness never lets go."""
HARD_LIMIT_FACTOR = 2
"""The hard limit on a sandbox's writable memory, as a multiple of its size (``_Memory.limit``)."""


def main(config_path: str, fd: int) -> None:
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    runtime_paths = [p for p in sys.path if p]  # the standard library (-I -S: no site-packages, no cwd)
    sys.path[:] = [config["code_dir"], *config["layer_dirs"], *runtime_paths]
    import site

    for directory in config["site_packages"]:
        site.addsitedir(directory)  # after the layers, as the runtime's boto3 is
    sys.path.insert(0, config["harness_dir"])
    import iam  # the harness's own module, from its directory (not a package import)

    sys.path.remove(config["harness_dir"])
    out = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, default=str) + "\n")
        out.flush()

    memory = _Memory(int(config["memory"]), send)
    memory.limit()
    _guard_botocore(config, iam, send, memory)
    os.chdir(config["code_dir"])
    module_name, _, attr = config["handler"].rpartition(".")
    handler: Any = None
    init_error: dict[str, Any] | None = None
    try:
        import importlib

        handler = getattr(importlib.import_module(module_name), attr)
    except MemoryError:
        memory.exceeded()
    except ImportError as exc:
        init_error = _error(exc, "Runtime.ImportModuleError")
    except Exception as exc:
        init_error = _error(exc, type(exc).__name__)
    _moved_clock(config)
    memory.check()  # init counts: a sandbox whose imports pass its size never serves
    send({"kind": "ready", "init_error": init_error, "peak_mb": memory.peak()})

    for line in sys.stdin:
        request = json.loads(line)
        if init_error is not None:
            send({"kind": "result", "ok": False, **init_error})
            continue
        context = _Context(config, request["request_id"], request["deadline"])
        try:
            payload = handler(request["event"], context)
            body = json.dumps(payload)
        except MemoryError:  # the hard limit refused an allocation: past its size, as Lambda would have killed it
            memory.exceeded()
        except Exception as exc:
            failed = _error(exc, type(exc).__name__)
            _flush()
            memory.check()
            send({"kind": "result", "ok": False, "peak_mb": memory.peak(), **failed})
            continue
        _flush()  # an invocation's log lines reach CloudWatch Logs by the time it ends, as on Lambda
        memory.check()
        send({"kind": "result", "ok": True, "payload": body, "peak_mb": memory.peak()})


class _Memory:
    """The function's ``MemorySize`` over the sandbox's peak resident memory, as Lambda counts it (Max Memory Used).

    Lambda's sandbox is a cgroup: the kernel kills it the moment it passes its size. Here the peak (the kernel's
    high-water RSS, kept by the kernel itself, so nothing is polled) is looked at where it matters: after init,
    before each AWS call (so a sandbox past its size makes no further write, as on Lambda) and at the end of each
    invocation (so a peak that came and went is caught). A sandbox past its size tells the harness and dies.
    """

    def __init__(self, size_mb: int, send: Any) -> None:
        self.size_mb = size_mb
        self._send = send

    def limit(self) -> None:
        """A hard stop between two looks: ``RLIMIT_DATA`` (the heap and private writable mappings, which hold
        everything the process can dirty but its code) at ``HARD_LIMIT_FACTOR`` x the size. Not ``RLIMIT_RSS``
        (Linux ignores it) nor ``RLIMIT_AS`` (address space: glibc reserves 64 MB an arena and 8 MB a thread's
        stack that are never touched, so a healthy sandbox's would pass its size long before its memory does).
        Not at the size itself: untouched writable reservations (thread stacks) count in it, and a sandbox must
        not fail here where Lambda would not. An allocation it refuses is a ``MemoryError``: past its size."""
        import resource

        hard = self.size_mb * HARD_LIMIT_FACTOR * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))

    def peak(self) -> int:
        """The sandbox's peak resident memory so far, in MB (rounded up), runtime and init included: ``VmHWM``, the
        kernel's high-water mark of this process's memory. Not ``ru_maxrss``: Linux carries it over ``execve``
        from the process that forked (with ``vfork``, the harness's whole pytest), so it reports the parent's."""
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return -(-int(line.split()[1]) // 1024)  # kB
        raise RuntimeError("no VmHWM in /proc/self/status: the harness measures memory on Linux")

    def check(self) -> None:
        if self.peak() > self.size_mb:
            self.exceeded()

    def exceeded(self) -> None:
        """Die as Lambda kills a sandbox past its size (``SIGKILL``), once the harness knows why."""
        self._send({"kind": "oom", "peak_mb": self.peak(), "size_mb": self.size_mb})
        os.kill(os.getpid(), 9)


_HELD: list[Any] = []
"""What must outlive the call that made it: the moved clock's context manager."""


def _moved_clock(config: dict[str, Any]) -> None:
    """dormant's clock, moved on by the seconds the harness wrote in its clock file (``Deployment.advance``): time
    that would really pass (a claim's deadline, a wait's grace) passes for the functions without waiting for it."""
    clock_file = config.get("clock_file")
    if not clock_file:
        return
    try:
        from dormant import clock
    except ImportError:  # a function without the library
        return
    read: list[Any] = [None, 0]  # the file's mtime, the offset in ms

    def offset() -> int:
        try:
            found = os.stat(clock_file)
            stamp = (found.st_ino, found.st_mtime_ns)  # a new file each advance (``LambdaService.advance``)
        except OSError:
            return 0
        if stamp != read[0]:
            with open(clock_file, encoding="utf-8") as f:
                read[:] = [stamp, int(float(f.read().strip() or 0) * 1000)]
        return int(read[1])

    moved = clock.use_clock(lambda: clock.system_ms() + offset())
    moved.__enter__()
    # Held for the sandbox's life: a context manager dropped after ``__enter__`` is collected at once, and closing
    # its generator runs its ``finally``, which put the system clock back (``d.advance`` then moved nothing).
    _HELD.append(moved)


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _error(exc: BaseException, error_type: str) -> dict[str, Any]:
    trace = traceback.format_exception(exc)
    sys.stderr.write("".join(trace))
    return {"errorType": error_type, "errorMessage": str(exc), "stackTrace": trace}


class _Context:
    """The Lambda context object: what the Python runtime passes as the handler's second argument."""

    def __init__(self, config: dict[str, Any], request_id: str, deadline: float) -> None:
        self.function_name = config["function_name"]
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = config["memory"]
        self.invoked_function_arn = config["function_arn"]
        self.aws_request_id = request_id
        self.log_group_name = f"/aws/lambda/{config['function_name']}"
        self.log_stream_name = "harness"
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.time()) * 1000))


def _capture(config: dict[str, Any]) -> Any:
    """The harness's ``capture`` module, loaded on first use (never on a sandbox's cold start)."""
    if "_harness_capture" not in sys.modules:  # a name no function's own module takes
        import importlib.util

        path = os.path.join(config["harness_dir"], "capture.py")
        spec = importlib.util.spec_from_file_location("_harness_capture", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["_harness_capture"] = module
        spec.loader.exec_module(module)
    return sys.modules["_harness_capture"]


def _guard_botocore(config: dict[str, Any], iam: Any, send: Any, memory: _Memory) -> None:
    """Authorize every botocore API call against the function's statements, as AWS would; while the harness
    captures (its capture file exists), record what each DynamoDB call touched (``capture.py``)."""
    import base64

    from botocore.client import BaseClient
    from botocore.exceptions import ClientError

    original = BaseClient._make_api_call
    statements = config["statements"]
    principal = f"arn:aws:sts::{iam.ACCOUNT}:assumed-role/{config['role']}/{config['function_name']}"

    def token_owner(token: str) -> str | None:
        try:
            return str(json.loads(base64.urlsafe_b64decode(token.encode()))["m"])
        except Exception:
            return None

    crash_file = config["crash_file"]

    def crash_before(action: str) -> None:
        """Die (SIGKILL) before the call, when the harness asked for it: a writer killed between two calls."""
        try:
            with open(crash_file, encoding="utf-8") as f:
                wanted = f.read().strip()
        except OSError:
            return
        if wanted == action:
            try:
                os.rename(crash_file, f"{crash_file}.{os.getpid()}")  # one sandbox claims it
            except OSError:
                return
            os.kill(os.getpid(), 9)

    hold_file = config["hold_file"]

    def hold_after(actions: list[str]) -> None:
        """Pause after the call, when the harness asked for it, until it lets go: a writer slow between two calls
        (the hold file names the action; claimed as ``<hold>.held``, which the harness deletes to let go)."""
        try:
            with open(hold_file, encoding="utf-8") as f:
                wanted = f.read().strip()
        except OSError:
            return
        if wanted not in actions:
            return
        held = f"{hold_file}.held"
        try:
            os.rename(hold_file, held)  # one sandbox claims it
        except OSError:
            return
        until = time.monotonic() + HOLD_LIMIT_S
        while os.path.exists(held) and time.monotonic() < until:
            time.sleep(0.005)

    fault_file = config["fault_file"]

    def fault_for(operation_name: str, api_params: dict[str, Any]) -> dict[str, Any] | None:
        """The error AWS answers this call with, when the harness armed one for a call like it (its ``times``)."""
        try:
            with open(fault_file, encoding="utf-8") as f:
                fault = json.load(f)
        except (OSError, ValueError):
            return None
        text = json.dumps(api_params, sort_keys=True, default=str)
        if fault["operation"] != operation_name or not all(part in text for part in fault["where"]):
            return None
        claimed = f"{fault_file}.{os.getpid()}"
        try:
            os.rename(fault_file, claimed)  # one call claims it
        except OSError:
            return None
        if int(fault.get("times", 1)) > 1:  # armed for more calls like it: the next one's, put back
            with open(f"{claimed}.next", "w", encoding="utf-8") as f:
                json.dump({**fault, "times": int(fault["times"]) - 1}, f)
            os.replace(f"{claimed}.next", fault_file)
        return fault["answer"]  # type: ignore[no-any-return]

    def answered(self: Any, operation_name: str, api_params: dict[str, Any], answer: dict[str, Any]) -> Any:
        """Make the call with every HTTP attempt answered 400 ``answer`` (the service's error body): botocore
        parses it and retries it as it would the service's own."""
        from botocore.awsrequest import AWSResponse

        class Raw:
            def stream(self, **_: Any) -> list[bytes]:
                return [json.dumps(answer).encode()]

        def refuse(request: Any, **_: Any) -> Any:
            return AWSResponse(request.url, 400, {"x-amzn-requestid": "harness-fault"}, Raw())

        event = f"before-send.{self.meta.service_model.endpoint_prefix}.{operation_name}"
        self.meta.events.register_first(event, refuse, unique_id="harness-fault")
        try:
            return original(self, operation_name, api_params)
        finally:
            self.meta.events.unregister(event, unique_id="harness-fault")

    def checked(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
        service = self.meta.service_model.endpoint_prefix
        required = iam.required(service, operation_name, api_params, token_owner=token_owner)
        try:
            return made(self, operation_name, api_params, service, required)
        finally:  # answered or refused, the call is over: a held writer pauses before its next step
            hold_after([action for action, _ in required])

    def made(
        self: Any, operation_name: str, api_params: dict[str, Any], service: str, required: list[tuple[str, str]]
    ) -> Any:
        """The call, once the role allows each of its actions (and any fault or capture the harness armed)."""
        memory.check()  # a sandbox past its size is dead before its next call: the call is never made
        for action, resource in required:
            crash_before(action)
            granted = iam.allowed(statements, action, resource)
            send(
                {
                    "kind": "call",
                    "operation": operation_name,
                    "action": action,
                    "resource": resource,
                    "allowed": granted,
                }
            )
            if not granted:
                message = (
                    f"User: {principal} is not authorized to perform: {action} on resource: {resource} "
                    f"because no identity-based policy allows the {action} action"
                )
                raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": message}}, operation_name)
        answer = fault_for(operation_name, api_params)
        if answer is not None:
            return answered(self, operation_name, api_params, answer)
        if service == "dynamodb" and config.get("capacity_url"):
            return _metered(
                config, lambda op, params: original(self, op, params), self, operation_name, api_params, send
            )
        if service == "dynamodb" and os.path.exists(config["capture_file"]):
            return _capture(config).observe(
                lambda op, params: original(self, op, params),
                operation_name,
                api_params,
                lambda record: send({"kind": "dynamodb", **record}),
            )
        return original(self, operation_name, api_params)

    BaseClient._make_api_call = checked  # type: ignore[method-assign]


def _module(name: str, path: str) -> Any:
    """A harness module loaded from its file once, under a name no function's own module takes."""
    if name not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_connection: list[Any] = []


def _post(url: str, body: dict[str, Any]) -> Any:
    """POST ``body`` to the harness's accountant on one kept-alive connection (a call a DynamoDB request)."""
    import http.client
    from urllib.parse import urlsplit

    if not _connection:
        parts = urlsplit(url)
        _connection.append(http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30))
    connection = _connection[0]
    data = json.dumps(body).encode()
    try:
        connection.request("POST", urlsplit(url).path, data, {"Content-Type": "application/json"})
        return json.loads(connection.getresponse().read())
    except (OSError, http.client.HTTPException):
        connection.close()  # reconnect once
        connection.request("POST", urlsplit(url).path, data, {"Content-Type": "application/json"})
        return json.loads(connection.getresponse().read())


def _metered(config: dict[str, Any], call: Any, client: Any, operation: str, params: dict[str, Any], send: Any) -> Any:
    """A DynamoDB call under the partitions' throughput (``capacity.py``): before each HTTP attempt the harness's
    accountant is asked whether a partition the call touches is over its rate (then the attempt is answered
    with DynamoDB's throttle, which botocore retries); once made, the call's units per partition, billed from
    the items before and after it (``capture``, ``bench.units``), are charged. Capture's record goes out too."""
    capture = _capture(config)
    units = _module("_harness_units", config["units_file"])
    if operation not in capture.WRITES | capture.READS:
        return call(operation, params)
    tables = {t["TableName"]: units.Table.described(t) for t in config["tables"]}
    targets = capture._targets(call, operation, params) if operation in capture.WRITES else []
    before = [capture._get(call, table, key) for table, key in targets]
    record: dict[str, Any] = {"operation": operation, "params": capture.plain(params), "error": None}
    touched = _touched(units, tables, record, params, before)
    url = config["capacity_url"]

    def admit(request: Any, **_: Any) -> Any:
        refused = _post(f"{url}/admit", {"function": config["function_name"], "partitions": touched})["refused"]
        if refused is None:
            return None
        return _throttle(request, operation, params, refused)

    event = f"before-send.dynamodb.{operation}"
    client.meta.events.register_first(event, admit, unique_id="harness-capacity")
    try:
        answer = call(operation, params)
    except Exception as exc:
        record["error"] = str(getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__)
        if record["error"] not in ("ProvisionedThroughputExceededException", "ThrottlingException"):
            record["images"] = [[b, b] for b in before]  # refused by its condition: billed, nothing applied
            _charge(units, tables, record, url, config, send)
        raise
    finally:
        client.meta.events.unregister(event, unique_id="harness-capacity")
    if operation in capture.WRITES:
        record["images"] = [
            [b, _after(capture, call, operation, params, t, k)] for b, (t, k) in zip(before, targets, strict=True)
        ]
    elif operation == "Query" and not capture._NARROWING & params.keys():
        record["items"] = [capture.plain(item) for item in answer.get("Items", [])]  # evaluated whole, as read
    elif operation == "BatchGetItem":  # each key asked for, found or not (a projection may leave out the key)
        asked = [(t, key) for t, request in params["RequestItems"].items() for key in request["Keys"]]
        record["items"] = [capture._get(call, t, key) for t, key in asked]
        record["tables"] = [t for t, _ in asked]
    else:
        record["items"] = capture._read_items(call, operation, params, answer)
    _charge(units, tables, record, url, config, send)
    return answer


def _after(capture: Any, call: Any, operation: str, params: dict[str, Any], table: str, key: Any) -> Any:
    """The item as the write left it: a put's item, nothing after a delete, else read back (off the books)."""
    if operation == "PutItem" and "ConditionExpression" not in params:
        return capture.plain(params["Item"])
    if operation == "DeleteItem" and "ConditionExpression" not in params:
        return None
    return capture._get(call, table, key)


def _touched(
    units: Any, tables: dict[str, Any], record: dict[str, Any], params: dict[str, Any], before: list[Any]
) -> list[Any]:
    """The partitions a call will touch, known before it runs: its items' keys, the index entries they hold now and
    the ones a put gives them; a read's keys (a batch read's are left out: its items are not known yet)."""
    plan = dict(record)
    operation = record["operation"]
    if operation in ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"):
        puts: list[Any] = []
        if operation == "PutItem":
            puts = [params["Item"]]
        elif operation == "BatchWriteItem":
            puts = [r.get("PutRequest", {}).get("Item") for rs in params["RequestItems"].values() for r in rs]
        elif operation == "TransactWriteItems":
            puts = [e.get("Put", {}).get("Item") for e in params["TransactItems"]]
        else:
            puts = [None]
        plan["images"] = [[b, p if p is not None else b] for b, p in zip(before, puts, strict=True)]
    elif operation == "GetItem":
        plan["items"] = [None]
    elif operation == "TransactGetItems":
        plan["items"] = [None] * len(params["TransactItems"])
    else:
        plan["items"], plan["tables"] = [], []
    plan["params"] = params
    return [list(p) for p in units.partition_units(plan, tables)]


def _charge(
    units: Any, tables: dict[str, Any], record: dict[str, Any], url: str, config: dict[str, Any], send: Any
) -> None:
    billed = units.partition_units(record, tables)
    _post(f"{url}/charge", {"units": [[list(p), u] for p, u in billed.items()]})
    if os.path.exists(config["capture_file"]):
        send({"kind": "dynamodb", **record})


def config_account() -> str:
    return str(sys.modules["iam"].ACCOUNT)


def _throttle(request: Any, operation: str, params: dict[str, Any], refused: list[str]) -> Any:
    """DynamoDB's answer to a request past a partition's rate: ``ProvisionedThroughputExceededException`` with its
    reason (an on-demand table's key range too), or in a transaction a cancellation whose items say
    ``ThrottlingError`` (every item here: the harness does not tell which one)."""
    from botocore.awsrequest import AWSResponse

    place, _, kind = refused
    reason = f"{'Index' if '/' in place else 'Table'}{kind.capitalize()}KeyRangeThroughputExceeded"
    arn = (
        f"arn:aws:dynamodb:{os.environ.get('AWS_REGION', '')}:{config_account()}:table/{place.replace('/', '/index/')}"
    )
    body: dict[str, Any]
    if operation in ("TransactWriteItems", "TransactGetItems"):
        body = {
            "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
            "message": "Transaction cancelled, please refer cancellation reasons for specific reasons",
            "CancellationReasons": [
                {
                    "Code": "ThrottlingError",
                    "Message": "Throughput exceeds the current capacity for one or more global secondary indexes.",
                }
                for _ in params["TransactItems"]
            ],
        }
    else:
        body = {
            "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            "message": "The level of configured provisioned throughput for the table was exceeded.",
            "ThrottlingReasons": [{"reason": reason, "resource": arn}],
        }

    class Raw:
        def stream(self, **_: Any) -> list[bytes]:
            return [json.dumps(body).encode()]

    return AWSResponse(request.url, 400, {"x-amzn-requestid": "harness-capacity"}, Raw())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
