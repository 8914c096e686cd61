"""Lambda (EventBridge schedule): repair commits a stopped writer left pending."""

from dormant.serving.workflow import sweeper_handler

handler = sweeper_handler()
