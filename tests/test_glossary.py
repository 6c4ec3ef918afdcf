"""The glossary: one file of definitions (includes/abbreviations.md), shown twice.

Every page gets the file appended (pymdownx.snippets ``auto_append``), so each term a page
writes as a word is an ``<abbr title="...">``; docs/glossary.md lists the same definitions,
each linked to the handbook section that teaches it. These tests hold the two uses to one
source, and each link to a section that really names its term.
"""

from __future__ import annotations

import functools
import html
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import yaml

from infralens_docs import glossary
from infralens_docs.registry import ROOT, read_front_matter

TERMS = glossary.read_terms()
HOVER = [t for t in TERMS if not t.is_code]
DOCS = ROOT / "docs"
#: a hover definition shows as a tooltip on every occurrence: one short sentence
MAX_WORDS = {"hover": 20, "code": 25}


def words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][\w'.-]*", text))


def mkdocs_config() -> dict:
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !ENV, !relative
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=loader)


# --------------------------------------------------------------------------- the source


def test_every_page_gets_the_abbreviations_file():
    extensions = {}
    for entry in mkdocs_config()["markdown_extensions"]:
        extensions.update(entry if isinstance(entry, dict) else {entry: None})
    assert "abbr" in extensions
    appended = extensions["pymdownx.snippets"]["auto_append"]
    assert glossary.ABBREVIATIONS.relative_to(ROOT).as_posix() in appended


@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.name)
def test_definitions_are_one_short_sentence(term):
    kind = "code" if term.is_code else "hover"
    assert words(term.definition) <= MAX_WORDS[kind], (
        f"{term.name}: keep it under {MAX_WORDS[kind]} words"
    )
    assert term.definition.endswith(".") and ". " not in term.definition, term.name


def test_every_term_links_a_handbook_section_that_exists():
    """Without a build: the glossary page's ``taught_in`` names every term, and each target
    is a heading of a handbook page (the directive fails the build on the same rules)."""
    taught_in = read_front_matter(DOCS / "glossary.md")["taught_in"]
    assert sorted(taught_in) == sorted(t.name for t in TERMS)
    for name, target in taught_in.items():
        assert glossary.section_title(DOCS, target), name


def test_a_term_no_section_teaches_links_where_it_is_named_and_says_so():
    """Without a build: Heun, KDPM2 and UniPC (the scheduler page only names them: Heun's
    call count, which schedulers rescale or keep state, which take flow sigmas) and APG and
    PAG (named by the pipeline page's modular section; Lab 22 teaches them), which no handbook
    section teaches, are the glossary page's ``named_only`` terms, so their entries say "Named
    in", every other entry "Taught in", and a ``named_only`` name that is no term fails. The
    page's description says so too."""
    meta = read_front_matter(DOCS / "glossary.md")
    named_only = meta.get("named_only") or []
    assert {"Heun", "KDPM2", "UniPC"} <= set(named_only)
    assert "names it" in meta["description"], "the description says every link teaches"
    body = (DOCS / "glossary.md").read_text(encoding="utf-8").split("\n---\n", 1)[1]
    assert "stated, with its tests, on the linked section" not in body
    listed = glossary.glossary_markdown(TERMS, meta["taught_in"], DOCS, str, named_only)
    said = dict(re.findall(r"\{ #([\w-]+) \}\n:   .*\n\n    (Named|Taught) in: \[", listed))
    assert said == {t.anchor: "Named" if t.name in named_only else "Taught" for t in TERMS}
    with pytest.raises(glossary.GlossaryError, match="named_only"):
        glossary.glossary_markdown(TERMS, meta["taught_in"], DOCS, str, ["KDPM3"])


#: a diffusers class a definition names: what it says of one is library behaviour
DIFFUSERS_CLASS = re.compile(r"\b[A-Z]\w*(?:Pipeline|Scheduler)\b")


