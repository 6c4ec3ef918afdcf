"""The real-model size data file is well-formed and the table renders all of it.

No torch needed: this reads ``labkit/model_sizes.json`` as installed with the package.
tests/verify/test_model_sizes.py checks the numbers against the real classes.
"""

from __future__ import annotations

import re

import pytest

from labkit import model_sizes

PIPELINES = ["SD 1.5", "SDXL", "SD3 Medium", "Flux.1-dev", "SD3.5 Large", "Qwen-Image"]
PIPELINES += ["Wan 2.1 T2V 14B", "Wan 2.1 T2V 1.3B"]
#: denoisers whose only published size is the rounded number in their name, which the count
#: misses by more than the tolerance; their note says so
NAMED_ONLY = {"Wan 2.1 T2V 1.3B"}


@pytest.fixture(scope="module")
def data() -> dict:
    return model_sizes.load()


def test_data_file_is_well_formed(data):
    """The data file names its versions, byte sizes and tolerance, and one row per (pipeline, component) of eight pipelines."""
    assert set(data["versions"]) == {"diffusers", "transformers", "torch"}
    assert all(re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", v) for v in data["versions"].values())
    assert data["bytes_per_element"] == {"fp32": 4, "fp16": 2, "bf16": 2}
    assert 0 < data["published_rtol"] <= 0.05
    keys = [(row["pipeline"], row["component"]) for row in data["components"]]
    assert len(keys) == len(set(keys))
    assert list(dict.fromkeys(p for p, _ in keys)) == PIPELINES
    for row in data["components"]:
        assert row["library"] in {"diffusers", "transformers"}
        assert isinstance(row["params"], int) and row["params"] > 0
        assert isinstance(row["config"], dict) and row["config"]


def test_bytes_are_params_times_element_size(data):
    """Each row's bytes are its parameter count times 4 (fp32), 2 (fp16) and 2 (bf16)."""
    for row in data["components"]:
        assert row["bytes"] == {
            "fp32": 4 * row["params"],
            "fp16": 2 * row["params"],
            "bf16": 2 * row["params"],
        }


def test_every_row_states_its_source(data):
    """Every row names the public repository (at a commit) or paper its config comes from."""
    for row in data["components"]:
        assert re.search(r"[\w.-]+/[\w.-]+@[0-9a-f]{12} \S+", row["source"]), row["source"]


def test_published_figures_are_complete_and_agree(data):
    """Each published figure has its number, short citation, covered components and source, and the recorded counts agree with it within the stated tolerance."""
    checked = 0
    for row in data["components"]:
        if row["published"] is None:
            assert (
                row["published_params"] is row["published_covers"] is row["published_cite"] is None
            )
            continue
        checked += 1
        assert re.match(r"~?[\d.]+[MB]\b.* \(.+\)$", row["published"]), row["published"]
        assert row["published_cite"] and row["published_params"] > 0
        components = {
            r["component"] for r in data["components"] if r["pipeline"] == row["pipeline"]
        }
        assert row["component"] in row["published_covers"]
        assert set(row["published_covers"]) <= components
        diff = model_sizes.published_agreement(row, data["components"])
        assert abs(diff) <= data["published_rtol"], (row["pipeline"], row["component"], diff)
    assert checked >= 4  # at least every denoiser


def test_every_denoiser_has_a_published_figure(data):
    """Every pipeline's denoiser (UNet or transformer) is checked against a published total, except one known only by the rounded size in its name, whose note says how far the count is from it."""
    denoisers = [r for r in data["components"] if r["component"] in {"unet", "transformer"}]
    assert [r["pipeline"] for r in denoisers] == PIPELINES
    assert all(r["published"] for r in denoisers if r["pipeline"] not in NAMED_ONLY)
    for row in denoisers:
        if row["pipeline"] in NAMED_ONLY:
            assert row["published"] is None and "name" in row["note"]


def test_markdown_table_renders_every_row(data):
    """markdown_table() renders one table row per component, with its size and published cell, under a caption that states what is counted."""
    table = model_sizes.markdown_table()
    caption, _, rest = table.partition("\n\n")
    assert "parameters only" in caption and "GB = 10⁹ bytes" in caption
    for name, version in data["versions"].items():
        assert f"{name} {version}" in caption
    body = [line for line in rest.splitlines() if line.startswith("| ")][1:]  # minus header
    assert len(body) == len(data["components"])
    for line, row in zip(body, data["components"], strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[:3] == [row["pipeline"], f"`{row['component']}`", f"`{row['class']}`"]
        assert cells[3] == model_sizes.format_params(row["params"])
        assert cells[4] == model_sizes.format_gb(row["bytes"]["fp32"])
        assert cells[5] == model_sizes.format_gb(row["bytes"]["fp16"])
        assert ("counted" in cells[6]) == (row["published"] is not None)
    notes = [line for line in rest.splitlines() if line.startswith("- ")]
    assert len(notes) == sum(1 for row in data["components"] if row["note"])


def test_markdown_table_selects_pipelines_and_adds_totals(data):
    """markdown_table() can show chosen pipelines only, with a summed total row each, and rejects unknown names."""
    table = model_sizes.markdown_table(["SDXL", "Flux.1-dev"], totals=True, notes=False)
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert {line.split(" | ")[0].lstrip("| ") for line in rows} == {"SDXL", "Flux.1-dev"}
    flux = sum(r["params"] for r in data["components"] if r["pipeline"] == "Flux.1-dev")
    assert f"| Flux.1-dev | **total** |  | **{model_sizes.format_params(flux)}** |" in table
    assert not any(line.startswith("- ") for line in table.splitlines())
    with pytest.raises(ValueError, match="unknown pipeline"):
        model_sizes.markdown_table("SD 2.1")


def test_size_formats():
    """Parameter counts print as M below a billion and B from a billion; bytes in GB of 10⁹."""
    assert model_sizes.format_params(859_520_964) == "859.5 M"
    assert model_sizes.format_params(2_567_463_684) == "2.57 B"
    assert model_sizes.format_gb(3_438_083_856) == "3.44 GB"


def test_the_size_table_is_shown_on_one_page_only():
    """The size table is shown on one page, Memory's, where weights memory is taught, and
    unfolded there; another page may keep a few of its pipelines' rows in a collapsed block
    (issue 32: the reader met the whole table on Memory, Serving and
    Interview). A directive outside a ``???`` block starts its line; inside one it is
    indented; with no pipeline named it renders every row."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    directives = [
        (page.relative_to(docs).as_posix(), line)
        for page in docs.rglob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith("<!-- infralens:model-sizes")
    ]
    atlas = [(p, line) for p, line in directives if "--atlas" in line]  # the atlas: models.md
    assert atlas == [("handbook/models.md", "<!-- infralens:model-sizes --atlas -->"), ("handbook/models.md", "    <!-- infralens:model-sizes --atlas-sources -->")]  # fmt: skip
    directives = [d for d in directives if d not in atlas]
    unfolded = [(page, line) for page, line in directives if not line[0].isspace()]
    whole = [page for page, line in directives if line.strip() == "<!-- infralens:model-sizes -->"]
    assert unfolded == [("handbook/memory.md", "<!-- infralens:model-sizes -->")]
    assert whole == ["handbook/memory.md"]


def test_atlas_table_renders_every_family(data):
    """The model-sizes directive's ``--atlas`` renders one row per atlas family, with its
    pipeline kind, parameters and tokens, and ``--atlas-sources`` one source line per family."""
    table = model_sizes.render(["--atlas"])
    body = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(body) == len(data["atlas"]) >= 16
    for line, row in zip(body, data["atlas"], strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == row["family"] and f"`{row['pipeline']}`" in cells[1]
        assert ("modular only" in cells[1]) == (row["kind"] == "modular only")
        assert model_sizes.format_params(row["denoiser_params"]) in cells[4]
        assert (row["tokens"] is None) == ("UNet" in cells[7])
        if row["tokens"] is not None:
            assert cells[7].startswith(f"{row['tokens']:,} at ")
    sources = model_sizes.render(["--atlas-sources"]).splitlines()
    assert [s.split(":", 1)[0] for s in sources] == ["- " + r["family"] for r in data["atlas"]]
    for line, row in zip(sources, data["atlas"], strict=True):
        assert row["denoiser_source"] in line and row["vae_source"] in line
    assert model_sizes.render([]) == model_sizes.markdown_table(None, totals=True)


def test_atlas_sources_render_as_written():
    """The atlas's Sources fold, rendered by Python-Markdown (emphasis as on the site),
    shows every source a row records as written, but for the Markdown the source means (its
    code spans' backticks, a quote's bold): a dunder name (``__main__``, ``__init__``) is
    not taken for emphasis (model_sizes._literal_markdown)."""
    import html

    import markdown

    rendered = markdown.markdown(
        model_sizes.atlas_table(sources=True), extensions=["attr_list", "md_in_html"]
    )  # fmt: skip
    text = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    recorded = [
        source
        for row in model_sizes.load()["atlas"]
        for key, value in row.items()
        if key.endswith("_source") or key == "text_encoder_sources"
        for source in (value.values() if isinstance(value, dict) else [value])
        if isinstance(source, str) and source
    ]
    assert any("__main__" in source for source in recorded)
    meant = [re.sub(r"`|\*\*", "", source) for source in recorded]  # code spans, bold
    assert [source for source in meant if source not in text] == []
