"""Every relative link in the README and docs/ reaches a file, and every ``#anchor`` a heading of it.

The README is short and points into docs/ for the rest, so a page renamed or a heading reworded must not
leave a reader at a dead link. Anchors are slugged as GitHub slugs headings.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", flags=re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", flags=re.M)


def _prose(text: str) -> str:
    """The text outside fenced blocks and code spans: a link-shaped string in code is not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: formatting dropped, lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated heading gets ``-1``, ``-2``... as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(path: Path) -> list[str]:
    """The relative targets linked from ``path`` (web addresses and mail left out)."""
    targets = _LINK.findall(_prose(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def broken(path: Path) -> list[str]:
    """The links of ``path`` that reach no file, or no heading of the file they name."""
    bad = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        reached = (path.parent / file_part).resolve() if file_part else path
        if not reached.exists():
            bad.append(f"{target}: no file {_name(reached)}")
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            bad.append(f"{target}: no heading with that anchor in {_name(reached)}")
    return bad


def test_the_pages_exist_and_link_into_each_other() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "CHANGELOG.md", "docs/decisions.md", "docs/dynamodb.md"} <= names
    assert any(t.startswith("docs/") for t in links(ROOT / "README.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Two\n\n## Two\n\n"
        "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [ok](#two-1) [ok](https://x.example/#nope)\n"
        "`[code](missing.md)`\n\n```sh\n[fenced](missing.md)\n```\n"
        "[bad](missing.md) [bad](other.md#nope) [bad](#three)\n"
    )
    assert broken(page) == [
        "missing.md: no file " + str((tmp_path / "missing.md").resolve()),
        "other.md#nope: no heading with that anchor in " + str((tmp_path / "other.md").resolve()),
        "#three: no heading with that anchor in " + str(page),
    ]