def test_the_glossary_page_does_not_say_its_definitions_state_no_behaviour():
    """Without a build: some definitions state what a diffusers class does (``s_churn``'s
    StableDiffusionPipeline, ``prediction_type``'s FlowMatchEulerDiscreteScheduler), and not
    always on the section they link (``latents``' single decode is on the pipeline page), so
    the page does not say a definition gives a term's meaning only."""
    stating = [t.name for t in TERMS if DIFFUSERS_CLASS.search(t.definition)]
    assert {"s_churn", "prediction_type"} <= set(stating)
    body = (DOCS / "glossary.md").read_text(encoding="utf-8").split("\n---\n", 1)[1]
    assert "meaning only" not in body


#: clauses of hover definitions cut for stating library behaviour no test takes: (term, words)
UNTESTED_CLAUSES = [("Heun", "last step"), ("PNDM", "skip_prk_steps")]


def first_sentence_of(module: str, test: str) -> str:
    """The first paragraph of a verify test's docstring (the sentence it checks), whitespace
    folded, read with ``ast`` from ``tests/verify/<module>``."""
    import ast

    tree = ast.parse((ROOT / "tests" / "verify" / module).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test)
    return " ".join(ast.get_docstring(node).split("\n\n")[0].split())


def test_code_definitions_say_only_what_a_verify_test_shows():
    """Without a build: ``PipelineState``'s definition names the object and states no
    behaviour: not that a call returns it (only at ``output=None``), that it holds what the
    blocks write (the loop's ``noise_pred``, SDXL's ``time_ids`` and ``extra_step_kwargs`` are
    written to a ``BlockState`` and not kept), nor what SDXL's blocks write "with the prompt
    embeddings passed in": SDXL's shipped ``StableDiffusionXLAutoBlocks`` ignores passed
    prompt embeddings (modular_pipeline.py:3026 warns) and runs its text-encoder block, and
    test_page_pipeline.py's block-writes test pops that block, the IP-Adapter's and the VAE
    encoder's, so two of its five top-level blocks ran; ``init_noise_sigma``'s Euler value is
    its set grid's ``sigmas.max()``, as test_page_scheduler.py::test_init_noise_sigma_per_class_and_spacing
    has it, not "sigma_max" (under leading spacing with steps_offset 1, SDXL's config, 50
    steps give 13.16, not the sqrt(14.61^2 + 1) a schedule's sigma_max gives), and
    ``EulerDiscreteScheduler``'s only (``FlowMatchEulerDiscreteScheduler`` has none)."""
    definitions = {t.name: t.definition for t in TERMS}
    state = definitions["PipelineState"]
    for untested in ("one state", "read and write", "call returns", "values its blocks write",
                     "SDXL", "prompt embeddings", "writes", "declares"):  # fmt: skip
        assert untested not in state, untested
    assert state == "A modular pipeline's keyed state object, in diffusers.modular_pipelines."
    sigma = definitions["init_noise_sigma"]
    assert "sigma_max" not in sigma and "Euler's" not in sigma
    assert "for EulerDiscreteScheduler its grid's sigmas.max(), or sqrt(sigmas.max()^2 + 1) under leading spacing" in sigma  # fmt: skip
    tested = first_sentence_of(
        "test_page_scheduler.py", "test_init_noise_sigma_per_class_and_spacing"
    )
    assert "`EulerDiscreteScheduler` it is `sigmas.max()`" in tested
    assert "`(sigmas.max()**2 + 1) ** 0.5` under `leading`" in tested


def test_hovers_state_no_untested_step_rule():
    """Without a build: the Heun and PNDM hovers, shown on every page, name their schedulers
    and no step rule of them (HeunDiscreteScheduler's last step, PNDMScheduler's pseudo
    Runge-Kutta steps unless ``skip_prk_steps``), which no verify test takes."""
    definitions = {t.name: t.definition for t in TERMS}
    for name, words_ in UNTESTED_CLAUSES:
        assert words_ not in definitions[name], name
        assert re.search(rf"\b{name}\w*Scheduler in diffusers", definitions[name]), name


# --------------------------------------------------------------------------- the README

README = ROOT / "README.md"


