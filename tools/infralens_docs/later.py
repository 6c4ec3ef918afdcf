"""Which of a page's blocks the browser may leave unrendered while the page loads.

site.css gives a block marked ``data-later`` ``content-visibility: auto`` until a11y.js has
laid it out after load (see both files). A block is marked only when what comes before
it is certainly taller than 1,000 px, because Chromium can draw its first frame with
every such block at its placeholder height, on screen or not (Lighthouse saw it on one
run in five of lab 07's notebook page: the footer came into view, then moved, layout
shift 0.19). So in a window up to 1,000 px tall a block on the first screen, the title
and the opening among them, is never marked, however short the blocks before it are.

"Certainly taller" is a lower bound on the height, estimated without layout from what
was measured on the built site (Chromium, every page, <details> opened) and Material's
CSS:
- a code line is at least 13 px (13.98 px, console code in an admonition; a ``<pre>``
  never wraps: it scrolls), a line of prose at least 20 px (20.48 px in an admonition),
  16 px in an ``<h5>`` or ``<h6>`` (16.38 px in an admonition: none on the site yet);
- a paragraph, heading, list item, table row or summary with text takes at least one
  line, or one per 180 characters: the most a line held was 164, at 1219 px wide, where
  the column is widest (the left sidebar has become a drawer and the table of contents
  still shows); 118.7 at 1280 px and wider, 136 at 1100, 130 at 800, 123 at 744. In a
  window at most 480 px wide, one per 80 characters (76 at 481 px, 73 at 480, 58.8 at
  390): a block certainly that far down only there is marked ``data-later="narrow"``,
  which site.css and a11y.js defer only in such a window;
- what is hidden at load counts nothing: a closed ``<details>`` but its summary, a tab
  but the first, ``hidden``, ``<template>``, ``<script>``, ``<style>``, a MathML
  annotation. Margins, padding, images and SVGs count nothing either.

So the bound is loose: the first marked block starts further down than 1,000 px (the
browser tests hold it at 1.2 windows or more below the top on every page at 390 x 800 and
1280 x 800, and 1.5 at 1280 x 800 on a first visit; they measure no other width). In a taller window a
marked block can be on the first screen, where it is drawn at its placeholder height if
the first frame comes before Chromium has decided it is near the screen. A window
resized across 480 px after load can see a block's margins change as the narrow marks
start or stop applying.

The blocks are the article's top-level elements, the cells of a notebook
(``.jp-Notebook``'s children) and each cell's outputs (``.jp-OutputArea``), and the runs of
a long code block's lines. A block is laid out whole, in one task of a11y.js's settle, so
its size bounds that task; Lighthouse counts each task's time over 50 ms as blocking. On
lab 06's notebook page, a code cell of 106 lines (1,172 highlighted spans) and its figure
took 74-116 ms to style and lay out the first time (Chromium at 4x CPU throttling, 412 px,
three loads, timed around setting ``data-shown`` and reading ``offsetHeight``): layout
grows with the lines, style with the spans. So :func:`split_code` wraps the lines of a
``<pre>`` longer than ``CODE_RUN`` lines in runs of that many lines at most (more only
where an element spans the cut: none on the site), ``<span class="code-lines">``, each a
block in site.css. In runs of 24 lines, that cell's took 17-25 ms each and its figure
34-57 ms (five loads, timed the same way). A run ends at a newline outside every
element, so the runs hold the block's text and elements unchanged, and a copy of the
block (Material copies its ``innerText``, with ``data-md-copying`` set, under which
site.css gives the runs ``display: contents``) is the same text.
"""

from __future__ import annotations

import itertools
import re
from html.parser import HTMLParser

#: a window's height up to which a marked block is never on the first screen
LATER_PX = 1000
#: the most lines in one run of a code block's lines (see the docstring: 17-25 ms each)
CODE_RUN = 24
#: the shortest code line, line of prose, and line of a small heading (see the docstring)
CODE_PX, PROSE_PX, SMALL_HEADING_PX = 13, 20, 16
#: the most characters a line of prose holds: in any window, in one at most 480 px wide
LINE_CHARS = (180, 80)

