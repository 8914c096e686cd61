"""Lambda: create, list, show and delete sessions; page a session's ledger (see dormant.serving.api)."""

from dormant.serving.api import api_handler

handler = api_handler()
