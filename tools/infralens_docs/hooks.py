"""MkDocs hooks: registry-driven nav, starters as pages, build-time outputs and math.

Wired in ``mkdocs.yml`` through ``hooks/infralens.py``. What each event does:

- ``on_config``: appends one nav entry per lab (lab page + its starter pages)
  under "Labs", from the registry; keys mkdocs-jupyter's cache on the labkit
  sources, so an edit to the shared package re-executes the notebooks.
- ``on_files``: adds the starter files under ``code/`` (outside ``docs/``) so
  mkdocs-jupyter renders them as executed notebook pages.
- ``on_page_markdown``: expands ``<!-- infralens:... -->`` directives:
  ``run`` (execute a starter, show command and real output), ``lab-card``,
  ``labs-table``, ``labs-for SECTION``, ``sections-table`` and ``verified-versions``.
- ``on_page_content``: TeX to MathML; strips the notebook pages' inline
  CSS and their MathJax / Mermaid CDN scripts (styles come from site.css) and
  turns their code cells into Material code blocks.
- ``on_post_page``: names Material's search dialog and defers its bundle
  (accessibility and render-blocking fixes, without copying a template).

Any directive it does not know, any starter that exits non-zero and any TeX it
cannot render fails the build.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from infralens_docs.mathml import MathError, render_math
from infralens_docs.registry import ROOT, Lab, RegistryError, load_labs, read_front_matter
from infralens_docs.runner import labkit_digest, run_starter

DIRECTIVE_RE = re.compile(r"^<!-- infralens:(?P<name>[a-z-]+)(?P<args>[^\n]*?)-->$", re.MULTILINE)
VERSIONS_FILE = ROOT / "tests" / "verify" / "verified_versions.json"

_labs: list[Lab] = []


# --------------------------------------------------------------------------- config


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    global _labs
    try:
        _labs = load_labs()
    except RegistryError as exc:
        raise PluginError(f"lab registry: {exc}") from exc

    # Notebook kernels start as "python" from PATH: make that this interpreter,
    # whichever way mkdocs was launched, so labkit is importable in the kernel.
    bindir = os.path.dirname(sys.executable)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    labs_section = next(
        (item for item in config.nav or [] if isinstance(item, dict) and "Labs" in item), None
    )
    if labs_section is None:
        raise PluginError("mkdocs.yml nav needs a 'Labs' section for the registry to fill")
    for lab in _labs:
        entries = [{"Lab guide": lab.page.as_posix()}]
        entries += [{s.path.name: s.path.as_posix()} for s in lab.starters if _is_page(s.path)]
        labs_section["Labs"].append({lab.label: entries})

    jupyter = config.plugins.get("mkdocs-jupyter")
    if jupyter is not None:
        # mkdocs-jupyter keys its cache on the notebook file alone; the starters
        # import labkit, so fold labkit's digest into the cache location too.
        base = ROOT / ".cache" / "mkdocs-jupyter"
        jupyter.config["cache_dir"] = str(base / labkit_digest()[:16])
        for stale in base.glob("*") if base.is_dir() else []:
            if stale.is_dir() and stale.name != labkit_digest()[:16]:
                for f in stale.glob("*.json"):
                    f.unlink()
                stale.rmdir()
    return config


def _is_page(path: Path) -> bool:
    """Starters that render as pages: .py notebooks (runnable) and Markdown notes."""
    return path.suffix in {".py", ".md"}


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
    return files


# --------------------------------------------------------------------------- markdown


def _rel(page: Page, target: str) -> str:
    """A link from ``page`` to the docs-relative ``target``, as MkDocs expects."""
    return posixpath.relpath(target, posixpath.dirname(page.file.src_uri))


def _starter_links(page: Page, lab: Lab) -> str:
    return ", ".join(
        f"[`{s.path.name}`]({_rel(page, s.path.as_posix())})"
        if _is_page(s.path)
        else f"`{s.path.name}`"
        for s in lab.starters
    )


def _section_title(section: str) -> str:
    meta = read_front_matter(ROOT / "docs" / "handbook" / f"{section}.md")
    return str(meta.get("title", section))


def _directive_run(page: Page, args: list[str]) -> str:
    if not args:
        raise PluginError(f"{page.file.src_uri}: infralens:run needs a starter path")
    starter, flags = args[0], args[1:]
    expect_fail = False
    if flags[:1] == ["--expect-error"]:
        expect_fail, flags = True, flags[1:]
    run = run_starter(starter, flags)
    if expect_fail:
        if run.returncode == 0 or run.stdout or len(run.stderr.strip().splitlines()) != 1:
            raise PluginError(f"{page.file.src_uri}: `{run.command}` should fail with one line")
        shown = f"$ {run.command}\n{run.stderr.rstrip()}\n$ echo $?\n{run.returncode}"
    else:
        if run.returncode != 0 or run.stderr:
            raise PluginError(
                f"{page.file.src_uri}: `{run.command}` exited {run.returncode}: {run.stderr.strip()}"
            )
        shown = f"$ {run.command}\n{run.stdout.rstrip()}"
    return f"```console\n{shown}\n```"


def _directive_lab_card(page: Page) -> str:
    lab = next((lab for lab in _labs if lab.page.as_posix() == page.file.src_uri), None)
    if lab is None:
        raise PluginError(f"{page.file.src_uri}: lab-card outside a registered lab page")
    sections = ", ".join(
        f"[{_section_title(s)}]({_rel(page, f'handbook/{s}.md')})" for s in lab.sections
    )
    runnable = [s for s in lab.starters if s.runnable]
    run_line = (
        " ".join(f"`python {s.path.as_posix()}`" for s in runnable) if runnable else "reading only"
    )
    return (
        f'!!! abstract "Lab {lab.number:02d} at a glance"\n\n'
        f"    **Question.** {lab.question}\n\n"
        f"    **Starter files.** {_starter_links(page, lab)} (folder `{lab.folder.as_posix()}/`)\n\n"
        f"    **Run.** {run_line}\n\n"
        f"    **Handbook sections.** {sections}\n"
    )


def _directive_labs_table(page: Page, labs: list[Lab]) -> str:
    rows = ["| # | Lab | Question it answers | Starter files | Runs |", "|---|---|---|---|---|"]
    for lab in labs:
        runs = "yes" if any(s.runnable for s in lab.starters) else "reading"
        title_link = f"[{lab.title}]({_rel(page, lab.page.as_posix())})"
        rows.append(
            f"| {lab.number:02d} | {title_link} | {lab.question} | {_starter_links(page, lab)} | {runs} |"
        )
    return "\n".join(rows)


def _directive_sections_table(page: Page, config: MkDocsConfig) -> str:
    """Handbook section -> the labs that serve it, in the nav's section order."""
    handbook = next(
        (
            item["Handbook"]
            for item in config.nav or []
            if isinstance(item, dict) and "Handbook" in item
        ),
        [],
    )
    rows = ["| Handbook section | Labs that serve it |", "|---|---|"]
    for entry in handbook:
        target = entry if isinstance(entry, str) else next(iter(entry.values()))
        section = posixpath.splitext(posixpath.basename(target))[0]
        labs = [lab for lab in _labs if section in lab.sections]
        if not labs:
            raise PluginError(f"{page.file.src_uri}: no lab serves section '{section}'")
        links = ", ".join(
            f"[Lab {lab.number:02d}]({_rel(page, lab.page.as_posix())})" for lab in labs
        )
        rows.append(f"| [{_section_title(section)}]({_rel(page, target)}) | {links} |")
    return "\n".join(rows)


