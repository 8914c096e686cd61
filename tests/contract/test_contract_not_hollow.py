"""The compliance suite is not hollow: stores with one deliberate defect each fail it."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from dormant.errors import DormantError
from dormant.events import Event
from dormant.stores.base import (
    RUNNING_STATUS,
    CommitResult,
    PreparedCommit,
    Refused,
    RunningSession,
    ScopedStateChange,
    SessionListing,
    StoredSession,
    StoreLimits,
)
from dormant.stores.memory import MemorySessionStore
from dormant.testing import StoreContract


class DuplicatesRecommittedIds(MemorySessionStore):
    def commit(
        self, session: StoredSession, new_events: Sequence[Event], expected_version: int, scoped_changes: Any = None
    ) -> CommitResult:
        entry = self._sessions.get((session.app_name, session.id))
        again = [e for e in new_events if entry is not None and e.id in entry.ids]
        result = super().commit(session, new_events, expected_version, scoped_changes)
        if result.ok and entry is not None:  # re-sent ids appended a second time
            entry.events.extend(e.model_dump_json() for e in again)
        return result


class WritesEventsOnConflict(MemorySessionStore):
    def commit(
        self, session: StoredSession, new_events: Sequence[Event], expected_version: int, scoped_changes: Any = None
    ) -> CommitResult:
        result = super().commit(session, new_events, expected_version, scoped_changes)
        entry = self._sessions.get((session.app_name, session.id))
        if not result.ok and entry is not None:
            entry.events.extend(e.model_dump_json() for e in new_events)
        return result


class WritesScopedChangesOnConflict(MemorySessionStore):
    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        result = super().commit(session, new_events, expected_version, scoped_changes)
        if not result.ok:
            for change in scoped_changes or ():
                self.save_scoped_state(session.app_name, change.scope, change.scope_id, {change.key: change.value})
        return result


class LastWriterWins(MemorySessionStore):
    """No version check: every commit goes through."""

    def commit(
        self, session: StoredSession, new_events: Sequence[Event], expected_version: int, scoped_changes: Any = None
    ) -> CommitResult:
        entry = self._sessions.get((session.app_name, session.id))
        return super().commit(session, new_events, entry.row.version if entry else 0, scoped_changes)


class ReversesBatches(MemorySessionStore):
    def commit(
        self, session: StoredSession, new_events: Sequence[Event], expected_version: int, scoped_changes: Any = None
    ) -> CommitResult:
        return super().commit(session, list(reversed(new_events)), expected_version, scoped_changes)


class ListsEveryApp(MemorySessionStore):
    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None, status: str | None = None
    ) -> list[SessionListing]:
        apps = {app for app, _ in self._sessions}
        listed = (MemorySessionStore.list(self, app, limit=limit, cursor=cursor, status=status) for app in sorted(apps))
        return [item for page in listed for item in page]


class FiltersStatusAfterThePage(MemorySessionStore):
    """Filters a page of the whole listing by status (what the API's read-ahead did, without reading ahead):
    pages come back short, or empty, while more sessions of that status follow."""

    def _list(self, app_name: str, limit: int | None, after: Any, status: str | None) -> list[SessionListing]:
        return [s for s in super()._list(app_name, limit, after, None) if status is None or s.status == status]


class StatusIndexOfTheCreate(MemorySessionStore):
    """A status index written when a session is created and never moved by a later commit."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[tuple[str, str], str | None] = {}

    def _write(self, commit: PreparedCommit) -> int | Refused:
        appended = super()._write(commit)
        if not isinstance(appended, Refused):
            self.first.setdefault((commit.row.app_name, commit.row.id), commit.row.status)
        return appended

    def _list(self, app_name: str, limit: int | None, after: Any, status: str | None) -> list[SessionListing]:
        listed = super()._list(app_name, None, after, None)
        kept = [s for s in listed if status is None or self.first.get((app_name, s.id)) == status]
        return kept if limit is None else kept[:limit]


class RebindsScopes(MemorySessionStore):
    """The gate checks the version only: a commit may change a session's scopes."""

    def _write(self, commit: PreparedCommit) -> int | Refused:
        entry = self._sessions.get((commit.row.app_name, commit.row.id))
        if entry is not None:
            entry.row = replace(entry.row, scopes=commit.row.scopes)
        return super()._write(commit)


class IgnoresAfter(MemorySessionStore):
    def _read(self, app_name: str, session_id: str, after: int) -> Any:
        return super()._read(app_name, session_id, 0)


class UpdatedAtFollowsTheClock(MemorySessionStore):
    def _write(self, commit: PreparedCommit) -> int | Refused:
        appended = super()._write(commit)
        entry = self._sessions.get((commit.row.app_name, commit.row.id))
        if not isinstance(appended, Refused) and entry is not None:
            entry.row = replace(entry.row, updated_at=commit.row.updated_at)
        return appended


class OverwritesForkFields(MemorySessionStore):
    def _write(self, commit: PreparedCommit) -> int | Refused:
        appended = super()._write(commit)
        entry = self._sessions.get((commit.row.app_name, commit.row.id))
        if not isinstance(appended, Refused) and entry is not None:
            entry.row = replace(entry.row, forked_from=commit.row.forked_from, fork_reason=commit.row.fork_reason)
        return appended


class IgnoresLimits(MemorySessionStore):
    """Claims the default limits, enforces none."""

    def _prepare(self, *args: Any) -> PreparedCommit:
        self.limits = StoreLimits(10**9, 10**12, 10**12, 10**12)  # type: ignore[misc]
        try:
            return super()._prepare(*args)
        finally:
            del self.limits


class RemembersEveryRun(MemorySessionStore):
    """An index of running sessions that is added to and never cleaned: an end or a delete leaves it there."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: dict[tuple[str, str], int] = {}

    def _write(self, commit: PreparedCommit) -> int | Refused:
        appended = super()._write(commit)
        if not isinstance(appended, Refused) and commit.row.status == RUNNING_STATUS:
            self.ran[(commit.row.app_name, commit.row.id)] = commit.row.updated_at
        return appended

    def _running(self, limit: int) -> list[RunningSession]:
        return sorted(RunningSession(app, sid, at) for (app, sid), at in self.ran.items())[:limit]


class RunningOfOneApp(MemorySessionStore):
    """Finds running sessions app by app, and stops after the first app."""

    def _running(self, limit: int) -> list[RunningSession]:
        found = super()._running(limit)
        return [r for r in found if r.app_name == min(r.app_name for r in found)]


class SavesTheStatusOfARefusedCommit(MemorySessionStore):
    def _write(self, commit: PreparedCommit) -> int | Refused:
        appended = super()._write(commit)
        entry = self._sessions.get((commit.row.app_name, commit.row.id))
        if isinstance(appended, Refused) and entry is not None:
            entry.row = replace(entry.row, status=commit.row.status)
        return appended


class RunningNewestFirst(MemorySessionStore):
    def _running(self, limit: int) -> list[RunningSession]:
        return sorted(super()._running(10**9), key=lambda r: -r.updated_at)[:limit]


def _calls(method: Callable[..., None]) -> list[dict[str, Any]]:
    """The keyword arguments of each case of a (possibly parametrized) test."""
    cases: list[dict[str, Any]] = [{}]
    for mark in getattr(method, "pytestmark", []):
        if mark.name == "parametrize":
            names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
            values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
            cases = [{**case, **dict(zip(names, v, strict=True))} for case in cases for v in values]
    return cases


def failing_tests(factory: Callable[[], MemorySessionStore]) -> set[str]:
    """Run every StoreContract test against stores from ``factory``; return the names that failed."""

    class Probe(StoreContract):
        def make_store(self) -> Any:
            return factory()

    probe = Probe()
    failed = set()
    for name, method in inspect.getmembers(probe, predicate=inspect.ismethod):
        if not name.startswith("test_"):
            continue
        params = inspect.signature(method).parameters
        for case in _calls(method):
            kwargs: dict[str, Any] = dict(case)
            if "app" in params:
                kwargs["app"] = f"app-{uuid.uuid4().hex[:8]}"
            if "store" in params:
                kwargs["store"] = factory()
            try:
                method(**kwargs)
            except (AssertionError, pytest.fail.Exception):
                failed.add(name)
            except pytest.skip.Exception:
                pass
            except Exception as exc:  # a defect may also surface as an error; that is a failure too
                if isinstance(exc, DormantError) or type(exc).__name__ in (
                    "Flaky",
                    "FlakyFailure",
                    "MultipleFailures",
                ):
                    failed.add(name)
                else:
                    raise
    return failed


def test_the_suite_passes_a_correct_store() -> None:
    assert failing_tests(MemorySessionStore) == set()


LEDGER_PROPERTY = "test_any_sequence_of_commits_matches_a_reference_ledger"
RUNNING = "test_running_sessions_are_the_running_ones_of_every_app"


@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        (
            DuplicatesRecommittedIds,
            {"test_recommitted_ids_are_not_duplicated_and_new_ones_land_in_order", LEDGER_PROPERTY},
        ),
        (WritesEventsOnConflict, {"test_a_stale_commit_is_refused_and_writes_nothing", LEDGER_PROPERTY}),
        (WritesScopedChangesOnConflict, {"test_a_stale_commit_is_refused_and_writes_nothing"}),
        (LastWriterWins, {"test_a_stale_commit_is_refused_and_writes_nothing", LEDGER_PROPERTY}),
        (ReversesBatches, {"test_order_within_and_across_batches", LEDGER_PROPERTY}),
        (ListsEveryApp, {"test_list_is_per_app_with_updated_at"}),
        (RebindsScopes, {"test_a_commit_with_other_scopes_is_refused_and_writes_nothing"}),
        (IgnoresAfter, {"test_load_after_a_version_returns_only_the_later_events"}),
        (UpdatedAtFollowsTheClock, {"test_updated_at_never_goes_backwards"}),
        (OverwritesForkFields, {"test_fork_fields_are_kept_from_creation"}),
        (RemembersEveryRun, {RUNNING}),
        (RunningOfOneApp, {RUNNING}),
        (SavesTheStatusOfARefusedCommit, {RUNNING}),
        (RunningNewestFirst, {RUNNING}),
        (FiltersStatusAfterThePage, {"test_list_by_status_pages_through_that_status_alone"}),
        (StatusIndexOfTheCreate, {"test_a_status_change_moves_the_session_between_status_listings"}),
        (
            IgnoresLimits,
            {
                "test_an_event_at_the_size_limit_is_stored_and_one_byte_more_is_refused",
                "test_a_commit_over_the_event_count_limit_is_refused_and_writes_nothing",
                "test_a_commit_over_the_byte_limit_is_refused",
                "test_a_scoped_value_over_its_limit_is_refused",
            },
        ),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_a_store_with_a_defect_fails_the_suite(broken: Callable[[], MemorySessionStore], caught_by: set[str]) -> None:
    assert caught_by <= failing_tests(broken)
