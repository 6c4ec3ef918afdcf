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
    # The first run block's output is what the starter prints today.
    from infralens_docs.runner import run_starter

    starter = next(s for s in lab.starters if s.runnable)
    first_line = run_starter(starter.path).stdout.splitlines()[0]
    assert first_line.split()[0] in text


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_runnable_starters_render_as_executed_notebooks(built_site, lab):
    for starter in lab.starters:
        if not starter.runnable:
            continue
        out = built_site / starter.path.with_suffix("") / "index.html"
        text = out.read_text(encoding="utf-8")
        assert "jp-OutputArea-output" in text, f"{starter.path} shows no executed output"
        assert "<style" not in text.split("<article")[1], "inline notebook CSS was not stripped"
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