#: elements whose text takes at least a line of its own
LINE_TAGS = {"p", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "dt", "dd", "summary",
             "figcaption", "caption"}  # fmt: skip
#: elements with no end tag
VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip
#: elements whose content counts nothing: never drawn as text of the page, or (an SVG)
#: of a height its text does not tell
UNCOUNTED = {
    "template", "script", "style", "noscript", "title", "annotation", "annotation-xml", "svg",
}  # fmt: skip
#: elements in which <x/> closes x (SVG and MathML); in HTML it opens it
FOREIGN = {"svg", "math"}


class _Element:
    __slots__ = ("chars", "children", "classes", "foreign", "open", "shown", "tag", "text")

    def __init__(self, tag: str, classes: list[str], shown: bool, attrs: dict, foreign: bool):
        self.tag, self.classes, self.shown, self.foreign = tag, classes, shown, foreign
        self.children = 0
        self.open = "open" in attrs
        self.chars = 0  # prose characters in a LINE_TAGS element
        self.text: list[str] = []  # a <pre>'s text


class _Blocks(HTMLParser):
    """Each block's insertion point (the end of its start tag) and the height above it."""

    def __init__(self, html: str, pres: dict | None = None) -> None:
        super().__init__(convert_charrefs=True)
        # <pre> start tag offset -> (its text, its runs), for the <pre>s fed as a comment
        self.pres = pres or {}
        # getpos() counts lines at "\n" only (not at every character splitlines() splits at)
        lines = html.split("\n")[:-1]  # each line's start, from its length and a "\n"
        self.starts = [0, *itertools.accumulate(len(line) + 1 for line in lines)]
        self.stack: list[_Element] = []
        self.px = [0.0, 0.0]  # the height so far: in any window, in a narrow one
        self.blocks: list[tuple[int, list[float], bool]] = []  # (offset, px, marked already)

    def _offset(self) -> int:
        line, column = self.getpos()
        return self.starts[line - 1] + column

    def _shown(self, tag: str, attrs: dict) -> bool:
        if tag in UNCOUNTED or "hidden" in attrs:
            return False
        if not self.stack:
            return True
        parent = self.stack[-1]
        if not parent.shown:
            return False
        if parent.tag == "details" and not parent.open and tag != "summary":
            return False
        return not ("tabbed-content" in parent.classes and parent.children > 0)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        classes = (named.get("class") or "").split()
        parent = self.stack[-1] if self.stack else None
        holds_cells = {"jupyter-wrapper", "jp-Notebook"} & set(classes)
        shown = self._shown(tag, named)
        px = self.px
        if "code-lines" in classes:
            # a run of a code block's lines, below the lines before it in its <pre>. Not a
            # block: one hidden at load (what a closed <details> or a later tab holds is
            # laid out when shown), nor one in a table cell (the cells beside it, a
            # <pre> of line numbers among them, count as above it here)
            pre = next((e for e in reversed(self.stack) if e.tag == "pre"), None)
            above = "".join(pre.text).removeprefix("\n").count("\n") if pre else 0
            in_cell = any(e.tag in ("td", "th") for e in self.stack)
            px = [p + CODE_PX * above for p in self.px] if shown and not in_cell else None
        elif not (
            (parent is None and not holds_cells)
            or (parent and "jp-Notebook" in parent.classes)
            or ("jp-OutputArea" in classes and shown)
        ):
            px = None
        if px is not None:
            # the mark goes at the end of the start tag: what matches a tag by its opening
            # (<figure class="lab-figure") still does
            raw = self.get_starttag_text() or ""
            end = self._offset() + len(raw) - (2 if raw.endswith("/>") else 1)
            self.blocks.append((end, px[:], "data-later" in named))
        foreign = tag in FOREIGN or bool(parent and parent.foreign)
        if parent:
            parent.children += 1
        if tag not in VOID:
            self.stack.append(_Element(tag, classes, shown, named, foreign))
        if tag == "pre" and self._offset() in self.pres:
            # its body was fed as a comment (_quiet_code): its text and its runs, as the
            # "code-lines" branch above would have seen them
            text, runs = self.pres[self._offset()]
            self.stack[-1].text.append(text)
            if shown and not any(e.tag in ("td", "th") for e in self.stack):
                for end, above, marked in runs:
                    self.blocks.append((end, [p + CODE_PX * above for p in self.px], marked))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID and self.stack[-1].foreign:
            self.handle_endtag(tag)

    def _close(self, element: _Element) -> None:
        if not element.shown:
            return
        if element.tag == "pre":
            # a newline right after <pre> is not drawn (HTML drops it), nor is the last one
            text = "".join(element.text).removeprefix("\n").rstrip("\n")
            lines = text.count("\n") + 1 if text.strip() else 0
            self.px = [px + CODE_PX * lines for px in self.px]
        elif element.tag in LINE_TAGS and element.chars:
            line = SMALL_HEADING_PX if element.tag in ("h5", "h6") else PROSE_PX
            self.px = [
                px + line * max(1.0, element.chars / chars)
                for px, chars in zip(self.px, LINE_CHARS, strict=True)
            ]

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        # close up to the matching element (markdown and nbconvert close what they open)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].tag == tag:
                while len(self.stack) > i:
                    self._close(self.stack.pop())
                break

    def handle_data(self, data: str) -> None:
        if self.stack and not self._shown("#text", {}):
            return
        chars = len(" ".join(data.split()))  # white space collapses
        for element in reversed(self.stack):
            if element.tag == "pre":
                element.text.append(data)
                return
            if element.tag in LINE_TAGS:
                element.chars += chars
                return
        # text outside any line element: no line of its own
        self.px = [px + PROSE_PX * chars / n for px, n in zip(self.px, LINE_CHARS, strict=True)]


