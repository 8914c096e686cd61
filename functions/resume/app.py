"""Lambda (Step Functions): run a session on once answered; record an expired wait or a failure on its ledger."""

from dormant.serving.workflow import workflow_handler

handler = workflow_handler()
