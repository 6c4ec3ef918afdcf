"""Notebook pages: how a starter becomes its executed notebook page, executed ahead of time.

mkdocs-jupyter renders each starter page (a jupytext percent-format ``.py``) with
nbconvert: its ExecutePreprocessor executes the notebook, its HTML exporter renders it.
Out of the box that was most of a cold build: a Jupyter kernel, talking to nbclient over
ZMQ, computed every starter once more in its own interpreter, and each page's exporter
compiled its Jinja templates afresh (~0.2 s a page).

:func:`configure` swaps the kernel for the build's own executor. A page's code cells run
in order in one IPython shell (IPython's ``run_cell``, the call ipykernel makes for each
cell), in a child forked from a notebook zygote (``infralens_docs.zygote --notebook``, one
per thread that runs notebooks: NumPy, labkit and IPython imported once in each, not once
per page; the starters' environment), and come
back as the outputs nbclient would have written: streams, ``display(...)`` data, a
cell's last value, the error that stops the notebook. The exporter's templates are
compiled once per build process (a shared Jinja bytecode cache).

:func:`prebuild` executes the notebook pages missing from mkdocs-jupyter's cache on
background threads (each with its notebook zygote) as soon as the build knows its files.
mkdocs-jupyter renders the notebook pages after ``docs/``'s pages (the starters are added
after them; only the home page comes later: ``hooks._render_summaries_last``); when it
reaches one, the ExecutePreprocessor picks up the finished outputs (keyed on the
cells' sources, so an edit in between runs again) and the exporter renders the page. A
cell that raises fails the build with the cell and its traceback (under ``mkdocs serve``
the page shows the error instead: ``hooks.on_pre_page``).
"""

from __future__ import annotations

import copy
import hashlib
import html
import json
import os
import re
import sys
import types
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jinja2
import jupytext
from mkdocs.exceptions import PluginError

from infralens_docs.registry import ROOT


def _key_on_the_files_beside() -> None:
    """Wrap ``mkdocs_jupyter.plugin._compute_cache_key`` (the plugin and :func:`prebuild`
    look it up at each call) to hash the starter's path and the files beside it too."""
    from mkdocs_jupyter import plugin

    from infralens_docs.runner import beside

    original = plugin._compute_cache_key

    def key(nb_path, config, exec_nb):
        path = Path(nb_path).resolve()
        # the page names its starter's path (its figures' alt texts): a moved starter too
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        parts = [original(nb_path, config, exec_nb), where, *beside(path)]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    plugin._compute_cache_key = key


class _TemplateBytecode(jinja2.BytecodeCache):
    """Jinja's compiled templates, shared by every exporter of this process: mkdocs-jupyter
    builds a new exporter (a new Jinja environment) for each page, and compiling nbconvert's
    templates again was ~40% of a page's export. Jinja checks each entry against the
    template's source checksum, so an edited template compiles again."""

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}

    def load_bytecode(self, bucket) -> None:
        if bucket.key in self.store:
            bucket.bytecode_from_string(self.store[bucket.key])

    def dump_bytecode(self, bucket) -> None:
        self.store[bucket.key] = bucket.bytecode_to_string()


#: What ipykernel reports of this Python (``IPythonKernel.language_info``); nbclient
#: writes it into the executed notebook's metadata.
LANGUAGE_INFO = {
    "name": "python",
    "version": sys.version.split()[0],
    "mimetype": "text/x-python",
    "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
    "pygments_lexer": "ipython3",
    "nbconvert_exporter": "python",
    "file_extension": ".py",
}


