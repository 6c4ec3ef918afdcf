"""What a page must look like, as data the tests, ``make bench`` and the lab template share.

A lab guide teaches before it shows code: the question and a prediction prompt, then the
figure and three things to notice on the first screen, the mental model, the code with its
explanation beside it, one run with the others behind tabs, then the misunderstandings,
how to say it out loud and further reading (``LAB_HEADINGS``). Prose visible by default
is budgeted (``BUDGETS``); depth goes in collapsed ``???`` blocks, which the reading time
counts apart (``paths.reading_words``).
"""

from __future__ import annotations

import re

from infralens_docs import paths

#: the ``## `` headings of a lab guide, all of them, in this order
LAB_HEADINGS = (
    "Predict first",
    "What you will see",
    "Mental model",
    "The code, explained",
    "Run it",
    "Common misunderstandings",
    "How to say it out loud",
    "Further reading",
)

#: the most words of prose a page may show by default (outside code, directives and
#: collapsed blocks), by kind of page; the issue's targets are about 1,000 and 1,500
BUDGETS = {"handbook": 1200, "labs": 1800}

#: how many top-level bullets "What you will see" gives as the things to notice
NOTICES = 3

_H2_RE = re.compile(r"^## (.+)$", re.MULTILINE)
_FENCE_RE = re.compile(r"^\s*(```|~~~)", re.MULTILINE)
_FIGURE_RE = re.compile(r"^\s*<!-- infralens:figure ", re.MULTILINE)


def kind(page: str) -> str | None:
    """``"handbook"`` or ``"labs"`` for a budgeted page (docs-relative), else None."""
    top = page.split("/", 1)[0]
    if top == "labs" and page != "labs/index.md":
        return "labs"
    return "handbook" if top == "handbook" else None


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown page ("" if it has none)."""
    found = re.search(
        rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL
    )
    return found.group(1) if found else ""


def lab_problems(text: str) -> list[str]:
    """What keeps a lab guide's Markdown from the anatomy (empty when it follows it)."""
    problems = []
    headings = tuple(_H2_RE.findall(text))
    if headings != LAB_HEADINGS:
        extra = [h for h in headings if h not in LAB_HEADINGS]
        missing = [h for h in LAB_HEADINGS if h not in headings]
        problems.append(
            f"## headings: missing {missing}, not in the anatomy {extra}"
            if missing or extra
            else f"## headings out of order: {list(headings)}"
        )
    predict = section(text, "Predict first")
    if '!!! question "' not in predict:
        problems.append('"Predict first" has no !!! question block')
    figure, fence = _FIGURE_RE.search(text), _FENCE_RE.search(text)
    if figure is None:
        problems.append("no figure")
    elif fence is not None and fence.start() < figure.start():
        problems.append("a code block comes before the first figure")
    see = section(text, "What you will see")
    if not _FIGURE_RE.search(see):
        problems.append('"What you will see" shows no figure')
    bullets = re.findall(r"^- ", see, re.MULTILINE)
    if len(bullets) != NOTICES:
        problems.append(f'"What you will see" has {len(bullets)} top-level bullets, not {NOTICES}')
    run = section(text, "Run it")
    if run.count("<!-- infralens:run ") > 1 and '=== "' not in run:
        problems.append('"Run it" shows more than one run without tabs')
    return problems


def visible_words(page: str) -> int:
    """Words of prose a docs page shows by default (``paths.reading_words``)."""
    return paths.reading_words((paths.DOCS / page).read_text(encoding="utf-8"))[0]
