"""Render TeX to MathML at build time, so no page loads a math script.

pymdownx.arithmatex in ``generic`` mode leaves ``<span class="arithmatex">\\(...\\)</span>``
(inline) and ``<div class="arithmatex">\\[...\\]</div>`` (display) in the HTML.
This module swaps each for MathML from latex2mathml, which Chromium, Firefox
and Safari render natively. A formula latex2mathml cannot parse fails the build.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

INLINE_RE = re.compile(r'<span class="arithmatex">\\\((.+?)\\\)</span>', re.DOTALL)
BLOCK_RE = re.compile(r'<div class="arithmatex">\\\[(.+?)\\\]</div>', re.DOTALL)


class MathError(ValueError):
    pass


def _to_mathml(tex: str, display: str) -> str:
    tex = html.unescape(tex).strip()
    try:
        return convert(tex, display=display)
    except Exception as exc:  # latex2mathml raises several exception types
        raise MathError(f"cannot render TeX {tex!r}: {exc}") from exc


def render_math(page_html: str) -> str:
    """Replace every arithmatex placeholder in ``page_html`` with MathML."""
    page_html = BLOCK_RE.sub(
        lambda m: f'<div class="math-display">{_to_mathml(m.group(1), "block")}</div>', page_html
    )
    return INLINE_RE.sub(lambda m: _to_mathml(m.group(1), "inline"), page_html)
