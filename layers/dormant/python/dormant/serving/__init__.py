"""Serving: what handlers that run agents for callers need.

``advance`` runs a stored session, claiming it before any tool acts; ``commit`` commits with conflict
resolution (merge, or fork instead of failing).
"""

from .advance import AdvanceOutcome, advance
from .commit import CommitOutcome, CommitStatus, commit

__all__ = ["AdvanceOutcome", "CommitOutcome", "CommitStatus", "advance", "commit"]
