"""Lambda: store answers to yielded tools (POST /sessions/{id}/tools), then wake the execution waiting on them.

Waking answers a task token: no state machine ARN is needed.
"""

from dormant.serving.api import api_handler
from dormant.serving.hooks import Hooks
from dormant.serving.workflow import StepFunctions

handler = api_handler(Hooks(on_answers=StepFunctions().on_answers), function="tools")
