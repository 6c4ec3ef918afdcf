"""Material's search indexing, parsed once per page content instead of once per build.

Material's search plugin splits every page's HTML into sections with a pure-Python
``html.parser`` subclass (``material.plugins.search.plugin.Parser``). On this site that
was ~40% of a warm rebuild: the notebook pages are large (every highlighted token is a
``<span>``), and a rebuild parsed all 52 pages again although their HTML had not changed.

:func:`install` swaps that class for :class:`CachedParser`, which keeps the parsed
sections of each distinct HTML string in ``.cache/search/`` (pickled, keyed on the HTML,
Material's and Python's versions and this module's code) and parses only what it has not seen, with the
token spans inside its code blocks taken out first (:func:`_without_token_spans`). What
the index holds is unchanged: the sections are Material's own objects, built by
Material's own parser, and Material still turns them into entries (titles, anchors, tags,
boosts) on every build. ``evict_unused`` drops the entries no page of the last build used.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import sys
from importlib.metadata import version
from pathlib import Path

from infralens_docs.runner import CACHE_ROOT

CACHE = CACHE_ROOT / "search"
_used: set[Path] = set()


def _path(html: str) -> Path:
    # this module's code too: it changes what the parser is fed (_without_token_spans); and
    # Python's version: the parser is a subclass of its html.parser
    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    key = f"{version('mkdocs-material')}\0{sys.version}\0{own}\0{html}"
    key = hashlib.sha256(key.encode()).hexdigest()
    return CACHE / f"{key[:32]}.pickle"


#: a ``<pre>`` (its start tag, content, end tag), and a ``<span>`` tag
PRE_RE = re.compile(r"(<pre\b[^>]*>)(.*?)(</pre>)", re.S | re.I)
SPAN_TAG_RE = re.compile(r"</?span\b[^>]*>", re.I)


def _without_token_spans(html: str) -> str:
    """``html`` with the ``<span>`` tags inside each ``<pre>`` taken out, their text kept.

    Highlighted code is mostly token spans (a lab page's code blocks hold thousands), each
    two parser callbacks that Material's parser drops (it keeps no ``<span>``): taken out
    first, the lab pages richest in code parse in a fifth to a third of the time, the site
    in about half. Inside a ``<pre>`` the parser keeps
    text as it comes, white space included, so a section's text is cut into fewer pieces
    and, joined, is the same (every built page when this was written;
    ``tests/test_build.py`` re-parses the six pages with the most spans both ways and
    compares their index entries)."""
    return PRE_RE.sub(lambda m: m.group(1) + SPAN_TAG_RE.sub("", m.group(2)) + m.group(3), html)


def install() -> None:
    """Make Material's search plugin parse pages through the cache (idempotent)."""
    from material.plugins.search import plugin

    if getattr(plugin.Parser, "infralens_cached", False):
        return
    original = plugin.Parser

    class CachedParser(original):
        """Material's parser; ``feed`` collects, ``close`` parses or loads the sections."""

        infralens_cached = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._chunks: list[str] = []

        def feed(self, data: str) -> None:
            self._chunks.append(data)

        def close(self) -> None:
            html = "".join(self._chunks)
            path = _path(html)
            _used.add(path)
            try:
                self.data = pickle.loads(path.read_bytes())
                return
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
                pass  # not seen yet (or written by another Material): parse it
            super().feed(_without_token_spans(html))
            super().close()
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(self.data, protocol=pickle.HIGHEST_PROTOCOL))
            tmp.replace(path)

    plugin.Parser = CachedParser


def evict_unused() -> None:
    """Delete the cached parses no page of this build asked for."""
    if _used and CACHE.is_dir():
        for path in CACHE.glob("*.pickle"):
            if path not in _used:
                path.unlink(missing_ok=True)
    _used.clear()
