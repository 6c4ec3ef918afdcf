"""The glossary: one file of definitions (``includes/abbreviations.md``), used twice.

- ``pymdownx.snippets`` appends the file to every page (``auto_append`` in mkdocs.yml), and
  Python-Markdown's ``abbr`` turns each term, wherever a page writes it as a word outside
  code, into ``<abbr title="definition">``: the hover definitions.
- The ``glossary`` directive lists every term on ``docs/glossary.md``, alphabetically, with
  the same definition and a link to the handbook section that teaches it (the page's
  ``taught_in`` front matter: term -> ``handbook/page.md#anchor``). A term that no section
  teaches, only names, is listed under ``named_only`` too: its link says "Named in", not
  "Taught in".

Each line of the file is ``*[TERM]: definition``: one plain-text sentence (it is an HTML
``title`` too, so no Markdown in it). A term in backticks, ``*[`alpha_bar`]: ...``, is a
name the pages write as code: ``abbr`` never reaches inside code, and a key in backticks
never matches a word, so such a term has no hover. It is on the glossary page only, in
code style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown.extensions.toc import slugify

from infralens_docs.registry import ROOT, read_front_matter

ABBREVIATIONS = ROOT / "includes" / "abbreviations.md"
LINE_RE = re.compile(r"^\*\[(?P<key>[^\]]+)\]: (?P<definition>\S.*)$")
#: Markdown or HTML a definition must not hold: the same text is an attribute and a paragraph
ACTIVE_RE = re.compile(r"[`*<>]|\]\(|\\")
HEADING_RE = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*(?:\{\s*#(?P<id>[\w-]+)\s*\})?\s*#*\s*$")
FENCE_RE = re.compile(r"^\s*(```|~~~)")


class GlossaryError(ValueError):
    """The abbreviations file, or a glossary link, breaks its contract."""


@dataclass(frozen=True)
class Term:
    key: str  # as written in the file: "CFG", "`alpha_bar`"
    definition: str

    @property
    def name(self) -> str:
        return self.key.strip("`")

    @property
    def is_code(self) -> bool:
        """A name the pages write as code: listed on the glossary page, no hover."""
        return self.key.startswith("`")

    @property
    def anchor(self) -> str:
        return slugify(self.name, "-")


def read_terms(path: Path = ABBREVIATIONS) -> list[Term]:
    """Every term of the abbreviations file, in file order."""
    terms, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        match = LINE_RE.match(line)
        if not match:
            raise GlossaryError(f"{path.name}:{number}: not a '*[TERM]: definition' line")
        term = Term(match.group("key"), match.group("definition").strip())
        if ACTIVE_RE.search(term.definition):
            raise GlossaryError(f"{path.name}:{number}: {term.name}'s definition holds Markdown")
        if term.anchor in seen:
            raise GlossaryError(f"{path.name}:{number}: {term.name} is defined twice")
        seen.add(term.anchor)
        terms.append(term)
    return terms


def alphabetical(terms: list[Term]) -> list[Term]:
    return sorted(terms, key=lambda t: (t.name.casefold(), t.name))


def headings(page: Path) -> dict[str, str]:
    """A Markdown page's headings, id -> text as written (fenced code skipped): the ids
    Python-Markdown's ``toc`` gives them, for the default ``slugify``."""
    found, fenced = {}, False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING_RE.match(line)
        if match:
            text = match.group("text")
            shown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")
            found[match.group("id") or slugify(shown, "-")] = text
    return found


def section_title(docs: Path, target: str) -> str:
    """``Page title › Section heading`` for ``handbook/page.md#anchor``; fails when the
    target is not a handbook section."""
    page, _, anchor = target.partition("#")
    if not page.startswith("handbook/") or not anchor:
        raise GlossaryError(f"{target}: link a handbook section, as handbook/PAGE.md#ANCHOR")
    path = docs / page
    if not path.is_file():
        raise GlossaryError(f"{target}: no page {page}")
    found = headings(path)
    if anchor not in found:
        raise GlossaryError(f"{target}: {page} has no heading with id '{anchor}'")
    title = read_front_matter(path).get("title", page)
    return f"{title} › {found[anchor]}"


def glossary_markdown(
    terms: list[Term], taught_in: dict, docs: Path, rel, named_only: list | tuple = ()
) -> str:
    """The glossary as a definition list: each term with its id, its definition and the
    link to the section that teaches it, or, for a term in ``named_only``, to the section
    that names it (``rel`` makes a docs-relative path a link)."""
    names = {t.name for t in terms}
    missing = sorted(names - set(taught_in))
    unknown = sorted(set(taught_in) - names)
    if missing or unknown:
        raise GlossaryError(
            f"taught_in must link every term of {ABBREVIATIONS.name} and no other: "
            f"missing {missing}, unknown {unknown}"
        )
    named_only = {str(name) for name in named_only}
    if named_only - names:
        raise GlossaryError(
            f"named_only lists no term of {ABBREVIATIONS.name}: {sorted(named_only - names)}"
        )
    out = []
    for term in alphabetical(terms):
        target = str(taught_in[term.name])
        page, _, anchor = target.partition("#")
        shown = f"`{term.name}`" if term.is_code else f"**{term.name}**"
        label = "Named in" if term.name in named_only else "Taught in"
        out += [
            f"{shown} {{ #{term.anchor} }}",
            f":   {term.definition}",
            "",
            f"    {label}: [{section_title(docs, target)}]({rel(page)}#{anchor})",
            "",
        ]
    return "\n".join(out)
