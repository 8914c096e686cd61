"""Lambda: claim and run one turn (POST /sessions/{id}/runs); a turn that yields starts the resume workflow."""

from dormant.serving.api import api_handler
from dormant.serving.workflow import workflow_hooks

handler = api_handler(workflow_hooks())
