"""Step Functions, locally: an interpreter of the template's own ASL, served over HTTP as the real API
(awsJson1_0, ``X-Amz-Target: AWSStepFunctions.<Op>``) so the functions reach it with their own botocore.

Standard workflows only. Task resources: ``arn:aws:states:::lambda:invoke`` (and ``.waitForTaskToken``),
dispatched to the Lambda stand-in, and ``arn:aws:states:::states:startExecution`` (continue-as-new). Each
state machine's own role is checked (``lambda:InvokeFunction``, ``states:StartExecution``) like a function's.

``time_scale`` multiplies Retry intervals and Wait states (not task timeouts, which the tests set through
template parameters). Each execution keeps a history of the events AWS would write for the same run, so a
test can count events per loop; 25,000 events or ``max_execution_seconds`` end it as AWS would.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import iam
from .template import ACCOUNT, REGION

MAX_EVENTS = 25_000
YEAR = 365 * 24 * 3600.0
NAME_REUSE_SECONDS = 90 * 24 * 3600.0


class StatesError(Exception):
    """An error a state raises (``States.TaskFailed``, a Lambda errorType, ...), matched by Retry/Catch."""

    def __init__(self, error: str, cause: str = "") -> None:
        super().__init__(f"{error}: {cause}")
        self.error = error
        self.cause = cause


class ApiError(Exception):
    """An error the API answers (``ExecutionAlreadyExists``, ``TaskDoesNotExist``...): HTTP 400."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- JsonPath, intrinsics, Parameters -----------------------------------------------------------------------

_MISSING = object()


def path_get(data: Any, path: str, context: Any = None) -> Any:
    """Read a reference path (``$.a.b[0]``, ``$['a']``; ``$$.`` reads the context object)."""
    if path.startswith("$$"):
        data, path = context, path[1:]
    if not path.startswith("$"):
        raise StatesError("States.Runtime", f"not a path: {path}")
    value = data
    for key in _path_keys(path[1:]):
        if isinstance(key, int):
            if not isinstance(value, list) or not -len(value) <= key < len(value):
                raise StatesError("States.Runtime", f"the path {path} does not exist in the input")
            value = value[key]
        else:
            if not isinstance(value, dict) or key not in value:
                raise StatesError("States.Runtime", f"the path {path} does not exist in the input")
            value = value[key]
    return value


def _path_keys(rest: str) -> list[str | int]:
    keys: list[str | int] = []
    for match in re.finditer(r"\.([^.\[]+)|\[(-?\d+)\]|\['([^']*)'\]", rest):
        if match.group(1) is not None:
            keys.append(match.group(1))
        elif match.group(2) is not None:
            keys.append(int(match.group(2)))
        else:
            keys.append(match.group(3))
    return keys


def path_present(data: Any, path: str) -> bool:
    try:
        path_get(data, path)
    except StatesError:
        return False
    return True


def path_set(data: Any, path: str, value: Any) -> Any:
    """``data`` with ``value`` at ``path`` (ResultPath): ``$`` replaces it, missing objects are created."""
    if path == "$":
        return value
    keys = _path_keys(path[1:])
    root = json.loads(json.dumps(data)) if isinstance(data, dict) else {}
    node = root
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):  # type: ignore[union-attr]
            node[key] = {}  # type: ignore[index]
        node = node[key]  # type: ignore[index]
    node[keys[-1]] = value  # type: ignore[index]
    return root


def intrinsic(expression: str, data: Any, context: Any) -> Any:
    """Evaluate ``States.Func(args...)``: args are string literals, numbers, paths or nested calls."""
    value, rest = _call(expression.strip(), data, context)
    if rest.strip():
        raise StatesError("States.Runtime", f"trailing text in {expression!r}")
    return value


def _call(text: str, data: Any, context: Any) -> tuple[Any, str]:
    match = re.match(r"(States\.[A-Za-z]+)\(", text)
    if match is None:
        raise StatesError("States.Runtime", f"not an intrinsic function: {text!r}")
    name, rest = match.group(1), text[match.end() :]
    args: list[Any] = []
    while True:
        rest = rest.lstrip()
        if rest.startswith(")"):
            rest = rest[1:]
            break
        arg, rest = _argument(rest, data, context)
        args.append(arg)
        rest = rest.lstrip()
        if rest.startswith(","):
            rest = rest[1:]
    return _apply(name, args), rest


