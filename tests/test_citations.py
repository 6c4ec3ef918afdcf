"""Citations agree with the References page: every cited paper is listed there, with one year.

A paper cited as "Lin et al. (2023)" on one page and "(2024)" on another reads as
two papers. The References page is the register: each entry names its year and its
arXiv id, and every arXiv link on any page must point to a listed paper and, where
the citation shows a year, show that one.
"""

from __future__ import annotations

import re

import pytest

from infralens_docs.registry import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
ARXIV_LINK_RE = re.compile(r"\[(?P<text>[^\]]*)\]\(https://arxiv\.org/abs/(?P<id>\d{4}\.\d{4,5})\)")
YEAR_RE = re.compile(r"(?<![\d.:])(?:19|20)\d{2}(?![\d.])")


def registered() -> dict[str, str]:
    """arXiv id -> year, from the References page's entries ("Authors (YEAR). *Title.* ...")."""
    entries = {}
    for line in (DOCS / "references.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("- **"):
            continue
        year = re.search(r"\((\d{4})\)", line)
        for arxiv_id in re.findall(r"arxiv\.org/abs/(\d{4}\.\d{4,5})", line):
            assert year, f"references.md entry without a year: {line[:80]}"
            entries[arxiv_id] = year.group(1)
    return entries


REGISTERED = registered()


def test_references_page_lists_papers():
    assert len(REGISTERED) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_every_cited_paper_is_registered_with_one_year(page):
    text = page.read_text(encoding="utf-8")
    problems = []
    for match in ARXIV_LINK_RE.finditer(text):
        arxiv_id = match.group("id")
        if arxiv_id not in REGISTERED:
            problems.append(f"arXiv:{arxiv_id} ({match.group('text')}) is not in references.md")
            continue
        # the year of a citation sits in the link text, "[Ho et al., 2020](...)", or just
        # after it, "[Title](...) (2022)"
        after = text[match.end() : match.end() + 24]
        nearby = match.group("text") + " " + (re.match(r"\s*\(([^)]*)\)", after) or [""])[0]
        for year in YEAR_RE.findall(nearby):
            if year != REGISTERED[arxiv_id]:
                problems.append(
                    f"arXiv:{arxiv_id} cited as {year}, registered as {REGISTERED[arxiv_id]}"
                )
    assert problems == []
