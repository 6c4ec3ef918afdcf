"""The strict build, and what it produced: offline, complete, registry-driven."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infralens_docs.registry import ROOT, load_labs

pytestmark = pytest.mark.build

LABS = load_labs()
EXTERNAL_ASSET_RE = re.compile(
    r"""<(?:script|link|img|iframe|source|video|audio)\b[^>]*\b(?:src|href)=["']((?:https?:)?//[^"']+)["']""",
    re.I,
)
CSS_URL_RE = re.compile(r"url\(\s*['\"]?((?:https?:)?//[^)'\"]+)", re.I)
FILLER = [
    "Distributed training scales beyond one device",
    "A Transformer block turns token ids into vectors",
    "prefill, decode, batching, KV Cache",
    "Diffusion systems frame generation as iterative denoising",
]


def html_pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def test_every_page_loads_only_its_own_assets(built_site):
    """No script, stylesheet, font, image or frame comes from another host."""
    offenders = {}
    for page in html_pages(built_site):
        # rel="canonical" names the page's public address; the browser loads nothing from it.
        text = re.sub(r'<link rel="canonical"[^>]*>', "", page.read_text(encoding="utf-8"))
        found = EXTERNAL_ASSET_RE.findall(text)
        if found:
            offenders[str(page.relative_to(built_site))] = found
    for css in built_site.rglob("*.css"):
        found = CSS_URL_RE.findall(css.read_text(encoding="utf-8", errors="replace"))
        if found:
            offenders[str(css.relative_to(built_site))] = found
    assert offenders == {}


def test_no_web_fonts_and_no_math_script(built_site):
    for page in html_pages(built_site):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        assert "mathjax" not in text.lower() and "katex" not in text.lower(), page


def test_math_is_rendered_to_mathml(built_site):
    for name in ["handbook/objective/index.html", "handbook/forward-reverse/index.html"]:
        text = (built_site / name).read_text(encoding="utf-8")
        assert "<math" in text, f"{name} has no MathML"
        assert 'class="arithmatex"' not in text, f"{name} has unconverted TeX"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_lab_page_shows_code_and_real_output(built_site, lab):
    page = built_site / lab.page.with_suffix("") / "index.html"
    text = page.read_text(encoding="utf-8")
    assert "--8<--" not in text, "a snippet marker leaked into the page"
    assert "infralens:" not in text, "an unexpanded directive leaked into the page"
    assert 'class="language-python highlight"' in text
    assert 'class="language-console highlight"' in text
    # Every run directive became a console block holding what the starter prints
    # today: rerun each one (no cache) and find its command and output on the page.
    import html
    import shlex

    from infralens_docs.runner import run_starter

    consoles = [
        html.unescape(re.sub(r"<[^>]+>", "", block))
        for block in re.findall(
            r'<div class="language-console highlight">(.*?)</div>', text, re.DOTALL
        )
    ]
    source = (ROOT / "docs" / lab.page).read_text(encoding="utf-8")
    directives = re.findall(r"^<!-- infralens:run (.+?) -->$", source, re.MULTILINE)
    assert directives, f"{lab.page} shows no executed output"
    for directive in directives:
        path, *flags = shlex.split(directive)
        expect_error = flags[:1] == ["--expect-error"]
        run = run_starter(path, flags[1:] if expect_error else flags, cache=False)
        shown = (run.stderr if expect_error else run.stdout).strip()
        assert any(f"$ {run.command}" in c and shown in c for c in consoles), directive


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_runnable_starters_render_as_executed_notebooks(built_site, lab):
    for starter in lab.starters:
        if not starter.runnable:
            continue
        out = built_site / starter.path.with_suffix("") / "index.html"
        text = out.read_text(encoding="utf-8")
        assert "jp-OutputArea-output" in text, f"{starter.path} shows no executed output"
        article = text.split("<article")[1].split("</article>")[0]
        assert "<style" not in article, "inline notebook CSS was not stripped"
        assert "<script" not in article, "nbconvert scripts were not stripped"
        assert "clipboard-copy" not in article, "nbconvert's copy widget leaked"
        assert "--8&lt;--" not in article, "snippet markers leaked into the notebook"
        assert (out.parent / starter.path.name).is_file(), "the source download is missing"


def test_nav_and_labs_index_come_from_the_registry(built_site):
    index = (built_site / "labs" / "index.html").read_text(encoding="utf-8")
    home = (built_site / "index.html").read_text(encoding="utf-8")
    for lab in LABS:
        href = f"{lab.page.with_suffix('').name}/"
        assert href in index, f"labs index misses {lab.id}"
        assert lab.label.replace("·", "&middot;") in home or lab.label in home, (
            f"nav misses {lab.id}"
        )


def test_no_seed_filler_anywhere(built_site):
    for page in html_pages(built_site):
        text = page.read_text(encoding="utf-8")
        for phrase in FILLER:
            assert phrase not in text, f"seed filler in {page.relative_to(built_site)}: {phrase}"


def test_pages_have_descriptions(built_site):
    for page in html_pages(built_site):
        if page.name == "404.html":
            continue
        text = page.read_text(encoding="utf-8")
        assert re.search(r'<meta name="description" content="[^"]{20,}"', text), page


def test_generated_output_is_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    for entry in ["site/", ".venv/", ".cache/"]:
        assert entry in ignored


@pytest.mark.parametrize(
    "starter",
    [s.path for lab in LABS for s in lab.starters if s.runnable],
    ids=lambda p: p.name,
)
def test_notebook_page_prints_what_the_script_prints(built_site, starter):
    """Executed as a notebook (defaults, kernel argv ignored) the starter prints exactly
    what `python <starter>` prints: one file, two ways of running it, one result."""
    import html

    from infralens_docs.runner import run_starter

    page = (built_site / starter.with_suffix("") / "index.html").read_text(encoding="utf-8")
    outputs = re.findall(
        r'<div class="jp-RenderedText jp-OutputArea-output[^"]*"[^>]*>\s*<pre>(.*?)</pre>',
        page,
        re.DOTALL,
    )
    notebook_text = "".join(html.unescape(re.sub(r"<[^>]+>", "", o)) for o in outputs)
    script_text = run_starter(starter).stdout
    assert notebook_text.split() == script_text.split()


#: Numbers lab prose may quote that no run prints: constants, each with its reason.
PROSE_CONSTANTS = {
    "98.9%",  # on_mode of true data: 1 - exp(-4.5), stated in labkit.metrics
    "1.00",  # spread of true data, by construction of labkit.metrics.sample_quality
    "0.1",  # the lightest mode weight of labkit.default_mixture (0.4 / 0.3 / 0.2 / 0.1)
    "0.18215",  # SD 1.x vae.config.scaling_factor (AutoencoderKL default in diffusers)
}


def quoted_numbers(markdown_path: Path) -> set[str]:
    """Decimals in a page's prose: not in code, math, link targets or version strings."""
    md = markdown_path.read_text(encoding="utf-8")
    md = re.sub(r"\A---\n.*?\n---\n", "", md, flags=re.DOTALL)  # front matter
    for pattern in [r"```.*?```", r"`[^`]*`", r"\$\$.*?\$\$", r"\$[^$]*\$", r"\]\([^)]*\)"]:
        md = re.sub(pattern, " ", md, flags=re.DOTALL)  # code, math, link targets
    md = re.sub(r"\b\d+\.\d+\.\d+\b|Section \d+\.\d+|arXiv:\s*\d+\.\d+", " ", md)
    return set(re.findall(r"(?<![\w.])\d+\.\d+(?:e-\d+)?%?", md)) - PROSE_CONSTANTS