def _argument(text: str, data: Any, context: Any) -> tuple[Any, str]:
    if text.startswith("'"):
        out, i = "", 1
        while text[i] != "'":
            if text[i] == "\\":
                i += 1
            out += text[i]
            i += 1
        return out, text[i + 1 :]
    if text.startswith("States."):
        return _call(text, data, context)
    if text.startswith("$"):
        match = re.match(r"[^,)\s]+", text)
        assert match is not None
        return path_get(data, match.group(0), context), text[match.end() :]
    match = re.match(r"-?\d+(\.\d+)?|true|false|null", text)
    if match is None:
        raise StatesError("States.Runtime", f"bad intrinsic argument: {text!r}")
    return json.loads(match.group(0)), text[match.end() :]


def _apply(name: str, args: list[Any]) -> Any:
    if name == "States.Format":
        template, *values = args
        parts = re.split(r"(?<!\\)\{\}", template)
        if len(parts) - 1 != len(values):
            raise StatesError("States.IntrinsicFailure", "States.Format: argument count")
        out = parts[0]
        for value, part in zip(values, parts[1:], strict=True):
            out += (value if isinstance(value, str) else json.dumps(value)) + part
        return out
    functions: dict[str, Callable[..., Any]] = {
        "States.StringToJson": json.loads,
        "States.JsonToString": lambda v: json.dumps(v, separators=(",", ":")),
        "States.Array": lambda *a: list(a),
        "States.ArrayLength": len,
        "States.ArrayGetItem": lambda a, i: a[int(i)],
        "States.ArrayContains": lambda a, v: v in a,
        "States.ArrayUnique": lambda a: [v for i, v in enumerate(a) if v not in a[:i]],
        "States.ArrayRange": lambda s, e, st: list(range(int(s), int(e) + 1, int(st))),
        "States.ArrayPartition": lambda a, n: [a[i : i + int(n)] for i in range(0, len(a), int(n))],
        "States.MathAdd": lambda a, b: a + b,
        "States.MathRandom": lambda a, b, *_: random.randint(int(a), int(b) - 1),
        "States.StringSplit": lambda s, d: [p for p in re.split("[" + re.escape(d) + "]", s) if p],
        "States.UUID": lambda: str(uuid.uuid4()),
        "States.Base64Encode": lambda s: base64.b64encode(s.encode()).decode(),
        "States.Base64Decode": lambda s: base64.b64decode(s).decode(),
        "States.JsonMerge": lambda a, b, deep=False: {**a, **b},
    }
    if name not in functions:
        raise StatesError("States.Runtime", f"unsupported intrinsic {name}")
    try:
        return functions[name](*args)
    except StatesError:
        raise
    except Exception as exc:
        raise StatesError("States.IntrinsicFailure", f"{name}: {exc}") from exc


def fill(template: Any, data: Any, context: Any) -> Any:
    """A payload template (Parameters, ResultSelector, Payload): ``key.$`` values are paths or intrinsics."""
    if isinstance(template, list):
        return [fill(v, data, context) for v in template]
    if not isinstance(template, dict):
        return template
    out: dict[str, Any] = {}
    for key, value in template.items():
        if key.endswith(".$") and isinstance(value, str):
            out[key[:-2]] = (
                intrinsic(value, data, context) if value.startswith("States.") else path_get(data, value, context)
            )
        else:
            out[key] = fill(value, data, context)
    return out


# -- Choice rules ----------------------------------------------------------------------------------------------


