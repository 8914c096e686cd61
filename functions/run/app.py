"""Lambda: claim one turn (POST /sessions/{id}/runs); run it here if the caller waits, else start its execution.

Without ``Prefer: wait`` the execution is started before the claim is committed, so every claim that lands has a
runner; the API answers 202. With it, this function runs the turn until the hold ends and answers 200 with it;
an execution is started only if the turn parks or outlasts the hold (a lost start: the sweeper's). It needs the
state machine's ARN, and the model's grant (``infra.wiring.MODEL_FUNCTIONS``).
"""

import os

from dormant.serving.api import api_handler
from dormant.serving.workflow import StepFunctions, step_functions_hooks

handler = api_handler(
    step_functions_hooks(
        StepFunctions(os.environ["DORMANT_STATE_MACHINE"], wait_machine_arn=os.environ.get("DORMANT_WAIT_MACHINE"))
    ),
    function="run",
)
