"""Lambda's asynchronous invocation (``InvocationType=Event``: an EventBridge rule's) and its on-failure destination.

As Lambda runs them: the event is queued and the function invoked; a function error is retried up to the
function's ``MaximumRetryAttempts`` (its ``AWS::Lambda::EventInvokeConfig``; 2 without one), the first retry a
minute after the failure and the second two minutes after that (times the deployment's ``time_scale``); a
throttle is retried, not counted, while the event is younger than ``MaximumEventAgeInSeconds`` (6 hours without
one). An event that exhausts them is sent, as Lambda's invocation record, to the config's
``DestinationConfig.OnFailure`` destination (an SQS queue here), with the function's execution role: a role that
may not ``sqs:SendMessage`` to it loses the record, as on AWS; with no destination the event is dropped.

Queues count their messages; ``alarm_states`` evaluates each alarm on a queue's ``ApproximateNumberOfMessagesVisible``
against that depth, as CloudWatch would at its next period.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from . import iam

RETRY_DELAYS = (60.0, 120.0)
"""Seconds Lambda waits before the first and the second retry of a failed asynchronous invocation."""
DEFAULT_RETRIES = 2
DEFAULT_MAX_AGE = 6 * 3600.0
_COMPARISONS = {
    "GreaterThanThreshold": lambda value, threshold: value > threshold,
    "GreaterThanOrEqualToThreshold": lambda value, threshold: value >= threshold,
    "LessThanThreshold": lambda value, threshold: value < threshold,
    "LessThanOrEqualToThreshold": lambda value, threshold: value <= threshold,
}


@dataclass
class Delivery:
    """What became of one asynchronous event: each attempt, and the record its destination got (if any)."""

    attempts: list[Any]
    condition: str | None = None
    """``RetriesExhausted`` or ``EventAgeExceeded`` when it failed; ``None`` when an attempt succeeded."""
    destination: str | None = None
    """The ARN the failure record was sent to (``None``: none configured, or the role may not send there)."""


@dataclass
class AsyncLambda:
    """Asynchronous invocations of a ``Deployment``'s functions, and the SQS queues their destinations name."""

    d: Any
    queues: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    """Queue ARN -> the messages sent to it (bodies), oldest first."""

    def config(self, function: str) -> dict[str, Any]:
        """The function's ``EventInvokeConfig`` properties, resolved (``{}`` without one)."""
        logical = self.d.functions[function].logical_id
        for resource in self.d.template.of_type("AWS::Lambda::EventInvokeConfig").values():
            props = resource["Properties"]
            if props.get("FunctionName") == {"Ref": logical}:
                return self.d.template.resolve(props)  # type: ignore[no-any-return]
        return {}

    def invoke(self, function: str, event: Any) -> Delivery:
        """Invoke ``function`` with ``event`` asynchronously, through its retries, to its end (this call waits)."""
        config = self.config(function)
        retries = int(config.get("MaximumRetryAttempts", DEFAULT_RETRIES))
        max_age = float(config.get("MaximumEventAgeInSeconds", DEFAULT_MAX_AGE))
        scale = self.d.sfn.time_scale
        queued = time.monotonic()
        delivery = Delivery([])
        errors = 0
        while True:
            done = self.d.lambdas.invoke(function, event)
            delivery.attempts.append(done)
            if done.ok:
                return delivery
            if not done.throttled:
                errors += 1
            if errors > retries:
                delivery.condition = "RetriesExhausted"
                break
            pause = RETRY_DELAYS[min(errors, len(RETRY_DELAYS)) - 1] if not done.throttled else 1.0
            if (time.monotonic() - queued) / scale + pause > max_age:
                delivery.condition = "EventAgeExceeded"
                break
            time.sleep(pause * scale)
        target = (config.get("DestinationConfig") or {}).get("OnFailure", {}).get("Destination")
        if target is None:
            return delivery
        if not iam.allowed(self.d.functions[function].statements, "sqs:SendMessage", target):
            return delivery  # Lambda sends with the function's role: refused, the record is lost
        self.queues[target].append(_record(self.d.functions[function].arn, event, delivery))
        delivery.destination = target
        return delivery

    def depth(self, queue_arn: str) -> int:
        """``ApproximateNumberOfMessagesVisible``: what was sent and not yet received (nothing receives here)."""
        return len(self.queues.get(queue_arn, []))

    def alarm_states(self, queue_arn: str) -> dict[str, str]:
        """Each alarm of the template on this queue's depth -> ``ALARM`` or ``OK``, at the depth it has now."""
        name = queue_arn.rsplit(":", 1)[1]
        states = {}
        for logical, resource in self.d.template.of_type("AWS::CloudWatch::Alarm").items():
            props = resource["Properties"]
            if props.get("MetricName") != "ApproximateNumberOfMessagesVisible" or props.get("Namespace") != "AWS/SQS":
                continue
            dimensions = {d["Name"]: self.d.template.resolve(d["Value"]) for d in props.get("Dimensions", [])}
            if dimensions.get("QueueName") != name:
                continue
            breached = _COMPARISONS[props["ComparisonOperator"]](self.depth(queue_arn), float(props["Threshold"]))
            states[logical] = "ALARM" if breached else "OK"
        return states


def _record(function_arn: str, event: Any, delivery: Delivery) -> dict[str, Any]:
    """Lambda's invocation record, as an on-failure destination receives it."""
    last = delivery.attempts[-1]
    return {
        "version": "1.0",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": f"{function_arn}:$LATEST",
            "condition": delivery.condition,
            "approximateInvokeCount": len(delivery.attempts),
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "responsePayload": last.error(),
    }
