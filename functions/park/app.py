"""Lambda (Step Functions, .waitForTaskToken): store the task token with the session waiting for answers.

When the answers came first it sends the token back itself: it answers task tokens, so it needs a Step
Functions client but no state machine ARN. It also records a failed Run or Expire (``fail``): resume, at its
reserved concurrency, cannot record its own throttling.
"""

from dormant.serving.workflow import StepFunctions, workflow_handler

handler = workflow_handler(step_functions=StepFunctions(), function="park")
