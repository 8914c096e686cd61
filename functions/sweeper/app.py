"""Lambda (EventBridge schedule): repair commits a stopped writer left pending; purge sessions past retention."""

from dormant.serving.workflow import sweeper_handler

handler = sweeper_handler()
