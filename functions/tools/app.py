"""Lambda: store answers to yielded tools (POST /sessions/{id}/tools), then wake the workflow waiting on them."""

from dormant.serving.api import api_handler
from dormant.serving.workflow import workflow_hooks

handler = api_handler(workflow_hooks())
