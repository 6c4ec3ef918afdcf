"""The lab registry: the one list of labs, read from lab page front matter.

Each lab page ``docs/labs/lab-NN-slug.md`` opens with YAML front matter::

    ---
    title: "Lab 01: Forward Noise Process"
    description: One sentence for search engines and link previews.
    lab:
      number: 1
      slug: forward-noise-process
      title: Forward Noise Process
      question: How fast does the forward process destroy the signal?
      starters:
        - file: forward_noise.py
          runnable: true
      sections: [objective, forward-reverse]
    ---

Each ``.py`` and ``.md`` starter is a page of the site (a ``.py`` an executed notebook
page) unless its entry says ``page: false``: an exercise's checker and blanks file, whose
code and output the guide already shows, are files served at their own path, with no page,
nav entry or search entry. Any other file (a ``*_solution.txt``) is never a page.

The site nav, the generated labs index, mkdocs-jupyter's list of notebooks and the
contract tests all call :func:`load_labs`; nothing else lists the labs.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGE_RE = re.compile(r"^lab-(\d{2})-([a-z0-9]+(?:-[a-z0-9]+)*)\.md$")
FRONT_MATTER_RE = re.compile(r"\A---\n(.*?)\n---\n", re.DOTALL)
#: The starters that can be pages: jupytext ``.py`` notebooks and Markdown notes.
PAGE_SUFFIXES = {".py", ".md"}


class RegistryError(ValueError):
    """A lab page's front matter breaks the contract."""


@dataclass(frozen=True)
class Starter:
    """One starter file of a lab. ``path`` is relative to the repository root."""

    path: Path
    runnable: bool
    #: rendered as a page of the site (``page: false``: served as a file only)
    page: bool

    @property
    def notebook(self) -> bool:
        """Rendered by mkdocs-jupyter as an executed notebook page."""
        return self.page and self.path.suffix == ".py"


@dataclass(frozen=True)
class Lab:
    number: int
    slug: str
    title: str
    question: str
    starters: tuple[Starter, ...]
    sections: tuple[str, ...]
    page: Path  # relative to docs/

    @property
    def id(self) -> str:
        """``lab-01-forward-noise-process``: the page stem and the code folder name."""
        return f"lab-{self.number:02d}-{self.slug}"

    @property
    def folder(self) -> Path:
        """The starter folder, relative to the repository root."""
        return Path("code") / self.id

    @property
    def name(self) -> str:
        """``Lab 01: Forward Noise Process``: the one name the page's title, the nav, the
        footer's previous/next links, the home page's map and the labs index all show."""
        return f"Lab {self.number:02d}: {self.title}"


#: libyaml's loader where PyYAML has it (its wheels do): the same data, about ten times faster
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_front_matter(path: Path) -> dict:
    """A page's YAML front matter. A build reads each page's several hundred times (nav,
    indexes, directives, cards), so it is parsed once per version of the file (its size
    and modification time) and each caller gets its own copy."""
    stat = Path(path).stat()
    return copy.deepcopy(_front_matter(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=1024)
def _front_matter(path: str, mtime_ns: int, size: int) -> dict:
    match = FRONT_MATTER_RE.match(Path(path).read_text(encoding="utf-8"))
    if not match:
        raise RegistryError(f"{path}: no YAML front matter")
    data = yaml.load(match.group(1), Loader=SAFE_LOADER) or {}
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: front matter is not a mapping")
    return data


def _parse_lab(path: Path, root: Path) -> Lab:
    name_match = PAGE_RE.match(path.name)
    if not name_match:
        raise RegistryError(f"{path}: lab pages are named lab-NN-slug.md")
    front = read_front_matter(path)
    meta = front.get("lab")
    if not isinstance(meta, dict):
        raise RegistryError(f"{path}: front matter has no 'lab' mapping")
    missing = {"number", "slug", "title", "question", "starters", "sections"} - meta.keys()
    if missing:
        raise RegistryError(f"{path}: lab front matter misses {sorted(missing)}")
    number, slug = int(name_match.group(1)), name_match.group(2)
    if meta["number"] != number or meta["slug"] != slug:
        raise RegistryError(
            f"{path}: front matter says lab {meta['number']} '{meta['slug']}', "
            f"file name says {number} '{slug}'"
        )
    folder = Path("code") / path.stem
    starters = []
    for entry in meta["starters"]:
        if not isinstance(entry, dict) or "file" not in entry:
            raise RegistryError(f"{path}: each starter needs a 'file'")
        file = folder / entry["file"]
        page = entry.get("page", file.suffix in PAGE_SUFFIXES)
        if not isinstance(page, bool):
            raise RegistryError(f"{path}: {entry['file']}: 'page' is true or false")
        if page and file.suffix not in PAGE_SUFFIXES:
            raise RegistryError(f"{path}: {entry['file']} cannot be a page (.py or .md only)")
        if not page and file.suffix == ".md":
            raise RegistryError(f"{path}: {entry['file']}: a Markdown starter is a page")
        starters.append(Starter(file, bool(entry.get("runnable", False)), page))
    if not starters:
        raise RegistryError(f"{path}: a lab needs at least one starter")
    # Each starter page is at code/<lab>/<stem>/, so two starters sharing a stem
    # (notes.md beside notes.py) would collide on one URL.
    stems = [starter.path.stem for starter in starters]
    if len(set(stems)) != len(stems):
        raise RegistryError(f"{path}: starter file names must differ in their stem, got {stems}")
    page_title = front.get("title")
    if page_title != f"Lab {number:02d}: {meta['title']}":
        raise RegistryError(
            f"{path}: the page's title must be the lab's name, "
            f"'Lab {number:02d}: {meta['title']}', got {page_title!r}"
        )
    sections = tuple(meta["sections"])
    for section in sections:
        if not (root / "docs" / "handbook" / f"{section}.md").is_file():
            raise RegistryError(f"{path}: unknown handbook section '{section}'")
    return Lab(
        number=number,
        slug=slug,
        title=str(meta["title"]),
        question=str(meta["question"]),
        starters=tuple(starters),
        sections=sections,
        page=path.relative_to(root / "docs"),
    )


def load_labs(root: Path = ROOT) -> list[Lab]:
    """Every lab, in number order. Raises :class:`RegistryError` on a broken contract."""
    pages = sorted((root / "docs" / "labs").glob("lab-*.md"))
    labs = [_parse_lab(page, root) for page in pages]
    numbers = [lab.number for lab in labs]
    if len(set(numbers)) != len(numbers):
        raise RegistryError(f"lab numbers must be unique, got {numbers}")
    return labs
