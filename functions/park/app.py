"""Lambda (Step Functions, .waitForTaskToken): store the task token with the session waiting for answers."""

from dormant.serving.workflow import workflow_handler

handler = workflow_handler()
