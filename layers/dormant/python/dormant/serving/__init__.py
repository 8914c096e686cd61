"""Serving: what handlers that run agents for callers need (commit with conflict resolution)."""

from .commit import CommitOutcome, CommitStatus, commit

__all__ = ["CommitOutcome", "CommitStatus", "commit"]
