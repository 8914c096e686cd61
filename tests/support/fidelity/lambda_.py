"""Lambda, locally: each function in worker processes of its own (warm sandboxes), with exactly the
environment its template gives it plus what Lambda sets, its timeout, its memory size and its response limit
enforced.

A sandbox serves one invocation at a time; concurrent invocations of a function get more sandboxes, as
Lambda scales out. A sandbox that times out, dies or passes its memory size is discarded (the next invocation
cold-starts). Each function's peak memory, as Lambda's REPORT line gives it (Max Memory Used), is kept in
``peaks`` (``worker._Memory``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .template import REGION, Function

HERE = Path(__file__).resolve().parent
MAX_RESPONSE_BYTES = 6 * 1024 * 1024
"""Lambda's limit on a synchronous invocation's response payload."""
INIT_WAIT = 60.0
"""How long a cold start's init may take here before the sandbox counts as dead (Lambda allows 10 s; a shared
machine is slower). A test at the harness's pace may give it more (``LambdaService.init_wait``)."""
PEAKS_FILE = "DORMANT_FIDELITY_PEAKS"
"""An environment variable naming a JSON file: when set, each deployment's functions' peak memory is merged into
it as the deployment closes (``record_peaks``)."""
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "dormantlocal", "AWS_SECRET_ACCESS_KEY": "dormantlocal", "AWS_SESSION_TOKEN": "x"}


@dataclass
class Invocation:
    """One invocation's outcome, as Lambda reports it: a payload, or a function error."""

    function: str
    ok: bool
    payload: Any = None
    error_type: str | None = None
    error_message: str = ""
    seconds: float = 0.0
    throttled: bool = False
    """Refused by Lambda before it ran: the function was at its concurrency (``TooManyRequestsException``)."""
    peak_mb: int = 0
    """The sandbox's peak memory by the invocation's end (Max Memory Used): runtime, init and invocations so far."""
    init_mb: int | None = None
    """A cold start's: the sandbox's peak memory by the end of its init (None when the sandbox was warm)."""

    def error(self) -> dict[str, Any]:
        return {"errorType": self.error_type, "errorMessage": self.error_message}


@dataclass
class Call:
    """One IAM check of an AWS call a function made."""

    function: str
    operation: str
    action: str
    resource: str
    allowed: bool


@dataclass
class Concurrency:
    """Lambda's concurrency as the account has it: each reserved function's cap, and what the others share."""

    reserved: dict[str, int]
    unreserved: int
    accountant: Any = None
    """Where throttles are counted (``capacity.Accountant``)."""


@dataclass
class _Sandbox:
    process: subprocess.Popen[bytes]
    messages: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)
    busy: bool = False


