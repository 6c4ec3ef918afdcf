"""The glossary: one file of definitions (includes/abbreviations.md), shown twice.

Every page gets the file appended (pymdownx.snippets ``auto_append``), so each term a page
writes as a word is an ``<abbr title="...">``; docs/glossary.md lists the same definitions,
each linked to the handbook section that teaches it. These tests hold the two uses to one
source, and each link to a section that really names its term.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import yaml

from infralens_docs import glossary
from infralens_docs.registry import ROOT, read_front_matter

TERMS = glossary.read_terms()
HOVER = [t for t in TERMS if not t.is_code]
DOCS = ROOT / "docs"
#: a hover definition shows as a tooltip on every occurrence: one short sentence
MAX_WORDS = {"hover": 20, "code": 25}


def words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][\w'.-]*", text))


def mkdocs_config() -> dict:
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !ENV, !relative
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=loader)


# --------------------------------------------------------------------------- the source


def test_every_page_gets_the_abbreviations_file():
    extensions = {}
    for entry in mkdocs_config()["markdown_extensions"]:
        extensions.update(entry if isinstance(entry, dict) else {entry: None})
    assert "abbr" in extensions
    appended = extensions["pymdownx.snippets"]["auto_append"]
    assert glossary.ABBREVIATIONS.relative_to(ROOT).as_posix() in appended


@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.name)
def test_definitions_are_one_short_sentence(term):
    kind = "code" if term.is_code else "hover"
    assert words(term.definition) <= MAX_WORDS[kind], (
        f"{term.name}: keep it under {MAX_WORDS[kind]} words"
    )
    assert term.definition.endswith(".") and ". " not in term.definition, term.name


def test_every_term_links_a_handbook_section_that_exists():
    """Without a build: the glossary page's ``taught_in`` names every term, and each target
    is a heading of a handbook page (the directive fails the build on the same rules)."""
    taught_in = read_front_matter(DOCS / "glossary.md")["taught_in"]
    assert sorted(taught_in) == sorted(t.name for t in TERMS)
    for name, target in taught_in.items():
        assert glossary.section_title(DOCS, target), name


# --------------------------------------------------------------------------- the built site

#: text in these is code, figures or markup a reader does not read as prose
SKIPPED = {"code", "pre", "kbd", "samp", "math", "svg", "script", "style", "figure", "abbr"}
#: the blocks Python-Markdown writes prose into; one with a class (other than an admonition's
#: title) is HTML a hook or a template added after Markdown, which no abbr reaches
BLOCKS = {"p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6"}
MARKDOWN_CLASSES = {None, "admonition-title"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class Prose(HTMLParser):
    """The article's prose text nodes (code, math, figures and abbrs skipped), and every
    ``<abbr>`` with its title."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []  # (tag, class)
        self.texts: list[str] = []
        self.abbrs: list[tuple[str, str]] = []  # (text, title)
        self._abbr: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        attrs = dict(attrs)
        self.stack.append((tag, attrs.get("class")))
        if tag == "abbr":
            self._title, self._abbr = attrs.get("title", ""), []

    def handle_endtag(self, tag):
        if tag in VOID or tag not in {t for t, _ in self.stack}:
            return
        while self.stack.pop()[0] != tag:
            pass
        if tag == "abbr" and self._abbr is not None:
            self.abbrs.append(("".join(self._abbr), self._title))
            self._abbr = None

    def handle_data(self, data):
        if self._abbr is not None:
            self._abbr.append(data)
        if any(tag in SKIPPED for tag, _ in self.stack):
            return
        block = next((c for tag, c in reversed(self.stack) if tag in BLOCKS), "")
        if block in MARKDOWN_CLASSES:
            self.texts.append(data)


def article(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    match = re.search(r"<article\b[^>]*>(.*)</article>", text, re.DOTALL)
    return match.group(1) if match else ""


def markdown_pages(site: Path) -> list[Path]:
    """Built pages whose content Python-Markdown rendered: not the notebook pages, which
    mkdocs-jupyter renders with its own Markdown (no abbr, no snippets)."""
    return [
        p
        for p in sorted(site.rglob("*.html"))
        if p.name != "404.html" and 'class="jupyter-wrapper"' not in p.read_text(encoding="utf-8")
    ]


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def shown_glossary(site: Path) -> dict[str, tuple[str, str]]:
    """The built glossary page: term id -> (definition shown, href of its section link)."""
    page = article(site / "glossary" / "index.html")
    entries = re.findall(r'<dt id="([^"]+)">.*?</dt>\s*<dd>\s*<p>(.*?)</p>\s*<p>(.*?)</p>', page, re.DOTALL)  # fmt: skip
    shown = {}
    for anchor, definition, taught in entries:
        links = re.findall(r'<a href="([^"]+)"', taught)
        assert len(links) == 1, f"glossary #{anchor}: one link to the section that teaches it"
        shown[anchor] = (text_of(definition), links[0])
    return shown


def word_re(term: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(term)}(?![A-Za-z0-9])")


@pytest.mark.build
def test_glossary_page_shows_every_definition_of_the_file(built_site):
    shown = shown_glossary(built_site)
    assert list(shown) == [t.anchor for t in glossary.alphabetical(TERMS)]
    for term in TERMS:
        assert shown[term.anchor][0] == term.definition, term.name


@pytest.mark.build
@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.name)
def test_glossary_link_reaches_a_section_that_names_the_term(built_site, term):
    """The link resolves to a built page and a heading on it, and the section under that
    heading (down to the next heading of its level) writes the term."""
    href = shown_glossary(built_site)[term.anchor][1]
    url = urlparse(urljoin("/glossary/", href))
    assert url.fragment, f"{term.name}: link a section, not a page"
    target = built_site / url.path.lstrip("/") / "index.html"
    assert target.is_file(), f"{term.name}: {href} is no page"
    text = target.read_text(encoding="utf-8")
    heading = re.search(rf'<h([1-6]) id="{re.escape(url.fragment)}"', text)
    assert heading, f"{term.name}: {href} names no heading"
    end = re.compile(rf"<h[1-{heading.group(1)}]\b").search(text, heading.end())
    section = text_of(text[heading.start() : end.start() if end else len(text)])
    assert word_re(term.name).search(section), f"{term.name}: {href} does not write it"


@pytest.mark.build
def test_every_prose_term_carries_its_hover_definition(built_site):
    """On every page Python-Markdown rendered, each hover term written as a word outside
    code is inside an ``<abbr>``, and every ``<abbr>`` shows the glossary page's definition."""
    shown = shown_glossary(built_site)
    definitions = {t.name: shown[t.anchor][0] for t in HOVER}
    # the same match as Python-Markdown's abbr: whole words, longest term first
    names = sorted(definitions, key=len, reverse=True)
    pattern = re.compile(rf"\b(?:{'|'.join(re.escape(n) for n in names)})\b")
    bare, wrong, used = {}, {}, set()
    for page in markdown_pages(built_site):
        parser = Prose()
        parser.feed(article(page))
        rel = page.relative_to(built_site).as_posix()
        found = sorted({m.group(0) for text in parser.texts for m in pattern.finditer(text)})
        if found:
            bare[rel] = found
        for text, title in parser.abbrs:
            if definitions.get(text) != title:
                wrong.setdefault(rel, []).append(text)
            if rel != "glossary/index.html":
                used.add(text)
    assert bare == {}, "terms in prose without their <abbr>"
    assert wrong == {}, "<abbr> titles that differ from the glossary page"
    assert sorted(set(definitions) - used) == [], "hover terms no page uses"