def configure() -> None:
    """mkdocs-jupyter's notebook runs and exports, set up once per process.

    - Execution through the build's executor (:func:`executed`) instead of a kernel, with
      the outputs nbclient would write; a cell that raises raises nbclient's
      ``CellExecutionError`` (the cell and its traceback), as with a kernel.
    - The exporters share one Jinja bytecode cache (:class:`_TemplateBytecode`), and the
      exported page is cleaned for the site (:func:`clean_html`) before mkdocs-jupyter
      caches it.
    - Stable cell ids (:func:`read_starter`), so two clean builds give byte-identical pages.
    - A page's cache key folds in its starter's path and the files beside it that a run may
      read (``runner.beside``): mkdocs-jupyter keys on the notebook's bytes and its options
      alone, so a moved starter, or an edit to a file beside it that its run reads, left its
      page as it was (``_key_on_the_files_beside``).
    """
    from mkdocs_jupyter import convert, nbconvert2
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.preprocessors import ExecutePreprocessor

    if getattr(ExecutePreprocessor.preprocess, "infralens", False):
        return
    _key_on_the_files_beside()
    bytecode = _TemplateBytecode()
    create_environment = TemplateExporter._create_environment

    def _create_environment(self):
        environment = create_environment(self)
        environment.bytecode_cache = bytecode
        return environment

    TemplateExporter._create_environment = _create_environment
    _export_with_a_small_soup()

    def preprocess(self, nb, resources=None, km=None):
        path = ((resources or {}).get("metadata") or {}).get("path") or str(ROOT)
        fill(nb, executed(code_cells(nb), path))
        return nb, resources

    preprocess.infralens = True  # type: ignore[attr-defined]
    ExecutePreprocessor.preprocess = preprocess
    export = convert.nb2html  # the plugin calls it through its module, at each page

    def nb2html(nb_path, *args, **kwargs):
        path = Path(nb_path).resolve()
        starter = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        return clean_html(export(nb_path, *args, **kwargs), starter)

    convert.nb2html = nb2html
    # mkdocs-jupyter reads the .py starters with jupytext; read them with stable cell ids.
    nbconvert2.jupytext = types.SimpleNamespace(read=read_starter, writes=jupytext.writes)


#: A ``<pre>`` of the rendered page (code cells, text outputs) and its content; the tags
#: inside one that :func:`_as_soup_prints` reproduces (Pygments' and the ANSI filter's spans).
_PRE_RE = re.compile(r"(<pre\b[^>]*>)(.*?)(</pre>)", re.DOTALL)
_TAG_RE = re.compile(r"(<[^>]*>)")
_SPAN_RE = re.compile(r'</span>|<span(?: class="[\w -]*")?>')


def _as_soup_prints(fragment: str) -> str | None:
    """``fragment`` as BeautifulSoup (html.parser, minimal formatter) prints it again: each
    text's entities decoded and ``&``, ``<``, ``>`` escaped; None if it holds a tag other
    than a plain ``span``, whose printing this does not reproduce."""
    parts = _TAG_RE.split(fragment)
    for index, part in enumerate(parts):
        if index % 2:
            if not _SPAN_RE.fullmatch(part):
                return None
        elif part:
            parts[index] = html.escape(html.unescape(part), quote=False)
    return "".join(parts)


def _export_with_a_small_soup() -> None:
    """nbconvert's ``HTMLExporter.from_notebook_node`` renders a page, then parses and
    prints it whole with BeautifulSoup to add alt texts and ``tabindex`` attributes; a
    starter's ~9,000 highlighted tokens made that parse most of the export. Here the
    ``<pre>`` blocks (code and text, where the tokens are) are held out of the parse and
    put back as BeautifulSoup would have printed them (:func:`_as_soup_prints`): the same
    page, byte for byte, for what tests/test_build.py::test_notebook_export_matches_nbconverts
    exports (lab 01's starter, and text outputs with ANSI colours, markup and quotes).
    The rest is nbconvert 7's method as it stands."""
    from bs4 import BeautifulSoup
    from nbconvert.exporters.html import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

    def from_notebook_node(self, nb, resources=None, **kw):
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        highlight_code = self.filters.get(
            "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)
        )
        resources = self._init_resources(resources)
        filter_data_type = WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources
        )
        self.register_filter("highlight_code", highlight_code)
        self.register_filter("filter_data_type", filter_data_type)
        page, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        held: list[str] = []

        def hold(match: re.Match) -> str:
            printed = _as_soup_prints(match.group(2))
            if printed is None:
                return match.group(0)
            held.append(printed)
            return f"{match.group(1)}{_HELD}{len(held) - 1}{_HELD}{match.group(3)}"

        soup = BeautifulSoup(_PRE_RE.sub(hold, page), features="html.parser")
        missing_alt = 0
        for elem in soup.select("img:not([alt])"):
            elem.attrs["alt"] = "No description has been provided for this image"
            missing_alt += 1
        if missing_alt:
            self.log.warning("Alternative text is missing on %s image(s).", missing_alt)
        for elem in soup.select(".jp-Notebook div.jp-Cell-inputWrapper"):
            elem.attrs["tabindex"] = "0"
        for elem in soup.select(".jp-Notebook div.jp-OutputArea-output"):
            elem.attrs["tabindex"] = "0"
        page = _HELD_RE.sub(lambda m: held[int(m.group(1))], str(soup))
        return page, resources

    from_notebook_node.nbconvert = HTMLExporter.from_notebook_node  # type: ignore[attr-defined]
    HTMLExporter.from_notebook_node = from_notebook_node


