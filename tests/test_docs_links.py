"""Every relative link in README.md and docs/ leads somewhere: the file exists in the
repository and, for a link into a markdown file, the heading (or ``<a id>``) it names does."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.support import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    found, seen = set(), {}
    for line in prose(page.read_text()):
        found.update(re.findall(r'<a id="([^"]+)"', line))
        heading = re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    return [target for line in prose(page.read_text()) for target in LINK.findall(line)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        destination = (page.parent / file).resolve() if file else page
        if not destination.exists() or not destination.is_relative_to(REPO):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in "
                          f"{destination.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_the_docs_are_where_the_readme_says():
    assert {p.name for p in (REPO / "docs").iterdir()} == {"guides", "reference", "benchmarks"}
    readme = (REPO / "README.md").read_text()
    for guide in sorted((REPO / "docs" / "guides").glob("*.md")):
        assert f"docs/guides/{guide.name}" in readme, f"the README does not link {guide.name}"
