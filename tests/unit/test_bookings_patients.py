"""Patient ids: one per name (up to case, spaces and Unicode normalisation), never one for two names."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookings import build, patient_id
from dormant.ids import check_id
from dormant.serving import advance
from dormant.serving.runtime import for_tenant
from tests.support.bookings_cli import REQUEST

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300).filter(lambda s: s.strip())


def canonical(name: str) -> str:
    return " ".join(unicodedata.normalize("NFC", name).split()).casefold()


@given(names, names)
def test_two_different_names_never_share_an_id(a: str, b: str) -> None:
    if canonical(a) != canonical(b):
        assert patient_id(a) != patient_id(b)


@given(names)
def test_every_name_gives_a_valid_id_and_its_spellings_the_same_one(name: str) -> None:
    assert check_id(patient_id(name), "user id") == patient_id(name)
    assert patient_id(f"  {name.upper()} ") == patient_id(name.upper())
    assert patient_id(unicodedata.normalize("NFD", name)) == patient_id(unicodedata.normalize("NFC", name))


@pytest.mark.parametrize(
    ("a", "b"),
    [("Jö Li", "Jå Li"), ("Jø Li", "J Li"), ("李 小龙", "王 小龙"), ("A" * 30 + " x", "A" * 30 + " y")],
)
def test_names_that_a_slug_would_merge_get_different_ids(a: str, b: str) -> None:
    assert patient_id(a) != patient_id(b)


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        patient_id(" \t ")


def test_each_tenant_books_its_own_slots(tmp_path: Path) -> None:
    """Served for tenants (``bookings@<tenant>``), the reservations are the tenant's too."""
    bookings = build(tmp_path / "t.db")
    with bookings.app:
        for tenant in ("clinic-a", "clinic-b"):
            app = for_tenant(bookings.app, tenant)
            asked = advance(
                app, bookings.agent, app.sessions.ephemeral(scopes={"user": patient_id("Alex Doe")}), REQUEST
            )
            answer = {"call_id": asked.yielded_tools[0].call_id, "input": {"approved": True}}
            done = advance(app, bookings.agent, asked.session_id, {"answers": [answer]})
            assert done.session.state.confirmation is not None, tenant
        assert bookings.reservations.holder("physio-tue-1430") is None
        for tenant in ("clinic-a", "clinic-b"):
            assert bookings.reservations.holder("physio-tue-1430", f"bookings@{tenant}") is not None
        # Each tenant's slots are its view of the app bookings.slots: none is a tenant of bookings, whose
        # purge would then take the reservations (a tenant "clinic-a.slots" of "bookings" before the key rule).
        store = bookings.app.store
        assert store.app_names("bookings@") == ["bookings@clinic-a", "bookings@clinic-b"]
        assert store.app_names("bookings.slots@") == ["bookings.slots@clinic-a", "bookings.slots@clinic-b"]
