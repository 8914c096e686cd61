"""Turns run and sleeping sessions woken by Step Functions (on AWS) or by threads of this process (locally).

The state machine (``infra/workflow.py``) calls ``workflow_handler`` with ``{action, tenant, session_id,
invocation_id}``; each action works on that one invocation, never on "whatever is open":

* ``run`` takes the invocation on and runs it (``serving.turns.resume_turn``), committing before every step,
  and returns its status: ``yielded_tool`` parks, ``handed_on`` (its time ran out) runs again in a fresh
  invocation of the function, anything else ends the execution. A retried ``run`` (its first attempt timed
  out or died after committing) finds the invocation still open and takes it over from its last committed
  step; one that finds it waiting for answers parks again. An invocation not on the ledger yet (the
  execution starts just before the API commits the claim) is read again through ``CLAIM_GRACE_S`` (under a
  second), then is ``TurnNotClaimed``, which the state machine retries for a while and then drops: a claim
  that never landed has nothing to run. Its model calls must
  return ``MODEL_END_RESERVE_MS`` before the function's own deadline (``models.base.calls_end_by``): a slow
  provider ends the step with a typed error on the ledger, not a killed function.
* ``park`` (a ``.waitForTaskToken`` task) stores the task token with the session, gated on the version at
  which the invocation still awaited answers, and with it the wait's record: which execution parked
  (``execution``), at which version (``wait_version``) and until when it waits (``wait_until``); the sweeper
  reads it to tell a live wait from a lost one. It is no commit: the record is written with the wait's due time
  (``set_due(scoped_changes=)``), so the session's version stays the yield's. Answers that arrived first moved
  the version: park sees them and wakes the execution itself, so they are not lost. ``POST /tools`` commits the
  answers, then reads the token and wakes the execution. Whichever lands second sees the other.
* ``expire`` (the wait timed out) ends the invocation with ``SessionExpired`` only while it still waits on
  answers, and only if this execution holds the wait (the record names it, or none does): an execution the
  sweeper superseded never expires the wait its successor holds. Answers that landed as the wait timed out
  are honoured (``resumable``: the state machine runs on).
* ``fail`` (a task failed for good) ends the invocation as an ``error`` with the reason, if it is still open;
  it runs on the other workflow function than the one that failed (``infra.workflow``).

The package, by job: ``stepfunctions`` (the executions and task tokens), ``tasks`` (the actions above, the
workflow's Lambda handler), ``sweeper`` (the scheduled sweep: lost runners, lost wake-ups) and ``threads`` (the
local stand-in for Step Functions: turns in threads of this process).
"""

from __future__ import annotations

from .stepfunctions import TOKEN_SCOPE, StepFunctions, execution_name, step_functions_hooks, wait_record
from .sweeper import WAIT_GRACE_MS, running_turns, sweep_turns, sweep_waits, sweeper_handler, waiting_turns
from .tasks import MODEL_END_RESERVE_MS, end_invocation, repair_after_lost_runner, run_action, workflow_handler
from .threads import in_process_hooks, join_local_turns

__all__ = [
    "MODEL_END_RESERVE_MS",
    "TOKEN_SCOPE",
    "WAIT_GRACE_MS",
    "StepFunctions",
    "end_invocation",
    "execution_name",
    "in_process_hooks",
    "join_local_turns",
    "repair_after_lost_runner",
    "run_action",
    "running_turns",
    "step_functions_hooks",
    "sweep_turns",
    "sweep_waits",
    "sweeper_handler",
    "wait_record",
    "waiting_turns",
    "workflow_handler",
]
