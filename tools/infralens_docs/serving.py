"""`mkdocs serve` while a reader edits a starter (issue 32, item 1).

Lab 17 asks the reader to edit a starter with the site served. Two things made that hurt:

- **A failing starter took the whole site down.** The build runs the starters (the
  ``run`` and ``figure`` directives, and mkdocs-jupyter's notebook pages), so one missing
  ``)`` failed the build, and mkdocs' live-reload server then holds every request until a
  build succeeds. Under ``serve`` (the ``on_startup(command="serve")`` event, or
  ``on_serve``) a starter that fails no longer fails the build: each page that shows it
  gets a box with the file, the line, the message and what to do, in place of what that
  starter would have shown (:func:`error_box`, :func:`notebook_error_html`); every other
  page renders as usual. ``mkdocs build`` (``make build``, CI, the tests) never sets
  :data:`SERVING`, and fails on the same starter as before.
- **Requests waited for every rebuild.** mkdocs 1.6's ``LiveReloadServer`` builds into the
  folder it serves (``build`` empties it first) and makes each request wait until the
  rebuild ends (``_serve_request`` waits for ``_visible_epoch == _wanted_epoch``). With
  the starters executed at build time a rebuild takes seconds to minutes on a small
  machine, and the pages hung for as long. :func:`on_serve` wraps the server's builder: a
  rebuild writes into a second folder while requests are answered from the last good
  one, which is swapped for the new one when the build succeeds; a failed build leaves the
  last good pages served. mkdocs itself is not changed; if its server no longer has the
  attributes this relies on, the wrapper is not installed and serving works as mkdocs
  does.
- **A save rebuilt everything.** The starters' runs and notebook pages were already cached
  on their sources (``runner``, ``notebooks``), so a save re-ran only the edited starter's
  lab; but every Markdown page was converted again. A page's render is now reused while
  nothing it depends on changed (:func:`render_cached`), in this process under ``serve``
  and from ``.cache/renders/`` in every build, ``mkdocs build`` included.
"""

from __future__ import annotations

import copy
import hashlib
import html
import logging
import os
import pickle
import re
import shutil
import textwrap
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mkdocs.exceptions import PluginError

from infralens_docs import runner
from infralens_docs.registry import ROOT
from infralens_docs.runner import CACHE_ROOT

log = logging.getLogger("mkdocs.hooks.infralens")

#: True under ``mkdocs serve``: a failing starter shows its error on its own pages.
SERVING = False
#: The folder the build in progress writes to (set by the served builder, read by on_config).
_NEXT_SITE_DIR: dict[str, str] = {}
#: Notebook pages of this build whose starter failed (their HTML is the error box alone).
FAILED_PAGES: set[str] = set()

WHAT_TO_DO = "Fix the line and save; the page rebuilds."


def on_startup(command: str) -> None:
    global SERVING
    SERVING = command == "serve"


def site_dir_override() -> str | None:
    return _NEXT_SITE_DIR.get("site_dir")


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Failure:
    """Where a starter's run failed: the innermost frame in the repository's ``code/``
    (the starter, a file it imports beside it, or labkit), and the error's last line."""

    command: str
    file: str | None
    line: int | None
    message: str
    tail: str  # the last lines of stderr, paths shown from the repository root

    @property
    def where(self) -> str:
        if self.file is None:
            return "the starter"
        return f"{self.file}, line {self.line}" if self.line else self.file


FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def describe(command: str, stderr: str, returncode: int | None = None) -> Failure:
    """File, line and message of a failed run, read from its traceback."""
    text = ANSI_RE.sub("", stderr).rstrip()
    file = line = None
    first = None  # where the reader's own frames start (the build's runner frames above)
    code = (ROOT / "code").resolve()
    for match in FRAME_RE.finditer(text):
        path = Path(match.group("file"))
        try:
            rel = path.resolve().relative_to(code)
        except (ValueError, OSError):
            continue
        file, line = f"code/{rel.as_posix()}", int(match.group("line"))
        first = match.start() if first is None else first
    if file is None:  # no traceback (an argparse error, a one-line message): the starter
        file = next((w for w in command.split() if w.startswith("code/")), None)
    if first is not None and text.startswith("Traceback"):
        text = "Traceback (most recent call last):\n" + text[first:]
    lines = [entry for entry in text.splitlines() if entry.strip()]
    if lines:
        message = lines[-1].strip()
    else:
        message = f"exited {returncode} with no message" if returncode else "failed"
    root = str(ROOT.resolve()) + "/"
    tail = "\n".join(lines[-12:]).replace(root, "")
    return Failure(command, file, line, message, tail)


