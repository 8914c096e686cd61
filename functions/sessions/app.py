"""Lambda: create, list, show and delete sessions; page a session's ledger; erase a person (POST /erasures).

See dormant.serving.api.
"""

from dormant.serving.api import api_handler

handler = api_handler()