class LambdaService:
    """Invoke the template's functions by name or ARN, each in its own sandboxes."""

    def __init__(
        self,
        functions: dict[str, Function],
        layer_dirs: dict[str, Path],
        endpoints: dict[str, str],
        workdir: Path,
        *,
        concurrency: Concurrency | None = None,
        capacity_config: dict[str, Any] | None = None,
    ) -> None:
        self.functions = functions
        self.concurrency = concurrency
        """When given, Lambda's concurrency is enforced (``capacity``): one invocation past a cap is throttled."""
        self._capacity_config = capacity_config or {}
        self._running: dict[str, int] = {name: 0 for name in functions}
        self.init_wait = INIT_WAIT
        self.layer_dirs = layer_dirs
        self.endpoints = endpoints
        self.workdir = workdir
        self.calls: list[Call] = []
        self.dynamodb: list[dict[str, Any]] = []
        """While capturing (``capture``): each DynamoDB call's record (``capture.py``), with its ``function``."""
        self.invocations: list[Invocation] = []
        self.cold_starts: dict[str, int] = {}
        """Function -> how many sandboxes were started for it (each a cold start: its init ran once)."""
        self.peaks: dict[str, int] = {}
        """Function -> the highest peak memory (MB) any of its sandboxes reached, as Lambda reports Max Memory Used."""
        self.init_peaks: dict[str, int] = {}
        """Function -> the highest peak memory (MB) a sandbox of it reached by the end of its init (its imports)."""
        self._idle: dict[str, list[_Sandbox]] = {name: [] for name in functions}
        self._busy: dict[str, list[_Sandbox]] = {name: [] for name in functions}
        self._lock = threading.Lock()
        self._configs = {name: self._write_config(f) for name, f in functions.items()}

    def name_of(self, name_or_arn: str) -> str:
        for name, function in self.functions.items():
            if name_or_arn in (name, function.function_name, function.arn) or name_or_arn.startswith(
                function.arn + ":"
            ):
                return name
        raise KeyError(f"no function {name_or_arn!r}")

    def environment(self, function: Function) -> dict[str, str]:
        """Exactly what the function sees: its template variables, Lambda's own, the endpoint stand-ins."""
        env = {
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_LAMBDA_FUNCTION_NAME": function.function_name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function.function_name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "harness",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
            "LAMBDA_TASK_ROOT": str(function.code_dir),
            "LAMBDA_RUNTIME_DIR": str(Path(sys.executable).parent),
            "TZ": ":UTC",
            "LANG": "en_US.UTF-8",
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            **CREDENTIALS,
            **self.endpoints,
        }
        env.update(function.environment)  # Lambda refuses templates that set its reserved names; CDK would too
        return env

    def _write_config(self, function: Function) -> Path:
        import site

        config = {
            "code_dir": str(function.code_dir),
            "layer_dirs": [str(self.layer_dirs[layer]) for layer in function.layers],
            "site_packages": site.getsitepackages(),
            "harness_dir": str(HERE),
            "handler": function.handler,
            "function_name": function.function_name,
            "function_arn": function.arn,
            "memory": function.memory,
            "role": function.role,
            "statements": function.statements,
            "crash_file": str(self.workdir / f"{function.name}.crash"),
            "fault_file": str(self.workdir / f"{function.name}.fault"),
            "hold_file": str(self.workdir / f"{function.name}.hold"),
            "capture_file": str(self.workdir / "capture"),
            "clock_file": str(self.workdir / "clock"),
            **self._capacity_config,
        }
        path = self.workdir / f"{function.name}.json"
        path.write_text(json.dumps(config))
        return path

    def _start(self, name: str) -> _Sandbox:
        function = self.functions[name]
        with self._lock:
            self.cold_starts[name] = self.cold_starts.get(name, 0) + 1
        read, write = os.pipe()
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(HERE / "worker.py"), str(self._configs[name]), str(write)],
            env=self.environment(function),
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            pass_fds=(write,),
            cwd=str(function.code_dir),
        )
        os.close(write)
        log.close()
        sandbox = _Sandbox(process)
        threading.Thread(target=self._read, args=(name, read, sandbox), daemon=True).start()
        return sandbox

    def _read(self, name: str, fd: int, sandbox: _Sandbox) -> None:
        with os.fdopen(fd, encoding="utf-8") as lines:
            for line in lines:
                message = json.loads(line)
                if message["kind"] == "call":
                    with self._lock:
                        self.calls.append(
                            Call(name, message["operation"], message["action"], message["resource"], message["allowed"])
                        )
                elif message["kind"] == "dynamodb":
                    with self._lock:
                        self.dynamodb.append({**message, "function": name})
                else:
                    sandbox.messages.put(message)
        sandbox.messages.put(None)  # the process is gone

    def _take(self, name: str) -> _Sandbox:
        with self._lock:
            if self._idle[name]:
                sandbox = self._idle[name].pop()
                self._busy[name].append(sandbox)
                return sandbox
        sandbox = self._start(name)
        with self._lock:
            self._busy[name].append(sandbox)
        return sandbox

    def _discard(self, name: str, sandbox: _Sandbox) -> None:
        _end(sandbox)
        with self._lock, contextlib.suppress(ValueError):
            self._busy[name].remove(sandbox)

    def invoke(self, name_or_arn: str, event: Any) -> Invocation:
        """A synchronous (RequestResponse) invocation."""
        name = self.name_of(name_or_arn)
        if not self._admit(name):
            message = "Rate Exceeded."
            return self._record(
                Invocation(name, False, error_type="TooManyRequestsException", error_message=message, throttled=True)
            )
        try:
            return self._invoke(name, event)
        finally:
            with self._lock:
                self._running[name] -= 1

    def _admit(self, name: str) -> bool:
        """Count the invocation in, unless the function (or the account's unreserved pool) is at its limit."""
        with self._lock:
            limits = self.concurrency
            if limits is not None:
                if name in limits.reserved:
                    full = self._running[name] >= limits.reserved[name]
                else:
                    shared = sum(n for f, n in self._running.items() if f not in limits.reserved)
                    full = shared >= limits.unreserved
                if full:
                    if limits.accountant is not None:
                        limits.accountant.throttled(name, "concurrency")
                    return False
            self._running[name] += 1
            return True

    def _invoke(self, name: str, event: Any) -> Invocation:
        function = self.functions[name]
        started = time.monotonic()
        request_id = str(uuid.uuid4())
        sandbox = self._take(name)
        # Lambda's timeout covers the invocation, not the cold start's init (which has its own 10 s).
        ready = self._next(sandbox, started + self.init_wait)
        if ready is not None and ready.get("kind") == "oom":
            self._discard(name, sandbox)
            return self._record(self._out_of_memory(name, request_id, ready))
        if ready is None or ready.get("kind") != "ready":
            self._discard(name, sandbox)
            return self._record(Invocation(name, False, error_type="Runtime.ExitError", error_message="init died"))
        init_mb = self._peaked(name, ready, init=True) if "peak_mb" in ready else None
        deadline = time.time() + function.timeout
        request = {"event": event, "request_id": request_id, "deadline": deadline}
        try:
            assert sandbox.process.stdin is not None
            sandbox.process.stdin.write((json.dumps(request) + "\n").encode())
            sandbox.process.stdin.flush()
        except OSError:
            self._discard(name, sandbox)
            return self._record(Invocation(name, False, error_type="Runtime.ExitError", error_message="died"))
        until = time.monotonic() + function.timeout
        message = self._next(sandbox, until)
        seconds = time.monotonic() - started
        if message is not None and message.get("kind") == "oom":
            self._discard(name, sandbox)
            return self._record(self._out_of_memory(name, request_id, message, seconds))
        if message is None:
            # None before the deadline: the process closed its end (it died). Asking the process instead
            # races with the kernel, which closes a killed process's files before it can be reaped.
            timed_out = time.monotonic() >= until
            self._discard(name, sandbox)
            if timed_out:
                text = f"Task timed out after {function.timeout:.2f} seconds"
                return self._record(Invocation(name, False, error_type="Sandbox.Timedout", error_message=text))
            text = f"RequestId: {request_id} Error: Runtime exited with error: signal: killed"
            return self._record(Invocation(name, False, error_type="Runtime.ExitError", error_message=text))
        self._release(name, sandbox)
        peak = self._peaked(name, message)
        if not message["ok"]:
            return self._record(
                Invocation(
                    name,
                    False,
                    error_type=message["errorType"],
                    error_message=message["errorMessage"],
                    peak_mb=peak,
                    init_mb=init_mb,
                )
            )
        body = message["payload"]
        if len(body.encode()) > MAX_RESPONSE_BYTES:
            text = f"Response payload size ({len(body.encode())} bytes) exceeded maximum allowed payload size"
            return self._record(Invocation(name, False, error_type="Function.ResponseSizeTooLarge", error_message=text))
        return self._record(
            Invocation(name, True, payload=json.loads(body), seconds=seconds, peak_mb=peak, init_mb=init_mb)
        )

    def _peaked(self, name: str, message: dict[str, Any], *, init: bool = False) -> int:
        peak = int(message.get("peak_mb", 0))
        with self._lock:
            self.peaks[name] = max(self.peaks.get(name, 0), peak)
            if init:
                self.init_peaks[name] = max(self.init_peaks.get(name, 0), peak)
        return peak

    def resize(self, name: str, memory_mb: int) -> None:
        """Give ``name`` another memory size, as ``UpdateFunctionConfiguration`` would: its idle sandboxes are
        retired, so the next invocation cold-starts at the new size (a busy one ends at the size it started with)."""
        with self._lock:
            self.functions[name].memory = memory_mb
            self._configs[name] = self._write_config(self.functions[name])
            idle, self._idle[name] = self._idle[name], []
        for sandbox in idle:
            _end(sandbox)

    def _out_of_memory(self, name: str, request_id: str, message: dict[str, Any], seconds: float = 0.0) -> Invocation:
        """What Lambda answers for a sandbox that passed its memory size (killed by the kernel, discarded), with its
        peak recorded as Lambda's REPORT line would show it (Max Memory Used at the size)."""
        self._peaked(name, message)
        text = f"RequestId: {request_id} Error: Runtime exited with error: signal: killed"
        return Invocation(
            name,
            False,
            error_type="Runtime.OutOfMemory",
            error_message=text,
            seconds=seconds,
            peak_mb=int(message.get("peak_mb", 0)),
        )

    def _next(self, sandbox: _Sandbox, until: float) -> dict[str, Any] | None:
        try:
            return sandbox.messages.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return None

    def _release(self, name: str, sandbox: _Sandbox) -> None:
        sandbox.messages.put({"kind": "ready"})  # warm: the next invocation skips init
        with self._lock:
            with contextlib.suppress(ValueError):
                self._busy[name].remove(sandbox)
            self._idle[name].append(sandbox)

    def _record(self, invocation: Invocation) -> Invocation:
        with self._lock:
            self.invocations.append(invocation)
        return invocation

    def kill(self, name: str) -> int:
        """``kill -9`` the function's busy sandboxes (mid-invocation); how many were killed."""
        with self._lock:
            busy = list(self._busy[name])
        for sandbox in busy:
            with contextlib.suppress(ProcessLookupError):
                sandbox.process.kill()
        return len(busy)

    def crash_before(self, name: str, action: str) -> None:
        """The next call of ``action`` by ``name`` is not made: its sandbox is killed just before it."""
        (self.workdir / f"{name}.crash").write_text(action)

    def hold_after(self, name: str, action: str) -> None:
        """The next call of ``action`` by ``name`` is made, then its sandbox pauses until ``release(name)`` (or
        ``worker.HOLD_LIMIT_S``): a writer slow between two calls, e.g. the API between its execution and its claim."""
        (self.workdir / f"{name}.hold").write_text(action)

    def holding(self, name: str) -> bool:
        """Whether a sandbox of ``name`` made the call ``hold_after`` named and is paused after it now."""
        return (self.workdir / f"{name}.hold.held").exists()

    def release(self, name: str) -> None:
        """Let a held sandbox of ``name`` go on (and disarm a hold no call has met yet)."""
        for path in (self.workdir / f"{name}.hold", self.workdir / f"{name}.hold.held"):
            path.unlink(missing_ok=True)

    def fail_next(self, name: str, operation: str, where: list[str], answer: dict[str, Any], times: int = 1) -> None:
        """The next ``operation`` call by ``name`` whose parameters (as JSON) hold each of ``where`` (and the
        ``times - 1`` like it after it: a caller's own re-sends) is answered by the service with a 400 of ``answer``
        (its error body) instead of reaching it."""
        fault = {"operation": operation, "where": where, "answer": answer, "times": times}
        (self.workdir / f"{name}.fault").write_text(json.dumps(fault))

    def fault_armed(self, name: str) -> bool:
        """Whether a ``fail_next`` of ``name`` is still waiting for its call."""
        return (self.workdir / f"{name}.fault").exists()

    def capture(self, on: bool) -> None:
        """Record what every function's DynamoDB calls touch (``self.dynamodb``), from now until turned off. The
        records cost the functions extra reads: time nothing while capturing."""
        path = self.workdir / "capture"
        if on:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def advance(self, seconds: float) -> None:
        """Move dormant's clock on by ``seconds`` in every sandbox, now and to come (``worker._moved_clock``)."""
        path = self.workdir / "clock"
        moved = float(path.read_text()) if path.exists() else 0.0
        written = path.with_name("clock.next")
        written.write_text(str(moved + seconds))
        os.replace(written, path)  # whole or not at all: a sandbox never reads a half-written (empty) offset

    def busy(self, name: str) -> int:
        with self._lock:
            return len(self._busy[name])

    def close(self) -> None:
        with self._lock:
            sandboxes = [s for group in (*self._idle.values(), *self._busy.values()) for s in group]
        for sandbox in sandboxes:
            _end(sandbox)
        if os.environ.get(PEAKS_FILE):
            record_peaks(
                Path(os.environ[PEAKS_FILE]), {**self.peaks, **{f"{n}.init": p for n, p in self.init_peaks.items()}}
            )


def record_peaks(path: Path, peaks: dict[str, int]) -> None:
    """Merge ``peaks`` into the JSON file at ``path`` (function -> the highest peak MB seen), under a lock: how
    each function's peak over the fidelity arcs is measured (``PEAKS_FILE``; docs/deploying.md)."""
    import fcntl

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        seen = json.loads(path.read_text()) if path.exists() else {}
        for name, peak in peaks.items():
            seen[name] = max(int(seen.get(name, 0)), peak)
        path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")


def _end(sandbox: _Sandbox) -> None:
    with contextlib.suppress(ProcessLookupError):
        sandbox.process.kill()
    sandbox.process.wait()
    if sandbox.process.stdin is not None:
        with contextlib.suppress(OSError):
            sandbox.process.stdin.close()


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="fidelity-"))
