"""Lambda (Step Functions): run a claimed turn, committing each step; end an expired wait or a failed turn.

See dormant.serving.workflow for its actions (run, expire; fail when park is what failed).
"""

from dormant.serving.workflow import workflow_handler

handler = workflow_handler(function="resume")
