"""Patient ids: one per name (up to case, spaces and Unicode normalisation), never one for two names."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookings import patient_id
from dormant.ids import check_id

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
