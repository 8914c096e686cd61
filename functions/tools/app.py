"""Lambda: store answers to yielded tools (POST /sessions/{id}/tools), then wake the execution waiting on them.

Answers whose caller waits (``Prefer: wait``) and that leave the turn ready to go on are run on here: the waiting
execution is ended (its task token) and one is started only if the turn parks again or outlasts the hold. It needs
the state machine's ARN (to start one) and the model's grant (``infra.wiring.MODEL_FUNCTIONS``).
"""

import os

from dormant.serving.api import api_handler
from dormant.serving.workflow import StepFunctions, step_functions_hooks

handler = api_handler(
    step_functions_hooks(
        StepFunctions(os.environ["DORMANT_STATE_MACHINE"], wait_machine_arn=os.environ.get("DORMANT_WAIT_MACHINE"))
    ),
    function="tools",
)
