"""``later.mark_later`` for each page, kept from one build to the next.

``mark_later`` parses every page's HTML (Python's ``HTMLParser``) to estimate the blocks'
heights; on this 2-core machine that was about a quarter of a warm rebuild (11 of 49 s
under cProfile), for pages that had not changed. Its output depends on its input and on
``later.py`` alone, so each page's result is kept under ``.cache/later/``, named by the
hash of both; a build reads the entries its pages need, and :func:`evict_unused` removes
those no build has used for a day when it ends (a day, not this build's alone: the
offline build marks other HTML, and the two alternate in a test run).

The page's TeX is converted to MathML (``mathml.render_math``) just before, for the same
pages on every build: the entry holds both steps' output, keyed on both modules and
latex2mathml's version too.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from infralens_docs import later, mathml, runner
from infralens_docs.runner import CACHE_ROOT

CACHE_DIR = CACHE_ROOT / "later"
_used: set[str] = set()


@functools.cache
def _version() -> bytes:
    from importlib.metadata import version

    sources = b"\0".join(Path(m.__file__).read_bytes() for m in (later, mathml))
    return sources + b"\0" + version("latex2mathml").encode()


def mark_later(html: str) -> str:
    """``later.mark_later(mathml.render_math(html))``, from the cache when this HTML was
    converted before (``mathml.MathError`` when its TeX cannot be converted)."""
    digest = hashlib.sha256(_version() + b"\0" + html.encode("utf-8")).hexdigest()
    _used.add(digest)
    entry = CACHE_DIR / f"{digest}.html"
    try:
        marked = entry.read_text(encoding="utf-8")
        os.utime(entry)  # used: kept by evict_unused
        return marked
    except OSError:
        pass
    marked = later.mark_later(mathml.render_math(html))
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(marked, encoding="utf-8")
    tmp.replace(entry)  # whole or absent: two builds may share the cache
    return marked


def evict_unused(max_age_s: float = 86400) -> None:
    """Remove the entries unused for ``max_age_s`` (``runner.evict_unused``)."""
    runner.evict_unused(CACHE_DIR, "*.html", _used, max_age_s)
