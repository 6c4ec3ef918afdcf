"""Diagrams are drawn, not typed: no page on a reading path draws one in characters, each
diagram of ``tools/infralens_docs/diagrams.yml`` draws inside its width with its text
equivalent, and every chart on every built page keeps its text at 8 px or more on a phone
(its min-width; tests/test_browser.py measures the text as rendered at 390 px)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import yaml

from infralens_docs import diagrams, paths
from infralens_docs.registry import ROOT

SVG = "{http://www.w3.org/2000/svg}"
#: a call or tensor name as a diagram writes it: a name called, or one with a dot or an
#: underscore (``scheduler.step(``, ``noise_pred``, ``randn(``)
NAME_RE = re.compile(r"[A-Za-z_][\w.]*\w(?=\()|[A-Za-z_]\w*(?:[._]\w+)+")
#: a checkpoint family or a pipeline class
FAMILY_RE = r"\bSD \d|\bStableDiffusion\w*Pipeline\b|\bFLUX\.1\b"


def code_names(text: str) -> set[str]:
    return set(NAME_RE.findall(text))


def test_no_page_on_a_path_draws_a_diagram_in_characters():
    drawn = {}
    for page in paths.load_paths().order:
        found = diagrams.ascii_diagrams((paths.DOCS / page).read_text(encoding="utf-8"))
        if found:
            drawn[page] = found
    assert drawn == {}, "draw these with <!-- infralens:diagram NAME --> (diagrams.yml)"


@pytest.mark.parametrize(
    ("block", "drawn"),
    [
        ("```text\nx0   noise\n |     |\n +--+--+\n    v\nx_t\n```\n", True),
        ("```text\nrequests ──> [text queue] ──> text encoder\n```\n", True),
        ("    ```text\n    x\n     ├─ base_layer(x)\n    ```\n", True),
        ("```text\nfor t in timesteps:\n |  latents = step(...)\n v\n```\n", True),
        ("```text\nsteps  mode acc  spread\n   20    0.912   0.31\n```\n", False),
        ("```python\nx = a -> b\n```\n", False),
    ],
)
def test_a_drawing_in_characters_is_found(block, drawn):
    assert bool(diagrams.ascii_diagrams(block)) is drawn


@pytest.mark.parametrize("name", sorted(yaml.safe_load(diagrams.DIAGRAMS_FILE.read_text())))
def test_each_diagram_draws_its_rows_inside_its_width(name):
    diagram = diagrams.load(name)
    root = ET.fromstring(diagram.svg())
    assert root.get("viewBox").split()[2] == str(diagrams.WIDTH)
    texts = {t.text for t in root.iter(SVG + "text")}
    for stage, operation, lines in diagram.rows:
        assert {stage, operation, *lines} <= texts
    # the alt text is the figure's text equivalent: it names every call and tensor of each
    # row (its operation and the first line beside its arrow), and a shape drawn for one
    # family (SD 1.x's 4 latent channels, CLIP ViT-L's 768) comes with the family's name
    for _, operation, lines in diagram.rows:
        # and the tensor the first line starts with, even a plain one (latents, image, x0)
        first = re.match(r"\W*([A-Za-z_]\w*)", lines[0]).group(1)
        names = code_names(operation) | code_names(lines[0]) | {first}
        missing = {name for name in names if not re.search(rf"\b{re.escape(name)}\b", diagram.alt)}
        assert missing == set(), operation
    drawn = " ".join(line for _, _, lines in diagram.rows for line in lines)
    if re.search(r"\(B, (?:4|77), ", drawn):
        for text in (diagram.caption, diagram.alt):
            assert re.search(FAMILY_RE, text), f"{name}: which family's shapes? {text[:60]}"
    # a phone shows it whole: its min-width fits the 358 px a page's column has at 390 px
    shown = diagrams.chart_html(diagram.svg(), diagram.alt)
    assert int(re.search(r"min-width:(\d+)px", shown).group(1)) <= 358


def test_a_chart_keeps_its_smallest_text_at_8_px():
    svg = '<svg class="lab-chart" viewBox="0 0 800 420"><text font-size="9.5">a</text></svg>'
    assert 'style="min-width:674px"' in diagrams.chart_html(svg, "alt")  # 800 * 8 / 9.5
    plain = '<svg class="lab-chart" viewBox="0 0 640 360"><text>a</text></svg>'
    assert 'style="min-width:394px"' in diagrams.chart_html(plain, "alt")  # 640 * 8 / 13


def test_a_diagram_that_overruns_its_width_fails_the_build(tmp_path):
    file = tmp_path / "diagrams.yml"
    alt = "a diagram whose label is far too long to fit beside its arrow"
    file.write_text(yaml.safe_dump({"d": {"alt": alt, "caption": "c",
                                          "rows": [["s", "op()", ["x" * 40]]]}}))  # fmt: skip
    with pytest.raises(diagrams.DiagramError, match="overruns"):
        diagrams.load("d", file)
    with pytest.raises(diagrams.DiagramError, match="no diagram"):
        diagrams.load("e", file)


def test_every_chart_on_every_page_keeps_its_text_at_8_px_on_a_phone(built_site):
    """Every inline SVG chart (a starter's, a diagram's, on a lab page or a notebook page)
    has a min-width at which its smallest text, at the size site.css or the chart gives
    it, renders at 8 px."""
    css = (ROOT / "docs" / "assets" / "stylesheets" / "site.css").read_text(encoding="utf-8")
    font = int(re.search(r"\n\.lab-chart \{[^}]*font-size: (\d+)px", css).group(1))
    assert font == diagrams.FONT_PX
    small, charts = [], 0
    for html in sorted(built_site.rglob("*.html")):
        text = html.read_text("utf-8")
        for svg in re.findall(r'<svg [^>]*class="lab-chart".*?</svg>', text, re.DOTALL):
            charts += 1
            tag = svg[: svg.index(">")]
            width = float(re.search(r'viewBox="0 0 ([\d.]+) ', tag).group(1))
            sizes = [float(v) for v in re.findall(r'font-size="([\d.]+)"', svg)]
            least = re.search(r'style="min-width:(\d+)px"', tag)
            if not least or int(least.group(1)) * min([font, *sizes]) / width < 8:
                small.append(f"{html.relative_to(built_site)}: {tag[:120]}")
    assert charts > 50
    assert small == []
