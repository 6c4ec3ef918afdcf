"""Pygments' highlighting of the pages' code blocks, kept from one build to the next.

Every code block on the site (the starter sections the lab pages include, the handbook's
examples) goes through ``pymdownx.highlight``, which calls ``pygments.highlight(src,
lexer, formatter)``. That was ~10% of a warm rebuild, for blocks that rarely change.

:func:`install` wraps the ``highlight`` that ``pymdownx.highlight`` calls: the HTML of a
block is looked up by everything Pygments' output depends on (the source, the lexer's
and the formatter's classes and options, Pygments' version) and computed by Pygments
only when that combination is new. The cache is one JSON file, ``.cache/highlight.json``,
loaded when the build starts and rewritten at its end with the blocks it used.
"""

from __future__ import annotations

import hashlib
import json
import os

from infralens_docs.runner import CACHE_ROOT

CACHE_FILE = CACHE_ROOT / "highlight.json"
_store: dict[str, str] = {}
_used: dict[str, str] = {}


def _key(src: str, lexer, formatter) -> str:
    from pygments import __version__

    def describe(obj) -> str:
        kind = type(obj)
        options = sorted((k, repr(v)) for k, v in getattr(obj, "options", {}).items())
        return f"{kind.__module__}.{kind.__qualname__}{options}"

    parts = [__version__, describe(lexer), describe(formatter), src]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def install() -> None:
    """Route pymdownx.highlight's Pygments calls through the cache (idempotent); load it."""
    from pymdownx import highlight as module

    _used.clear()
    _store.clear()
    try:
        _store.update(json.loads(CACHE_FILE.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    if getattr(module.highlight, "infralens_cached", False):
        return
    pygments_highlight = module.highlight

    def highlight(src, lexer, formatter, outfile=None):
        if outfile is not None:  # (pymdownx never passes one)
            return pygments_highlight(src, lexer, formatter, outfile)
        key = _key(src, lexer, formatter)
        html = _store.get(key)
        if html is None:
            html = pygments_highlight(src, lexer, formatter)
        _used[key] = html
        return html

    highlight.infralens_cached = True  # type: ignore[attr-defined]
    module.highlight = highlight


def save(keep: bool = False) -> None:
    """Write the blocks this build used (only those: the file does not grow forever);
    ``keep``, those it loaded too (under ``mkdocs serve``, a page whose render is reused
    highlights nothing)."""
    used = {**_store, **_used} if keep else _used
    if not used or used == _store:
        return
    CACHE_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE_FILE.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(used, sort_keys=True), encoding="utf-8")
    tmp.replace(CACHE_FILE)
