"""Lambda: commit events from a runner that runs agents elsewhere (POST /sessions/{id}/commit)."""

from dormant.serving.api import api_handler

handler = api_handler(function="commit")
