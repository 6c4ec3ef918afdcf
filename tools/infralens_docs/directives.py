r"""The ``<!-- infralens:NAME args -->`` directives a page may hold, one function each.

A directive stands alone on its line and is replaced by Markdown at build time:

| directive | becomes |
|---|---|
| ``run PATH [--expect-error] FLAGS`` | the command and the starter's real output (or its one-line error) |
| ``lab-card`` | the lab's question, starters, run command and handbook sections |
| ``labs-table`` | every lab, from the registry |
| ``labs-for SECTION`` | the labs that serve one handbook section |
| ``sections-table`` | every handbook section (nav order) with the labs that serve it |
| ``verified-claims [MODULE ...]`` | what this page's verify module checks, and against which versions |
| ``verified-summary`` | every page's verify module, with its number of checks |
| ``figure PATH NAME [FLAGS]`` | figure NAME that the starter saves when run with ``--figures DIR`` |
| ``diagram NAME`` | diagram NAME of ``diagrams.yml``, drawn at build time (no starter draws it) |
| ``model-sizes [PIPELINE ... \| --atlas \| --atlas-sources]`` | the real-model size table (``labkit.model_sizes``), all rows or some pipelines; or the model atlas (its sources) |
| ``paths`` | the reading paths (``docs/paths.yml``): the core path by evening, then the tracks, with reading times |
| ``glossary`` | every term of ``includes/abbreviations.md`` (the hover definitions), with the section that teaches it |
| ``taught-by PAGE[#ANCHOR]`` | which path teaches an interview question (``docs/paths.yml``: the core path's evening, or the track), linking the page |

``DIRECTIVES`` maps each name to its function; a name not in it fails the build.
"""

from __future__ import annotations

import hashlib
import html
import json
import posixpath
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.pages import Page

from infralens_docs import claims, diagrams, glossary, paths
from infralens_docs.registry import ROOT, Lab, read_front_matter
from infralens_docs.runner import StarterError, run_starter, starter_figures
from infralens_docs.serving import StarterRunError, describe

#: Figure files the pages use, site-relative destination -> generated source. The
#: ``on_post_build`` hook copies them into the site (SVGs are inlined instead).
GENERATED_FILES: dict[str, Path] = {}


@dataclass(frozen=True)
class Context:
    page: Page
    config: MkDocsConfig
    labs: list[Lab]

    @property
    def where(self) -> str:
        return self.page.file.src_uri

    def rel(self, target: str) -> str:
        """A link from this page to the docs-relative ``target``, as MkDocs expects."""
        return posixpath.relpath(target, posixpath.dirname(self.page.file.src_uri))

    def fail(self, message: str) -> PluginError:
        return PluginError(f"{self.where}: {message}")

    def starter_failed(self, message: str, command: str, stderr: str, code: int) -> StarterRunError:
        """A starter the page runs failed: the build fails with ``message``; under
        ``mkdocs serve`` the page shows the error instead (``hooks.on_page_markdown``)."""
        return StarterRunError(f"{self.where}: {message}", describe(command, stderr, code))


def is_page(path) -> bool:
    """Starters that render as pages: .py notebooks (runnable) and Markdown notes."""
    return path.suffix in {".py", ".md"}


def _starter_links(ctx: Context, lab: Lab) -> str:
    return ", ".join(
        f"[`{s.path.name}`]({ctx.rel(s.path.as_posix())})"
        if is_page(s.path)
        else f"`{s.path.name}`"
        for s in lab.starters
    )


def _section_title(section: str) -> str:
    meta = read_front_matter(ROOT / "docs" / "handbook" / f"{section}.md")
    return str(meta.get("title", section))


