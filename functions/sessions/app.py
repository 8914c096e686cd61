"""Lambda: create, list, show and delete sessions; page a session's ledger; erase a person (POST /erasures).

See dormant.serving.api. It serves only its own routes (dormant.serving.routes), from dormant.serving.http.sessions.
"""

from dormant.serving.api import api_handler

handler = api_handler(function="sessions")