def _timestamp(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def choice_matches(rule: dict[str, Any], data: Any) -> bool:
    if "And" in rule:
        return all(choice_matches(r, data) for r in rule["And"])
    if "Or" in rule:
        return any(choice_matches(r, data) for r in rule["Or"])
    if "Not" in rule:
        return not choice_matches(rule["Not"], data)
    variable = rule["Variable"]
    if "IsPresent" in rule:
        return path_present(data, variable) == rule["IsPresent"]
    if not path_present(data, variable):
        raise StatesError(
            "States.Runtime",
            f"Invalid path {variable!r}: the choice state's condition path references an invalid value",
        )
    value = path_get(data, variable)
    for key, expected in rule.items():
        if key in ("Variable", "Next"):
            continue
        if key.endswith("Path"):
            return _compare(key[:-4], value, path_get(data, expected))
        return _compare(key, value, expected)
    raise StatesError("States.Runtime", f"a choice rule without a comparison: {rule}")


def _compare(operator: str, value: Any, expected: Any) -> bool:
    checks: dict[str, Callable[[], bool]] = {
        "IsNull": lambda: (value is None) == expected,
        "IsString": lambda: isinstance(value, str) == expected,
        "IsNumeric": lambda: (isinstance(value, int | float) and not isinstance(value, bool)) == expected,
        "IsBoolean": lambda: isinstance(value, bool) == expected,
        "IsTimestamp": lambda: (_timestamp(value) is not None) == expected,
    }
    if operator in checks:
        return checks[operator]()
    kind = re.match(r"String|Numeric|Boolean|Timestamp", operator)
    if kind is None:
        raise StatesError("States.Runtime", f"unknown comparison {operator}")
    relation = operator[kind.end() :]
    if kind.group(0) == "String":
        if not isinstance(value, str):
            return False
        if relation == "Matches":
            pattern = re.escape(expected).replace(r"\*", ".*")
            return re.fullmatch(pattern, value) is not None
    elif kind.group(0) == "Numeric":
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
    elif kind.group(0) == "Boolean":
        return isinstance(value, bool) and value == expected
    else:
        value, expected = _timestamp(value), _timestamp(expected)
        if value is None or expected is None:
            return False
    relations: dict[str, Callable[[Any, Any], bool]] = {
        "Equals": lambda a, b: a == b,
        "LessThan": lambda a, b: a < b,
        "GreaterThan": lambda a, b: a > b,
        "LessThanEquals": lambda a, b: a <= b,
        "GreaterThanEquals": lambda a, b: a >= b,
    }
    return relations[relation](value, expected)


def error_matches(error_equals: list[str], error: str) -> bool:
    if "States.ALL" in error_equals:
        return error != "States.Runtime"  # States.ALL does not catch States.Runtime
    if "States.TaskFailed" in error_equals and error not in ("States.Timeout", "States.Runtime"):
        return True
    return error in error_equals


# -- executions ------------------------------------------------------------------------------------------------


@dataclass
class Execution:
    arn: str
    name: str
    machine_arn: str
    input: str
    started: float
    status: str = "RUNNING"
    output: str | None = None
    error: str | None = None
    cause: str | None = None
    stopped: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    """The names of the states entered, in order."""
    in_flight: str | None = None
    """The state whose work is running now (not a parked ``.waitForTaskToken`` wait)."""
    abort: threading.Event = field(default_factory=threading.Event)
    parked: Any = None
    """Its ``.waitForTaskToken`` wait (``_Wait``), woken when the execution ends: a parked task sleeps, not polls."""

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "executionArn": self.arn,
            "stateMachineArn": self.machine_arn,
            "name": self.name,
            "status": self.status,
            "startDate": self.started,
            "input": self.input,
        }
        if self.stopped is not None:
            out["stopDate"] = self.stopped
        if self.output is not None:
            out["output"] = self.output
        if self.error is not None:
            out["error"] = self.error
            out["cause"] = self.cause or ""
        return out


@dataclass
class _Wait:
    """A ``.waitForTaskToken`` task waiting for its token."""

    execution: Execution
    done: threading.Event = field(default_factory=threading.Event)
    outcome: tuple[str, Any] | None = None
    heartbeat: float = field(default_factory=time.monotonic)
    closed: bool = False