_HELD = "\ue000"  # a private-use character: no page holds one
_HELD_RE = re.compile(f"{_HELD}(\\d+){_HELD}")


# --------------------------------------------------------------------------- clean

NOTEBOOK_STRIP = [
    # ~600 kB of JupyterLab CSS inlined per page; site.css styles the cells instead.
    re.compile(r"<style[^>]*>.*?</style>", re.DOTALL),
    # Every script nbconvert emits: MathJax and Mermaid loaders (from a CDN) and the
    # copy widget's custom element (instant navigation would define it twice).
    # The pages run no notebook JavaScript; Material gives code cells its copy button.
    re.compile(r"<script\b[^>]*>.*?</script>", re.DOTALL),
    # and the comments those templates leave behind ("Load mathjax", ...)
    re.compile(r"<!--.*?-->", re.DOTALL),
]
# The starters' snippet-section markers are for the lab pages, not for readers of the notebook.
SNIPPET_MARKER_RE = re.compile(
    r'(?:<span class="c1">)?# --8&lt;-- \[(?:start|end):[\w-]+\](?:</span>)?\n?'
)
# nbconvert's copy widget and the hidden copy of each cell's source it reads from.
COPY_WIDGET_RE = re.compile(
    r'<div class="zeroclipboard-container">.*?</clipboard-copy>\s*</div>'
    r'|<div (?:id="cell-\d+" class="clipboard-copy-txt"|class="clipboard-copy-txt" id="cell-\d+")>'
    r".*?</div>",
    re.DOTALL,
)
CELL_PRE_RE = re.compile(r'(<div class="highlight-ipynb[^"]*"><pre>)(.*?)(</pre>)', re.DOTALL)
NO_ALT = 'alt="No description has been provided for this image"'
# nbconvert's pilcrow after every heading of a Markdown cell; the page's table of contents
# already links each heading, and the marks only clutter the notebook.
ANCHOR_LINK_RE = re.compile(r'<a class="anchor-link" href="#[^"]*">¶</a>')


def clean_html(html: str, title: str) -> str:
    """Make an nbconvert page a good citizen of the site: no inline CSS, no CDN script.
    Done once, when the page is exported (:func:`configure`), so mkdocs-jupyter's cache
    holds the clean page and a warm build does not clean it again.

    Code cells become ``pre > code`` blocks inside ``.highlight``, so Material styles
    them and gives them its own copy button, like every other code block on the site.
    """
    html = COPY_WIDGET_RE.sub("", html)
    for pattern in NOTEBOOK_STRIP:
        html = pattern.sub("", html)
    html = SNIPPET_MARKER_RE.sub("", html)
    html = ANCHOR_LINK_RE.sub("", html)
    html = CELL_PRE_RE.sub(r"\1<code>\2</code>\3", html)
    return html.replace(NO_ALT, f'alt="Figure drawn by the cell above ({title})"')


