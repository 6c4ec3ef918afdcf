"""The shape every page on a reading path keeps (``infralens_docs.anatomy``): a first
screen that says what the reader will be able to do and why it matters, prose within its
budget (depth collapsed), and for lab guides the order that teaches before it shows code.
The numbers are printed per page by ``make bench``."""

from __future__ import annotations

import pytest

from infralens_docs import anatomy, paths
from infralens_docs.registry import ROOT, load_labs, read_front_matter

ON_A_PATH = paths.load_paths().order
BUDGETED = [p for p in ON_A_PATH if anatomy.kind(p)]
TEMPLATE = ROOT / "tools" / "infralens_docs" / "lab_template.md"


@pytest.mark.parametrize("page", ON_A_PATH)
def test_first_screen_says_what_and_why(page):
    meta = read_front_matter(paths.DOCS / page)
    for key in ("outcome", "why"):
        value = str(meta.get(key, "")).strip()
        assert len(value.split()) >= 8, f"{page}: front matter '{key}' must say it in a sentence"
        assert value[-1] in ".)", f"{page}: end '{key}' with a full stop"
    for target in meta.get("prereqs") or []:
        assert (paths.DOCS / target).is_file(), f"{page}: prereqs names missing {target}"


@pytest.mark.parametrize("page", BUDGETED)
def test_visible_prose_within_budget(page):
    words, budget = anatomy.visible_words(page), anatomy.BUDGETS[anatomy.kind(page)]
    assert words <= budget, f"{page}: {words} words shown by default (budget {budget})"


@pytest.mark.parametrize("lab", load_labs(), ids=lambda lab: lab.id)
def test_lab_guide_follows_the_anatomy(lab):
    text = (ROOT / "docs" / lab.page).read_text(encoding="utf-8")
    assert anatomy.lab_problems(text) == []


def test_the_lab_template_follows_the_anatomy():
    """``tools/infralens_docs/lab_template.md`` is what a new lab starts from."""
    assert anatomy.lab_problems(TEMPLATE.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("## Predict first\n", "headings"),
        ("```python\nx\n```\n<!-- infralens:figure a.py f -->\n", "before the first figure"),
        ("## What you will see\n<!-- infralens:figure a.py f -->\n- one\n", "1 top-level"),
    ],
)
def test_the_checker_names_what_is_wrong(text, problem):
    assert any(problem in p for p in anatomy.lab_problems(text))