class StarterRunError(PluginError):
    """A directive's starter failed: the build's error, with the :class:`Failure` that a
    served page shows instead."""

    def __init__(self, message: str, failure: Failure) -> None:
        super().__init__(message)
        self.failure = failure


def _box_lines(failures: list[Failure]) -> list[str]:
    lines = []
    seen = set()
    for failure in failures:
        key = (failure.file, failure.line, failure.message)
        if key in seen:
            continue
        seen.add(key)
        message = failure.message.replace("`", "'")
        lines += [
            f"**`{failure.where}`**: `{message}`",
            f"From `{failure.command}`:",
            "```text\n" + failure.tail + "\n```",
        ]
    return lines


def error_box(failures: list[Failure]) -> str:
    """The Markdown box a served page shows under its title when a starter it shows fails."""
    lines = _box_lines(failures)
    lines.append(
        f"**{WHAT_TO_DO}** Until then this page shows no output of that starter; the rest "
        "of the site is unchanged. (`mkdocs serve` only: `make build` and CI fail on it.)"
    )
    body = "\n\n".join(textwrap.indent(entry, "    ") for entry in lines)
    title = "A starter this page runs fails"
    return f'!!! failure "{title}"\n\n{body}\n\n'


def placeholder(failure: Failure) -> str:
    """What stands in for a failed directive's output (the box at the top says why)."""
    return (
        f"*Output not shown: `{failure.command}` fails "
        f"(`{failure.where}`; see the box at the top of this page).*"
    )


def notebook_error_html(starter: str, failure: Failure) -> str:
    """A notebook page's whole content when its starter fails under ``serve``."""
    parts = [
        f"<p><strong><code>{html.escape(failure.where)}</code></strong>: "
        f"<code>{html.escape(failure.message)}</code></p>",
        f"<p>From <code>{html.escape(failure.command)}</code>:</p>",
        f'<div class="highlight"><pre><code>{html.escape(failure.tail)}</code></pre></div>',
        f"<p><strong>{WHAT_TO_DO}</strong> Until then this page shows no output of "
        f"<code>{html.escape(starter)}</code>; the rest of the site is unchanged. "
        "(<code>mkdocs serve</code> only: <code>make build</code> and CI fail on it.)</p>",
    ]
    return (
        f"<h1>{html.escape(Path(starter).name)}</h1>\n"
        '<div class="admonition failure">\n'
        '<p class="admonition-title">This starter fails</p>\n' + "\n".join(parts) + "\n</div>\n"
    )


def report(where: str, failures: list[Failure]) -> None:
    """One log line per distinct error of a page (INFO: strict mode counts warnings)."""
    for failure in {(f.where, f.message): f for f in failures}.values():
        log.info(
            "%s: %s: %s (the page shows the error; %s)",
            where,
            failure.where,
            failure.message,
            WHAT_TO_DO.lower().rstrip("."),
        )


# --------------------------------------------------------------------------- renders

#: This process's renders (``mkdocs serve`` rebuilds in one process), by page, with their key.
_RENDERS: dict[str, tuple[str, dict]] = {}
#: Every build's renders, kept from one build to the next: ``<key>.pickle`` (see render_cached).
RENDER_CACHE = CACHE_ROOT / "renders"
_used: set[str] = set()
_reused: list[str] = []
SNIPPET_RE = re.compile(r'--8<--\s*"([^"]+)"')
#: What converts a page's Markdown besides mkdocs.yml's settings: these packages' code.
RENDER_PACKAGES = ("mkdocs", "markdown", "pymdown-extensions", "pygments", "mkdocs-material")


def render_key(page, build_key: str) -> str | None:
    """What a Markdown page's HTML depends on: its Markdown (directives expanded, so the
    starters' outputs and figures are in it), its URL, the files its snippets include, and
    ``build_key`` (mkdocs.yml, the appended glossary, every file's URL, the build's own
    modules, the converting packages' versions). None if a snippet's file cannot be read
    (the render reports it)."""
    h = hashlib.sha256(f"{build_key}\0{page.file.src_uri}\0{page.url}\0".encode())
    h.update(page.markdown.encode("utf-8"))
    for target in sorted(set(SNIPPET_RE.findall(page.markdown))):
        try:
            h.update(b"\0" + target.encode() + b"\0" + (ROOT / target.split(":")[0]).read_bytes())
        except OSError:
            return None
    return h.hexdigest()