#: a <pre> (start tag, content, end tag); or a comment, <script>, <style> or <template>,
#: whose text may look like one without being one (left as it is). "<pre" in an attribute's
#: value would be taken for one. Python-Markdown's serializer and the hooks here write "<"
#: there as "&lt;", but raw HTML (in Markdown, or a notebook's Markdown cells) passes as
#: written; no attribute on the built site holds a "<", and tests/test_build.py checks
#: that every run there is a run of a <pre>'s lines.
PRE_RE = re.compile(
    r"(<!--.*?-->|<(script|style|template)\b.*?</\2\s*>)|(<pre(?=[\s>])[^>]*>)(.*?)(</pre>)",
    re.S | re.I,
)
#: where a <pre>'s lines start: after its <code> start tag (pymdownx writes an empty
#: <span> before it; a notebook cell's lines begin with one, inside the first run)
CODE_START_RE = re.compile(r"\s*(?:<span></span>)?<code\b[^>]*>")
#: a tag; a tag (its name), or a newline
TAG_RE = re.compile(r"<[^>]*>")
TAG_OR_NEWLINE_RE = re.compile(r"<(/?)([^\s/>]*)[^>]*>|\n")


def _lines(text: str) -> int:
    """How many lines ``text`` (markup included) draws in a ``<pre>``: a last newline
    starts no line."""
    text = TAG_RE.sub("", text)
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def _runs(text: str) -> str:
    """``text`` (a ``<pre>``'s lines, markup included) in runs of at most ``CODE_RUN``
    lines, as even as they go, each ending at a newline outside every element; a cut
    that falls inside an element (a multi-line span) moves to the next newline outside,
    so that run is longer and the runs after it share the lines left. ``text`` as it is if
    it has at most ``CODE_RUN`` lines, no newline outside every element before its last
    line, or markup that does not balance (in HTML ``<span/>`` opens a span)."""
    lines = _lines(text)
    if lines <= CODE_RUN:
        return text
    k = -(-lines // CODE_RUN)  # runs
    cuts, depth, done = [0], 0, 0
    due = -(-lines // k)  # the lines before the next cut: the lines left, shared evenly
    for m in TAG_OR_NEWLINE_RE.finditer(text):
        token, closing, name = m.group(), m.group(1), (m.group(2) or "").lower()
        if token == "\n":
            done += 1
            if depth == 0 and len(cuts) < k and due <= done < lines:
                cuts.append(m.end())
                due = done + -(-(lines - done) // (k - len(cuts) + 1))
        elif closing:
            depth -= 1
            if depth < 0:
                return text
        elif name in VOID or token.startswith("<!"):
            continue
        else:
            depth += 1
    if depth != 0 or len(cuts) == 1:
        return text
    cuts.append(len(text))
    return "".join(
        f'<span class="code-lines" style="--lines: {_lines(text[a:b])}">{text[a:b]}</span>'
        for a, b in itertools.pairwise(cuts)
    )


def split_code(html: str) -> str:
    """``html`` with the lines of each ``<pre>`` longer than ``CODE_RUN`` lines wrapped in
    runs (see the module's docstring). Left as it is: a ``<pre>`` already split, and one
    with highlighted lines (pymdownx's ``.hll``: Material draws their background and bar
    outside the line's box, which a run not yet laid out would clip)."""

    def split(m: re.Match) -> str:
        if m.group(1):
            return m.group()
        start, body, end = m.group(3, 4, 5)
        if '<span class="code-lines"' in body or 'class="hll"' in body:
            return m.group()
        code = CODE_START_RE.match(body)
        at = code.end() if code else 0
        close = body.rfind("</code>") if code else len(body)
        if close < at:
            return m.group()
        if not code and body.startswith("\n"):
            at = 1  # the newline right after <pre> is not drawn: it stays where it is
        return start + body[:at] + _runs(body[at:close]) + body[close:] + end

    return PRE_RE.sub(split, html)


#: the tags a highlighted <pre> holds: its <code>, token spans and runs of its lines
CODE_TAG_RE = re.compile(r"</?(?:span|code)\b[^>\n]*>")


def _quiet_code(html: str) -> tuple[str, dict[int, tuple[str, list[tuple[int, int, bool]]]]]:
    """``html`` with the body of each ``<pre>`` that holds only ``<code>`` and ``<span>``
    markup replaced by a comment of the same length, and for each such ``<pre>`` (by its
    start tag's offset) what :class:`_Blocks` reads of it: its text, and each run of its
    lines (``code-lines``) as (the end of its start tag, the lines above it, marked
    already). A highlighted block is mostly token spans (a notebook page's are most of its
    tags), each a parser callback that counts nothing; offsets and newlines stay where
    they were."""
    import html as entities

    pres = {}

    def quiet(m: re.Match) -> str:
        if m.group(1):
            return m.group()
        body = m.group(4)
        if len(body) < 7 or "<" in CODE_TAG_RE.sub("", body):
            return m.group()
        text, runs, at = [], [], m.start(4)
        last = 0
        for tag in CODE_TAG_RE.finditer(body):
            text.append(entities.unescape(body[last : tag.start()]))
            last = tag.end()
            if 'class="code-lines"' in tag.group():
                above = "".join(text).removeprefix("\n").count("\n")
                runs.append((at + tag.end() - 1, above, "data-later" in tag.group()))
        text.append(entities.unescape(body[last:]))
        pres[m.start(3)] = ("".join(text), runs)
        newlines = body.count("\n")
        filler = "x" * (len(body) - 7 - newlines) + "\n" * newlines
        return m.group(3) + "<!--" + filler + "-->" + m.group(5)

    return PRE_RE.sub(quiet, html), pres


def mark_later(html: str) -> str:
    """``html`` (a page's content) with its long code blocks split (:func:`split_code`),
    then ``data-later`` on each block with at least ``LATER_PX`` of height above it in any
    window, ``data-later="narrow"`` on each with as much only in a narrow one (see the
    module's docstring)."""
    html = split_code(html)
    quiet, pres = _quiet_code(html)
    parser = _Blocks(quiet, pres)  # the same offsets and lines: the marks go into ``html``
    parser.feed(quiet)
    parser.close()
    out, last = [], 0
    for offset, (wide, narrow), marked in parser.blocks:
        if narrow >= LATER_PX and not marked:
            out.append(html[last:offset])
            out.append(" data-later" if wide >= LATER_PX else ' data-later="narrow"')
            last = offset
    out.append(html[last:])
    return "".join(out)