def code_cells(nb) -> list[str]:
    """The sources of the cells a kernel executes: code cells that are not blank (nbclient
    skips those)."""
    return [c.source for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def execute(cells: list[str], cwd: str) -> dict:
    """Run ``cells`` through the notebook executor (``runner.execute_cells``): each cell's
    outputs, the execution counts, and the index of the cell that raised (or None)."""
    from infralens_docs.runner import execute_cells

    proc = execute_cells(cells, cwd)
    if proc.returncode != 0:
        raise PluginError(f"the notebook executor failed ({proc.returncode}): {proc.stderr}")
    return json.loads(proc.stdout)


def executed(cells: list[str], cwd: str) -> dict:
    """The outputs of ``cells``: from :func:`prebuild`'s run of the same sources, or run now."""
    future = _jobs.get(_job_key(cells, cwd))
    if future is not None and not future.cancelled():
        return future.result()
    return execute(cells, cwd)


def fill(nb, result: dict) -> None:
    """Write ``result`` (:func:`execute`) into ``nb`` as nbclient does: each executed cell's
    outputs and execution count, the kernel's language info; raise nbclient's
    ``CellExecutionError`` for the cell that raised."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for cell, outputs, count in zip(cells, result["outputs"], result["counts"], strict=False):
        cell.execution_count = count
        cell.outputs = [nbformat.from_dict(o) for o in merge_adjacent_streams(outputs)]
    if result["error"] is not None:
        cell = cells[result["error"]]
        error = next(o for o in cell.outputs if o.output_type == "error")
        raise CellExecutionError.from_cell_and_msg(cell, error)


def merge_adjacent_streams(outputs: list) -> list:
    """Join each run of consecutive ``stream`` outputs of one name (stdout, stderr) into
    one output; every other output, and the order of all of them, stays as it was."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and output.get("output_type") == "stream"
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def read_starter(path):
    """``jupytext.read`` with stable cell ids. jupytext gives each cell a random id, which
    lands in the page's HTML and the .ipynb download, so two builds of the same starter
    differed; ``cell-<index>`` keeps them byte-identical.

    A build reads each starter four times (its run ahead, mkdocs-jupyter's page and table
    of contents, the .ipynb download) and jupytext's parse is slow: each caller gets its
    own copy of one parse, parsed again when the file's size, time or inode changed."""
    stat = os.stat(path)
    key = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    cached = _READ.get(os.fspath(path))
    if cached is None or cached[0] != key:
        notebook = jupytext.read(path)
        for index, cell in enumerate(notebook.cells):
            cell["id"] = f"cell-{index}"
        cached = _READ[os.fspath(path)] = (key, notebook)
    return copy.deepcopy(cached[1])


_READ: dict = {}  # path -> (size, time, inode), its parse: the last one only


# --------------------------------------------------------------------------- prebuild

_jobs: dict[tuple[str, str], Future] = {}  # (cells digest, cwd) -> the executor's result
_pool: list[ThreadPoolExecutor] = []
_paths: dict[str, tuple[str, str]] = {}  # starter -> its job's key


def _job_key(cells: list[str], cwd: str) -> tuple[str, str]:
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest(), cwd


def prebuild(plugin, files, serving: bool = False) -> None:
    """Start executing, on background threads, each notebook page ``plugin``
    (mkdocs-jupyter) will render whose result is not in its cache yet.

    ``serving`` (``mkdocs serve``): a starter that does not compile is not run: its page
    shows the error (``hooks.on_pre_page``)."""
    from mkdocs_jupyter.plugin import _compute_cache_key, _get_cache_path

    config = plugin.config
    if not config["cache"] or config["execute_ignore"] or not config["execute"]:
        return  # (both would need mkdocs-jupyter's per-page decisions; not used here)
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = len(cores) if cores else os.cpu_count() or 1
    # INFRALENS_NOTEBOOK_WORKERS=0 executes every notebook page in its render (the
    # reproducibility test compares that with a build that executed them ahead)
    workers = int(os.environ.get("INFRALENS_NOTEBOOK_WORKERS", cores))
    if workers <= 0:
        return
    for file in files:
        if not plugin.should_include(file):
            continue
        path = file.abs_src_path
        cache_path = _get_cache_path(
            config["cache_dir"], _compute_cache_key(path, config, config["execute"])
        )
        if cache_path.exists():
            continue
        if serving:
            try:
                compile(Path(path).read_bytes(), path, "exec")
            except (SyntaxError, ValueError):
                continue
        cells, cwd = code_cells(read_starter(path)), str(ROOT)  # (mkdocs-jupyter passes no path)
        key = _paths[path] = _job_key(cells, cwd)
        if key in _jobs:
            continue
        if not _pool:
            _pool.append(ThreadPoolExecutor(workers, thread_name_prefix="infralens-notebooks"))
        _jobs[key] = _pool[0].submit(execute, cells, cwd)


def wait_for(path: str) -> BaseException | None:
    """Block until the notebook of ``path`` has run ahead (nothing if it did not); return
    what went wrong in the executor itself, if anything. A failure is not raised here: the
    page's render reports the real error (under ``mkdocs serve``, the page shows it)."""
    future = _jobs.get(_paths.get(path, ("", "")))
    if future is not None and not future.cancelled():
        return future.exception()
    return None


def finish() -> None:
    """End of a build: runs no page waited for (a build that failed before its notebook
    pages) are dropped, the rest awaited; the executors' zygotes stop with the starters'
    (``runner.close_zygotes``)."""
    for future in _jobs.values():
        future.cancel()
    while _pool:
        _pool.pop().shutdown(wait=True)
    _jobs.clear()
    _paths.clear()