def readme_section(title: str) -> str:
    """One ``## title`` section of the README, whitespace folded."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert match, title
    return " ".join(match.group(1).split())


def help_text(path: Path) -> str:
    """What ``python3 PATH --help`` prints, run in this process (``runpy``, as ``__main__``):
    the starter's own parser, without an interpreter and NumPy import per starter."""
    import contextlib
    import io
    import runpy
    import sys

    out, argv, syspath = io.StringIO(), sys.argv, list(sys.path)
    sys.argv = [str(path), "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, syspath
    assert stop.value.code in (0, None), path
    return out.getvalue()


def script_output(path: Path, *argv: str) -> tuple[str, int | str | None]:
    """(stdout and stderr, exit code) of ``python3 PATH ARGV...``, run in this process as
    :func:`help_text` does; the code is None for a script that ends without ``sys.exit``."""
    import contextlib
    import io
    import runpy
    import sys

    out, argv_, syspath, code = io.StringIO(), sys.argv, list(sys.path), None
    sys.argv = [str(path), *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.argv, sys.path[:] = argv_, syspath
    return out.getvalue(), code


def test_readme_names_the_starters_without_a_figures_flag():
    """README's "Run a lab from the terminal" and "Adding a lab": every runnable starter's
    ``--help`` lists ``--figures`` but an exercise's checker's (``check_*.py``, ``page:
    false``), and both sections say so. The run section speaks of the runnable starters
    (``runnable: true``) only: a blanks file answers ``--figures`` and ``--help`` with its
    one-line error, and lab 17's ``rebuild_diffusers.py`` (torch and diffusers) takes no flag
    at all, a bad one included; the Layout table names test_odd_input.py's set the same way."""
    from infralens_docs.registry import load_labs

    starters = [s for lab in load_labs() for s in lab.starters]
    runnable = [s for s in starters if s.runnable]
    without = [s for s in runnable if "--figures" not in help_text(ROOT / s.path)]
    assert without, "every starter takes --figures now: say so"
    assert all(not s.page and s.path.name.startswith("check_") for s in without), without
    assert len(without) < len(runnable)
    others = [s for s in starters if not s.runnable and s.path.suffix == ".py"]
    assert {s.path.name for s in others} >= {"spacing_blanks.py", "rebuild_diffusers.py"}
    for s in others:
        said, code = script_output(ROOT / s.path, "--figures", "/nonexistent", "--bogus")
        assert "--figures" not in said and code in (2, None), (s.path, code)
    section = readme_section("Run a lab from the terminal")
    assert "Each runnable starter (`runnable: true` in the registry) needs NumPy alone" in section
    assert "holds every runnable starter to that" in section
    assert "an exercise's checker, which takes no `--figures`" in section
    assert "`test_odd_input.py` (every runnable starter's flags on odd values)" in readme_section("Layout")  # fmt: skip
    adding = readme_section("Adding a lab")
    assert "(including `add_figures_argument`)" not in adding
    assert "all but an exercise's checker also take `--figures` (`add_figures_argument`)" in adding


#: labkit's exact denoisers: a starter that samples with one knows its denoiser exactly
EXACT = re.compile(r"\b(?:ExactDenoiser|FlowMatchDenoiser|FiniteSet|exact_prediction)\b")


def test_readme_says_only_the_sampling_labs_have_an_exact_denoiser():
    """README's opening: the labs that sample do it on toy data whose exact denoiser is known,
    not every lab: each runnable starter that calls a scheduler's ``step`` uses one of labkit's
    exact denoisers, while some labs (attention on random arrays, launch costs from a real
    model's shapes) use none."""
    from infralens_docs.registry import load_labs

    sources = {}
    for lab in load_labs():
        for s in lab.starters:
            if s.runnable and not s.path.name.startswith("check_"):
                sources.setdefault(lab.number, []).append((ROOT / s.path).read_text(encoding="utf-8"))  # fmt: skip
    sampling = [n for n, texts in sources.items() if any(".step(" in t for t in texts)]
    assert sampling and all(any(EXACT.search(t) for t in sources[n]) for n in sampling)
    assert [n for n, texts in sources.items() if not any(EXACT.search(t) for t in texts)]
    opening = " ".join(README.read_text(encoding="utf-8").split("## ", 1)[0].split())
    assert "Every lab runs real numerics with NumPy alone, offline, on toy data" not in opening
    assert "the labs that sample do it on toy data whose exact denoiser is known" in opening
    assert "Every claim the labs make" not in opening  # the honest bullet says what is held


def test_readme_names_the_pages_without_a_verify_module():
    """README's "How the site stays honest" does not say every claim about diffusers has a
    test: it names each docs page with no verify module (the glossary, whose hovers state
    some behaviour, the labs list and References), as References' "How facts are checked" does."""
    from infralens_docs.registry import load_labs

    with_module = {"index.md", *(f"handbook/{p.name}" for p in (DOCS / "handbook").glob("*.md"))}
    with_module |= {lab.page.as_posix() for lab in load_labs()}
    without = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} - with_module
    named = {"glossary.md": "the glossary", "labs/index.md": "the labs list", "references.md": "References"}  # fmt: skip
    assert without == set(named)
    section = readme_section("How the site stays honest")
    assert "Every claim about diffusers has a test" not in section
    bullet = section.split("**Claims about diffusers have tests**", 1)[1].split("- **", 1)[0]
    for page, words_ in named.items():
        assert words_ in bullet, page


# --------------------------------------------------------------------------- the built site

#: text in these is code, figures or markup a reader does not read as prose
SKIPPED = {"code", "pre", "kbd", "samp", "math", "svg", "script", "style", "figure", "abbr"}
#: the blocks Python-Markdown writes prose into; one with a class (other than an admonition's
#: title) is HTML a hook or a template added after Markdown, which no abbr reaches
BLOCKS = {"p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6"}
MARKDOWN_CLASSES = {None, "admonition-title"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class Prose(HTMLParser):
    """The article's prose text nodes (code, math, figures and abbrs skipped), and every
    ``<abbr>`` with its title."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []  # (tag, class)
        self.texts: list[str] = []
        self.abbrs: list[tuple[str, str]] = []  # (text, title)
        self._abbr: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        attrs = dict(attrs)
        self.stack.append((tag, attrs.get("class")))
        if tag == "abbr":
            self._title, self._abbr = attrs.get("title", ""), []

    def handle_endtag(self, tag):
        if tag in VOID or tag not in {t for t, _ in self.stack}:
            return
        while self.stack.pop()[0] != tag:
            pass
        if tag == "abbr" and self._abbr is not None:
            self.abbrs.append(("".join(self._abbr), self._title))
            self._abbr = None

    def handle_data(self, data):
        if self._abbr is not None:
            self._abbr.append(data)
        if any(tag in SKIPPED for tag, _ in self.stack):
            return
        block = next((c for tag, c in reversed(self.stack) if tag in BLOCKS), "")
        if block in MARKDOWN_CLASSES:
            self.texts.append(data)


def article(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    match = re.search(r"<article\b[^>]*>(.*)</article>", text, re.DOTALL)
    return match.group(1) if match else ""


def markdown_pages(site: Path) -> list[Path]:
    """Built pages whose content Python-Markdown rendered: not the notebook pages, which
    mkdocs-jupyter renders with its own Markdown (no abbr, no snippets)."""
    return [
        p
        for p in sorted(site.rglob("*.html"))
        if p.name != "404.html" and 'class="jupyter-wrapper"' not in p.read_text(encoding="utf-8")
    ]


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def shown_glossary(site: Path) -> dict[str, tuple[str, str]]:
    """The built glossary page: term id -> (definition shown, href of its section link)."""
    page = article(site / "glossary" / "index.html")
    entries = re.findall(r'<dt id="([^"]+)">.*?</dt>\s*<dd>\s*<p>(.*?)</p>\s*<p>(.*?)</p>', page, re.DOTALL)  # fmt: skip
    shown = {}
    for anchor, definition, taught in entries:
        links = re.findall(r'<a href="([^"]+)"', taught)
        assert len(links) == 1, f"glossary #{anchor}: one link to the section that teaches it"
        shown[anchor] = (text_of(definition), links[0])
    return shown


def word_re(term: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(term)}(?![A-Za-z0-9])")


@pytest.mark.build
def test_glossary_page_shows_every_definition_of_the_file(built_site):
    shown = shown_glossary(built_site)
    assert list(shown) == [t.anchor for t in glossary.alphabetical(TERMS)]
    for term in TERMS:
        assert shown[term.anchor][0] == term.definition, term.name


@pytest.mark.build
@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.name)
def test_glossary_link_reaches_a_section_that_names_the_term(built_site, term):
    """The link resolves to a built page and a heading on it, and the section under that
    heading (down to the next heading of its level) writes the term."""
    href = shown_glossary(built_site)[term.anchor][1]
    url = urlparse(urljoin("/glossary/", href))
    assert url.fragment, f"{term.name}: link a section, not a page"
    target = built_site / url.path.lstrip("/") / "index.html"
    assert target.is_file(), f"{term.name}: {href} is no page"
    text = target.read_text(encoding="utf-8")
    heading = re.search(rf'<h([1-6]) id="{re.escape(url.fragment)}"', text)
    assert heading, f"{term.name}: {href} names no heading"
    end = re.compile(rf"<h[1-{heading.group(1)}]\b").search(text, heading.end())
    section = text_of(text[heading.start() : end.start() if end else len(text)])
    assert word_re(term.name).search(section), f"{term.name}: {href} does not write it"


@pytest.mark.build
def test_every_prose_term_carries_its_hover_definition(built_site):
    """On every page Python-Markdown rendered, each hover term written as a word outside
    code is inside an ``<abbr>``, and every ``<abbr>`` shows the glossary page's definition."""
    shown = shown_glossary(built_site)
    definitions = {t.name: shown[t.anchor][0] for t in HOVER}
    # the same match as Python-Markdown's abbr: whole words, longest term first
    names = sorted(definitions, key=len, reverse=True)
    pattern = re.compile(rf"\b(?:{'|'.join(re.escape(n) for n in names)})\b")
    bare, wrong, used = {}, {}, set()
    for rel, parser in parsed_pages(built_site):
        found = sorted({m.group(0) for text in parser.texts for m in pattern.finditer(text)})
        if found:
            bare[rel] = found
        for text, title in parser.abbrs:
            if definitions.get(text) != title:
                wrong.setdefault(rel, []).append(text)
            if rel != "glossary/index.html":
                used.add(text)
    assert bare == {}, "terms in prose without their <abbr>"
    assert wrong == {}, "<abbr> titles that differ from the glossary page"
    assert sorted(set(definitions) - used) == [], "hover terms no page uses"


@pytest.mark.build
def test_the_glossary_page_says_where_the_hovers_are(built_site):
    """The glossary page says its definitions appear as hovers on every page but the
    starters' executed ones: those pages (mkdocs-jupyter renders their Markdown cells
    without Python-Markdown's ``abbr``) write the terms in their prose and carry no
    ``<abbr>``, while the pages Python-Markdown rendered carry them."""
    notebooks = [
        p for p in sorted(built_site.rglob("*.html"))
        if 'class="jupyter-wrapper"' in p.read_text(encoding="utf-8")
    ]  # fmt: skip
    names = sorted((t.name for t in HOVER), key=len, reverse=True)
    pattern = re.compile(rf"\b(?:{'|'.join(re.escape(n) for n in names)})\b")
    with_terms = []
    for page in notebooks:
        text = page.read_text(encoding="utf-8")
        assert "<abbr" not in text, f"{page}: a hover on an executed page"
        cells = re.findall(r"jp-RenderedMarkdown[^>]*>(.*?)</div>", text, re.DOTALL)
        prose = text_of(re.sub(r"<code>.*?</code>", " ", " ".join(cells), flags=re.DOTALL))
        if pattern.search(prose):
            with_terms.append(page)
    assert with_terms, "no executed page writes a glossary term: the exception is moot"
    assert any(parser.abbrs for _, parser in parsed_pages(built_site))
    said = text_of(article(built_site / "glossary" / "index.html"))
    assert "every page but the starters' executed ones" in said, (
        "the page promises hovers everywhere"
    )


@pytest.mark.build
def test_the_built_glossary_says_named_in_for_the_terms_no_section_teaches(built_site):
    """On the built glossary page, the entries of the ``named_only`` terms (APG, Heun,
    KDPM2, PAG, UniPC) link their section under "Named in" and every other entry under "Taught in":
    the directive reads the page's own front matter."""
    named_only = set(read_front_matter(DOCS / "glossary.md").get("named_only") or [])
    page = (built_site / "glossary" / "index.html").read_text(encoding="utf-8")
    said = {}
    for term in TERMS:
        entry = re.search(rf'<dt id="{re.escape(term.anchor)}".*?<dd>(.*?)</dd>', page, re.DOTALL)
        assert entry, f"no entry for {term.name}"
        label = re.search(r"\b(Named|Taught) in: ", text_of(entry.group(1)))
        said[term.name] = label.group(1) if label else None
    assert said == {t.name: "Named" if t.name in named_only else "Taught" for t in TERMS}


# --------------------------------------------------------------------------- the scheduler page

#: the section that teaches the samplers (issue 32: the page a reader called "the wall")
SCHEDULER_PAGE = "handbook/scheduler/index.html"
#: names it uses besides the stems of the scheduler classes it names
SAMPLER_WORDS = ["sigma", "Karras sigmas", "KDPM2"]
#: ``EulerDiscreteScheduler`` -> Euler, ``DPMSolverMultistepScheduler`` -> DPMSolver
STEM_RE = re.compile(
    r"\b([A-Z][A-Za-z0-9]*?)(?:Discrete|Multistep|Singlestep|Parallel)*Scheduler\b"
)


class Ordered(Prose):
    """:class:`Prose` that also keeps the prose text and the abbrs in page order:
    (text, the abbr's title, or None outside an abbr)."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, str | None]] = []

    def handle_data(self, data):
        before = len(self.texts)
        super().handle_data(data)
        if self._abbr is not None:
            self.events.append((data, self._title))
        elif len(self.texts) > before:
            self.events.append((data, None))


def sampler_names(markdown: str) -> list[str]:
    """The words for the samplers a page names: each scheduler class's stem, as the
    glossary spells it (DPMSolver -> DPM-Solver), and ``SAMPLER_WORDS``."""
    spelled = {t.name.replace("-", ""): t.name for t in HOVER}
    stems = {spelled.get(stem, stem) for stem in STEM_RE.findall(markdown)}
    return sorted(stems | set(SAMPLER_WORDS))


@pytest.mark.build
def test_scheduler_page_defines_each_sampler_name_at_first_use(built_site):
    """Each sampler name the scheduler page writes in prose (Euler, Heun, PNDM, DPM-Solver,
    UniPC, derived from the classes it names, and sigma, Karras sigmas, KDPM2) is a glossary
    term, and its first occurrence carries the hover definition; ``s_churn``, written as code,
    has its glossary entry."""
    markdown = (DOCS / "handbook" / "scheduler.md").read_text(encoding="utf-8")
    names = sampler_names(markdown)
    assert {"Euler", "Heun", "PNDM", "DPM-Solver", "sigma", "Karras sigmas"} <= set(names)
    definitions = {t.name: t.definition for t in HOVER}
    parser = Ordered()
    parser.feed(article(built_site / SCHEDULER_PAGE))
    undefined = {}
    for name in names:
        first = next(((text, title) for text, title in parser.events if word_re(name).search(text)), None)  # fmt: skip
        if name in SAMPLER_WORDS:
            assert first is not None, f"the scheduler page no longer writes {name}"
        if first is not None and (name not in definitions or first[1] != definitions[name]):
            undefined[name] = first[0]
    assert undefined == {}, "sampler names whose first use on the page has no hover definition"
    code_terms = {t.name for t in TERMS if t.is_code}
    assert "s_churn" in code_terms and "`s_churn`" in markdown


@pytest.mark.build
def test_scheduler_page_teaches_sigma_before_its_first_sigma_figure(built_site):
    """The page's first figure drawn in sigma comes after the sentence that teaches sigma:
    the word with its hover and the formula sigma_t = sqrt((1 - alpha_bar_t) / alpha_bar_t)."""
    page = article(built_site / SCHEDULER_PAGE)
    figures = [m for m in re.finditer(r"<figure\b.*?</figure>", page, re.DOTALL) if "sigma" in m.group(0)]  # fmt: skip
    assert figures, "the scheduler page has no figure drawn in sigma"
    before = page[: figures[0].start()]
    sigma = next(t for t in HOVER if t.name == "sigma")
    parser = Ordered()
    parser.feed(before)
    assert ("sigma", sigma.definition) in parser.events, "sigma has no hover before the figure"
    formulas = [html.unescape(f) for f in re.findall(r"<math\b.*?</math>", before, re.DOTALL)]
    assert any("σ" in f and "<msqrt>" in f and "α" in f for f in formulas), (
        "no formula for sigma before the first sigma figure"
    )


#: a word written right before or after an "Euler" hover -> the diffusers class it then means
EULER_CONTEXTS = {
    "flow-matching Euler": "FlowMatchEulerDiscreteScheduler",
    "Euler loop of a tiny Flux": "FlowMatchEulerDiscreteScheduler",
    "Euler Ancestral": "EulerAncestralDiscreteScheduler",
}


@functools.cache
def parsed_pages(site: Path) -> tuple[tuple[str, Ordered], ...]:
    """(path in the site, :class:`Ordered` parse of its article) for each page Python-Markdown
    rendered: parsed once per built site for the tests that read every page's prose (the
    built site does not change during a run; the parsers are only read)."""
    parsed = []
    for page in markdown_pages(site):
        parser = Ordered()
        parser.feed(article(page))
        parsed.append((page.relative_to(site).as_posix(), parser))
    return tuple(parsed)


def hover_contexts(site: Path, term: str) -> list[tuple[str, str, str]]:
    """Every ``<abbr>`` of ``term`` on the pages Python-Markdown rendered (the glossary page
    aside), as (page, the prose around it with the term in place, its title)."""
    found = []
    for rel, parser in parsed_pages(site):
        if rel == "glossary/index.html":
            continue
        prose, start = "".join(text for text, _ in parser.events), 0
        for text, title in parser.events:
            if title is not None and text == term:
                found.append((rel, prose[max(0, start - 40) : start + len(term) + 40], title))
            start += len(text)
    return found


@pytest.mark.build
def test_euler_hover_names_the_scheduler_each_page_means(built_site):
    """The Euler hover is true where it shows: next to "flow-matching" or a Flux loop it
    names FlowMatchEulerDiscreteScheduler, and in "Euler Ancestral" the ancestral class."""
    seen = set()
    for rel, context, title in hover_contexts(built_site, "Euler"):
        for phrase, cls in EULER_CONTEXTS.items():
            if phrase in " ".join(context.split()):
                seen.add(phrase)
                assert cls in title, f"{rel}: '{phrase}' shows a hover without {cls}"
    assert seen == set(EULER_CONTEXTS), "the site no longer writes some of these contexts"


@pytest.mark.build
def test_sigma_hover_sits_only_on_noise_levels(built_site):
    """The sigma hover defines a noise level; no page puts it on DiT's learned sigma, the
    variance channels of ``learn_sigma``, which are not one."""
    learned = [
        (rel, c) for rel, c, _ in hover_contexts(built_site, "sigma") if "learned sigma" in c
    ]
    assert learned == []


@pytest.mark.build
def test_no_hover_inside_a_chart(built_site):
    """No built page has an <abbr> inside an inline <svg>: SVG draws no text of an element
    it does not know, so a hover on a legend's or axis's word blanked it (lab 03's sigma
    charts, lab 08, 10, 12 and 14's)."""
    bad = {}
    for page in built_site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        for svg in re.findall(r"<svg\b.*?</svg>", text, re.DOTALL):
            found = re.findall(r"<abbr\b[^>]*>([^<]*)</abbr>", svg)
            if found:
                bad.setdefault(page.relative_to(built_site).as_posix(), []).extend(found)
    assert bad == {}
