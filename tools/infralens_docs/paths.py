"""The reading paths (``docs/paths.yml``): the core path and the tracks, as data.

One file says in which order a reader meets the pages. Generated from it:

- the home page's map (the ``paths`` directive), each item with its reading time;
- the Handbook section of the nav (sections in the order the paths first reach them);
- the footer's previous/next links and ``<link rel="prev/next">`` (one linear walk: the
  core path, then each track; a lab's starter pages follow their lab page);
- the "you are here" line under each page's title;
- the tag above each interview question (the ``taught-by`` directive: the path its page is on).

Every page is on exactly one path, except the home page and the pages listed under
``reference``, which are on none. :func:`load_paths` fails on anything else,
so a new page cannot be left off the map.

Reading time counts what a reader sees by default: prose and tables at
:data:`WORDS_PER_MINUTE`, and code at :data:`CODE_LINES_PER_MINUTE` (non-blank lines of
the page's code blocks, of the starter sections they pull in and of each ``run``
directive's command and output; the ``model-sizes`` table counts as prose). Front matter
and the other directives (figures among them) are left out; every tab of a tabbed block
counts as shown. A collapsed block (``??? note``) counts as optional depth, reported apart,
except the interview answers a page's exercise minutes count (:func:`practised_words`).
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
#: code and program output: a line of the starters holds about eight words, so 160 words a
#: minute, a little slower than prose. Labs 01, 02, 04, 11 and 12 then come within 2 min of
#: the times a reader measured, labs run (../shared/reviews/reader-walk-2026-11-29.md, "Mine")
CODE_LINES_PER_MINUTE = 20


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


_SNIPPET_RE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
_RUN_RE = re.compile(r"^\s*<!-- infralens:(run|model-sizes)\b(.*?)-->\s*$")


def snippet_lines(spec: str) -> int:
    """Lines pymdownx.snippets puts on the page for ``"file"`` or ``"file:section"``."""
    name, _, section = spec.partition(":")
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    if section:
        start, end = f"--8<-- [start:{section}]", f"--8<-- [end:{section}]"
        at = [i for i, line in enumerate(lines) if line.strip().endswith((start, end))]
        if len(at) != 2:
            raise PathsError(f"snippet {spec}: no section {section!r}")
        lines = lines[at[0] + 1 : at[1]]
    return sum(1 for line in lines if line.strip() and "--8<-- [" not in line)


def directive_lines(name: str, args: list[str]) -> tuple[int, int]:
    """(code lines, table words) a ``run`` or ``model-sizes`` directive shows: a run's
    command and its output (the build's cached run), the size table's words."""
    if name == "model-sizes":
        from labkit import model_sizes

        table = model_sizes.render(args)
        return 0, len(_WORD_RE.findall(table))
    from infralens_docs.runner import run_starter

    flags = args[1:]
    expect_error = flags[:1] == ["--expect-error"]
    result = run_starter(args[0], flags[1:] if expect_error else flags)
    shown = result.stderr if expect_error else result.stdout
    lines = sum(1 for line in shown.splitlines() if line.strip())
    return 1 + lines + (2 if expect_error else 0), 0  # the command; "$ echo $?" and the code


def reading_code(text: str) -> tuple[int, int, int, int]:
    """(code lines shown, code lines collapsed, table words shown, table words collapsed)
    that a Markdown page's code blocks, snippets and directives put on screen."""
    import shlex

    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), 0)
        lines = lines[end + 1 :]
    code = [0, 0]
    words = [0, 0]
    fenced = False
    collapsed_at: int | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if not fenced and collapsed_at is not None and line.strip() and indent <= collapsed_at:
            collapsed_at = None
        marker = _COLLAPSED_RE.match(line)
        if marker and not fenced and collapsed_at is None:
            collapsed_at = len(marker.group(1))
            continue
        where = 0 if collapsed_at is None else 1
        if _FENCE_RE.match(line):
            fenced = not fenced
            continue
        snippet = _SNIPPET_RE.match(line)
        directive = None if fenced else _RUN_RE.match(line)
        if snippet:
            code[where] += snippet_lines(snippet.group(1))
        elif directive:
            lines_, table = directive_lines(directive.group(1), shlex.split(directive.group(2)))
            code[where] += lines_
            words[where] += table
        elif fenced and line.strip():
            code[where] += 1
    return code[0], code[1], words[0], words[1]


_TAUGHT_BY_RE = re.compile(r"<!-- infralens:taught-by ([^#\s]+)\S* -->")


def practised_words(text: str) -> int:
    """Words of the collapsed questions tagged with a core-path page (the interview page's
    ``taught-by`` directives): its ``exercise_minutes`` count them, each answer said out loud
    and read to compare, so they are not optional depth too."""
    core = {page for evening in load_paths().evenings for page in evening.items}
    lines, words, tag = text.splitlines(), 0, None
    for at, line in enumerate(lines):
        if match := _TAUGHT_BY_RE.fullmatch(line.strip()):
            tag = match.group(1)
        elif _COLLAPSED_RE.match(line) and tag in core:
            end = next((i for i in range(at + 1, len(lines)) if lines[i][:1].strip()), len(lines))
            words += reading_words("\n".join(lines[at:end]))[1]
            tag = None
    return words


@cache
def _minutes(page: str, text: str) -> tuple[int, int]:
    shown, depth = reading_words(text)
    depth -= practised_words(text)
    code_shown, code_depth, table_shown, table_depth = reading_code(text)
    minutes = (shown + table_shown) / WORDS_PER_MINUTE + code_shown / CODE_LINES_PER_MINUTE
    more = (depth + table_depth) / WORDS_PER_MINUTE + code_depth / CODE_LINES_PER_MINUTE
    return max(math.ceil(minutes), 1), math.ceil(more)


def reading_minutes(page: str) -> tuple[int, int]:
    """(minutes to read what is shown, minutes more for the collapsed depth): prose and
    tables at :data:`WORDS_PER_MINUTE`, code and output at :data:`CODE_LINES_PER_MINUTE`."""
    return _minutes(page, (DOCS / page).read_text(encoding="utf-8"))


def clear_caches() -> None:
    """Forget the paths and the reading times (``mkdocs serve`` rebuilds in one process)."""
    load_paths.cache_clear()
    _minutes.cache_clear()


def exercise_minutes(page: str) -> int:
    """Minutes a page's hands-on exercise takes beyond reading (front matter
    ``exercise_minutes``, e.g. Lab 17's blanks), 0 for a page without one."""
    return int(read_front_matter(DOCS / page).get("exercise_minutes") or 0)


def total_minutes(pages) -> int:
    """Minutes for a part of a path: each page's shown reading time and its exercise."""
    return sum(reading_minutes(p)[0] + exercise_minutes(p) for p in pages)


def as_duration(minutes: int) -> str:
    """``95`` -> ``"1 h 35 min"``; ``40`` -> ``"40 min"``."""
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min" if hours else f"{rest} min"
