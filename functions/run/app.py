"""Lambda: claim one turn (POST /sessions/{id}/runs) and start the Step Functions execution that runs it.

The execution is started before the claim is committed, so every claim that lands has a runner; the API
answers 202 (or, with ``Prefer: wait=N``, the finished turn). It needs the state machine's ARN.
"""

import os

from dormant.serving.api import api_handler
from dormant.serving.workflow import StepFunctions, step_functions_hooks

handler = api_handler(step_functions_hooks(StepFunctions(os.environ["DORMANT_STATE_MACHINE"])), function="run")
