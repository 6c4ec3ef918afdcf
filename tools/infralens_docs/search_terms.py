"""Search ranks the section that teaches a word first.

Material's search (lunr) weighs a match in a section's ``tags`` a million times one in its
text, and one in its title a thousand times. Without tags, a starter's notebook page whose
heading happens to hold a word ("4. Strength: set_adapters weights", lab 08) outranked the
section that teaches it ("strength", image-to-image). The site renders no tags; here they
are search keywords, given to the one section that teaches each term:

- every glossary term, to the section the glossary links it to (``taught_in`` in
  docs/glossary.md's front matter: term -> ``handbook/page.md#anchor``);
- a page's own ``search_terms`` front matter (word -> ``#anchor`` on that page), for a
  topic's word that has no glossary entry (``offload`` on the memory page).

:func:`tag_sections` runs after the search plugin has written ``search_index.json``, and
first takes code blocks and verified-claims lists out of its text (``search_slim``).

The starters' notebook pages (``code/``: starters, exercises, checkers, lab 17's solution) are
left out of the index (:func:`leave_out_starter` sets Material's ``search: exclude`` page
meta; these pages have no front matter). Each opens with a link to its lab guide, which is
in the index. They were 27% of the index's bytes: without them the search worker has less
to download and index before the first results, and no starter outranks its guide.
"""

from __future__ import annotations

import json
from pathlib import Path

from infralens_docs import search_slim
from infralens_docs.registry import ROOT, read_front_matter

DOCS = ROOT / "docs"
GLOSSARY = DOCS / "glossary.md"


def leave_out_starter(page) -> None:
    """Leave a starter's notebook page (``code/...``) out of the search index."""
    if page.file.src_uri.startswith("code/"):
        page.meta["search"] = {**(page.meta.get("search") or {}), "exclude": True}


class SearchTermError(ValueError):
    """A term names a section the site does not have."""


def _location(target: str, directory_urls: bool = True) -> str:
    """'handbook/memory.md#offload' -> the search index's location: 'handbook/memory/#offload'
    with directory URLs (the home page '', 'labs/index.md' 'labs/'), and
    'handbook/memory.html#offload' without (the offline build: 'index.html', 'labs/index.html')."""
    path, _, anchor = target.partition("#")
    stem = path.removesuffix(".md")
    if not directory_urls:
        url = stem + ".html"
    else:
        url = "" if stem == "index" else stem.removesuffix("/index") + "/"
    return url + (f"#{anchor}" if anchor else "")


def section_terms(docs: Path = DOCS, directory_urls: bool = True) -> dict[str, list[str]]:
    """Search location of a section -> the words it is the teaching section for."""
    terms: dict[str, list[str]] = {}
    for term, target in (read_front_matter(docs / GLOSSARY.name).get("taught_in") or {}).items():
        terms.setdefault(_location(str(target), directory_urls), []).append(str(term))
    for page in sorted(docs.rglob("*.md")):
        if not page.read_text(encoding="utf-8").startswith("---\n"):
            continue  # no front matter
        for word, anchor in (read_front_matter(page).get("search_terms") or {}).items():
            target = page.relative_to(docs).as_posix() + str(anchor)
            terms.setdefault(_location(target, directory_urls), []).append(str(word))
    return terms


def tag_sections(site: Path, docs: Path = DOCS, directory_urls: bool = True) -> None:
    """Give each teaching section its words as tags in ``site/search/search_index.json``
    (slimmed first: :func:`infralens_docs.search_slim.slim_index`); fail on a term whose
    section is not in the index (a renamed heading)."""
    index = site / "search" / "search_index.json"
    if not index.is_file():
        return
    # first, code blocks and verified-claims lists out of the sections' text (search_slim)
    data = search_slim.slim_cached(index.read_text(encoding="utf-8"))
    entries = {entry["location"]: entry for entry in data["docs"]}
    missing = []
    for location, words in section_terms(docs, directory_urls).items():
        entry = entries.get(location)
        if entry is None:
            missing.append(f"{location} ({', '.join(words)})")
            continue
        entry["tags"] = sorted({*entry.get("tags", []), *words})
    if missing:
        raise SearchTermError(
            "search terms name sections the site does not have: " + "; ".join(missing)
        )
    index.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")  # as Material