def shown_output(built_page: Path) -> str:
    """The text of a built page's code and console blocks (included code, real runs)."""
    import html

    page = built_page.read_text(encoding="utf-8")
    blocks = re.findall(
        r'<div class="language-(?:console|python|text) highlight">(.*?)</div>', page, re.DOTALL
    )
    return html.unescape(re.sub(r"<[^>]+>", "", " ".join(blocks)))


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_numbers_in_lab_prose_come_from_the_page_runs(built_site, lab):
    """Every decimal a lab page's prose quotes appears in that page's executed output or
    included code. A starter change that moves a number fails here instead of leaving
    the prose quoting a value the page no longer shows."""
    quoted = quoted_numbers(ROOT / "docs" / lab.page)
    shown = shown_output(built_site / lab.page.with_suffix("") / "index.html")
    assert sorted(n for n in quoted if n.rstrip("%") not in shown) == []


#: Handbook passages that quote diffusers' own numbers; tests/verify/test_handbook_claims.py
#: recomputes each of them with the installed diffusers.
VERIFIED_ELSEWHERE = re.compile(
    r"^\s*\| (`(?:leading|trailing|linspace)`|`linspace` \(default\)|`use_karras_sigmas=True`|\d\.\d) \|.*$"
    r"|fractional \([\d., ]+, …\)",
    re.MULTILINE,
)


@pytest.mark.parametrize(
    "page", sorted((ROOT / "docs" / "handbook").glob("*.md")), ids=lambda p: p.stem
)
def test_numbers_in_handbook_prose_come_from_a_run(built_site, page, tmp_path):
    """Handbook sections may quote a lab's measured numbers: each must appear in some
    lab page's executed output (or the section's own code blocks). Quoted diffusers
    grids are checked against diffusers by the verify suite instead."""
    stripped = tmp_path / page.name
    stripped.write_text(VERIFIED_ELSEWHERE.sub(" ", page.read_text(encoding="utf-8")))
    shown = shown_output(built_site / "handbook" / page.stem / "index.html") + "".join(
        shown_output(built_site / lab.page.with_suffix("") / "index.html") for lab in LABS
    )
    assert sorted(n for n in quoted_numbers(stripped) if n.rstrip("%") not in shown) == []