class StepFunctions:
    """The state machines and their executions; ``serve()`` puts the API on loopback."""

    def __init__(
        self,
        invoke: Callable[[str, Any], Any],
        *,
        time_scale: float = 1.0,
        max_execution_seconds: float = YEAR,
        machine_role: list[dict[str, Any]] | None = None,
    ) -> None:
        self.invoke = invoke
        """``invoke(function, payload) -> (ok, payload_or_error)``: the Lambda stand-in."""
        self.time_scale = time_scale
        self.max_execution_seconds = max_execution_seconds
        self.machine_role = machine_role
        """The role a machine created without one of its own acts with (``None``: nothing is checked)."""
        self.roles: dict[str, list[dict[str, Any]]] = {}
        """Each machine's own role (``create_state_machine(role=)``): the calls its tasks make are checked on it."""
        self.machines: dict[str, dict[str, Any]] = {}
        self.executions: dict[str, Execution] = {}
        self.waits: dict[str, _Wait] = {}
        self.role_calls: list[tuple[str, str, bool]] = []
        self.accountant: Any = None
        """When set (``capacity.Accountant``), each API action spends a token of its bucket or is throttled."""
        self.poll_seconds = 60.0
        """A parked task's backstop look at its execution: it is woken when the execution ends (``_finish``), so
        thousands of parked tasks cost nothing while they sleep."""
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # -- the API ---------------------------------------------------------------------------------------------

    def create_state_machine(
        self, arn: str, definition: dict[str, Any], role: list[dict[str, Any]] | None = None
    ) -> None:
        self.machines[arn] = definition
        if role is not None:
            self.roles[arn] = role

    def start_execution(self, machine_arn: str, name: str | None = None, input: str | None = None) -> dict[str, Any]:
        if machine_arn not in self.machines:
            raise ApiError("StateMachineDoesNotExist", f"State Machine Does Not Exist: '{machine_arn}'")
        name = name or str(uuid.uuid4())
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", name):
            raise ApiError("InvalidName", f"Invalid Name: '{name}'")
        text = input if input is not None else "{}"
        try:
            json.loads(text)
        except ValueError as exc:
            raise ApiError("InvalidExecutionInput", f"Invalid execution input: {exc}") from exc
        machine_name = machine_arn.rsplit(":", 1)[1]
        arn = f"arn:aws:states:{REGION}:{ACCOUNT}:execution:{machine_name}:{name}"
        with self._lock:
            existing = self.executions.get(arn)
            if existing is not None:
                if existing.status == "RUNNING" and json.loads(existing.input) == json.loads(text):
                    return {"executionArn": arn, "startDate": existing.started}
                if existing.status == "RUNNING" or time.time() - (existing.stopped or 0) < NAME_REUSE_SECONDS:
                    raise ApiError("ExecutionAlreadyExists", f"Execution Already Exists: '{arn}'")
            execution = Execution(arn, name, machine_arn, text, time.time())
            self.executions[arn] = execution
        self._event(execution, "ExecutionStarted", {"input": text, "roleArn": "machine-role"})
        threading.Thread(target=self._run, args=(execution,), daemon=True, name=f"sfn-{name[:12]}").start()
        return {"executionArn": arn, "startDate": execution.started}

    def describe_execution(self, arn: str) -> dict[str, Any]:
        execution = self.executions.get(arn)
        if execution is None:
            raise ApiError("ExecutionDoesNotExist", f"Execution Does Not Exist: '{arn}'")
        return execution.describe()

    def stop_execution(self, arn: str, error: str | None = None, cause: str | None = None) -> dict[str, Any]:
        execution = self.executions.get(arn)
        if execution is None:
            raise ApiError("ExecutionDoesNotExist", f"Execution Does Not Exist: '{arn}'")
        with self._lock:
            if execution.status == "RUNNING":
                self._finish(execution, "ABORTED", error=error, cause=cause)
                execution.abort.set()
        return {"stopDate": execution.stopped or time.time()}

    def list_executions(self, machine_arn: str, status: str | None = None) -> dict[str, Any]:
        found = [
            {k: v for k, v in e.describe().items() if k not in ("input", "output", "error", "cause")}
            for e in self.executions.values()
            if e.machine_arn == machine_arn and (status is None or e.status == status)
        ]
        return {"executions": sorted(found, key=lambda e: -e["startDate"])}

    def send_task(self, token: str, outcome: tuple[str, Any]) -> dict[str, Any]:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            assert isinstance(decoded, dict) and "m" in decoded
        except Exception as exc:
            raise ApiError("InvalidToken", "Invalid Token: 'Invalid token'") from exc
        with self._lock:
            wait = self.waits.get(token)
            if wait is None:
                raise ApiError("TaskDoesNotExist", "Task Does Not Exist")
            if wait.closed or wait.execution.status != "RUNNING":
                raise ApiError("TaskTimedOut", "Task Timed Out: 'Provided task does not exist anymore'")
            if outcome[0] == "heartbeat":
                wait.heartbeat = time.monotonic()
                return {}
            wait.closed = True
            wait.outcome = outcome
            wait.done.set()
        return {}

    def token_owner(self, token: str) -> str | None:
        with contextlib.suppress(Exception):
            return str(json.loads(base64.urlsafe_b64decode(token.encode()))["m"])
        return None

    # -- the interpreter --------------------------------------------------------------------------------------

    def _event(self, execution: Execution, kind: str, details: Any = None) -> None:
        with self._lock:
            execution.history.append(
                {"id": len(execution.history) + 1, "type": kind, "timestamp": time.time(), "details": details}
            )
            if len(execution.history) > MAX_EVENTS and execution.status == "RUNNING":
                self._finish(
                    execution, "FAILED", error="States.Runtime", cause="the execution history exceeded 25,000 events"
                )
                execution.abort.set()

    def _finish(
        self,
        execution: Execution,
        status: str,
        *,
        output: Any = None,
        error: str | None = None,
        cause: str | None = None,
    ) -> None:
        with self._lock:
            if execution.status != "RUNNING":
                return
            execution.status = status
            execution.stopped = time.time()
            execution.in_flight = None
            if execution.parked is not None:
                execution.parked.done.set()  # its parked task wakes to find the execution ended
            if output is not None:
                execution.output = json.dumps(output)
            execution.error, execution.cause = error, cause
            kind = {
                "SUCCEEDED": "ExecutionSucceeded",
                "FAILED": "ExecutionFailed",
                "ABORTED": "ExecutionAborted",
                "TIMED_OUT": "ExecutionTimedOut",
            }[status]
            execution.history.append(
                {
                    "id": len(execution.history) + 1,
                    "type": kind,
                    "timestamp": time.time(),
                    "details": {"error": error, "cause": cause},
                }
            )

    def _alive(self, execution: Execution) -> bool:
        if execution.status != "RUNNING":
            return False
        if time.time() - execution.started > self.max_execution_seconds:
            self._finish(execution, "TIMED_OUT", error="States.Timeout", cause="the execution ran past its limit")
            return False
        return True

    def _sleep(self, execution: Execution, seconds: float) -> bool:
        """Sleep, ending early (False) if the execution stops or would outlive its limit."""
        left = self.max_execution_seconds - (time.time() - execution.started)
        if seconds > left:
            execution.abort.wait(max(0.0, left))
            self._alive(execution)
            return False
        return not execution.abort.wait(seconds) and self._alive(execution)

    def _run(self, execution: Execution) -> None:
        definition = self.machines[execution.machine_arn]
        data: Any = json.loads(execution.input)
        name = definition["StartAt"]
        try:
            while self._alive(execution):
                state = definition["States"][name]
                execution.states.append(name)
                context = self._context(execution, name)
                kind = state["Type"]
                self._event(execution, f"{kind}StateEntered", {"name": name})
                try:
                    data, following = self._state(execution, name, state, data, context)
                except StatesError as error:
                    caught = next(
                        (c for c in state.get("Catch", []) if error_matches(c["ErrorEquals"], error.error)), None
                    )
                    if caught is None or kind not in ("Task", "Parallel", "Map"):
                        if self._alive(execution):
                            self._finish(execution, "FAILED", error=error.error, cause=error.cause)
                        return
                    result = {"Error": error.error, "Cause": error.cause}
                    data = self._result_path(data, result, caught.get("ResultPath", "$"))
                    self._event(execution, f"{kind}StateExited", {"name": name})
                    name = caught["Next"]
                    continue
                if not self._alive(execution):
                    return
                if kind != "Fail":
                    self._event(execution, f"{kind}StateExited", {"name": name})
                if following is None:
                    if kind == "Fail":
                        self._finish(execution, "FAILED", error=state.get("Error"), cause=state.get("Cause"))
                    else:
                        self._finish(execution, "SUCCEEDED", output=data)
                    return
                name = following
        except Exception as exc:  # a bug in the interpreter must not look like a sleeping execution
            self._finish(execution, "FAILED", error="Harness.InterpreterError", cause=repr(exc))
            raise

    def _context(self, execution: Execution, state: str) -> dict[str, Any]:
        started = dt.datetime.fromtimestamp(execution.started, dt.UTC).isoformat().replace("+00:00", "Z")
        return {
            "Execution": {
                "Id": execution.arn,
                "Name": execution.name,
                "Input": json.loads(execution.input),
                "StartTime": started,
                "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/machine-role",
            },
            "StateMachine": {"Id": execution.machine_arn, "Name": execution.machine_arn.rsplit(":", 1)[1]},
            "State": {"Name": state, "EnteredTime": dt.datetime.now(dt.UTC).isoformat(), "RetryCount": 0},
        }

    def _result_path(self, data: Any, result: Any, path: str | None) -> Any:
        if path is None:
            return data
        return path_set(data, path, result)

    def _state(
        self, execution: Execution, name: str, state: dict[str, Any], data: Any, context: dict[str, Any]
    ) -> tuple[Any, str | None]:
        kind = state["Type"]
        following = None if state.get("End") else state.get("Next")
        if kind == "Succeed":
            return self._io_out(state, self._io_in(state, data)), None
        if kind == "Fail":
            return data, None
        if kind == "Choice":
            effective = self._io_in(state, data)
            for rule in state.get("Choices", []):
                if choice_matches(rule, effective):
                    return self._io_out(state, effective), rule["Next"]
            if "Default" not in state:
                raise StatesError("States.NoChoiceMatched", f"no choice rule matched in {name}")
            return self._io_out(state, effective), state["Default"]
        if kind == "Wait":
            effective = self._io_in(state, data)
            if "Seconds" in state or "SecondsPath" in state:
                seconds = float(state["Seconds"] if "Seconds" in state else path_get(effective, state["SecondsPath"]))
            else:
                stamp = _timestamp(state.get("Timestamp") or path_get(effective, state["TimestampPath"]))
                seconds = max(0.0, (stamp.timestamp() if stamp else 0) - time.time())
            self._sleep(execution, seconds * self.time_scale)
            return self._io_out(state, effective), following
        if kind == "Pass":
            effective = self._io_in(state, data)
            if "Parameters" in state:
                effective = fill(state["Parameters"], effective, context)
            result = state.get("Result", effective)
            return self._io_out(state, self._result_path(data, result, state.get("ResultPath", "$"))), following
        if kind == "Task":
            return self._task(execution, state, data, context), following
        raise StatesError("States.Runtime", f"unsupported state type {kind}")

    def _io_in(self, state: dict[str, Any], data: Any) -> Any:
        path = state.get("InputPath", "$")
        return {} if path is None else path_get(data, path)

    def _io_out(self, state: dict[str, Any], data: Any) -> Any:
        path = state.get("OutputPath", "$")
        return {} if path is None else path_get(data, path)

    def _task(self, execution: Execution, state: dict[str, Any], data: Any, context: dict[str, Any]) -> Any:
        effective = self._io_in(state, data)
        attempts: dict[int, int] = {}
        while True:
            try:
                result = self._attempt(execution, state, effective, context)
                break
            except StatesError as error:
                if not self._alive(execution):
                    raise
                retrier = next(
                    (i for i, r in enumerate(state.get("Retry", [])) if error_matches(r["ErrorEquals"], error.error)),
                    None,
                )
                if retrier is None:
                    raise
                rule = state["Retry"][retrier]
                count = attempts.get(retrier, 0)
                if count >= rule.get("MaxAttempts", 3):
                    raise
                attempts[retrier] = count + 1
                context["State"]["RetryCount"] = sum(attempts.values())
                # the exponent bounded: past 64 doublings a delay is at any MaxDelaySeconds (a float would overflow)
                delay = rule.get("IntervalSeconds", 1) * rule.get("BackoffRate", 2.0) ** min(count, 64)
                if "MaxDelaySeconds" in rule:
                    delay = min(delay, rule["MaxDelaySeconds"])
                if rule.get("JitterStrategy") == "FULL":
                    delay = random.uniform(0, delay)
                if not self._sleep(execution, delay * self.time_scale):
                    raise
        if "ResultSelector" in state:
            result = fill(state["ResultSelector"], result, context)
        return self._io_out(state, self._result_path(data, result, state.get("ResultPath", "$")))

    def _timeout(self, state: dict[str, Any], data: Any) -> float | None:
        if "TimeoutSecondsPath" in state:
            return float(path_get(data, state["TimeoutSecondsPath"]))
        value = state.get("TimeoutSeconds")
        return None if value is None else float(value)

    def _attempt(self, execution: Execution, state: dict[str, Any], effective: Any, context: dict[str, Any]) -> Any:
        resource: str = state["Resource"]
        wait_for_token = resource.endswith(".waitForTaskToken")
        base = resource.removesuffix(".waitForTaskToken")
        token = None
        if wait_for_token:
            token = base64.urlsafe_b64encode(
                json.dumps({"m": execution.machine_arn, "t": uuid.uuid4().hex}).encode()
            ).decode()
            context["Task"] = {"Token": token}
        parameters = fill(state.get("Parameters", {}), effective, context) if "Parameters" in state else effective
        timeout = self._timeout(state, effective)
        heartbeat = state.get("HeartbeatSeconds")
        self._event(execution, "TaskScheduled", {"resource": base, "parameters": parameters})
        self._event(execution, "TaskStarted", {"resource": base})
        wait = None
        if token is not None:
            wait = _Wait(execution)
            with self._lock:
                self.waits[token] = wait
                execution.parked = wait
        execution.in_flight = context["State"]["Name"]
        started = time.monotonic()
        try:
            if base.endswith(":states:::lambda:invoke"):
                result = self._lambda(execution, parameters, timeout)
            elif base.endswith(":states:::states:startExecution"):
                result = self._start_child(execution, parameters)
            else:
                raise StatesError("States.Runtime", f"the harness does not run {resource}")
        except StatesError as error:
            if wait is not None:
                wait.closed = True
            self._event(execution, "TaskFailed", {"error": error.error, "cause": error.cause})
            raise
        finally:
            execution.in_flight = None
        if wait is None:
            self._event(execution, "TaskSucceeded", {"output": result})
            return result
        self._event(execution, "TaskSubmitted", {"output": result})
        return self._await(execution, wait, started, timeout, heartbeat)

    def _await(
        self, execution: Execution, wait: _Wait, started: float, timeout: float | None, heartbeat: float | None
    ) -> Any:
        while True:
            now = time.monotonic()
            limits = [self.poll_seconds, execution.started + self.max_execution_seconds - time.time()]
            if timeout is not None:
                limits.append(started + timeout - now)
            if heartbeat is not None:
                limits.append(wait.heartbeat + heartbeat - now)
            if wait.done.wait(max(0.0, min(limits))) and wait.outcome is not None:
                break
            if not self._alive(execution) or execution.abort.is_set():
                wait.closed = True
                raise StatesError("States.Runtime", "the execution ended")
            now = time.monotonic()
            with self._lock:
                if wait.outcome is not None:
                    break
                if timeout is not None and now >= started + timeout:
                    wait.closed = True
                    self._event(execution, "TaskTimedOut", {"error": "States.Timeout"})
                    raise StatesError("States.Timeout", "")
                if heartbeat is not None and now >= wait.heartbeat + heartbeat:
                    wait.closed = True
                    self._event(execution, "TaskTimedOut", {"error": "States.HeartbeatTimeout"})
                    raise StatesError("States.HeartbeatTimeout", "")
        assert wait.outcome is not None
        kind, value = wait.outcome
        if kind == "success":
            self._event(execution, "TaskSucceeded", {"output": value})
            return json.loads(value)
        self._event(execution, "TaskFailed", value)
        raise StatesError(value.get("error") or "", value.get("cause") or "")

    def _authorize(self, execution: Execution, action: str, resource: str) -> None:
        role = self.roles.get(execution.machine_arn, self.machine_role)
        if role is None:
            return
        granted = iam.allowed(role, action, resource)
        with self._lock:
            self.role_calls.append((action, resource, granted))
        if not granted:
            raise StatesError(
                "States.TaskFailed", f"AccessDeniedException: the state machine's role may not {action} on {resource}"
            )

    def _lambda(self, execution: Execution, parameters: dict[str, Any], timeout: float | None) -> Any:
        function = str(parameters["FunctionName"])
        arn = function if function.startswith("arn:") else f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}"
        self._authorize(execution, "lambda:InvokeFunction", arn)
        ok, value = self.invoke(function, parameters.get("Payload", {}))
        if not ok:
            raise StatesError(str(value.get("errorType") or "Lambda.Unknown"), json.dumps(value))
        return {
            "ExecutedVersion": "$LATEST",
            "Payload": value,
            "SdkHttpMetadata": {"HttpStatusCode": 200},
            "SdkResponseMetadata": {"RequestId": str(uuid.uuid4())},
            "StatusCode": 200,
        }

    def _start_child(self, execution: Execution, parameters: dict[str, Any]) -> Any:
        machine = str(parameters["StateMachineArn"])
        self._authorize(execution, "states:StartExecution", machine)
        given = parameters.get("Input", {})
        text = given if isinstance(given, str) else json.dumps(given)
        try:
            started = self.start_execution(machine, parameters.get("Name"), text)
        except ApiError as exc:
            raise StatesError(f"StepFunctions.{exc.code}Exception", exc.message) from exc
        return {"ExecutionArn": started["executionArn"], "StartDate": started["startDate"]}

    # -- views for tests -------------------------------------------------------------------------------------

    def in_flight(self) -> list[tuple[str, str]]:
        """(execution name, state) of every running execution that is doing work (not asleep on a token)."""
        with self._lock:
            return [
                (e.name, e.in_flight or e.states[-1] if e.states else "")
                for e in self.executions.values()
                if e.status == "RUNNING" and not self._asleep(e)
            ]

    def _asleep(self, execution: Execution) -> bool:
        return (
            any(w.execution is execution and not w.closed for w in self.waits.values()) and execution.in_flight is None
        )

    def close(self) -> None:
        for execution in list(self.executions.values()):
            with contextlib.suppress(ApiError):
                self.stop_execution(execution.arn)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- HTTP -------------------------------------------------------------------------------------------------

    def serve(self) -> str:
        """Serve the API on loopback; the endpoint URL (for ``AWS_ENDPOINT_URL_SFN``)."""
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                operation = (self.headers.get("X-Amz-Target") or "").split(".", 1)[-1]
                try:
                    status, answer = 200, service.dispatch(operation, body)
                except ApiError as exc:
                    status, answer = 400, {"__type": exc.code, "message": exc.message}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def dispatch(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.accountant is not None and not self.accountant.sfn_admits(operation):
            raise ApiError("ThrottlingException", "Rate exceeded")
        if operation == "StartExecution":
            return self.start_execution(body["stateMachineArn"], body.get("name"), body.get("input"))
        if operation == "DescribeExecution":
            return self.describe_execution(body["executionArn"])
        if operation == "StopExecution":
            return self.stop_execution(body["executionArn"], body.get("error"), body.get("cause"))
        if operation == "ListExecutions":
            return self.list_executions(body["stateMachineArn"], body.get("statusFilter"))
        if operation == "SendTaskSuccess":
            json.loads(body["output"])
            return self.send_task(body["taskToken"], ("success", body["output"]))
        if operation == "SendTaskFailure":
            return self.send_task(
                body["taskToken"], ("failure", {"error": body.get("error"), "cause": body.get("cause")})
            )
        if operation == "SendTaskHeartbeat":
            return self.send_task(body["taskToken"], ("heartbeat", None))
        raise ApiError("UnknownOperationException", f"the harness does not serve {operation}")
