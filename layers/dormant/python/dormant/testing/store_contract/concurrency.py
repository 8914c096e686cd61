"""Concurrency: racing committers on two handles, and any sequence of commits against a reference ledger."""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ...stores.base import (
    SessionStore,
)
from .base import WAIT, ContractBase, _event, _ids


class ConcurrencyContract(ContractBase):
    # -- concurrency ------------------------------------------------------------------------

    def test_concurrent_committers_never_lose_or_double_an_event(self, store: SessionStore, app: str) -> None:
        row = self.row(app)
        store.commit(row, [], 0)
        writers, per_writer = 4, 15
        peers = [self.make_peer(store) for _ in range(writers)]
        versions: list[int] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        start = threading.Barrier(writers, timeout=WAIT)

        def write(w: int, peer: SessionStore) -> None:
            try:
                start.wait()
                for n in range(per_writer):
                    event = _event(f"w{w}-{n}")
                    for _attempt in range(1000):
                        loaded = peer.load(app, row.id)
                        assert loaded is not None
                        result = peer.commit(row, [event], loaded.row.version)
                        if result.ok:
                            with lock:
                                versions.append(result.version)
                            break
                    else:
                        raise AssertionError(f"writer {w} never got a commit through")
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w, peer)) for w, peer in enumerate(peers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(thread.is_alive() for thread in threads), f"a writer was still running after {WAIT} s"
        for peer in peers:
            if peer is not store:
                peer.close()
        assert errors == []
        loaded = store.load(app, row.id)
        assert loaded is not None
        ids = _ids(loaded.events)
        expected = {f"evt-w{w}-{n}" for w in range(writers) for n in range(per_writer)}
        assert len(ids) == len(expected) and set(ids) == expected
        assert sorted(versions) == list(range(2, 2 + writers * per_writer))
        assert loaded.row.version == 1 + writers * per_writer
        for w in range(writers):  # each writer's events in its own order
            mine = [i for i in ids if i.startswith(f"evt-w{w}-")]
            assert mine == [f"evt-w{w}-{n}" for n in range(per_writer)]

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(
        steps=st.lists(
            st.tuples(
                st.lists(st.integers(min_value=0, max_value=30), max_size=6),  # event numbers in the batch
                st.integers(min_value=-1, max_value=1),  # version skew: -1 stale, 0 right, 1 ahead
            ),
            min_size=1,
            max_size=12,
        )
    )
    def test_any_sequence_of_commits_matches_a_reference_ledger(
        self, store: SessionStore, app: str, steps: list[tuple[list[int], int]]
    ) -> None:
        """Against a plain-Python model of the contract: order, idempotency and OCC, whatever the mix."""
        row = self.row(app)
        ledger: list[str] = []
        version = 0
        for numbers, skew in steps:
            expected = max(0, version + skew)
            events = [_event(n) for n in numbers]
            result = store.commit(row, events, expected)
            if expected == version:
                new = []
                for event in events:
                    if event.id not in ledger and event.id not in new:
                        new.append(event.id)
                ledger += new
                version += 1
                assert (result.ok, result.version, result.appended) == (True, version, len(new))
            else:
                assert (result.ok, result.version, result.appended) == (False, version, 0)
        loaded = store.load(app, row.id)
        assert (loaded is None) == (version == 0)
        if loaded is not None:
            assert _ids(loaded.events) == ledger and loaded.row.version == version
