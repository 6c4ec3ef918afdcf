"""Contract between pages and their verify modules: one module per page, both ways.

Runs without torch or diffusers: it reads the test files with ``ast`` (the same
reader the site uses to list a page's tested claims), so a page can never show a
claim list that the tests do not hold, even where the verify extra is absent.
"""

from __future__ import annotations

import re

import pytest

from infralens_docs import claims
from infralens_docs.registry import ROOT, load_labs

DOCS = ROOT / "docs"
#: Every page that describes diffusers' behaviour: the home page, the handbook, the labs.
CLAIM_PAGES = ["index.md"]
CLAIM_PAGES += [f"handbook/{p.name}" for p in sorted((DOCS / "handbook").glob("*.md"))]
CLAIM_PAGES += [lab.page.as_posix() for lab in load_labs()]
#: Pages with no claim of their own: the generated labs list; the references page, which
#: shows the generated summary of every module instead; and the glossary, whose
#: definitions give meanings and link to the sections that state (and test) behaviour.
NO_CLAIMS = {
    "labs/index.md": "generated lab list",
    "references.md": "lists sources only",
    "glossary.md": "defines terms; links to the sections that hold their claims",
}
DIRECTIVE = "<!-- infralens:verified-claims"


def test_every_docs_page_is_classified():
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages == set(CLAIM_PAGES) | NO_CLAIMS.keys()


@pytest.mark.parametrize("page", CLAIM_PAGES)
def test_page_has_its_verify_module_and_lists_its_claims(page):
    module = claims.module_for_page(page)
    assert module.is_file(), f"{page} needs {module.relative_to(ROOT)}"
    text = (DOCS / page).read_text(encoding="utf-8")
    assert text.count(DIRECTIVE) == 1, f"{page} must show its tested claims once"


@pytest.mark.parametrize("name", sorted(claims.page_modules()))
def test_every_verify_module_belongs_to_a_page(name):
    owners = [page for page in CLAIM_PAGES if claims.module_for_page(page).stem == name]
    assert owners, f"tests/verify/{name}.py names no page"


@pytest.mark.parametrize("name", sorted(claims.page_modules()))
def test_every_test_states_its_claim(name):
    """Each test's docstring opens with a sentence the page shows; no two are the same."""
    found = claims.read_claims(claims.page_modules()[name])
    texts = [c.text for c in found]
    assert len(set(texts)) == len(texts), f"{name}: two tests state the same claim"
    for claim in found:
        assert len(claim.text.split()) >= 6, f"{name}::{claim.test}: state the claim in words"
        assert claim.text[-1] in ".:)", f"{name}::{claim.test}: end the claim with a full stop"


def test_shared_modules_named_on_pages_state_their_claims():
    """A page may also list a shared module (labkit's schedulers against diffusers)."""
    for page in CLAIM_PAGES:
        text = (DOCS / page).read_text(encoding="utf-8")
        for match in re.finditer(re.escape(DIRECTIVE) + r"(?P<args>[^\n]*?)-->", text):
            for module in match.group("args").split():
                assert claims.read_claims(claims.VERIFY_DIR / module)


def test_no_page_claims_more_than_the_tests_hold():
    """The old blanket claim ("the tests check every claim") is gone from every page."""
    for page in DOCS.rglob("*.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert not re.search(r"check(s)? every claim", text), page
        assert "infralens:verified-versions" not in text, f"{page}: use verified-claims"
