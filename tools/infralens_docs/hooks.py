"""MkDocs hooks: registry-driven nav, starters as pages, build-time outputs and math.

Wired in ``mkdocs.yml`` through ``hooks/infralens.py``. What each event does:

- ``on_config``: appends one nav entry per lab (lab page + its starter pages)
  under "Labs", from the registry; gives mkdocs-jupyter the registry's notebook pages
  as its ``include`` (a starter with ``page: false``, an exercise's checker or blanks
  file, stays a plain file); keys mkdocs-jupyter's cache on the labkit
  sources, so an edit to the shared package re-executes the notebooks.
- ``on_files``: adds the starter files under ``code/`` (outside ``docs/``) so
  mkdocs-jupyter renders the notebook pages among them, and starts the work the
  pages will need on other cores: the starter runs (``runner.prefetch``) and the
  notebook pages (``notebooks.prebuild``).
- ``on_pre_page``: a notebook page waits for its cells' run ahead (``notebooks.prebuild``)
  before rendering.
- ``on_page_markdown``: expands ``<!-- infralens:... -->`` directives, one
  function each in ``infralens_docs.directives`` (``run``, ``lab-card``,
  ``labs-table``, ``labs-for``, ``sections-table``, ``verified-claims``,
  ``verified-summary``).
- ``on_page_content``: TeX to MathML (through ``later_cache``); strips the notebook pages' inline
  CSS and their MathJax / Mermaid CDN scripts (styles come from site.css) and
  turns their code cells into Material code blocks; splits long code blocks into runs
  of lines and marks the blocks well below the first screen, which the browser may
  render after load (``later.mark_later``, through ``later_cache``).
- ``on_post_page``: names Material's search dialog and defers its bundle
  (accessibility and render-blocking fixes, without copying a template).
- ``on_post_build``: copies the figure files the pages reference into the site, and
  stops the build's notebook runs and zygotes.
- ``on_startup`` / ``on_serve`` / ``on_shutdown``: under ``mkdocs serve`` a failing starter
  shows its error on its own pages instead of failing the build, and requests are answered
  from the last good build while the next one runs (``infralens_docs.serving``).

``on_config`` also routes Material's search indexing and Pygments' highlighting of
code blocks through caches kept between builds (``search_cache``, ``highlight_cache``).

Any directive it does not know, any starter that exits non-zero and any TeX it
cannot render fails the build (a starter under ``mkdocs serve``: see ``serving``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html as html_lib
import itertools
import json
import os
import posixpath
import re
import shlex
import shutil
import struct
import sys
from pathlib import Path
from urllib.parse import urljoin

import jupytext
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.structure.toc import get_toc
from mkdocs.utils import get_relative_url

from infralens_docs import (
    diagrams,
    highlight_cache,
    later_cache,
    notebooks,
    paths,
    search_cache,
    search_terms,
    serving,
)
from infralens_docs.directives import (
    DIRECTIVES,
    GENERATED_FILES,
    Context,
    first_screen,
    page_dir,
)
from infralens_docs.mathml import MathError
from infralens_docs.registry import ROOT, Lab, RegistryError, load_labs
from infralens_docs.runner import (
    CACHE_DIR,
    CACHE_ROOT,
    begin_build,
    close_zygotes,
    finish_prefetch,
    labkit_digest,
    prefetch,
    run_starter,
    starter_figures,
)

#: A directive alone on its line, at any indentation: inside a collapsible block or a tab
#: its Markdown output is indented to the same depth, so it stays inside.
DIRECTIVE_RE = re.compile(
    r"^(?P<indent>[ ]*)<!-- infralens:(?P<name>[a-z-]+)(?P<args>[^\n]*?)-->$", re.MULTILINE
)

_labs: list[Lab] = []


# --------------------------------------------------------------------------- config


def offline_build() -> bool:
    """``INFRALENS_OFFLINE=1`` (``make offline``): a site to read from the file system."""
    return os.environ.get("INFRALENS_OFFLINE") == "1"


def on_startup(*, command: str, dirty: bool) -> None:
    serving.on_startup(command)


def on_serve(server, config: MkDocsConfig, builder):
    return serving.on_serve(server, config, builder)


def on_shutdown() -> None:
    serving.on_shutdown()


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    global _labs
    begin_build()  # the sources' digests are read once per build
    GENERATED_FILES.clear()
    serving.FAILED_PAGES.clear()
    if serving.site_dir_override():  # a served rebuild, beside the pages being served
        config.site_dir = serving.site_dir_override()
    try:
        _labs = load_labs()
    except RegistryError as exc:
        raise PluginError(f"lab registry: {exc}") from exc
    if not config.repo_url:
        # no repository address given (INFRALENS_REPO_URL unset or empty): no edit links,
        # rather than MkDocs' edit_uri resolved against nothing (a relative, broken link)
        config.repo_url = None
        config.edit_uri = None
    if offline_build():
        # Opened from the file system, a link to a folder ("labs/") shows the folder, not
        # its index.html: link to the HTML files themselves. (What Material's offline
        # plugin does too; that plugin also adds a CDN script, which this site cannot have:
        # search_on_demand.js runs the search worker in a frame instead, and on_post_build
        # writes the index as a script.)
        config.use_directory_urls = False

    paths.clear_caches()  # `mkdocs serve` rebuilds in this process: reread the files
    try:
        reading = paths.load_paths()
    except paths.PathsError as exc:
        raise PluginError(f"reading paths: {exc}") from exc
    handbook_section = next(
        (item for item in config.nav or [] if isinstance(item, dict) and "Handbook" in item), None
    )
    if handbook_section is None:
        raise PluginError("mkdocs.yml nav needs a 'Handbook' section for docs/paths.yml to fill")
    # the sections in the order the paths first reach them (core path, then tracks)
    handbook_section["Handbook"] = [p for p in reading.order if p.startswith("handbook/")]

    labs_section = next(
        (item for item in config.nav or [] if isinstance(item, dict) and "Labs" in item), None
    )
    if labs_section is None:
        raise PluginError("mkdocs.yml nav needs a 'Labs' section for the registry to fill")
    for lab in _labs:
        # (titled with the lab's name: the footer names a page by its nav title alone)
        entries = [{lab.name: lab.page.as_posix()}]
        entries += [
            {f"Lab {lab.number:02d} · {s.path.name}": s.path.as_posix()}
            for s in lab.starters
            if s.page
        ]
        labs_section["Labs"].append({lab.name: entries})

    if "material/search" in config.plugins or "search" in config.plugins:
        search_cache.install()
    if "pymdownx.highlight" in config.markdown_extensions:
        highlight_cache.install()

    jupyter = config.plugins.get("mkdocs-jupyter")
    if jupyter is not None:
        notebooks.configure()
        # the registry decides which starters are notebook pages (mkdocs.yml leaves it empty)
        jupyter.config["include"] = [
            str(ROOT / s.path) for lab in _labs for s in lab.starters if s.notebook
        ]
        key = notebook_cache_key()
        base = CACHE_ROOT / "mkdocs-jupyter"
        jupyter.config["cache_dir"] = str(base / key)
        for stale in base.glob("*") if base.is_dir() else []:
            if stale.is_dir() and stale.name != key:
                for f in stale.glob("*.json"):
                    f.unlink()
                stale.rmdir()
    return config


#: The packages whose versions key the notebook pages: NumPy (the starters' numbers),
#: IPython (runs the cells) and what turns a starter into its page: jupytext, nbformat,
#: nbconvert with mistune, Pygments, Jinja2 and BeautifulSoup, mkdocs-jupyter.
NOTEBOOK_PACKAGES = (
    "numpy", "ipython", "jupytext", "nbformat", "nbconvert", "mistune", "pygments",
    "jinja2", "beautifulsoup4", "mkdocs-jupyter",
)  # fmt: skip
#: The build's files that decide how a notebook page runs and is exported: these events,
#: the export (``notebooks``), the executor (``zygote``) and the runs' environment (``runner``).
NOTEBOOK_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("hooks.py", "notebooks.py", "zygote.py", "runner.py")
)


def notebook_cache_key() -> str:
    """The folder of mkdocs-jupyter's cache. mkdocs-jupyter keys its cache on the notebook
    file and its options alone; the starters import labkit and run on this Python, the
    packages of :data:`NOTEBOOK_PACKAGES` make the page, and :data:`NOTEBOOK_SOURCES` run
    and export it, so fold them into the cache location too: their files and installed
    versions as read now, at each build, while ``mkdocs serve`` exports with the modules it
    imported (README: restart it with ``.cache/`` cleared after changing one)."""
    sources = NOTEBOOK_SOURCES
    versions = "".join(f"{name} {serving._version(name)}\0" for name in NOTEBOOK_PACKAGES)
    key = labkit_digest() + f"{sys.version}\0" + versions
    key += "".join(p.read_text() for p in sources)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- paths


def _reading_order(nav_pages: list[Page]) -> list[Page]:
    """The linear walk of docs/paths.yml: each page on a path in order. A lab's starter
    pages are off the walk (the lab card and the nav open them): the reader who follows
    "next" goes from a lab to the next page on its path."""
    by_uri = {page.file.src_uri: page for page in nav_pages}
    return [by_uri[uri] for uri in paths.load_paths().order]


def on_nav(nav, config: MkDocsConfig, files: Files):
    """Previous/next (the footer and ``<link rel>``) follow the reading paths, not the nav:
    the home page leads into the core path, a starter's page leads back to its lab and on
    to the page after it, and a page on no path (references, the labs index) has neither."""
    walk = _reading_order(nav.pages)
    for page in nav.pages:
        page.previous_page = page.next_page = None
    for before, after in itertools.pairwise(walk):
        before.next_page, after.previous_page = after, before
    by_uri = {page.file.src_uri: page for page in nav.pages}
    for lab in _labs:
        lab_page = by_uri.get(lab.page.as_posix())
        for starter in lab.starters:
            page = by_uri.get(starter.path.as_posix())
            if page is not None and lab_page is not None:
                page.previous_page, page.next_page = lab_page, lab_page.next_page
    home = next((page for page in nav.pages if page.file.src_uri == "index.md"), None)
    if home is not None and walk:
        home.next_page = walk[0]
    _render_summaries_last(files)
    return nav


#: the directives whose output reads every page's runs (a reading path's minutes count
#: the lines each run prints): a page with one renders after the pages it sums up
SUMMARY_DIRECTIVES = ("paths",)
_build_order: list = []


def _render_summaries_last(files: Files) -> None:
    """MkDocs renders the pages in ``files``' order, right after ``on_nav``. The home
    page comes first and sums up every page's runs (``SUMMARY_DIRECTIVES``): rendered
    there, the build's main thread waited 3.5 to 4.8 s of a cold build for the starters'
    runs while it could have rendered the pages they were running for (on this 2-core
    machine at load ~1.3; the runs kept both cores busy meanwhile, so rendering it last
    saved 1 to 1.5 s of the build's wall time there, not the whole wait). So those pages go last for the
    rendering alone; :func:`on_env`, which MkDocs calls once every page has rendered,
    puts ``files`` back in order, so the pages are written, listed in the sitemap and
    indexed for search in the order they were."""
    _build_order[:] = list(files)
    for file in files.documentation_pages():
        if file.abs_src_path and file.src_uri.endswith(".md"):
            text = Path(file.abs_src_path).read_text(encoding="utf-8")
            names = {m.group("name") for m in DIRECTIVE_RE.finditer(text)}
            if names & set(SUMMARY_DIRECTIVES):
                files.remove(file)
                files.append(file)


def on_env(env, config: MkDocsConfig, files: Files):
    """``files`` back in the order :func:`_render_summaries_last` found it in."""
    if _build_order and list(files) != _build_order:
        for file in _build_order:
            files.remove(file)
        for file in _build_order:
            files.append(file)
    _build_order.clear()
    return env


def _lab_of_starter(uri: str) -> str | None:
    for lab in _labs:
        if any(s.path.as_posix() == uri for s in lab.starters):
            return lab.page.as_posix()
    return None


def _you_are_here(page: Page, files: Files) -> str:
    """The line under a page's title: which path, which step, reading time, and the
    pages before and after it on the path (a starter page: its lab's place)."""
    uri = page.file.src_uri
    lab_page = _lab_of_starter(uri) if uri.startswith("code/") else None
    step = paths.load_paths().step(lab_page or uri)
    if step is None:
        return ""

    def link(target: str) -> str:
        href = get_relative_url(files.get_file_from_path(target).url, page.url)
        return f'<a href="{html_lib.escape(href)}">{html_lib.escape(paths.page_title(target))}</a>'

    where = "Core path" if step.on_core else "Track"
    parts = [f"<strong>{where} · {html_lib.escape(step.part)}</strong>, step {step.index} of {step.count}"]  # fmt: skip
    if lab_page:
        parts.append(f"the starter of {link(lab_page)}")
    else:
        shown, depth = paths.reading_minutes(uri)
        exercise = paths.exercise_minutes(uri)
        parts.append(
            f"{shown} min read"
            + (f" (+{depth} min optional depth)" if depth else "")
            + (f" + {exercise} min exercise" if exercise else "")
        )
    items = paths.load_paths().parts
    part = next(p for p in items if p.title == step.part)
    if step.index > 1:
        parts.append("after " + link(part.items[step.index - 2]))
    elif not step.on_core:
        parts.append("after the core path")
    if step.index < step.count:
        parts.append("next " + link(part.items[step.index]))
    else:  # the last page of an evening or a track: where the walk goes on
        order = paths.load_paths().order
        at = order.index(step.page)
        if at + 1 < len(order):
            after = paths.load_paths().step(order[at + 1])
            parts.append(f"then {html_lib.escape(after.part)}: " + link(order[at + 1]))
    return f'<p class="path-here">{" · ".join(parts)}</p>\n'


def _after_title(html: str, line: str) -> str:
    """``line`` right after the page's first ``<h1>`` (at the top if it has none)."""
    if not line:
        return html
    end = html.find("</h1>")
    return line + html if end < 0 else html[: end + 5] + "\n" + line + html[end + 5 :]


# --------------------------------------------------------------------------- files


@event_priority(100)  # before mkdocs-jupyter wraps notebook files
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for lab in _labs:
        for starter in lab.starters:
            if not (ROOT / starter.path).is_file():
                raise PluginError(f"{lab.page}: starter {starter.path} does not exist")
            files.append(
                File(
                    starter.path.as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                )
            )
    jobs = _runs_the_pages_need(files)
    # each notebook page looks up its figures' alt texts in the default run's figures
    jobs += [
        (s.path.as_posix(), [], True)
        for lab in _labs
        for s in lab.starters
        if s.runnable and s.notebook
    ]
    prefetch(jobs)
    jupyter = config.plugins.get("mkdocs-jupyter")
    if jupyter is not None:
        if serving.SERVING and hasattr(jupyter, "_used_cache_paths"):
            # mkdocs-jupyter evicts the entries a build did not use: while a starter is
            # broken, that was its last good page, rendered again once the line is fixed
            base = Path(jupyter.config["cache_dir"])
            jupyter._used_cache_paths.update(base.glob("*.json") if base.is_dir() else [])
        notebooks.prebuild(jupyter, files, serving=serving.SERVING)
    return files


def _runs_the_pages_need(files: Files) -> list[tuple[str, list[str], bool]]:
    """Every ``run`` and ``figure`` directive of every Markdown page, as prefetch jobs."""
    jobs = []
    for file in files.documentation_pages():
        if not file.src_path.endswith(".md") or not file.abs_src_path:
            continue
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        for match in DIRECTIVE_RE.finditer(text):
            name, args = match.group("name"), shlex.split(match.group("args"))
            if name == "run" and args:
                flags = args[1:]
                jobs.append(
                    (args[0], flags[1:] if flags[:1] == ["--expect-error"] else flags, False)
                )
            elif name == "figure" and len(args) >= 2:
                jobs.append((args[0], args[2:], True))
    return jobs


@event_priority(-100)  # after mkdocs-jupyter has given the notebook pages their render
def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """A Markdown page's render is reused while nothing it depends on changed
    (``serving.render_cached``). A notebook page waits for its cells' run ahead
    (``notebooks.prebuild``), then renders through mkdocs-jupyter, whose execution picks
    up that run's outputs."""
    render = page.render
    if not page.file.src_uri.startswith("code/"):
        # a Markdown page: its HTML is reused when nothing it depends on changed

        def render_reused(config: MkDocsConfig, files: Files) -> None:
            key = serving.render_key(page, _build_key(config, files))
            serving.render_cached(page, config, files, render, key)

        page.render = render_reused  # type: ignore[method-assign]
        _edit_starter_not_docs(page, config)
        return page

    def render_when_prebuilt(config: MkDocsConfig, files: Files) -> None:
        failed = notebooks.wait_for(page.file.abs_src_path)
        if serving.SERVING and failed is not None:
            # its executor failed; rendering here would fail the same way
            _notebook_failed(page, failed)
            return
        try:
            render(config, files)
        except Exception as exc:
            if not serving.SERVING:
                raise
            _notebook_failed(page, exc)

    page.render = render_when_prebuilt  # type: ignore[method-assign]
    _edit_starter_not_docs(page, config)
    return page


_BUILD_KEY: dict[int, str] = {}


def _build_key(config: MkDocsConfig, files: Files) -> str:
    """``serving.build_key`` once per build (its files are one object per build)."""
    if id(files) not in _BUILD_KEY:
        _BUILD_KEY.clear()
        _BUILD_KEY[id(files)] = serving.build_key(config, files)
    return _BUILD_KEY[id(files)]


def _notebook_failed(page: Page, error: BaseException) -> None:
    """Under ``serve``: the page of a starter that fails is its error box."""
    starter = page.file.src_uri
    run = run_starter(starter, [])  # its terminal run names the file and the line
    if run.returncode != 0:
        failure = serving.describe(run.command, run.stderr, run.returncode)
    else:  # fails as a notebook only: the cell's traceback
        failure = serving.describe(f"the notebook of {starter}", str(error))
    serving.report(starter, [failure])
    serving.FAILED_PAGES.add(starter)
    page.content = serving.notebook_error_html(starter, failure)
    page.toc = get_toc([])


def _edit_starter_not_docs(page: Page, config: MkDocsConfig) -> None:
    """A starter's page is built from the starter itself (``code/...``, outside ``docs/``):
    its edit link opens that file, not a ``docs/code/...`` page that does not exist."""
    if not (page.edit_url and config.repo_url) or page.file.src_dir != str(ROOT):
        return
    docs = Path(config.docs_dir).relative_to(ROOT).as_posix() + "/"
    edit_uri = config.edit_uri or ""
    if not edit_uri.endswith(docs):
        raise PluginError(f"edit_uri {edit_uri!r} must end with {docs!r} (the docs folder)")
    root_uri = edit_uri[: -len(docs)]
    page.edit_url = urljoin(config.repo_url.rstrip("/") + "/", root_uri + page.file.src_uri)


# --------------------------------------------------------------------------- markdown


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    ctx = Context(page=page, config=config, labs=_labs)
    failures: list[serving.Failure] = []

    def expand(match: re.Match) -> str:
        name, args = match.group("name"), shlex.split(match.group("args"))
        if name not in DIRECTIVES:
            raise ctx.fail(f"unknown directive infralens:{name}")
        indent = match.group("indent")
        try:
            out = DIRECTIVES[name](ctx, args)
        except serving.StarterRunError as exc:
            if not serving.SERVING:
                raise  # the build fails on it, as it always has
            failures.append(exc.failure)
            out = serving.placeholder(exc.failure)
        if not indent:
            return out
        return "\n".join(indent + line if line.strip() else line for line in out.split("\n"))

    markdown = _first_screen(DIRECTIVE_RE.sub(expand, markdown), page, ctx)
    if failures:  # under serve only: the error, where the reader sees it first
        serving.report(page.file.src_uri, failures)
        markdown = _after_title_markdown(markdown, serving.error_box(failures))
    return markdown


def _after_title_markdown(markdown: str, block: str) -> str:
    title = _TITLE_RE.search(markdown)
    if title is None:
        return block + markdown
    return markdown[: title.end()] + "\n\n" + block + markdown[title.end() :]


_TITLE_RE = re.compile(r"^# .+$", re.MULTILINE)


def _first_screen(markdown: str, page: Page, ctx: Context) -> str:
    """Under the title of every handbook page on a reading path, an "On this page" box:
    what the reader will be able to do, why it matters, what to read first
    (``directives.first_screen``). A lab page's card carries the same lines."""
    if paths.load_paths().step(page.file.src_uri) is None or "lab" in page.meta:
        return markdown
    lines = first_screen(ctx)
    if not lines:
        return markdown  # tests/test_anatomy.py requires outcome and why on every path page
    title = _TITLE_RE.search(markdown)
    if title is None:
        raise ctx.fail("a page on a reading path needs a '# ' title line")
    block = '!!! info "On this page"\n\n' + "".join(f"    {line}\n\n" for line in lines)
    return markdown[: title.end()] + "\n\n" + block + markdown[title.end() :]


# --------------------------------------------------------------------------- html


def _starter_header(page: Page, files: Files) -> str:
    """Above a starter page: back to its lab guide, and the file to download (.py, and
    for notebooks a .ipynb converted with jupytext, written by ``on_post_build``). The
    .py sits beside the page's HTML (mkdocs-jupyter's ``include_source``), and so does
    the .ipynb."""
    starter = Path(page.file.src_uri)
    lab = next((lab for lab in _labs if starter.parent == lab.folder), None)
    if lab is None:
        raise PluginError(f"{starter}: starter of no registered lab")
    guide_file = files.get_file_from_path(lab.page.as_posix())
    if guide_file is None:
        raise PluginError(f"{starter}: lab page {lab.page} is not in the site")
    guide = guide_file.url_relative_to(page.file)
    links = [f'<a href="{guide}">{html_lib.escape(lab.name)}</a>']
    if starter.suffix == ".py":
        notebook = _starter_notebook(ROOT / starter, f"{lab.id}-{starter.stem}")
        GENERATED_FILES[posixpath.join(page_dir(page), f"{starter.stem}.ipynb")] = notebook
        links.append(f'<a href="{starter.name}" download>Download {starter.name}</a>')
        links.append(f'<a href="{starter.stem}.ipynb" download>Download {starter.stem}.ipynb</a>')
    return f'<p class="starter-links">{" · ".join(links)}</p>\n'


def _starter_notebook(source: Path, name: str) -> Path:
    """The starter converted to .ipynb with jupytext, cached on its text (and jupytext's
    version): reading a starter with jupytext is slow, and a rebuild rarely changes one."""
    digest = hashlib.sha256(f"{jupytext.__version__}\0".encode() + source.read_bytes())
    notebook = CACHE_DIR / "notebooks" / f"{name}-{digest.hexdigest()[:16]}.ipynb"
    if not notebook.is_file():
        notebook.parent.mkdir(parents=True, exist_ok=True)
        for stale in notebook.parent.glob(f"{name}-*.ipynb"):
            stale.unlink()
        tmp = notebook.with_suffix(".tmp")
        notebook_text = jupytext.writes(notebooks.read_starter(source), fmt="ipynb")
        tmp.write_text(notebook_text, encoding="utf-8")
        tmp.replace(notebook)
    return notebook


HEADING_ID_RE = re.compile(r'<h([1-6])\b[^>]*\bid="([^"]+)"')


def align_toc_with_headings(html: str, page: Page) -> None:
    """Point a notebook page's table of contents at the ids its headings really have.

    mkdocs-jupyter slugs the TOC from the markdown cells with inline code dropped, while
    nbconvert's heading ids keep it ("1-setup-contract-pixels-latents" against
    "1-setup-contract-b-3-32-32-pixels-b-c-4-4-latents"), so every heading with code in it
    was a dead TOC link (and a dead skip link). Match them by order and level."""
    headings = [(int(level), anchor) for level, anchor in HEADING_ID_RE.findall(html)]
    entries = []

    def walk(items):
        for item in items:
            entries.append(item)
            walk(item.children)

    walk(page.toc.items if page.toc else [])
    position = 0
    for entry in entries:
        for index in range(position, len(headings)):
            if headings[index][0] == entry.level:
                entry.id, position = headings[index][1], index + 1
                break
        else:
            raise PluginError(f"{page.file.src_uri}: no heading for TOC entry '{entry.title}'")


NOTEBOOK_IMG_RE = re.compile(
    r'<img\b[^>]*?\bsrc="data:(image/(?:png|svg\+xml));base64,([^"]+)"[^>]*>'
)


def _svg_key(svg: str) -> str:
    """The same SVG as IPython's ``SVG`` display object re-serialises it (minidom). Parsing
    each figure twice a build was ~0.25 s of a warm one: the keys are kept from one build
    to the next (``.cache/svg-keys.json``, keyed on the SVG's text, rewritten with the ones
    a build used; under ``mkdocs serve``, added to the kept ones)."""
    from xml.dom import minidom

    if not _SVG_KEYS["loaded"]:
        _SVG_KEYS["loaded"] = {}
        try:
            _SVG_KEYS["loaded"] = json.loads(SVG_KEYS_FILE.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
    text = hashlib.sha256(svg.encode("utf-8")).hexdigest()
    key = _SVG_KEYS["loaded"].get(text)
    if key is None:
        node = minidom.parseString(svg).getElementsByTagName("svg")[0]
        key = hashlib.sha256(node.toxml().encode("utf-8")).hexdigest()
    _SVG_KEYS["used"][text] = key
    return key


SVG_KEYS_FILE = CACHE_ROOT / "svg-keys.json"
_SVG_KEYS: dict[str, dict] = {"loaded": {}, "used": {}}


def _save_svg_keys() -> None:
    """Write the keys this build used, if they differ from the file's; forget both."""
    used, loaded = _SVG_KEYS["used"], _SVG_KEYS["loaded"]
    if used and used != loaded and not (serving.SERVING and used.items() <= loaded.items()):
        keep = {**loaded, **used} if serving.SERVING else used
        SVG_KEYS_FILE.parent.mkdir(parents=True, exist_ok=True)
        tmp = SVG_KEYS_FILE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(keep, sort_keys=True), encoding="utf-8")
        tmp.replace(SVG_KEYS_FILE)
    _SVG_KEYS["loaded"], _SVG_KEYS["used"] = {}, {}


def _figure_alts(starter: str) -> dict[str, tuple[str, str]]:
    """``(alt text, name)`` of each figure a starter saves with its default flags, keyed
    by content: a notebook cell displays the same figure the ``figure`` directive shows."""
    try:
        directory = starter_figures(starter)
    except (FileNotFoundError, RuntimeError):
        return {}
    manifest = json.loads((directory / "figures.json").read_text(encoding="utf-8"))
    alts = {}
    for name, entry in manifest.items():
        path = directory / entry["file"]
        if path.suffix == ".svg":
            alts[_svg_key(path.read_text(encoding="utf-8"))] = (entry["alt"], name)
        else:
            alts[hashlib.sha256(path.read_bytes()).hexdigest()] = (entry["alt"], name)
    return alts


def externalize_notebook_figures(html: str, page: Page) -> str:
    """A notebook page's figures as the lab pages show them, not as base64 ``<img>``s:

    - SVG charts inline, so the site's stylesheet colours them (an ``<img>`` SVG sees no
      page CSS: its CSS-class colours vanish and its frames fill black) in both schemes;
    - PNG images as files beside the other figures, sized and lazy.

    Each gets the alt text its starter saved for it (``figures.json``) when it is one of
    the starter's saved figures, else the generic one ``notebooks.clean_html`` set."""
    starter = page.file.src_uri
    alts = _figure_alts(starter)
    generic = (f"Figure drawn by the cell above ({starter})", Path(starter).stem)

    def replace(match: re.Match) -> str:
        kind, data = match.group(1), base64.b64decode(match.group(2))
        if kind == "image/svg+xml":
            svg = data.decode("utf-8").strip()
            alt = html_lib.escape(alts.get(_svg_key(svg), generic)[0], quote=True)
            media = diagrams.chart_html(svg, alt)
        else:
            digest = hashlib.sha256(data).hexdigest()
            alt, name = alts.get(digest, generic)
            alt = html_lib.escape(alt, quote=True)
            width, height = struct.unpack(">II", data[16:24])  # the PNG IHDR chunk
            # the lab page's name for the same figure (directives.figure), so one file
            name = f"{name}-{digest[:10]}.png"
            dest = f"assets/figures/{Path(starter).parent.name}/{name}"
            path = CACHE_DIR / "notebook-figures" / Path(starter).parent.name / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            GENERATED_FILES[dest] = path
            src = posixpath.relpath(dest, page_dir(page))
            media = (
                f'<img src="{src}" alt="{alt}" width="{width}" height="{height}" '
                'loading="lazy" decoding="async">'
            )
        return f'<div class="lab-figure">{media}</div>'

    return NOTEBOOK_IMG_RE.sub(replace, html)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    search_terms.leave_out_starter(page)  # a starter's notebook page: not in search
    if page.file.src_uri.startswith("code/"):
        if page.file.src_uri.endswith(".py") and page.file.src_uri not in serving.FAILED_PAGES:
            # (nbconvert's page was cleaned when it was exported: notebooks.clean_html)
            html = externalize_notebook_figures(html, page)
            align_toc_with_headings(html, page)
        html = _starter_header(page, files) + html
    html = _after_title(html, _you_are_here(page, files))
    # md_in_html keeps the attribute on a block it met indented (directives.model_sizes)
    html = html.replace('<div class="model-sizes" markdown>', '<div class="model-sizes">')
    # a chart inside an indented block reaches Markdown as inline HTML, and the glossary's
    # abbreviations wrap words of its <text> in <abbr>: an element SVG does not know, whose
    # text Chromium then does not draw (lab 03's legends lost "Karras", "sigma")
    html = SVG_RE.sub(lambda m: ABBR_TAG_RE.sub("", m.group(0)), html)
    try:
        return later_cache.mark_later(html)  # TeX to MathML, then marks (cached)
    except MathError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc


SVG_RE = re.compile(r"<svg\b.*?</svg>", re.DOTALL)
ABBR_TAG_RE = re.compile(r"</?abbr\b[^>]*>")


# --------------------------------------------------------------------------- page

BUNDLE_RE = re.compile(
    r'<script src="([^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js)"></script>'
)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Fixes to Material's page template, applied to its output (no template copy):

    - the home page's title is the site name once, not "<site> - <site>";
    - the search overlay is a ``role="dialog"`` without a name; give it one (axe
      ``aria-dialog-name``);
    - Material's bundle starts on the reader's first interaction, and the colour scheme
      is set without it (``bundle_on_interaction.js``, which replaces the bundle's tag);
    - search on demand: the search index and worker wait until the reader reaches for
      search (``search_on_demand.js``);
    - the article's blocks off screen laid out after load, a few at a time, and the
      accessibility fixes that need their layout (``a11y.js``).

    The three scripts are inlined in one ``<script>`` where the bundle's tag was.
    """
    if page.is_homepage:  # Material writes "<site> - <site>" when the page title is the site name
        output = output.replace(
            f"<title>{config.site_name} - {config.site_name}</title>",
            f"<title>{config.site_name}</title>",
        )
    output = output.replace(
        '<div class="md-search" data-md-component="search" role="dialog">',
        '<div class="md-search" data-md-component="search" role="dialog" aria-label="Search">',
    )
    output, found = BUNDLE_RE.subn(
        lambda m: f'<script data-bundle="{m.group(1)}">{_inline_scripts()}</script>',
        output,
        count=1,
    )
    if not found:
        raise PluginError(f"{page.file.src_uri}: Material's bundle <script> tag not found")
    return output


#: Scripts inlined in place of Material's bundle tag (no extra request): see each file's
#: header. bundle_on_interaction.js reads the bundle's URL from the tag, so it comes first.
INLINE_SCRIPTS = ["bundle_on_interaction.js", "search_on_demand.js", "a11y.js"]


@functools.cache
def _inline_scripts() -> str:
    """The inline scripts, comment lines and indentation stripped."""
    out = []
    for name in INLINE_SCRIPTS:
        source = (Path(__file__).parent / name).read_text(encoding="utf-8")
        lines = (line.strip() for line in source.splitlines())
        # one statement per line, as written: a line's trailing comment ends at its newline
        out.append("\n".join(line for line in lines if line and not line.startswith("//")))
    return "\n".join(out)


# --------------------------------------------------------------------------- build


def on_build_error(error: Exception) -> None:
    finish_prefetch()
    notebooks.finish()
    close_zygotes()


@event_priority(-100)  # after the search plugin has written its index
def on_post_build(config: MkDocsConfig) -> None:
    """Copy the figure files the pages reference (see the ``figure`` directive); stop the
    build's notebook runs and starter zygotes; give the search index's teaching
    sections their words (``search_terms``); for the offline build, write the search index
    as a script."""
    finish_prefetch()
    notebooks.finish()
    close_zygotes()
    search_cache.evict_unused()
    later_cache.evict_unused()
    _save_svg_keys()
    # (a page whose render is reused highlights nothing: keep what it highlighted before)
    highlight_cache.save(keep=serving.SERVING or serving.renders_reused())
    serving.evict_unused()
    _BUILD_KEY.clear()
    site = Path(config.site_dir)
    # each teaching section first in search for its words
    search_terms.tag_sections(site, directory_urls=config.use_directory_urls)
    for dest, source in GENERATED_FILES.items():
        target = site / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    if offline_build():
        # Over file:// Material's bundle loads the index with a <script> (`__index`), as
        # no request can fetch a local file.
        index = site / "search" / "search_index.json"
        if index.is_file():
            script = "var __index = " + index.read_text(encoding="utf-8")
            (site / "search" / "search_index.js").write_text(script, encoding="utf-8")
        # A host serves 404.html for a missing path (its links are site-absolute for that
        # reason); from the file system nothing does.
        (site / "404.html").unlink(missing_ok=True)
