"""The reading paths (``docs/paths.yml``): the core path and the tracks, as data.

One file says in which order a reader meets the pages. Generated from it:

- the home page's map (the ``paths`` directive), each item with its reading time;
- the Handbook section of the nav (sections in the order the paths first reach them);
- the footer's previous/next links and ``<link rel="prev/next">`` (one linear walk: the
  core path, then each track; a lab's starter pages follow their lab page);
- the "you are here" line under each page's title.

Every page is on exactly one path, except the home page and the pages listed under
``reference``, which are on none. :func:`load_paths` fails on anything else,
so a new page cannot be left off the map.

Reading time counts the prose a reader sees by default, at :data:`WORDS_PER_MINUTE`:
code blocks, directives and front matter are left out, and a collapsed block
(``??? note``) counts as optional depth, reported apart.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from infralens_docs.registry import ROOT, read_front_matter

DOCS = ROOT / "docs"
PATHS_FILE = DOCS / "paths.yml"
#: a common figure for careful reading of technical prose
WORDS_PER_MINUTE = 200


class PathsError(ValueError):
    """docs/paths.yml breaks its contract."""


@dataclass(frozen=True)
class Step:
    page: str  # relative to docs/, e.g. "handbook/cfg.md"
    on_core: bool  # on the core path (else on a track)
    part: str  # the evening's title on the core path, the track's title on a track
    index: int  # 1-based, within the part
    count: int  # items in the part


@dataclass(frozen=True)
class Part:
    title: str
    summary: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class Paths:
    core_title: str
    core_summary: str
    evenings: tuple[Part, ...]
    tracks: tuple[Part, ...]
    reference: tuple[str, ...]

    @property
    def parts(self) -> tuple[Part, ...]:
        return self.evenings + self.tracks

    @property
    def order(self) -> list[str]:
        """Every page on a path, in reading order: the core path, then each track."""
        return [page for part in self.parts for page in part.items]

    def step(self, page: str) -> Step | None:
        for part in self.parts:
            if page in part.items:
                return Step(
                    page=page,
                    on_core=part in self.evenings,
                    part=part.title,
                    index=part.items.index(page) + 1,
                    count=len(part.items),
                )
        return None


def _part(raw: dict, where: str) -> Part:
    if not isinstance(raw, dict) or not isinstance(raw.get("items"), list) or not raw["items"]:
        raise PathsError(f"{where}: needs a title and a non-empty list of items")
    return Part(str(raw.get("title", "")), str(raw.get("summary", "")), tuple(raw["items"]))


@cache
def load_paths(file: Path = PATHS_FILE) -> Paths:
    """The paths, checked against the pages under docs/."""
    raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    core = raw.get("core") or {}
    paths = Paths(
        core_title=str(core.get("title", "")),
        core_summary=str(core.get("summary", "")),
        evenings=tuple(_part(e, "core.evenings") for e in core.get("evenings") or []),
        tracks=tuple(_part(t, "tracks") for t in raw.get("tracks") or []),
        reference=tuple(raw.get("reference") or []),
    )
    if not paths.evenings:
        raise PathsError(f"{file.name}: the core path has no evenings")
    order = paths.order
    docs = file.parent
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    for page in [*order, *paths.reference]:
        if page not in pages:
            raise PathsError(f"{file.name}: {page} is not a page under docs/")
    twice = sorted({p for p in order if order.count(p) > 1} | (set(order) & set(paths.reference)))
    if twice:
        raise PathsError(f"{file.name}: on more than one path: {', '.join(twice)}")
    missing = sorted(p for p in pages if p not in order + list(paths.reference) + ["index.md"])
    if missing:
        raise PathsError(f"{file.name}: on no path and not under reference: {', '.join(missing)}")
    return paths


def page_title(page: str) -> str:
    """A page's title from its front matter (the file name if it has none)."""
    return str(read_front_matter(DOCS / page).get("title", Path(page).stem))


_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'’.-]*")
_LINK_TARGET_RE = re.compile(r"\]\([^)]*\)")
_COLLAPSED_RE = re.compile(r"^(\s*)\?\?\?(?!\+)")


def reading_words(text: str) -> tuple[int, int]:
    """(words shown by default, words in collapsed blocks) of a Markdown page's prose."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), 0)
        lines = lines[end + 1 :]
    shown = depth = 0
    fenced = False
    collapsed_at: int | None = None  # indentation of the open collapsed block's marker
    for line in lines:
        if _FENCE_RE.match(line):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("<!--"):
            continue
        indent = len(line) - len(line.lstrip())
        if collapsed_at is not None and line.strip() and indent <= collapsed_at:
            collapsed_at = None
        marker = _COLLAPSED_RE.match(line)
        if marker and collapsed_at is None:
            collapsed_at = len(marker.group(1))
            # the block's title stays on screen; its type keyword ("note") does not
            shown += len(_WORD_RE.findall(" ".join(re.findall(r'"([^"]*)"', line))))
            continue
        words = len(_WORD_RE.findall(_LINK_TARGET_RE.sub("]", line)))
        if collapsed_at is not None:
            depth += words
        else:
            shown += words
    return shown, depth


def reading_minutes(page: str) -> tuple[int, int]:
    """(minutes to read what is shown, minutes more for the collapsed depth)."""
    shown, depth = reading_words((DOCS / page).read_text(encoding="utf-8"))
    minutes = math.ceil(shown / WORDS_PER_MINUTE)
    return max(minutes, 1), math.ceil(depth / WORDS_PER_MINUTE)


def exercise_minutes(page: str) -> int:
    """Minutes a page's hands-on exercise takes beyond reading (front matter
    ``exercise_minutes``, e.g. Lab 17's blanks), 0 for a page without one."""
    return int(read_front_matter(DOCS / page).get("exercise_minutes") or 0)


def total_minutes(pages) -> int:
    return sum(reading_minutes(p)[0] for p in pages)


def as_duration(minutes: int) -> str:
    """``95`` -> ``"1 h 35 min"``; ``40`` -> ``"40 min"``."""
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min" if hours else f"{rest} min"
