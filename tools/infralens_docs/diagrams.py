"""The diagrams a page draws that are no starter's output (``diagrams.yml`` beside this
file), drawn at build time by the same :func:`labkit.figures.flow_diagram` the starters
use, so they follow the colour scheme and the charts' size rules.

``<!-- infralens:diagram NAME -->`` puts one on a page (``directives.diagram``). Also:
:func:`chart_html`, how every inline SVG chart is put on a page (a min-width that keeps its
text at 8 px or more), and :func:`ascii_diagrams`, the diagrams a page still types in
characters (``tests/test_diagrams.py`` allows none on a reading path).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DIAGRAMS_FILE = Path(__file__).with_name("diagrams.yml")

#: The charts' font size (``.lab-chart`` in docs/assets/stylesheets/site.css) and the
#: smallest size any chart text may render at
FONT_PX, MIN_TEXT_PX = 13, 8

#: The diagrams' width: at most the width whose 13 px text still renders at 8 px in the
#: narrowest column a page has at 390 px (358 px), so that a phone shows one whole.
WIDTH = 560
#: flow_diagram's own estimate of a character's width at 13 px
CHAR_PX = 8


class DiagramError(ValueError):
    pass


@dataclass(frozen=True)
class Diagram:
    name: str
    alt: str
    caption: str
    rows: list[tuple[str, str, list[str]]]
    repeat: dict[str, str]

    def svg(self) -> str:
        from labkit import figures

        return figures.flow_diagram(self.rows, repeat=self.repeat, width=WIDTH)


def chart_html(svg: str, alt: str) -> str:
    """An inline SVG chart as a page shows it (a starter's figure on its lab page or its
    notebook page, or a diagram): labelled by its alt text, and never narrower than the
    width at which its smallest text (``font-size`` attributes, else the stylesheet's
    13 px) renders at 8 px. On a phone a wider chart scrolls sideways instead of shrinking
    below that (site.css)."""
    root = re.match(r"\s*<svg\b[^>]*>", svg)
    view = root and re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ', root.group(0))
    if view:
        sizes = [float(v) for v in re.findall(r'font-size[=:]\s*"?([\d.]+)', svg)]
        least = math.ceil(float(view.group(1)) * MIN_TEXT_PX / min([FONT_PX, *sizes]))
        svg = svg.replace("<svg ", f'<svg style="min-width:{least}px" ', 1)
    return f'<div class="lab-figure__chart" role="img" aria-label="{alt}">{svg.strip()}</div>'


def load(name: str, file: Path = DIAGRAMS_FILE) -> Diagram:
    """Diagram ``name``, checked: a real alt text, rows of (stage, operation, lines), and
    every line of text inside the diagram's width."""
    raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    if name not in raw:
        raise DiagramError(f"no diagram {name!r} in {file.name} (it has {sorted(raw)})")
    entry = raw[name]
    alt, caption = str(entry.get("alt", "")), str(entry.get("caption", ""))
    if len(alt) < 20 or not caption:
        raise DiagramError(f"diagram {name!r} needs a real alt text and a caption")
    rows = []
    for row in entry.get("rows") or []:
        if len(row) != 3 or not isinstance(row[2], list):
            raise DiagramError(f"diagram {name!r}: a row is [stage, operation, [lines]]: {row}")
        rows.append((str(row[0]), str(row[1]), [str(line) for line in row[2]]))
    if not rows:
        raise DiagramError(f"diagram {name!r} has no rows")
    repeat = {str(k): str(v) for k, v in (entry.get("repeat") or {}).items()}
    if set(repeat) - {stage for stage, _, _ in rows}:
        raise DiagramError(f"diagram {name!r} repeats a stage it does not have: {repeat}")
    # flow_diagram's layout: stage names left of x = 138, boxes from 138 as wide as the
    # longest operation, lines from the middle of the box to the right edge
    box_w = max(236, CHAR_PX * max(len(op) for _, op, _ in rows) + 20)
    room = WIDTH - (138 + box_w / 2 + 14) - 6
    for stage, _, lines in rows:
        if CHAR_PX * len(stage) > 138 - 22:
            raise DiagramError(f"diagram {name!r}: stage name {stage!r} is too long")
        for line in lines:
            if CHAR_PX * len(line) > room:
                raise DiagramError(f"diagram {name!r}: {line!r} overruns {WIDTH} px")
    if 138 + box_w > WIDTH - 6:
        raise DiagramError(f"diagram {name!r}: an operation overruns {WIDTH} px")
    return Diagram(name, " ".join(alt.split()), caption, rows, repeat)


_TEXT_BLOCK_RE = re.compile(r"^( *)```text\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
#: what draws: box-drawing characters, arrows, corners, and lines of connectors alone
_DRAWN_RE = re.compile(r"[\u2500-\u257f]|-->|<--|->|<-|\+--|--\+|^[ |v^+]*[|v^][ |v^+]*$", re.M)


def ascii_diagrams(markdown: str) -> list[str]:
    """The first line of each ```text block in ``markdown`` that draws a diagram in
    characters (a page draws one with the ``diagram`` directive instead: a monospace
    drawing is cut off or scrolls on a phone, and a screen reader reads it as symbols)."""
    found = []
    for match in _TEXT_BLOCK_RE.finditer(markdown):
        body = match.group(2)
        if _DRAWN_RE.search(body):
            found.append(body.strip().splitlines()[0] if body.strip() else "")
    return found