def _labs_rows(ctx: Context, labs: list[Lab]) -> str:
    rows = ["| Lab | Question it answers | Starter files | Runs |", "|---|---|---|---|"]
    for lab in labs:
        runs = "yes" if any(s.runnable for s in lab.starters) else "reading"
        name_link = f"[{lab.name}]({ctx.rel(lab.page.as_posix())})"
        rows.append(f"| {name_link} | {lab.question} | {_starter_links(ctx, lab)} | {runs} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- directives


def run(ctx: Context, args: list[str]) -> str:
    if not args:
        raise ctx.fail("infralens:run needs a starter path")
    starter, flags = args[0], args[1:]
    expect_error = flags[:1] == ["--expect-error"]
    if expect_error:
        flags = flags[1:]
    result = run_starter(starter, flags)
    if expect_error:
        if result.returncode == 0 or result.stdout or len(result.stderr.strip().splitlines()) != 1:
            raise ctx.starter_failed(
                f"`{result.command}` should fail with one line",
                result.command, result.stderr, result.returncode,
            )  # fmt: skip
        shown = f"$ {result.command}\n{result.stderr.rstrip()}\n$ echo $?\n{result.returncode}"
    else:
        if result.returncode != 0 or result.stderr:
            raise ctx.starter_failed(
                f"`{result.command}` exited {result.returncode}: {result.stderr.strip()}",
                result.command, result.stderr, result.returncode,
            )  # fmt: skip
        shown = f"$ {result.command}\n{result.stdout.rstrip()}"
    return f"```console\n{shown}\n```"


def first_screen(ctx: Context) -> list[str]:
    """The first screen's Markdown lines for a page on a reading path, from its front
    matter: what the reader will be able to do (``outcome``), why it matters for inference
    work (``why``), and what to read first (``prereqs``, docs-relative pages; by default
    the page before it on its path). Empty if the page gives no ``outcome``."""
    meta = ctx.page.meta
    if not str(meta.get("outcome", "")).strip():
        return []
    if not str(meta.get("why", "")).strip():
        raise ctx.fail("front matter gives an outcome but no 'why'")
    prereqs = meta.get("prereqs")
    step = paths.load_paths().step(ctx.where)
    if prereqs is None:  # the page before it on its path (the core path runs across evenings)
        order = paths.load_paths().order
        at = order.index(ctx.where) if step else 0
        prereqs = [order[at - 1]] if step and (step.index > 1 or step.on_core) and at else []
    for target in prereqs:
        if not (paths.DOCS / target).is_file():
            raise ctx.fail(f"prereqs names {target!r}, which is not a page")
    before = ", ".join(f"[{paths.page_title(t)}]({ctx.rel(t)})" for t in prereqs)
    return [
        f"**You will be able to** {str(meta['outcome']).strip()}",
        f"**Why it matters for inference work.** {str(meta['why']).strip()}",
        f"**Read first** {before or 'nothing on this site: Python, and PyTorch tensors'}.",
    ]


def lab_card(ctx: Context, args: list[str]) -> str:
    lab = next((lab for lab in ctx.labs if lab.page.as_posix() == ctx.where), None)
    if lab is None:
        raise ctx.fail("lab-card outside a registered lab page")
    sections = ", ".join(
        f"[{_section_title(s)}]({ctx.rel(f'handbook/{s}.md')})" for s in lab.sections
    )
    runnable = [s for s in lab.starters if s.runnable]
    run_line = (
        " ".join(f"`python3 {s.path.as_posix()}`" for s in runnable) if runnable else "reading only"
    )
    *intro, before = first_screen(ctx) or [""]
    # the facts a reader looks up, on one line, so the figure stays near the first screen
    where = [
        before.rstrip("."),
        f"**Starter files** {_starter_links(ctx, lab)} in `{lab.folder.as_posix()}/`",
        f"**Run** {run_line}",
        f"**Handbook** {sections}",
    ]
    lines = [f"**Question.** {lab.question}", *intro, " · ".join(w for w in where if w)]
    body = "".join(f"    {line}\n\n" for line in lines)
    return f'!!! abstract "Lab {lab.number:02d} at a glance"\n\n{body}'


def labs_table(ctx: Context, args: list[str]) -> str:
    return _labs_rows(ctx, ctx.labs)


def labs_for(ctx: Context, args: list[str]) -> str:
    if len(args) != 1:
        raise ctx.fail("labs-for takes one section id")
    labs = [lab for lab in ctx.labs if args[0] in lab.sections]
    if not labs:
        raise ctx.fail(f"no lab serves section '{args[0]}'")
    return _labs_rows(ctx, labs)


def _handbook_targets(ctx: Context) -> list[str]:
    handbook = next(
        (i["Handbook"] for i in ctx.config.nav or [] if isinstance(i, dict) and "Handbook" in i),
        [],
    )
    return [e if isinstance(e, str) else next(iter(e.values())) for e in handbook]


def sections_table(ctx: Context, args: list[str]) -> str:
    """Handbook section -> the labs that serve it, in the nav's section order."""
    rows = ["| Handbook section | Labs that serve it |", "|---|---|"]
    for target in _handbook_targets(ctx):
        section = posixpath.splitext(posixpath.basename(target))[0]
        labs = [lab for lab in ctx.labs if section in lab.sections]
        # A section no lab lists must say why in its front matter (``no_lab: ...``, e.g. the
        # interview page draws on every lab); anything else is a registry mistake.
        no_lab = read_front_matter(ROOT / "docs" / "handbook" / f"{section}.md").get("no_lab")
        if not labs and not no_lab:
            raise ctx.fail(f"no lab serves section '{section}' (and it gives no 'no_lab' reason)")
        if labs and no_lab:
            raise ctx.fail(f"section '{section}' says no_lab, but labs list it")
        links = ", ".join(f"[Lab {lab.number:02d}]({ctx.rel(lab.page.as_posix())})" for lab in labs)
        links = links or str(no_lab)
        rows.append(f"| [{_section_title(section)}]({ctx.rel(target)}) | {links} |")
    return "\n".join(rows)


def _versions_line() -> str:
    v = claims.verified_versions()
    return f"diffusers {v['diffusers']} (torch {v['torch']})"


def verified_claims(ctx: Context, args: list[str]) -> str:
    """The claims this page's verify module checks (plus any shared MODULE named in args)."""
    modules = [claims.module_for_page(ctx.where)]
    modules += [claims.VERIFY_DIR / name for name in args]
    try:
        found = [(m, claims.read_claims(m)) for m in modules]
        versions = _versions_line()
    except claims.ClaimsError as exc:
        raise ctx.fail(str(exc)) from exc
    count = sum(len(c) for _, c in found)
    names = " and ".join(f"`{m.relative_to(ROOT).as_posix()}`" for m, _ in found)
    lines = [
        f'??? success "Checked against {versions}: {count} tests hold this page\'s claims"',
        "",
        f"    Each line is one test in {names}, run against the real library by `make verify`"
        " (and in CI). Claims not listed here are about the papers or the labs' own NumPy code.",
        "",
    ]
    lines += [f"    - {claim.text}" for _, found_claims in found for claim in found_claims]
    return "\n".join(lines) + "\n"


def verified_summary(ctx: Context, args: list[str]) -> str:
    """Every page with a verify module, in site order, and how many checks each holds."""
    pages = ["index.md"] + _handbook_targets(ctx) + [lab.page.as_posix() for lab in ctx.labs]
    modules = claims.page_modules()
    rows = ["| Page | Verify module | Tests |", "|---|---|---|"]
    for src in pages:
        module = modules.pop(claims.module_for_page(src).stem, None)
        if module is None:
            continue  # the contract test (tests/test_claims.py) requires one per claim page
        try:
            count = len(claims.read_claims(module))
        except claims.ClaimsError as exc:
            raise ctx.fail(str(exc)) from exc
        title = read_front_matter(ROOT / "docs" / src).get("title", src)
        rows.append(f"| [{title}]({ctx.rel(src)}) | `{module.name}` | {count} |")
    if modules:
        raise ctx.fail(f"verify modules that belong to no page: {sorted(modules)}")
    return f"Checked against {_versions_line()}.\n\n" + "\n".join(rows)


def page_dir(page) -> str:
    """The site folder a page's HTML file is in ("." for the home page), which raw HTML
    links are relative to, with or without directory URLs (the offline build has none)."""
    return posixpath.dirname(page.file.dest_uri) or "."


def figure(ctx: Context, args: list[str]) -> str:
    """A figure the starter draws: SVG charts inline (they follow the colour scheme),
    PNG images as files with their size set and lazy loading."""
    if len(args) < 2:
        raise ctx.fail("figure takes a starter path and a figure name")
    starter, name, flags = args[0], args[1], args[2:]
    try:
        directory = starter_figures(starter, flags)
    except StarterError as exc:
        raise ctx.starter_failed(str(exc), exc.command, exc.stderr, exc.returncode) from exc
    except (FileNotFoundError, RuntimeError) as exc:
        raise ctx.fail(str(exc)) from exc
    manifest = json.loads((directory / "figures.json").read_text(encoding="utf-8"))
    if name not in manifest:
        raise ctx.fail(f"{starter} saves no figure {name!r} (it saves {sorted(manifest)})")
    entry = manifest[name]
    alt, caption = html.escape(entry["alt"], quote=True), entry["caption"]
    if len(entry["alt"]) < 20:
        raise ctx.fail(f"figure {name!r} of {starter} needs a real alt text")
    path = directory / entry["file"]
    if path.suffix == ".svg":
        body = path.read_text(encoding="utf-8").strip()
        media = diagrams.chart_html(body, alt)
    else:
        data = path.read_bytes()
        width, height = struct.unpack(">II", data[16:24])  # the PNG IHDR chunk
        digest = hashlib.sha256(data).hexdigest()[:10]
        dest = f"assets/figures/{Path(starter).parent.name}/{name}-{digest}{path.suffix}"
        GENERATED_FILES[dest] = path
        src = posixpath.relpath(dest, page_dir(ctx.page))
        media = (
            f'<img src="{src}" alt="{alt}" width="{width}" height="{height}" '
            'loading="lazy" decoding="async">'
        )
    return (
        f'<figure class="lab-figure">\n{media}\n'
        f"<figcaption>{html.escape(caption)}</figcaption>\n</figure>\n"
    )


def diagram(ctx: Context, args: list[str]) -> str:
    """A diagram that is no starter's output (``infralens_docs.diagrams``), inline like a
    starter's SVG chart, its alt text as the figure's label."""
    if len(args) != 1:
        raise ctx.fail("diagram takes one name from tools/infralens_docs/diagrams.yml")
    try:
        drawn = diagrams.load(args[0])
    except diagrams.DiagramError as exc:
        raise ctx.fail(str(exc)) from exc
    alt = html.escape(drawn.alt, quote=True)
    return (
        f'<figure class="lab-figure">\n'
        f"{diagrams.chart_html(drawn.svg(), alt)}\n"
        f"<figcaption>{html.escape(drawn.caption)}</figcaption>\n</figure>\n"
    )


def model_sizes(ctx: Context, args: list[str]) -> str:
    """Parameter counts and weight bytes of the real models (tests/verify/test_model_sizes.py
    instantiates each from its published config on the meta device)."""
    from labkit import model_sizes as sizes

    try:
        table = sizes.render(args)
    except (OSError, KeyError, ValueError) as exc:
        raise ctx.fail(f"model-sizes: {exc}") from exc
    # Wrapped so the build tests can read the numbers the table shows: prose may quote
    # them (tests/test_build.py, shown_output), and they change when the data does. The
    # table stays Markdown (md_in_html), so hover definitions apply inside it; inside a
    # collapsed block md_in_html leaves its `markdown` attribute, which
    # hooks.on_page_content removes.
    return f'<div class="model-sizes" markdown>\n\n{table}\n\n</div>'


def reading_paths(ctx: Context, args: list[str]) -> str:
    """The home page's map: the core path by evening, then the tracks; each item with its
    kind and reading time, each part with its total (``infralens_docs.paths``)."""
    reading = paths.load_paths()

    def items(part) -> str:
        rows = []
        for number, page in enumerate(part.items, 1):
            shown, depth = paths.reading_minutes(page)
            kind = "lab" if page.startswith("labs/") else "section"
            extra = f", +{depth} min optional" if depth else ""
            if paths.exercise_minutes(page):
                extra += f", +{paths.exercise_minutes(page)} min exercise"
            rows.append(f"{number}. [{paths.page_title(page)}]({ctx.rel(page)}) · {kind}, {shown} min{extra}")  # fmt: skip
        return "\n".join(rows)

    core_total = sum(paths.total_minutes(e.items) for e in reading.evenings)
    out = [f"## {reading.core_title}", ""]
    exercises = sum(paths.exercise_minutes(p) for e in reading.evenings for p in e.items)
    reading_only = core_total - exercises
    out += [f"{reading.core_summary} About {paths.as_duration(reading_only)} of reading (prose and tables at {paths.WORDS_PER_MINUTE} words a minute, code and its output at {paths.CODE_LINES_PER_MINUTE} lines a minute) and {exercises} min of exercise; each evening's time counts both, and the optional minutes of a page's folds come on top.", ""]  # fmt: skip
    for evening in reading.evenings:
        out += [f"### {evening.title} ({paths.as_duration(paths.total_minutes(evening.items))})", ""]  # fmt: skip
        out += [items(evening), ""]
    out += ["## Tracks that go deeper", ""]
    out += ["Each track assumes the core path.", ""]
    for track in reading.tracks:
        out += [f"### {track.title} ({paths.as_duration(paths.total_minutes(track.items))})", ""]  # fmt: skip
        out += [track.summary, "", items(track), ""]
    return "\n".join(out)


def glossary_list(ctx: Context, args: list[str]) -> str:
    """The glossary page's list, from the file the snippets extension appends to every
    page: one source for the hover text and the page (``infralens_docs.glossary``)."""
    appended = ctx.config.mdx_configs.get("pymdownx.snippets", {}).get("auto_append") or []
    source = glossary.ABBREVIATIONS.relative_to(ROOT).as_posix()
    if source not in appended:
        raise ctx.fail(f"glossary: mkdocs.yml must auto_append {source} (pymdownx.snippets)")
    try:
        terms = glossary.read_terms()
        taught_in = ctx.page.meta.get("taught_in") or {}
        named_only = ctx.page.meta.get("named_only") or []
        return glossary.glossary_markdown(terms, taught_in, ROOT / "docs", ctx.rel, named_only)
    except glossary.GlossaryError as exc:
        raise ctx.fail(f"glossary: {exc}") from exc


def taught_by(ctx: Context, args: list[str]) -> str:
    """The tag above an interview question: the path its page is on, from
    ``docs/paths.yml``, so moving the page moves the tag."""
    if len(args) != 1:
        raise ctx.fail("taught-by needs one page (docs-relative, an #anchor allowed)")
    page, _, anchor = args[0].partition("#")
    step = paths.load_paths().step(page)
    if step is None:
        raise ctx.fail(f"taught-by: {page} is on no reading path")
    where = (
        f"the core path, {step.part.split(':')[0]}" if step.on_core else f"the {step.part} track"
    )
    link = ctx.rel(page) + (f"#{anchor}" if anchor else "")
    return f"Taught on {where}: [{paths.page_title(page)}]({link})\n{{: .taught-by }}"


DIRECTIVES: dict[str, Callable[[Context, list[str]], str]] = {
    "run": run,
    "lab-card": lab_card,
    "labs-table": labs_table,
    "labs-for": labs_for,
    "sections-table": sections_table,
    "verified-claims": verified_claims,
    "verified-summary": verified_summary,
    "figure": figure,
    "diagram": diagram,
    "model-sizes": model_sizes,
    "paths": reading_paths,
    "glossary": glossary_list,
    "taught-by": taught_by,
}