def build_key(config, files) -> str:
    h = hashlib.sha256()
    if config.config_file_path:
        h.update(Path(config.config_file_path).read_bytes())
    for path in sorted(ROOT.glob("includes/*")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    # the hooks' modules (a change to how a page is converted, highlight_cache say)
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for name in RENDER_PACKAGES:
        h.update(f"\0{name}={_version(name)}".encode())
    for file in files:
        h.update(f"\0{file.src_uri}\0{file.url}".encode())
    return h.hexdigest()


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


class _Warnings(logging.Handler):
    """Counts the warnings logged while a page renders (a render that warned is not kept:
    reused, it would pass a strict build the same Markdown fails)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _load(key: str) -> dict | None:
    found = next((kept for k, kept in _RENDERS.values() if k == key), None)
    if found is not None:
        return found
    entry = RENDER_CACHE / f"{key}.pickle"
    try:
        kept = pickle.loads(entry.read_bytes())
        os.utime(entry)  # used: kept by evict_unused
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return kept


def _store(key: str, kept: dict) -> None:
    RENDER_CACHE.mkdir(parents=True, exist_ok=True)
    entry = RENDER_CACHE / f"{key}.pickle"
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(entry)  # whole or absent: two builds may share the cache


def render_cached(page, config, files, render, key: str | None) -> None:
    """``render(config, files)``, or the render made before for the same key: a warm build,
    or a rebuild under ``serve`` after a starter's edit, converts only the Markdown that
    changed. What mkdocs reads from a render, the anchors for its validation included, is
    restored. A render is kept in this process (``serve``) and under ``.cache/renders/``."""
    uri = page.file.src_uri
    kept = _load(key) if key is not None else None
    if kept is not None:
        links = {}
        for target, anchors in kept["links"].items() if kept["links"] is not None else ():
            target_file = files.get_file_from_path(target)
            if target_file is None:  # (the build key holds every file: not reached)
                kept = None
                break
            links[target_file] = dict(anchors)
    if kept is not None:
        page.content = kept["content"]
        page.toc = copy.deepcopy(kept["toc"])
        page._title_from_render = kept["title"]
        page.present_anchor_ids = set(kept["anchors"])
        page.links_to_anchors = links if kept["links"] is not None else None
        _RENDERS[uri] = (key, kept)
        _used.add(key)
        _reused.append(uri)
        return
    warnings = _Warnings()
    logging.getLogger("mkdocs").addHandler(warnings)
    try:
        render(config, files)
    finally:
        logging.getLogger("mkdocs").removeHandler(warnings)
    if key is None or warnings.count:
        return
    links = getattr(page, "links_to_anchors", None)
    kept = {
        "content": page.content,
        "toc": copy.deepcopy(page.toc),
        "title": page._title_from_render,
        "anchors": set(page.present_anchor_ids or ()),
        "links": None if links is None else {f.src_uri: dict(a) for f, a in links.items()},
    }
    _RENDERS[uri] = (key, kept)
    _used.add(key)
    _store(key, kept)


def renders_reused() -> bool:
    """Whether this build reused a render (its code blocks were not highlighted again)."""
    return bool(_reused)


def evict_unused(max_age_s: float = 86400) -> None:
    """Remove the renders no build used for ``max_age_s`` (``runner.evict_unused``)."""
    runner.evict_unused(RENDER_CACHE, "*.pickle", _used, max_age_s)
    _reused.clear()


# --------------------------------------------------------------------------- server


def on_serve(server, config, builder):
    """Answer requests from the last good build while the next one runs (see above)."""
    global SERVING
    SERVING = True
    needed = ("builder", "root", "_epoch_cond", "_wanted_epoch", "_visible_epoch")
    if not all(hasattr(server, name) for name in needed):
        log.info("infralens: mkdocs' server changed; serving without the last-good-build swap")
        return server
    build = server.builder
    first = Path(server.root)
    second = first.with_name(first.name + "-next")

    def build_beside() -> None:
        target = second if Path(server.root) == first else first
        with server._epoch_cond:
            wanted = server._wanted_epoch
            # requests stop waiting for this build: the served folder is not touched by it
            server._wanted_epoch = server._visible_epoch
            server._epoch_cond.notify_all()
        _NEXT_SITE_DIR["site_dir"] = str(target)
        try:
            build()  # on_config points the build at ``target``
        finally:
            _NEXT_SITE_DIR.clear()
        server.root = str(target)
        with server._epoch_cond:
            server._wanted_epoch = wanted  # the server's loop now shows it and reloads browsers

    def error_page(code: int) -> bytes | None:  # mkdocs' reads the first folder only
        page = Path(server.root) / f"{code}.html"
        return page.read_bytes() if code in (404, 500) and page.is_file() else None

    server.builder = build_beside
    server.error_handler = error_page
    _NEXT_SITE_DIR.clear()
    _SECOND.append(second)
    return server


_SECOND: list[Path] = []


def on_shutdown() -> None:
    """Remove the second site folder (mkdocs removes the first)."""
    while _SECOND:
        shutil.rmtree(_SECOND.pop(), ignore_errors=True)