def _directive_verified_versions(page: Page) -> str:
    if not VERSIONS_FILE.is_file():
        raise PluginError(f"{VERSIONS_FILE.relative_to(ROOT)} is missing; run the verify tests")
    v = json.loads(VERSIONS_FILE.read_text(encoding="utf-8"))
    return f"diffusers {v['diffusers']} (with torch {v['torch']})"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def expand(match: re.Match) -> str:
        name, args = match.group("name"), shlex.split(match.group("args"))
        if name == "run":
            return _directive_run(page, args)
        if name == "lab-card":
            return _directive_lab_card(page)
        if name == "labs-table":
            return _directive_labs_table(page, _labs)
        if name == "labs-for":
            if len(args) != 1:
                raise PluginError(f"{page.file.src_uri}: labs-for takes one section id")
            labs = [lab for lab in _labs if args[0] in lab.sections]
            if not labs:
                raise PluginError(f"{page.file.src_uri}: no lab serves section '{args[0]}'")
            return _directive_labs_table(page, labs)
        if name == "verified-versions":
            return _directive_verified_versions(page)
        if name == "sections-table":
            return _directive_sections_table(page, config)
        raise PluginError(f"{page.file.src_uri}: unknown directive infralens:{name}")

    return DIRECTIVE_RE.sub(expand, markdown)


# --------------------------------------------------------------------------- html

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


def clean_notebook_html(html: str, title: str) -> str:
    """Make an nbconvert page a good citizen of the site: no inline CSS, no CDN script.

    Code cells become ``pre > code`` blocks inside ``.highlight``, so Material styles
    them and gives them its own copy button, like every other code block on the site.
    """
    html = COPY_WIDGET_RE.sub("", html)
    for pattern in NOTEBOOK_STRIP:
        html = pattern.sub("", html)
    html = SNIPPET_MARKER_RE.sub("", html)
    html = CELL_PRE_RE.sub(r"\1<code>\2</code>\3", html)
    return html.replace(NO_ALT, f'alt="Figure drawn by the cell above ({title})"')


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri.startswith("code/"):
        html = clean_notebook_html(html, page.file.src_uri)
    try:
        return render_math(html)
    except MathError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc


# --------------------------------------------------------------------------- page

BUNDLE_RE = re.compile(
    r'<script src="([^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js)"></script>'
)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Two fixes to Material's page template, applied to its output (no template copy):

    - the search overlay is a ``role="dialog"`` without a name; give it one (axe
      ``aria-dialog-name``);
    - load the theme bundle with ``defer``: it sits at the end of ``<body>`` and
      needs the parsed DOM only, so deferring keeps it off the render path.
    """
    output = output.replace(
        '<div class="md-search" data-md-component="search" role="dialog">',
        '<div class="md-search" data-md-component="search" role="dialog" aria-label="Search">',
    )
    return BUNDLE_RE.sub(r'<script defer src="\1"></script>', output)
