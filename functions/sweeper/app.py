"""Lambda (EventBridge schedule): repair commits a stopped writer left pending; purge sessions past retention;
hand a turn whose runner died to a fresh Step Functions execution (it needs the state machine's ARN)."""

import os

from dormant.serving.workflow import StepFunctions, sweeper_handler

handler = sweeper_handler(
    step_functions=StepFunctions(
        os.environ["DORMANT_STATE_MACHINE"], wait_machine_arn=os.environ.get("DORMANT_WAIT_MACHINE")
    )
)
