"""The strict build, and what it produced: offline, complete, registry-driven."""

from __future__ import annotations

import functools
import hashlib
import html as html_lib
import json
import platform
import posixpath
import re
import shlex
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import TEST_REPO_URL, strict_build

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
            r'<div class="language-console highlight"[^>]*>(.*?)</div>', text, re.DOTALL
        )
    ]
    source = (ROOT / "docs" / lab.page).read_text(encoding="utf-8")
    directives = re.findall(r"^ *<!-- infralens:run (.+?) -->$", source, re.MULTILINE)
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
        if not (starter.runnable and starter.notebook):  # page: false is a file, no page
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


def link_texts(page_html: str, page_url: str, target: str, where: str = "") -> list[str]:
    """The texts of the links of ``page_html`` (those with ``where`` in their attributes)
    that lead to the site URL ``target``, whose page is at ``page_url``."""
    texts = []
    for attrs, inner in re.findall(r"<a\b([^>]*)>(.*?)</a>", page_html, re.DOTALL):
        href = re.search(r'href="([^"#]*)', attrs)
        if not href or where not in attrs or href.group(1).startswith(("http", "mailto")):
            continue
        url = posixpath.normpath(posixpath.join(page_url, href.group(1))).rstrip("/") + "/"
        if url == target:
            shown = re.sub(
                r"<span class=\"md-footer__direction\">.*?</span>", "", inner, flags=re.S
            )
            texts.append(" ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", shown)).split()))
    return texts


def test_nav_and_labs_index_come_from_the_registry(built_site):
    index = (built_site / "labs" / "index.html").read_text(encoding="utf-8")
    home = (built_site / "index.html").read_text(encoding="utf-8")
    for lab in LABS:
        href = f"{lab.page.with_suffix('').name}/"
        assert href in index, f"labs index misses {lab.id}"
        assert html_lib.escape(lab.name) in home, f"nav misses {lab.id}"


def test_each_lab_has_one_name_in_nav_footer_map_and_index(built_site):
    """The nav, the footer's previous/next links, the home page's map, the labs index and
    the page's own title all call a lab by the registry's name, "Lab 01: Forward Noise
    Process"; a prose link may say just "Lab 01"."""
    pages = {
        ("/" + p.relative_to(built_site).parent.as_posix().strip(".") + "/").replace("//", "/"): (
            p.read_text(encoding="utf-8")
        )
        for p in built_site.rglob("index.html")
    }
    home, index = pages["/"], pages["/labs/"]
    for lab in LABS:
        target = "/" + lab.page.with_suffix("").as_posix() + "/"
        own = pages[target]
        h1 = re.search(r"<h1\b[^>]*>(.*?)<a class=\"headerlink\"", own, re.DOTALL).group(1)
        assert html_lib.unescape(re.sub(r"<[^>]+>", "", h1)) == lab.name, lab.id
        assert f"<title>{html_lib.escape(lab.name)} - " in own, lab.id
        nav = home[
            home.index('<nav class="md-nav md-nav--primary') : home.index("md-sidebar--secondary")
        ]
        assert link_texts(nav, "/", target) == [lab.name], lab.id
        # the lab's own section: the nested item that holds its links (the innermost)
        section = [c for c in nav.split("md-nav__item--nested") if f'href="{target[1:]}"' in c][-1]
        label = re.search(r'<span class="md-ellipsis">\s*([^<]*?)\s*</span>', section)
        assert label.group(1) == lab.name, f"nav section of {lab.id}: {label.group(1)}"
        listed = link_texts(
            re.search(r"<article\b.*?</article>", index, re.DOTALL).group(0), "/labs/", target
        )
        assert listed == [lab.name], f"labs index: {lab.id}: {listed}"
        footer = [
            t
            for url, text in pages.items()
            for t in link_texts(text, url, target, "md-footer__link")
        ]
        assert footer and set(footer) == {lab.name}, f"footer names of {lab.id}: {set(footer)}"
        article = re.search(r"<article\b.*?</article>", home, re.DOTALL).group(0)
        in_map = link_texts(article, "/", target)
        assert in_map.count(lab.name) == 1, f"home page map: {lab.id}"
        assert set(in_map) <= {lab.name, f"Lab {lab.number:02d}"}, f"home page: {lab.id}: {in_map}"


def test_no_seed_filler_anywhere(built_site):
    for page in html_pages(built_site):
        text = page.read_text(encoding="utf-8")
        for phrase in FILLER:
            assert phrase not in text, f"seed filler in {page.relative_to(built_site)}: {phrase}"


def test_no_escaped_quote_reaches_a_page(built_site):
    """Markdown prints a backslash before a quote as is where it does not unescape it (an
    admonition's quoted title: `??? note "\\"scheduler\\" vs ..."` rendered `\\"scheduler\\"`):
    no page shows one outside code, in its text or its attributes."""
    code = re.compile(r"<(pre|code|script|style)\b.*?</\1>", re.S)
    found = []
    for page in html_pages(built_site):
        text = code.sub("", page.read_text(encoding="utf-8"))
        for m in re.finditer(r"\\(?:\"|&quot;|'|&#39;|&#x27;)", text):
            found.append(
                f"{page.relative_to(built_site)}: {text[max(0, m.start() - 40) : m.end() + 20]!r}"
            )
    assert found == []


def test_search_index_tags_each_teaching_section(built_site):
    """Every glossary term and every page's ``search_terms`` word is a tag of the one section
    that teaches it in the search index, which ranks a tag match first; the starters'
    notebook pages are not in the index (their lab guides are)."""
    from infralens_docs.search_terms import section_terms

    index = json.loads((built_site / "search" / "search_index.json").read_text(encoding="utf-8"))
    pages = {entry["location"].split("#")[0] for entry in index["docs"]}
    assert "labs/lab-10-memory-optimization-reading/" in pages
    assert [page for page in pages if page.startswith("code/")] == []
    tags = {entry["location"]: entry.get("tags", []) for entry in index["docs"]}
    terms = section_terms()
    assert "handbook/memory/#offload" in terms and "handbook/img2img/#img2img-start-the-loop-part-way" in terms  # fmt: skip
    for location, words in terms.items():
        assert set(words) <= set(tags[location]), location
    assert sum(len(words) for words in terms.values()) == sum(len(t) for t in tags.values())


def test_search_terms_fail_on_a_section_the_site_lacks(tmp_path, monkeypatch):
    """A term whose section is gone (a renamed heading) fails the build, by name."""
    from infralens_docs import search_slim
    from infralens_docs.search_terms import SearchTermError, _location, tag_sections

    monkeypatch.setattr(search_slim, "CACHE", tmp_path / "slim.json")

    pages = ("index.md", "labs/index.md#a", "handbook/memory.md#offload")
    assert [_location(t) for t in pages] == ["", "labs/#a", "handbook/memory/#offload"]
    assert [_location(t, directory_urls=False) for t in pages] == [
        "index.html",
        "labs/index.html#a",
        "handbook/memory.html#offload",
    ]
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "search_index.json").write_text('{"docs": [{"location": ""}]}')
    with pytest.raises(SearchTermError, match="handbook/memory/#offload"):
        tag_sections(tmp_path)


#: the search index's byte budget (issue 32 item 9): the browser's first search downloads it
#: and builds its lunr index from it, which takes time in proportion (1.97 MB before
#: infralens_docs.search_slim, 1.17 MB after)
SEARCH_INDEX_BUDGET = 1_400_000


def test_search_index_holds_no_code_blocks_or_claims_lists(built_site):
    """The search index's text has no code blocks and no verified-claims lists (the
    browser's first search indexes every word of it), and stays under its byte budget; of
    the words only those blocks had, those with a letter a-z are kept, in ``keywords``."""
    from infralens_docs.search_slim import CLAIMS_LEAD, FIELD

    path = built_site / "search" / "search_index.json"
    index = json.loads(path.read_text(encoding="utf-8"))
    assert path.stat().st_size <= SEARCH_INDEX_BUDGET, path.stat().st_size
    assert index["config"]["fields"][FIELD] == {"boost": 1.0}
    texts = {entry["location"]: entry["text"] for entry in index["docs"]}
    assert [loc for loc, text in texts.items() if "<pre>" in text] == []
    leads = [loc for loc, text in texts.items() if f"<p>{CLAIMS_LEAD}" in text]
    assert len(leads) > 10  # the claims' lead paragraph is kept ...
    assert [loc for loc in leads if re.search(f"<p>{CLAIMS_LEAD}.*?</p> ?<ul>", texts[loc])] == []
    keywords = " ".join(entry.get(FIELD, "") for entry in index["docs"]).split()
    assert len(keywords) > 1000  # ... and the words only the lists or code blocks had


def test_search_slim_keeps_each_lettered_word_the_page_lacks(tmp_path, monkeypatch):
    """search_slim takes code blocks and claims lists out of a section's text, and keeps
    in its ``keywords`` each of their words with a letter a-z that begins no word of the
    rest of the page, without stop words or the punctuation at a word's ends; a number
    only a code block had is not kept. A build whose index is the last one's reads the
    result back."""
    from infralens_docs import search_slim
    from infralens_docs.search_slim import slim_cached, slim_index

    lead = "<p>Each line is one test in <code>tests/verify/test_page_x.py</code>.</p>"
    claims = "<ul> <li><code>cpu_offload_with_hook</code> moves the unet.</li> </ul>"
    code = (
        "<pre><code>@torch.compile\nPipe(guidance_scale=7.5) # prose\n"
        "pipe(guidance_scale=7.5) * 0.18215</code></pre>"
    )
    data = {
        "config": {"separator": r"[\s\-]+", "fields": {"title": {"boost": 1000.0}}},
        "docs": [
            {"location": "p/", "title": "P", "text": "<p>Intro on torch.compile.</p>"},
            {
                "location": "p/#a",
                "title": "Guidance",
                "text": f"<p>Prose.</p> {code} <p>After.</p>",
            },
            {"location": "p/#t", "title": "What the tests check", "text": f"{lead} {claims}"},
            {"location": "q/", "title": "Q", "text": "<p>cpu_offload_with_hook elsewhere.</p>"},
        ],
    }
    original = json.loads(json.dumps(data))
    docs = {entry["location"]: entry for entry in slim_index(data)["docs"]}
    assert docs["p/#a"]["text"] == "<p>Prose.</p> <p>After.</p>"
    assert docs["p/#t"]["text"] == lead
    # "torch.compile" begins the intro's "torch.compile." (an unquoted query is a prefix), the
    # text keeps "prose", and "0.18215" has no letter: none of them is kept
    assert docs["p/#a"]["keywords"] == "pipe(guidance_scale=7.5"
    # another page's mention does not count: this page's claim is found on this page
    assert docs["p/#t"]["keywords"] == "cpu_offload_with_hook moves unet"
    assert "keywords" not in docs["p/"] and "keywords" not in docs["q/"]
    assert data["config"]["fields"]["keywords"] == {"boost": 1.0}

    monkeypatch.setattr(search_slim, "CACHE", tmp_path / "slim.json")
    text = json.dumps(original)
    assert slim_cached(text) == data  # slimmed, and kept
    monkeypatch.setattr(search_slim, "slim_index", None)  # not called again ...
    assert slim_cached(text) == data
    with pytest.raises(TypeError):  # ... unless the index changed
        slim_cached(text.replace("Prose", "Text"))


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
    [s.path for lab in LABS for s in lab.starters if s.runnable and s.notebook],
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


#: Numbers any page's prose may quote that no run prints: constants, each with its source.
PROSE_CONSTANTS = {
    "98.9%": "on_mode of true data: 1 - exp(-4.5), stated in labkit.metrics",
    "1.00": "spread of true data, by construction of labkit.metrics.sample_quality",
    "0.1": "the lightest mode weight of labkit.default_mixture (0.4 / 0.3 / 0.2 / 0.1)",
    "0.18215": "SD 1.x vae.config.scaling_factor (AutoencoderKL default in diffusers)",
}


def cited_numbers(markdown_path: Path) -> dict[str, str]:
    """A page's ``cited_numbers`` front matter: number as written -> its source (a paper's
    table, a model card). Those numbers come from the literature, not from a run."""
    from infralens_docs.registry import read_front_matter

    cited = read_front_matter(markdown_path).get("cited_numbers") or {}
    assert isinstance(cited, dict), f"{markdown_path}: cited_numbers must be a mapping"
    return {str(k): str(v) for k, v in cited.items()}


PROSE_LINKED_LAB = re.compile(r"\]\((?:[./]*labs/|\.\./)?(lab-\d\d-[a-z0-9-]+)(?:\.md|/)")
#: a link to a handbook section, from a section (``memory.md#...``) or a lab page
PROSE_LINKED_SECTION = re.compile(r"\]\((?:\.\./handbook/)?([a-z0-9-]+)\.md(?:#[^)]*)?\)")


def linked_size_tables(built_site: Path, written: str) -> list[str]:
    """The model-size tables of the handbook sections a prose block links to: the full table
    lives on one page (Memory's), and a block elsewhere that quotes a row links to it."""
    import html

    tables = []
    for name in sorted(set(PROSE_LINKED_SECTION.findall(written))):
        built = built_site / "handbook" / name / "index.html"
        if built.is_file():
            page = built.read_text(encoding="utf-8")
            found = re.findall(r'<div class="model-sizes"[^>]*>(.*?)</div>', page, re.DOTALL)
            tables += [html.unescape(re.sub(r"<[^>]+>", "", table)) for table in found]
    return tables


def prose_blocks(markdown_path: Path) -> list[tuple[str, set[str], str]]:
    """A page's prose, block by block (paragraphs, list items run together, table rows of one
    table): (the block's text, the lab pages it links to, the block as written, inline code and
    comments included). The first screen's ``outcome`` and ``why`` are blocks too; the rest of
    the front matter, code, math and a lab's prediction prompt (it offers wrong answers on
    purpose) are left out."""
    from infralens_docs.registry import read_front_matter

    md = markdown_path.read_text(encoding="utf-8")
    md = re.sub(r"\A---\n.*?\n---\n", "", md, flags=re.DOTALL)  # front matter
    meta = read_front_matter(markdown_path)  # the first screen shows `outcome` and `why`
    md = "\n\n".join([str(meta.get("outcome", "")), str(meta.get("why", "")), md])
    md = re.sub(r"^## Predict first\n.*?(?=^## )", "", md, flags=re.DOTALL | re.MULTILINE)
    for pattern in [r"```.*?```", r"\$\$.*?\$\$"]:
        md = re.sub(pattern, "\n\n", md, flags=re.DOTALL)  # fenced code and display math
    # a paragraph, a list or a table is a block; an admonition (`!!!`, `???`) or a content tab
    # (`===`) is one block with its indented body, so a question's answer and its "Lab: [NN]"
    # line go together, and a tab's label with the run it shows
    groups, admonition = [[]], False
    for line in md.splitlines():
        if re.match(r"(\?\?\?|!!!|===)\+? ", line):
            groups.append([line])
            admonition = True
        elif admonition and (not line.strip() or line.startswith("    ")):
            groups[-1].append(line)
        elif not line.strip():
            groups.append([])
            admonition = False
        else:
            if admonition:
                groups.append([])
                admonition = False
            groups[-1].append(line)
    blocks = []
    for block in ("\n".join(group) for group in groups if group):
        written = block
        labs = set(PROSE_LINKED_LAB.findall(block))
        for pattern in [r"`[^`]*`", r"\$[^$\n]*\$", r"\]\([^)]*\)"]:
            block = re.sub(pattern, " ", block)  # inline code, inline math, link targets
        block = re.sub(
            r"\b\d+\.\d+\.\d+\b|Sec(?:tion|\.) \d+\.\d+|arXiv:\s*\d+\.\d+|Python 3\.\d+|(?:SD|Wan) ?\d\.\d"
            r"|\*\*\d+\.\d+\.\*\*",  # versions, sections, papers, model names, item labels
            " ",
            block,
        )
        blocks.append((block, labs, written))
    return blocks


#: Units after which a whole number is a measurement, checked like a decimal.
UNITS = r"MiB|GiB|KiB|MB|GB|KB|TB|ms|µs|%"


def quoted_in(text: str, markdown_path: Path) -> set[str]:
    """Numbers quoted in ``text`` (prose of ``markdown_path``): decimals, and whole numbers
    with a unit (:data:`UNITS`), less the constants above and the page's cited numbers."""
    found = set(re.findall(r"(?<![\w.])\d+\.\d+(?:e[-+]\d+)?%?", text))
    # whole numbers count where they carry a unit of size, time or share ("24 MiB", "35%")
    for number, unit in re.findall(
        rf"(?<![\w.,])(\d{{1,3}}(?:,\d{{3}})+|\d+)\s?({UNITS})(?!\w)", text
    ):
        found.add(number + "%" if unit == "%" else number)
    return found - PROSE_CONSTANTS.keys() - cited_numbers(markdown_path).keys()


def quoted_numbers(markdown_path: Path) -> set[str]:
    """Decimals in a page's prose: not in code, math, link targets, version strings, model
    names or a lab's prediction prompt, nor the constants and cited numbers above."""
    return set().union(
        *(quoted_in(text, markdown_path) for text, *_ in prose_blocks(markdown_path))
    )


PAGES_WITH_PROSE = [ROOT / "docs" / "index.md", ROOT / "docs" / "references.md"]
PAGES_WITH_PROSE += [ROOT / "docs" / "glossary.md", ROOT / "docs" / "labs" / "index.md"]
PAGES_WITH_PROSE += sorted((ROOT / "docs" / "handbook").glob("*.md"))
PAGES_WITH_PROSE += [ROOT / "docs" / lab.page for lab in LABS]


def page_id(page: Path) -> str:
    """``labs/index``, ``handbook/cfg``: a page's path under docs/, unique where stems repeat."""
    return page.relative_to(ROOT / "docs").with_suffix("").as_posix()


#: Numbers the glossary's definitions (includes/abbreviations.md, shown on every page as a
#: hover and listed on the glossary page) quote, each with the verify test that observes it
GLOSSARY_NUMBERS = {
    "1.0": "tests/verify/test_page_scheduler.py::test_init_noise_sigma_per_class_and_spacing:"
    " init_noise_sigma is 1.0 for DDPMScheduler and DDIMScheduler",
}


def test_numbers_in_glossary_definitions_are_cited():
    """Every number a glossary definition quotes is in ``GLOSSARY_NUMBERS`` with its source,
    and every entry there is still quoted (the definitions are not a page's prose, so
    :func:`test_numbers_in_prose_come_from_the_runs_they_cite` does not read them)."""
    text = (ROOT / "includes" / "abbreviations.md").read_text(encoding="utf-8")
    text = re.sub(r"`[^`]*`", " ", text)  # a name in code, such as `init_noise_sigma`
    found = set(re.findall(r"(?<![\w.])\d+\.\d+(?:e[-+]\d+)?%?", text))
    assert found == set(GLOSSARY_NUMBERS)


@pytest.mark.parametrize("page", PAGES_WITH_PROSE, ids=page_id)
def test_cited_numbers_name_a_source_and_are_quoted(page):
    """Each ``cited_numbers`` entry gives a source and is quoted in the prose where it
    is cited (no stale exemptions)."""
    text = page.read_text(encoding="utf-8")
    body = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.DOTALL)
    for number, source in cited_numbers(page).items():
        assert len(source) > 10, f"{page.name}: cited number {number} needs its source"
        assert re.search(rf"(?<![\w.]){re.escape(number)}(?!\.?\d)", body), (
            f"{page.name}: cited number {number} is not on the page"
        )


def shows(number: str, text: str) -> bool:
    """``number`` (a trailing % aside) is in ``text`` as a whole number: "0.8" is not shown by
    "0.80", "10.85" or "0.8e-03" (the exponent is part of a number); a sign is not part of it
    (prose says "fell by 0.8" of a printed "-0.8")."""
    digits = re.escape(number.rstrip("%"))
    return re.search(rf"(?<![\d.]){digits}(?!\d|\.\d|e[-+]?\d)", text) is not None


#: Pygments' spans of comments and docstrings in highlighted code
CODE_PROSE = re.compile(r'<span class="(?:c|c1|cm|ch|cs|sd)">.*?</span>', re.DOTALL)


def shown_output(built_page: Path) -> str:
    """The text of a built page's code and console blocks (included code less its comments
    and docstrings, real runs), of its model-sizes tables (rendered from labkit/model_sizes.json, checked by verify) and
    of its figures' captions and alt texts (written by the starter at build time)."""
    return " ".join(shown_blocks(built_page))


def shown_blocks(built_page: Path) -> list[str]:
    """:func:`shown_output`, one text per block, figure caption or alt text."""
    import html

    page = built_page.read_text(encoding="utf-8")
    blocks = re.findall(
        r'<div class="language-(?:console|python|text) highlight"[^>]*>(.*?)</div>', page, re.DOTALL
    )
    # code's comments and docstrings are prose nothing runs: a number there shows nothing
    blocks = [CODE_PROSE.sub(" ", block) for block in blocks]
    blocks += re.findall(r'<div class="model-sizes"[^>]*>(.*?)</div>', page, re.DOTALL)
    # a figure's caption and alt text are written by the starter when the build runs it
    for figure in re.findall(r'<figure class="lab-figure"[^>]*>(.*?)</figure>', page, re.DOTALL):
        blocks += re.findall(r"<figcaption>(.*?)</figcaption>", figure, re.DOTALL)
        blocks += re.findall(r'(?:alt|aria-label)="([^"]*)"', figure)
    return [html.unescape(re.sub(r"<[^>]+>", "", block)) for block in blocks]


def run_flags(shown: str) -> tuple[str, ...] | None:
    """The flags of the starter run a shown block prints (its first line is the command a
    run directive shows: ``$ python3 code/lab-…/x.py FLAGS``), () for a run with its
    defaults, None for a block that is not a run."""
    first = shown.lstrip().split("\n", 1)[0]
    if not re.match(r"\$ python3 \S+\.py(?: |$)", first):
        return None
    return tuple(shlex.split(first[2:])[2:])


def cites_run(written: str, flags: tuple[str, ...]) -> bool:
    """A prose block (as written) cites the run with ``flags`` when it holds that run's
    directive, or names the run in inline code: a span whose words are consecutive words of
    the run's flags (after an optional ``python3 path.py``), one of them a flag's name or a
    value that is not a bare number (`--timestep 50`, `scaled_linear`; not `50`)."""
    joined = shlex.join(flags)
    directive = rf"infralens:(?:run|figure) \S+ (?:--expect-error |\S+ )?{re.escape(joined)} -->"
    if re.search(directive, written):
        return True
    for span in re.findall(r"`([^`\n]+)`", written):
        try:
            words = shlex.split(span)
        except ValueError:
            words = span.split()
        if words[:1] == ["python3"]:
            words = words[1:]
        if words and words[0].endswith(".py"):
            words = words[1:]
        n = len(words)
        named = any(w.startswith("--") or not re.fullmatch(r"[-+\d.,e]+", w) for w in words)
        if n and named and any(tuple(words) == flags[i : i + n] for i in range(len(flags))):
            return True
    return False


#: The name of the kernel set OpenBLAS picked (NumPy's wheels bundle scipy-openblas, built
#: with DYNAMIC_ARCH: one kernel set per CPU family, chosen at load or by OPENBLAS_CORETYPE).
OPENBLAS_CORE = """
import ctypes, glob, os, numpy
libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "libscipy_openblas*"))
lib = ctypes.CDLL(libs[0]) if libs else None
get = lib and (getattr(lib, "scipy_openblas_get_corename64_", None) or getattr(lib, "scipy_openblas_get_corename_", None))
if get:
    get.restype = ctypes.c_char_p
print(get().decode() if get else "")
"""


@functools.cache
def other_cpu_kernels() -> list[dict[str, str]]:
    """Environments in which a starter computes as other x86 CPUs would: OpenBLAS's Prescott
    (SSE3) kernels with NumPy's SIMD loops held to its baseline, and, on a CPU with AVX2,
    OpenBLAS's Haswell kernels with NumPy's AVX-512 loops off. OpenBLAS's kernels sum in
    another order; NumPy's loops compute exp and log with other approximations. Prescott's
    must really change OpenBLAS's kernels (an unknown name is silently ignored)."""
    import subprocess
    import sys

    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    from infralens_docs.runner import starter_env

    def core(env):
        run = [sys.executable, "-c", OPENBLAS_CORE]
        return subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout

    base = starter_env()
    base.pop("NPY_ENABLE_CPU_FEATURES", None)  # NumPy refuses both at once
    base.pop("OPENBLAS_CORETYPE", None)
    native = core(base)
    if not native.strip():
        pytest.skip("NumPy's BLAS is not its wheel's OpenBLAS: OPENBLAS_CORETYPE does nothing")
    dispatched = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
    prescott = dict(
        base, OPENBLAS_CORETYPE="Prescott", NPY_DISABLE_CPU_FEATURES=" ".join(dispatched)
    )
    assert core(prescott) != native, (
        "OPENBLAS_CORETYPE=Prescott left OpenBLAS's kernels as they were"
    )
    envs = [prescott]
    if __cpu_features__.get("AVX2"):
        above_avx2 = " ".join(name for name in dispatched if name != "X86_V3")
        haswell = dict(base, OPENBLAS_CORETYPE="Haswell", NPY_DISABLE_CPU_FEATURES=above_avx2)
        if above_avx2 or core(haswell) != native:  # else it is this machine's own setting
            envs.append(haswell)
    return envs


def page_runs(page: Path) -> list[tuple[str, list[str], bool]]:
    """(starter, flags, figures) for each run and figure directive of a page that prints."""
    source = page.read_text(encoding="utf-8")
    runs = []
    for name, body in re.findall(r"^ *<!-- infralens:(run|figure) (.+?) -->$", source, re.M):
        args = shlex.split(body)
        if name == "run" and args[1:2] != ["--expect-error"]:
            runs.append((args[0], args[1:], False))
        elif name == "figure":
            runs.append((args[0], args[2:], True))
    return runs


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="OpenBLAS's Prescott kernels and NumPy's x86 dispatch exist only on x86-64",
)
@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_numbers_in_lab_prose_hold_on_other_cpu_kernels(built_site, lab, tmp_path):
    """A number the prose quotes must not depend on the CPU the site is built on. The CPU
    picks OpenBLAS's and NumPy's kernels, and with them the order of each sum, so a
    rounding-level difference (1.0e-15 against 8.9e-16) or a value that a tie makes hang on
    its last bit (an SVD feeding int4 rounding) prints other digits on another machine: it
    did, for labs 14 and 19, on an AMD EPYC. Each run that shows a quoted number is run
    again with other kernels (:func:`other_cpu_kernels`); it must show that number too."""
    import json
    import subprocess
    import sys

    from infralens_docs.runner import run_starter, starter_figures

    def figure_text(folder: Path) -> str:
        manifest = json.loads((folder / "figures.json").read_text(encoding="utf-8"))
        return " ".join(f"{entry['alt']} {entry['caption']}" for entry in manifest.values())

    quoted = {n.rstrip("%") for n in quoted_numbers(ROOT / "docs" / lab.page)}
    envs = other_cpu_kernels()
    moved, checked = [], 0
    for k, (starter, flags, figures) in enumerate(page_runs(ROOT / "docs" / lab.page)):
        # what the built page shows (the build's cached run) against a run on other kernels
        shown = (
            figure_text(starter_figures(starter, flags))
            if figures
            else run_starter(starter, flags).stdout
        )
        at_stake = sorted(n for n in quoted if shows(n, shown))
        if not at_stake:
            continue
        for e, env in enumerate(envs):
            figures_dir = tmp_path / f"{k}-{e}"
            extra = ["--figures", str(figures_dir)] if figures else []
            proc = subprocess.run(
                [sys.executable, starter, *flags, *extra],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            other = figure_text(figures_dir) if figures else proc.stdout
            where = f"{starter} {shlex.join(flags)}, OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}"
            moved += [f"{n} ({where})" for n in at_stake if not shows(n, other)]
            checked += 1
    assert moved == [], f"quoted numbers that move with the CPU's kernels ({checked} runs rerun)"


#: Handbook passages that quote diffusers' own numbers; tests/verify/test_page_scheduler.py
#: recomputes each of them with the installed diffusers.
VERIFIED_ELSEWHERE = re.compile(
    r"^\s*\| (`(?:leading|trailing|linspace)`|`linspace` \(default\)|`use_karras_sigmas=True`|\d\.\d) \|.*$"
    r"|fractional \([\d., ]+, …\)",
    re.MULTILINE,
)


def built_path(site: Path, page: Path) -> Path:
    """Where a docs page lands in the built site (directory URLs)."""
    rel = page.relative_to(ROOT / "docs").with_suffix("")
    return site / ("index.html" if rel.name == "index" else rel / "index.html")


@pytest.mark.parametrize("page", PAGES_WITH_PROSE, ids=page_id)
def test_numbers_in_prose_come_from_the_runs_they_cite(built_site, page, tmp_path):
    """Every number a page's prose quotes (see :func:`quoted_in`) is a whole number in what
    the page shows, a lab page its block links to shows, the model-size table of a section its
    block links to, or, on a handbook section, a lab that serves that section (its
    ``sections``) shows; else it is cited. Of the page's own runs a
    block counts those with their defaults and the runs it cites (:func:`cites_run`: it holds
    the run's directive or names its flags), so a number printed by a run with other flags
    must say which run it comes from, and a number left stale in prose cannot pass by turning
    up in another run of the page. Included code, model-size tables and figures' captions and
    alt texts count everywhere on the page. A starter change that moves a quoted number fails
    here, and a number cannot pass by matching part of another ("0.8" in "10.85"). Quoted
    diffusers grids are recomputed by the verify suite instead (``VERIFIED_ELSEWHERE``)."""
    stripped = tmp_path / page.name
    stripped.write_text(
        VERIFIED_ELSEWHERE.sub(" ", page.read_text(encoding="utf-8")), encoding="utf-8"
    )
    labs = {lab.page.with_suffix("").name: lab for lab in LABS}
    serving = {name for name, lab in labs.items() if page.stem in lab.sections}
    blocks = [(run_flags(b), b) for b in shown_blocks(built_path(built_site, page))]
    own = " ".join(
        [b for flags, b in blocks if not flags]
        + [shown_output(built_site / labs[name].page.with_suffix("") / "index.html") for name in sorted(serving)]
    )  # fmt: skip
    flagged = [(flags, b) for flags, b in blocks if flags]
    unshown = []
    for text, linked, written in prose_blocks(stripped):
        cited = [shown_output(built_site / labs[name].page.with_suffix("") / "index.html")
                 for name in sorted(linked - serving) if name in labs]  # fmt: skip
        cited += [b for flags, b in flagged if cites_run(written, flags)]
        cited += linked_size_tables(built_site, written)
        shown = " ".join([own, *cited])
        first = " ".join(text.split())[:70]
        unshown += [
            f"{n} in '{first}...'" for n in sorted(quoted_in(text, page)) if not shows(n, shown)
        ]
    assert unshown == []


def test_a_block_cites_a_run_by_its_directive_or_its_flags():
    """What :func:`cites_run` counts as naming a run, and what it does not."""
    flags = ("--guidance-scales", "1,7.5", "--steps", "5")
    assert cites_run("In the `--guidance-scales 1,7.5 --steps 5` run, ...", flags)
    assert cites_run("With `--steps 5`, ...", flags)
    assert cites_run("`python3 code/lab-04/cfg.py --steps 5` prints", flags)
    assert cites_run("<!-- infralens:run code/x.py --guidance-scales 1,7.5 --steps 5 -->", flags)
    assert not cites_run("With `5` steps", flags)  # a bare number names nothing
    assert not cites_run("With `--steps 50`, ...", flags)
    assert not cites_run("With --steps 5 outside code", flags)
    assert cites_run("Under `scaled_linear`", ("--schedule", "scaled_linear"))
    assert run_flags("$ python3 code/lab-01/x.py --schedule linear\nt  abar") == (
        "--schedule",
        "linear",
    )
    assert run_flags("$ python3 code/lab-01/x.py\nt  abar") == ()
    assert run_flags("import numpy as np") is None


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_lab_page_shows_a_figure_its_starter_draws(built_site, lab):
    """Each lab page shows at least one figure made by its own starter at build time, with
    alt text; PNG files are small, sized and lazy, SVG charts are inline (no request)."""
    source = (ROOT / "docs" / lab.page).read_text(encoding="utf-8")
    runnable = {s.path.as_posix() for s in lab.starters if s.runnable}
    directives = re.findall(r"^ *<!-- infralens:figure (\S+) ", source, re.MULTILINE)
    assert directives and set(directives) <= runnable, f"{lab.page} shows no figure of its own"
    page = built_site / lab.page.with_suffix("") / "index.html"
    text = page.read_text(encoding="utf-8")
    found = re.findall(r'<figure class="lab-figure"[^>]*>(.*?)</figure>', text, re.DOTALL)
    assert len(found) >= len(directives)
    for figure in found:
        assert re.search(r'(?:aria-label|alt)="[^"]{20,}"', figure), "figure without alt text"
        assert "<figcaption>" in figure
        for src, rest in re.findall(r'<img src="([^"]+)"([^>]*)>', figure):
            assert 'width="' in rest and 'height="' in rest and 'loading="lazy"' in rest
            assert (page.parent / src).resolve().stat().st_size <= 60_000, src
        for svg in re.findall(r"<svg.*?</svg>", figure, re.DOTALL):
            assert len(svg.encode()) <= 60_000 and " id=" not in svg


@pytest.mark.parametrize(
    "page",
    ["handbook/loop/index.html", "index.html", "labs/lab-12-end-to-end-inference-trace/index.html"],
)
def test_the_pipeline_diagram_is_on_the_loop_page_alone(built_site, page):
    """The pipeline diagram (stages, tensors, shapes) that Lab 12's starter draws from its
    trace is inline SVG on the inference-loop section, where the loop is taught: no script,
    no request, with a text alternative that names every tensor. The home page and Lab 12
    link to it rather than show it again (issue 32: each fact taught once)."""
    text = (built_site / page).read_text(encoding="utf-8")
    found = [f for f in re.findall(r'<figure class="lab-figure"[^>]*>(.*?)</figure>', text, re.DOTALL)
             if "A text-to-image pipeline call" in f]  # fmt: skip
    if page != "handbook/loop/index.html":
        assert found == [], f"{page} shows the pipeline diagram again"
        assert re.search(r'href="[^"]*handbook/loop/#the-loop-line-by-line"', text), page
        return
    assert len(found) == 1, f"{page} shows no pipeline diagram"
    label = re.search(r'role="img" aria-label="([^"]+)"', found[0]).group(1)
    for name in ["prompt_embeds", "latent_model_input", "noise_pred", "latents", "image"]:
        assert name in label
    assert "<script" not in found[0] and "<img" not in found[0]


def test_memory_page_opens_with_lab_10s_memory_timeline(built_site):
    """The memory section's first picture, before any table or code, is the memory
    timeline Lab 10's starter draws from its run: one line per switch over the phases of a
    call, captioned as the lab's accounting of SD 1.5 (issue 32)."""
    text = (built_site / "handbook" / "memory" / "index.html").read_text(encoding="utf-8")
    article = re.search(r"<article\b.*?</article>", text, re.DOTALL).group(0)
    first = re.search(r'<figure class="lab-figure"|<table|<pre|<div class="highlight', article)
    assert first and first.group(0) == '<figure class="lab-figure"', "a table or code comes first"
    figure = re.search(r'<figure class="lab-figure".*?</figure>', article, re.DOTALL).group(0)
    for phase in ("loaded", "text encode", "denoise loop", "VAE decode"):
        assert f">{phase}</text>" in figure
    assert "Lab 10&#x27;s accounting" in figure or "Lab 10's accounting" in figure
    assert "SD 1.5" in figure


def test_no_page_inlines_base64_images(built_site):
    """Figures are files (PNG) or inline SVG markup, never base64 data URIs: a notebook
    page's charts are inline so site.css colours them, its images sized, lazy files."""
    for page in built_site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "data:image" not in text, page.relative_to(built_site)
        if "/code/" not in page.as_posix():
            continue
        for attrs in re.findall(r"<img ([^>]*)>", text):
            assert 'width="' in attrs and 'height="' in attrs and 'loading="lazy"' in attrs
            src = re.search(r'src="([^"]+)"', attrs).group(1)
            assert (page.parent / src).resolve().stat().st_size <= 60_000, src


def test_notebook_figures_carry_their_saved_alt_text(built_site):
    """A chart a notebook cell displays is the one its starter saves with ``--figures``:
    the page gives it that figure's alt text, not a generic one."""
    text = (built_site / "code/lab-11-scheduler-loop-reading/scheduler_loop/index.html").read_text(
        encoding="utf-8"
    )
    labels = re.findall(r'class="lab-figure__chart" role="img" aria-label="([^"]+)"', text)
    assert labels and not any(label.startswith("Figure drawn by") for label in labels)


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_starter_pages_link_back_and_offer_downloads(built_site, lab):
    """A starter page is titled "Lab NN · file", links to its lab guide and offers the
    file itself (and a .ipynb for notebooks); nbconvert's pilcrow marks are gone."""
    import json

    for starter in lab.starters:
        if not starter.page:  # a solution kept as .txt, an exercise's checker or blanks file
            continue
        out = built_site / starter.path.with_suffix("") / "index.html"
        text = out.read_text(encoding="utf-8")
        title = f"Lab {lab.number:02d} · {starter.path.name}"
        assert f"<title>{title} - " in text
        if starter.path.suffix == ".py":  # a Markdown starter keeps its own H1
            assert f"<h1>{title}</h1>" in text
        links = re.search(r'<p class="starter-links">(.*?)</p>', text).group(1)
        guide = re.search(
            rf'<a href="([^"]+)">{re.escape(html_lib.escape(lab.name))}</a>', links
        ).group(1)
        assert (out.parent / guide / "index.html").resolve().is_file(), guide
        assert "anchor-link" not in text
        if starter.path.suffix == ".py":
            assert f'href="{starter.path.name}" download' in links
            notebook = out.parent / f"{starter.path.stem}.ipynb"
            cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
            assert any(c["cell_type"] == "code" for c in cells)


EXERCISE_FILES = [(lab, s) for lab in LABS for s in lab.starters if s.path.suffix == ".py" and not s.page]  # fmt: skip


def site_hrefs(html: str, page_url: str, where: str = "") -> set[str]:
    """The site paths the links of ``html`` (those with ``where`` in their attributes) lead
    to, resolved against ``page_url``; a folder ends in "/"."""
    found = set()
    for attrs in re.findall(r"<a\b([^>]*)>", html):
        href = re.search(r'href="([^"#]*)', attrs)
        if href and where in attrs and href.group(1) and not href.group(1).startswith("http"):
            url = posixpath.normpath(posixpath.join(page_url, href.group(1)))
            found.add(url + "/" if href.group(1).endswith("/") else url)
    return found


@pytest.mark.parametrize("lab,starter", EXERCISE_FILES, ids=lambda x: getattr(x, "name", ""))
def test_an_exercise_file_is_a_file_not_a_page(built_site, lab, starter):
    """A starter with ``page: false`` (an exercise's checker or blanks file) has no notebook
    page and no nav entry, yet the .py itself is served, and the guide links the blanks
    file there; the lab's other notebook starters keep their pages and nav entries."""
    url = "/" + lab.page.with_suffix("").as_posix() + "/"
    guide = (built_site / url.strip("/") / "index.html").read_text(encoding="utf-8")
    page = "/" + starter.path.with_suffix("").as_posix() + "/"
    assert not (built_site / page.strip("/")).exists(), f"{page} was built"
    served = built_site / starter.path
    assert served.is_file(), f"{starter.path} is not served"
    assert served.read_bytes() == (ROOT / starter.path).read_bytes()
    nav = site_hrefs(guide, url, "md-nav__link")
    assert not {page, "/" + starter.path.as_posix()} & nav, f"{starter.path} has a nav entry"
    notebooks = [s for s in lab.starters if s.notebook]
    assert notebooks, f"{lab.id} has no notebook page left"
    for other in notebooks:
        other_page = "/" + other.path.with_suffix("").as_posix() + "/"
        assert other_page in nav, f"{other.path} lost its nav entry"
        assert (built_site / other_page.strip("/") / "index.html").is_file(), f"{other_page}?"
    if not starter.runnable:  # the blanks file: the guide links the file the reader edits
        article = guide.split("<article", 1)[1].split("</article>", 1)[0]
        assert "/" + starter.path.as_posix() in site_hrefs(article, url), "no link to the file"


def test_home_page_title_names_the_site_once(built_site):
    text = (built_site / "index.html").read_text(encoding="utf-8")
    assert "<title>InfraLens Diffusion Handbook</title>" in text


def test_every_page_links_to_its_source_without_asking_github(built_site):
    """Each page's "Edit this page" opens the file it is built from (a starter's page, the
    starter under code/); the header's repository link is a plain link, not Material's
    component that fetches stars and forks from api.github.com."""
    edit_re = re.compile(r'<a href="([^"]+)" title="Edit this page"[^>]*rel="edit"')
    prefix = TEST_REPO_URL + "/edit/main/"
    for page in html_pages(built_site):
        if page.name == "404.html":
            continue
        text = page.read_text(encoding="utf-8")
        links = edit_re.findall(text)
        assert len(links) == 1, f"{page}: {len(links)} edit links"
        assert links[0].startswith(prefix), links[0]
        assert (ROOT / links[0][len(prefix) :]).is_file(), f"{page}: {links[0]} is no file"
        assert 'data-md-component="source"' not in text
        assert "api.github.com" not in text


def test_a_build_without_a_repository_has_no_edit_links(offline_site):
    """INFRALENS_REPO_URL empty (or unset): no edit link and no header repository link,
    rather than an edit_uri resolved against nothing."""
    for page in html_pages(offline_site):
        text = page.read_text(encoding="utf-8")
        assert 'rel="edit"' not in text and "md-source" not in text, page


def test_two_clean_builds_are_identical_and_machine_free(built_site, tmp_path):
    """A second build with empty caches gives the same files, byte for byte (the sitemap's
    date aside): cached and fresh runs agree, and nothing depends on timing or randomness.
    The second build executes every notebook page in its render, so the runs ahead
    (``notebooks.prebuild``) are checked to give the same pages.
    No page holds an absolute path of the build machine or a kernel's stderr output."""
    site = strict_build(
        tmp_path / "site",
        INFRALENS_CACHE_DIR=str(tmp_path / "cache"),
        INFRALENS_NOTEBOOK_WORKERS="0",
    )

    def files(root: Path) -> dict[str, Path]:
        return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}

    first, second = files(built_site), files(site)
    assert first.keys() == second.keys()
    dated = {"sitemap.xml", "sitemap.xml.gz"}
    differ = [
        name
        for name in sorted(first)
        if name not in dated and first[name].read_bytes() != second[name].read_bytes()
    ]
    assert differ == []
    machine = [str(ROOT), str(tmp_path), str(Path.home())]
    for name, path in second.items():
        if path.suffix in {".html", ".json", ".ipynb", ".svg", ".xml", ".js", ".css"}:
            text = path.read_text(encoding="utf-8")
            assert not [m for m in machine if m in text], f"{name} holds a path of this machine"
            assert "application/vnd.jupyter.stderr" not in text, f"{name} shows a kernel's stderr"


def test_adjacent_stream_outputs_merge_and_keep_their_place():
    """A cell's stdout can arrive in one message or several, as the kernel flushes; the
    page must not depend on it. Text printed after a figure stays after it."""
    from infralens_docs.notebooks import merge_adjacent_streams

    def out(kind, text="", name="stdout"):
        if kind == "stream":
            return {"output_type": "stream", "name": name, "text": text}
        return {"output_type": "display_data", "data": {"text/plain": text}}

    outputs = [out("stream", "a\n"), out("stream", "b\n"), out("stream", "!", "stderr"),
               out("display"), out("stream", "c\n"), out("stream", "d\n")]  # fmt: skip
    assert merge_adjacent_streams(outputs) == [
        out("stream", "a\nb\n"), out("stream", "!", "stderr"), out("display"),
        out("stream", "c\nd\n"),
    ]  # fmt: skip
    assert merge_adjacent_streams([]) == []


def test_blocks_are_marked_later_only_below_a_lower_bound_of_1000_px():
    """later.mark_later marks a block (a top-level element, a notebook cell or its outputs,
    a run of a long code block's lines) once the height above it, counted as a lower bound
    (code lines CODE_PX, lines of prose PROSE_PX, nothing hidden at load), reaches
    LATER_PX; the mark lands at the end of the start tag, once."""
    from infralens_docs.later import (
        CODE_PX,
        LATER_PX,
        LINE_CHARS,
        PROSE_PX,
        SMALL_HEADING_PX,
        mark_later,
        split_code,
    )

    def page(code_lines):  # a title line, then a code block (in runs), then two blocks
        code = "<pre><code>" + "x = 1\n" * code_lines + "</code></pre>"
        return split_code(f"<h1>T</h1>\n{code}\n<p>b</p>\n<p>c</p>")

    enough = -(-(LATER_PX - PROSE_PX) // CODE_PX)  # code lines that reach LATER_PX
    # one line short: "b" starts above LATER_PX, and its line takes "c" below
    assert mark_later(page(enough - 1)) == page(enough - 1).replace("<p>c", "<p data-later>c")
    assert mark_later(page(enough)) == page(enough).replace("<p>", "<p data-later>")
    # prose: a paragraph of up to LINE_CHARS[0] characters is one line in any window (white
    # space collapses), one per LINE_CHARS[1] in a narrow one
    narrow = LINE_CHARS[1]
    lines = LATER_PX // PROSE_PX
    prose = "".join(f"<p>{'w ' * (narrow // 2)}{' ' * 500}</p>" for _ in range(lines - 1))
    assert "data-later" not in mark_later(prose + "<div><p>x</p></div>")
    marked = mark_later(prose + "<p>a</p><div><p>x</p></div>")
    assert marked.endswith("<div data-later><p>x</p></div>")  # a nested <p> is not a block
    assert mark_later(marked) == marked
    # 1 line in any window, 1.5 in a narrow one: far enough down only there
    longer = prose.replace("w " * (narrow // 2), "w " * (3 * narrow // 4))
    assert mark_later(longer + "<div><p>x</p></div>").endswith(
        '<div data-later="narrow"><p>x</p></div>'
    )
    # a notebook: the cells are blocks, the wrapper and the notebook are not
    cell = '<div class="jp-Cell"><pre>{}</pre><img src="f.png"></div>'
    cells = cell.format("y\n" * enough * 2) + cell.format("z")
    wrapped = f'<div class="jupyter-wrapper"><div class="jp-Notebook">{cells}</div></div>'
    for html in (wrapped, f'<div class="jp-Notebook">{cells}</div>'):
        marked = mark_later(html)
        assert re.findall(r'<div class="jp-Cell"[^>]*>', marked) == [
            '<div class="jp-Cell">',
            '<div class="jp-Cell" data-later>',
        ]
        assert '<div class="jp-Cell" data-later><pre>z' in marked
    # what is hidden at load counts nothing; an open <details> counts
    tall = "<pre>" + "y\n" * enough * 2 + "</pre>"
    hidden = [
        f"<details><summary>s</summary>{tall}</details>",
        f'<div class="tabbed-set"><div class="tabbed-content"><div class="tabbed-block"><p>a</p>'
        f'</div><div class="tabbed-block">{tall}</div></div></div>',
        f"<div hidden>{tall}</div>",
        f"<template>{tall}</template>",
        f"<style>{'a{}' * 9999}</style>",
        f"<svg><text>{'label ' * 9999}</text></svg>",
        f"<p><math><annotation>{'x' * 99999}</annotation></math></p>",
        f"<details><summary>s</summary>{'raw text ' * 9999}</details>",
    ]
    for html in hidden:
        assert "data-later" not in mark_later(html + "<p>z</p>"), html[:40]
    assert mark_later(f"<details open><summary>s</summary>{tall}</details><p>z</p>").endswith(
        "<p data-later>z</p>"
    )
    # a newline right after <pre> is not a line; a small heading's line is shorter
    k = (LATER_PX - PROSE_PX - CODE_PX - 1) // CODE_PX  # "b" above LATER_PX by < a line
    one, two = "<pre>\ny\n</pre>", "<pre>y\ny\n</pre>"
    assert mark_later(one + page(k)) == one + page(k).replace("<p>c", "<p data-later>c")
    assert "<p data-later>b" in mark_later(two + page(k))
    heads = -(-LATER_PX // SMALL_HEADING_PX)  # small headings that reach LATER_PX
    assert "data-later" not in mark_later("<h5>h</h5>" * (heads - 1) + "<p>z</p>")
    assert mark_later("<h5>h</h5>" * heads + "<p>z</p>").endswith("<p data-later>z</p>")
    # line breaks the parser does not count as lines do not move the mark
    text = "<p>one\u2028two\rthree</p>\n" + page(enough)
    assert mark_later(text) == text.replace("<p>b", "<p data-later>b").replace(
        "<p>c", "<p data-later>c"
    )
    # the mark ends the start tag, however the tag is written
    tag = '<div\n  title="a > b"\n  class="x">'
    assert mark_later(page(enough) + tag + "d</div>").endswith(
        '<div\n  title="a > b"\n  class="x" data-later>d</div>'
    )
    # in HTML <div/> opens a div (what follows is inside it)
    assert mark_later(page(enough) + "<div/><p>d</p>").endswith("<div data-later/><p>d</p>")


def test_long_code_blocks_are_split_into_runs_of_lines():
    """later.split_code wraps the lines of a <pre> longer than CODE_RUN lines in runs of
    at most CODE_RUN lines, as even as they go, each cut at a newline outside every element
    (a cut due inside a multi-line span moves past it) and with its line count in --lines;
    the text is unchanged. mark_later marks a run by the lines above it in its <pre>."""
    from infralens_docs.later import (
        CODE_PX,
        CODE_RUN,
        LATER_PX,
        PROSE_PX,
        mark_later,
        split_code,
    )

    def runs(html):
        return re.findall(r'<span class="code-lines" style="--lines: (\d+)">', html)

    def text(html):  # the block's text and elements, runs aside
        return re.sub(r'<span class="code-lines"[^>]*>((?:(?!<span class="code-lines").)*?)'
                      r"</span>(?=<span class=\"code-lines\"|</code>|</pre>)", r"\1", html,
                      flags=re.S)  # fmt: skip

    line = '<span class="n">x</span> <span class="o">=</span> <span class="mi">1</span>\n'
    last = '<span class="s">y\n</span>'  # a span that ends with its line's newline
    for n in (CODE_RUN, CODE_RUN + 1, 2 * CODE_RUN, 5 * CODE_RUN + 3):
        body = line * (n - 1) + last
        html = f'<div class="highlight"><pre><span></span><code>{body}</code></pre></div>'
        split = split_code(html)
        assert text(split) == html
        counts = [int(c) for c in runs(split)]
        if n <= CODE_RUN:
            assert split == html
            continue
        assert sum(counts) == n and max(counts) <= CODE_RUN and max(counts) - min(counts) <= 1
        assert split_code(split) == split
        for run in re.findall(r'<span class="code-lines"[^>]*>(.*?)(?=<span class="code-l|</c)',
                              split, re.S):  # fmt: skip
            assert run.count("<span") == run.count("</span>") - 1  # balanced, and its end
    # two runs, the cut due after line CODE_RUN: inside a span of two lines (as a coloured
    # output's), it moves to the next newline outside every element
    span = '<span class="ansi-red-fg">a\nb\n</span>'
    body = line * (CODE_RUN - 1) + span + line * (CODE_RUN - 2)
    split = split_code(f"<pre><code>{body}</code></pre>")
    assert text(split) == f"<pre><code>{body}</code></pre>"
    assert f'{span}{line}</span><span class="code-lines" style="--lines: 21">' in split
    # after a cut that moved, the runs left share the lines left evenly
    body = "x\n" * 10 + '<span class="s">' + "y\n" * 30 + "</span>" + "x\n" * 60
    assert runs(split_code(f"<pre><code>{body}</code></pre>")) == ["41", "15", "15", "15", "14"]
    # a <pre> with no <code>: the newline right after <pre> (never drawn) stays outside
    out = split_code("<pre>\n" + "z\n" * (2 * CODE_RUN) + "</pre>")
    assert out.startswith('<pre>\n<span class="code-lines" style="--lines: 24">z\n')
    # the runs far enough down are blocks of their own: a run starts below the lines above
    # it in its <pre>. Not a block: a run hidden at load (a closed <details>), nor one in a
    # table cell (a <pre> of line numbers beside it would count as above it)
    n = 8 * CODE_RUN
    block = "<pre><code>" + "x\n" * n + "</code></pre>"
    starts = [i * CODE_RUN * CODE_PX for i in range(8)]
    assert starts[1] < LATER_PX <= starts[-1]
    run_marks = re.compile(r'<span class="code-lines" style="--lines: \d+"( data-later)?>')
    assert [bool(m) for m in run_marks.findall(mark_later(block))] == [
        px >= LATER_PX for px in starts
    ]
    prose = "<p>p</p>" * (LATER_PX // PROSE_PX)  # over LATER_PX of visible text first
    for hidden in (
        f"<details><summary>s</summary>{block}</details>",
        f"<table><tr><td>{block}</td></tr></table>",
    ):
        marked = mark_later(prose + hidden)
        assert marked.count('class="code-lines"') == 8
        assert not any(run_marks.findall(marked)), hidden[:20]

    # a notebook cell's outputs are a block of their own, below the cell's code
    def cell(code_lines):
        return (
            '<div class="jp-Cell"><div class="jp-Cell-inputWrapper"><pre>'
            + "x\n" * code_lines
            + '</pre></div><div class="jp-Cell-outputWrapper"><div class="jp-Collapser"></div>'
            '<div class="jp-OutputArea jp-Cell-outputArea"><pre>y</pre></div></div></div>'
        )

    enough = -(-LATER_PX // CODE_PX)  # code lines that reach LATER_PX
    for code_lines, later in ((enough - 1, False), (enough, True)):
        marked = mark_later(f'<div class="jp-Notebook">{cell(code_lines)}</div>')
        mark = '<div class="jp-OutputArea jp-Cell-outputArea" data-later>'
        assert (mark in marked) == later
        assert '<div class="jp-Cell-outputWrapper">' in marked
    # what is not a <pre> element is left as it is
    lines = "x\n" * n
    for html in (
        f"<script>'<pre>{lines}</pre>'</script>",
        f"<!-- <pre>{lines}</pre> -->",
        f"<template><pre>{lines}</pre></template>",
        f"<pre-x>{lines}</pre>",
        f"<pre><samp>{lines}</samp></pre>",  # no newline outside every element
        f"<pre><code></span>{lines}<span></code></pre>",  # markup that does not balance
        f'<pre><code><span class="hll">a\n</span>{lines}</code></pre>',  # highlighted lines
        f"<pre><code><span/>{lines}</code></pre>",  # in HTML <span/> opens a span
    ):
        assert split_code(html) == html, html[:24]
    # void elements do not nest; a newline before <code> stays before it
    broken = "a<br>\n" * n
    assert split_code(f"<pre><code>{broken}</code></pre>").count("code-lines") == 8
    assert split_code(f"<pre>\n<code>{lines}</code></pre>").startswith(
        '<pre>\n<code><span class="code-lines"'
    )


def test_every_run_of_lines_on_the_site_belongs_to_a_code_block(built_site):
    """Every run later.split_code wrote on the built site is an element, a child of a
    <pre>'s <code> or of a <pre>, holding no <pre> (nothing that only looked like a <pre>
    was split: an attribute's value, a script, a comment), and no code block longer than
    CODE_RUN lines was left whole."""
    from infralens_docs.later import CODE_RUN

    class Runs(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.runs, self.bad = [], 0, []

        def handle_starttag(self, tag, attrs):
            if "code-lines" in (dict(attrs).get("class") or "").split():
                self.runs += 1
                path = [t for t, _ in self.stack[-2:]]
                if path[-1:] != ["pre"] and path != ["pre", "code"]:
                    self.bad.append(path)
            elif tag == "pre" and any(t == "span" and c for t, c in self.stack):
                self.bad.append(["pre in a run"])
            if tag not in {"br", "img", "input", "meta", "link", "hr", "wbr", "source"}:
                run = "code-lines" in (dict(attrs).get("class") or "")
                self.stack.append((tag, run))

        def handle_endtag(self, tag):
            while self.stack and self.stack.pop()[0] != tag:
                pass

    total, whole = 0, {}
    for page in sorted(built_site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        parser = Runs()
        parser.feed(text)
        name = page.relative_to(built_site).as_posix()
        assert parser.bad == [], name
        assert parser.runs == text.count('<span class="code-lines"'), name
        total += parser.runs
        # a <pre> left whole draws at most CODE_RUN lines (unless its lines are highlighted)
        for body in re.findall(r"<pre\b[^>]*>(.*?)</pre>", text, re.S):
            if 'class="code-lines"' in body or 'class="hll"' in body:
                continue
            drawn = re.sub(r"<[^>]*>", "", body).removeprefix("\n")
            lines = drawn.count("\n") + (not drawn.endswith("\n"))
            if lines > CODE_RUN:
                whole[name] = lines
    assert total > 100
    assert whole == {}


def test_every_in_page_anchor_has_its_target(built_site):
    """Every ``href="#..."`` on every built page names an id on that page: the TOC, the skip
    link and the permalinks of the notebook pages included (mkdocs' own anchor validation
    sees only links written in Markdown)."""
    broken = {}
    for page in sorted(built_site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        ids = set(re.findall(r'\bid="([^"]+)"', text))
        missing = {a for a in re.findall(r'href="#([^"]+)"', text) if a not in ids}
        if missing:
            broken[page.relative_to(built_site).as_posix()] = sorted(missing)[:5]
    assert broken == {}


def test_search_parse_cache_gives_materials_sections(tmp_path, monkeypatch):
    """Material's search sections for a page are the same whether its parser runs (on the
    page with its code blocks' token spans taken out, as a build feeds it) or the parse
    comes back from the cache (infralens_docs.search_cache), and a changed page is parsed
    again rather than served stale."""
    from material.plugins.search import plugin

    from infralens_docs import search_cache

    original = plugin.Parser
    monkeypatch.setattr(search_cache, "CACHE", tmp_path)
    html = (
        '<h1 id="a">Title <code>x</code></h1><p>Some <em>text</em>.</p>'
        '<h2 id="b">Next</h2><div class="highlight"><pre><span>code</span>\n<span>  </span>'
        '<span class="k">more</span></pre></div>'
        '<h2 id="c" data-search-exclude>Hidden</h2><p>gone</p>'
    )

    def sections(parser_class, text):
        parser = parser_class()
        parser.feed(text)
        parser.close()
        return [(s.el.tag, s.id, s.title, s.text, s.is_excluded()) for s in parser.data]

    try:
        search_cache.install()
        cached = plugin.Parser
        assert cached is not original and cached.__mro__[1] is original
        expected = sections(original, search_cache._without_token_spans(html))
        assert sections(cached, html) == expected  # parsed, then stored
        assert len(list(tmp_path.glob("*.pickle"))) == 1
        assert sections(cached, html) == expected  # loaded
        changed = html.replace("Next", "Later")
        assert sections(cached, changed) == sections(
            original, search_cache._without_token_spans(changed)
        )
        assert len(list(tmp_path.glob("*.pickle"))) == 2
    finally:
        plugin.Parser = original


def test_search_parse_without_token_spans_gives_the_same_index(built_site):
    """Material's parser fed a page with the token spans inside its ``<pre>`` blocks taken
    out (search_cache._without_token_spans, what a build feeds it) gives the sections'
    titles and their text outside ``<pre>`` as on the page as built, and, once
    search_slim has taken the ``<pre>`` blocks out, the same index entries: checked on
    the six built pages with the most token spans."""
    from material.plugins.search.plugin import Parser

    from infralens_docs.search_cache import _without_token_spans
    from infralens_docs.search_slim import PRE_RE, slim_index

    config = json.loads((built_site / "search" / "search_index.json").read_text("utf-8"))["config"]
    articles = {}
    for page in built_site.rglob("index.html"):
        if page.relative_to(built_site).parts[0] == "code":
            continue  # the starters' notebook pages are not indexed
        text = page.read_text(encoding="utf-8")
        start = text.find('<article class="md-content__inner md-typeset">')
        end = text.rfind("</article>")
        if start >= 0 < end:
            articles[page.parent.name] = text[text.index(">", start) + 1 : end]
    largest = sorted(articles, key=lambda name: -articles[name].count("<span"))[:6]
    assert all(articles[name].count("<span") > 1000 for name in largest), largest

    def index(html: str) -> dict:
        parser = Parser()
        parser.feed(html)
        parser.close()
        docs = [
            {"location": f"page/#{s.id}", "title": "".join(s.title), "text": "".join(s.text)}
            for s in parser.data
        ]
        return {"config": json.loads(json.dumps(config)), "docs": docs}

    for name in largest:
        spans, quiet = index(articles[name]), index(_without_token_spans(articles[name]))
        outside = [(d["title"], PRE_RE.sub("", d["text"])) for d in spans["docs"]]
        assert [(d["title"], PRE_RE.sub("", d["text"])) for d in quiet["docs"]] == outside
        assert slim_index(quiet) == slim_index(spans), name


def test_highlight_cache_gives_pygments_html(tmp_path, monkeypatch):
    """A code block's HTML is Pygments' own whether it is highlighted or comes back from
    the cache (infralens_docs.highlight_cache), and another lexer or formatter option
    is highlighted afresh rather than served from another block's entry."""
    from pygments import highlight as pygments_highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer, TextLexer
    from pymdownx import highlight as module

    from infralens_docs import highlight_cache

    monkeypatch.setattr(highlight_cache, "CACHE_FILE", tmp_path / "highlight.json")
    monkeypatch.setattr(module, "highlight", pygments_highlight)
    src = "latents = scheduler.step(noise_pred, t, latents).prev_sample\n"
    cases = [
        (PythonLexer(), HtmlFormatter(wrapcode=True)),
        (PythonLexer(), HtmlFormatter(wrapcode=True, hl_lines=[1])),
        (TextLexer(), HtmlFormatter(wrapcode=True)),
    ]
    expected = [pygments_highlight(src, lexer, formatter) for lexer, formatter in cases]
    assert len(set(expected)) == 3
    highlight_cache.install()
    assert [module.highlight(src, lexer, formatter) for lexer, formatter in cases] == expected
    highlight_cache.save()
    assert len(json.loads((tmp_path / "highlight.json").read_text())) == 3
    highlight_cache.install()  # a new build: loaded from the file
    assert [module.highlight(src, lexer, formatter) for lexer, formatter in cases] == expected


def test_offline_copy_links_resolve_to_files(offline_site):
    """The offline build (`make offline`) is read from the file system, where a link to a
    folder shows the folder: every local link and source of every page names a file that
    exists, and the search index is there as a script."""
    import posixpath
    from urllib.parse import unquote, urlparse

    attr = re.compile(r'\b(?:href|src)="([^"]+)"')
    broken = {}
    pages = sorted(offline_site.rglob("*.html"))
    assert len(pages) > 40
    for page in pages:
        rel = page.relative_to(offline_site).as_posix()
        for ref in attr.findall(page.read_text(encoding="utf-8")):
            parsed = urlparse(ref)
            if parsed.scheme or ref.startswith(("#", "//")):
                continue  # external (a few citations) or an anchor on the same page
            target = posixpath.normpath(
                posixpath.join(posixpath.dirname(rel), unquote(parsed.path))
            )
            if not (offline_site / target).is_file():
                broken.setdefault(rel, []).append(ref)
    assert broken == {}
    index = (offline_site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = {")
    assert json.loads(index.removeprefix("var __index = "))["docs"]


# --------------------------------------------------------------------------- metrics

#: Each metric a starter prints, as the output names it -> (what marks it in the starter's
#: source, what marks it in a page's text, what its gloss must say: what the code computes).
#: ``labkit.metrics.SampleQuality``'s fields are all here (a test below holds that).
METRICS = {
    "mode acc": ("'mode acc'", r"\bmode acc\b", r"most probable mode given .{0,80}came from"),
    "moment err": ("'moment err'", r"\bmoment err(?:or)?s?\b", r"mean and covariance"),
    "on_mode": (  # prose may spell it "on-mode" ("on-mode stays 99.2%"), not "on-mode samples"
        "on_mode",
        r"\bon_mode\b|(?i:\bon-mode\b)(?! samples)",
        r"within 3 std of (?:their|its) nearest mode",
    ),
    "weight_err": ("weight_err", r"\bweight_err(?:or)?\b", r"total-variation distance"),
    "spread": (  # on-mode samples only, and over what true samples give (1 = the data)
        ".spread",
        r"<code>spread</code>|\bspread (?:is |of )?\d",
        r"(?:on-mode samples[’']? RMS distance|RMS distance of on-mode samples) to their mode,?"
        r" over (?:what true samples give|the data[’']s)",
    ),
    "purity": ("'purity'", r"(?i)\bpurity\b", r"share of samples whose nearest class mean is"),
    "mean x": ("'mean x'", r"\bmean x\b", r"mean along the class axis"),
    "std x": ("'std x'", r"\bstd [xy]\b", r"standard deviation along"),
    "rows/step": ("'rows/step'", r"\brows/step\b", r"rows evaluated per step"),
    # Lab 01's check columns: the largest gaps of the batch's moments, and `ok`, which also
    # checks the noise term's variance
    "|mean err|": ("'|mean err|'", r"\|mean err\|", r"largest gaps between the batch[’']s mean"),
    "|cov err|": ("'|cov err|'", r"\|cov err\|", r"largest gaps between .{0,40}covariance"),
    "ok": (
        "'ok'",
        r"<code>ok</code>|\bok\s+mode acc",
        # forward_noise.py's tolerances: the Gaussian formula at the larger channel variance
        r"noise term[’']s variance.{0,60}within five standard errors \(Gaussian formula, at the"
        r" larger variance\)",
    ),
}
#: the blocks of a page in reading order: prose (a paragraph, list item, caption, cell,
#: heading) and code or program output (``pre``)
BLOCK_RE = re.compile(r"<(p|li|figcaption|td|th|summary|h[1-6]|pre)\b[^>]*>(.*?)</\1>", re.DOTALL)
#: charts, and the first screen's card: it names what the page will measure, the page
#: defines it where it shows it
HIDDEN_RE = re.compile(
    r"<(svg|script|style)\b.*?</\1>|<div class=\"admonition abstract\">.*?</div>", re.DOTALL
)


def first_mention_block(page_html: str, mention: str, code: bool) -> tuple[str, str] | None:
    """The first block of the page's article (charts aside; code and output only if
    ``code``) that mentions the metric: its tag and its text; None if none does."""
    body = re.search(r"<article\b[^>]*>(.*)</article>", page_html, re.DOTALL).group(1)
    body = HIDDEN_RE.sub("", body)
    for block in BLOCK_RE.finditer(body):
        if (code or block.group(1) != "pre") and re.search(mention, block.group(2)):
            text = html_lib.unescape(re.sub(r"<[^>]+>", "", block.group(2)))
            return block.group(1), " ".join(text.split())
    return None


def metric_pages() -> list[tuple[str, Path]]:
    """Every handbook section and lab guide (the Markdown pages that show starter output)."""
    pages = sorted((ROOT / "docs" / "handbook").glob("*.md"))
    pages += [ROOT / "docs" / lab.page for lab in LABS]
    return [(p.relative_to(ROOT / "docs").with_suffix("").as_posix(), p) for p in pages]


def test_every_sample_quality_field_has_a_gloss():
    """A metric added to labkit.metrics is added here with what it computes."""
    from dataclasses import fields

    from labkit.metrics import SampleQuality

    names = {name.removesuffix("or") for name in METRICS}
    assert {f.name.removesuffix("or") for f in fields(SampleQuality)} <= names


@pytest.mark.parametrize("page", metric_pages(), ids=lambda p: p[0])
def test_metrics_are_defined_where_first_shown(built_site, page):
    """Each metric a page shows, and each metric its lab's starters print, is defined in the
    first block of the page that mentions it, with what the code computes: the reader never
    meets a metric's name before its meaning. (Where the starters do not print it, a code
    variable of the same name does not count as showing it.)"""
    stem, source = page
    shown = (built_site / stem / "index.html").read_text(encoding="utf-8")
    lab = next((lab for lab in LABS if ROOT / "docs" / lab.page == source), None)
    starters = lab.starters if lab else ()
    printed = "".join((ROOT / s.path).read_text(encoding="utf-8") for s in starters)
    for name, (in_code, mention, gloss) in METRICS.items():
        first = first_mention_block(shown, mention, code=in_code in printed)
        if first is None:
            assert in_code not in printed, f"{stem}: its starter prints {name}, the page does not"
            continue
        tag, text = first
        assert tag != "pre", f"{stem}: {name} appears in code or output before prose defines it"
        assert re.search(gloss, text), f"{stem}: {name} is first shown undefined, in: {text[:300]}"


def runnable_starter_pages() -> list[tuple[str, Path]]:
    """Every executed starter page (a ``.py`` starter): its output shows the runs too."""
    return [
        (s.path.with_suffix("").as_posix(), ROOT / s.path)
        for lab in LABS
        for s in lab.starters
        if s.notebook and s.runnable
    ]


def test_every_gloss_of_spread_says_only_on_mode_samples_count():
    """Not only the first: every sentence that says what ``spread`` is (a page, a starter's
    comment or printed label, labkit) says it is taken over on-mode samples, as
    ``sample_quality`` computes it (hence its inf when no sample is on a mode)."""
    gloss = re.compile(r"\bspread\b[^.;]{0,25}?(?:RMS distance|how wide)[^.;]{0,45}", re.I)
    files = [*(ROOT / "docs").rglob("*.md"), *(ROOT / "code").rglob("*.py")]
    found, wrong = 0, []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            text = re.sub(r"\n\s*# ?", " ", text)  # a comment's lines as one sentence
        for m in gloss.finditer(text):
            found += 1
            if "on-mode" not in m.group(0):
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert found >= 5 and wrong == []


@pytest.mark.parametrize("page", metric_pages() + runnable_starter_pages(), ids=lambda p: p[0])
def test_an_infinite_spread_is_explained_before_it_is_shown(built_site, page):
    """``sample_quality`` returns a spread of inf when no sample lies within 3 std of a
    mode (its RMS is over on-mode samples only): a page, a starter's page too, whose output
    prints ``inf`` in a spread column says so in prose before that output."""
    shown = (built_site / page[0] / "index.html").read_text(encoding="utf-8")
    body = re.search(r"<article\b[^>]*>(.*)</article>", shown, re.DOTALL).group(1)
    body = HIDDEN_RE.sub("", body)
    said = ""
    for block in BLOCK_RE.finditer(body):
        text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", "", block.group(2))).split())
        if block.group(1) == "pre" and "spread" in text and re.search(r"\binf\b", text):
            why = r"\binf\b[^.]*(?:on-mode samples only|no sample is on a mode)"
            assert re.search(why, said), f"{page[0]}: a spread of inf, unexplained before it"
            return
        if block.group(1) != "pre":
            said += text + " "


def test_lab_02_says_what_the_stride_is_where_it_first_uses_it(built_site):
    """Lab 02's first block that says "stride" (the lab card aside) says what it is: the gap
    from the step's timestep to the previous one, ``num_train_timesteps //
    num_inference_steps`` in denoising_step.py. Its numbers are the default run's, as the
    page prints it: ``timestep=500 -> prev_timestep=400``."""
    shown = (built_site / "labs" / "lab-02-denoising-step" / "index.html").read_text()
    _, text = first_mention_block(shown, r"\bstride\b", code=False)
    said = re.search(
        r"one step from t = (\d+) with (\d+) inference steps, so stride (\d+), the gap from the"
        r" step[’']s timestep to the previous one: (\d+) → (\d+)",
        text,
    )
    assert said, text
    t, steps, stride, start, end = map(int, said.groups())
    runs = [
        html_lib.unescape(re.sub(r"<[^>]+>", "", pre))
        for pre in re.findall(r"<pre\b[^>]*>(.*?)</pre>", shown, re.DOTALL)
    ]
    command = "$ python3 code/lab-02-denoising-step/denoising_step.py\n"
    default = next(r for r in runs if r.startswith(command))
    printed = re.search(r"timestep=(\d+) -> prev_timestep=(-?\d+)", default)
    assert (t, start, end) == (int(printed.group(1)), int(printed.group(1)), int(printed.group(2)))
    assert stride == start - end == 1000 // steps  # num_train_timesteps // num_inference_steps


def test_a_starters_cache_keys_fold_in_the_files_beside_it(tmp_path):
    """A checker's page and runs show what the files beside it hold: the notebook page's
    cache key (mkdocs-jupyter's, wrapped by ``notebooks.configure``) and the run cache's key
    change when the exercise's blanks file or its ``*_solution.txt`` changes, and not when
    a file no run reads (a Markdown note) does."""
    from mkdocs_jupyter import plugin

    from infralens_docs import notebooks, runner

    notebooks.configure()
    checker, blanks, solution, note = (
        tmp_path / name for name in ("check.py", "blanks.py", "solution.txt", "notes.md")
    )
    for path in (checker, blanks, solution, note):
        path.write_text("x = 1\n", encoding="utf-8")
    config = dict.fromkeys(
        ["kernel_name", "theme", "allow_errors", "show_input", "no_input", "no_prompt",
         "remove_tag_config", "highlight_extra_classes", "include_requirejs",
         "custom_mathjax_url", "toc_depth"]
    )  # fmt: skip

    def keys() -> tuple[str, str]:
        return plugin._compute_cache_key(str(checker), config, True), runner._key("c", checker)

    first = keys()
    note.write_text("y = 2\n", encoding="utf-8")
    assert keys() == first
    blanks.write_text("x = 2\n", encoding="utf-8")
    second = keys()
    assert second[0] != first[0] and second[1] != first[1]
    solution.write_text("x = 3\n", encoding="utf-8")
    third = keys()
    assert third[0] != second[0] and third[1] != second[1]


def test_the_notebook_pages_cache_folder_folds_in_python_numpy_and_the_converters(monkeypatch):
    """The notebook pages are cached under a folder keyed on the Python version and the
    versions of NumPy, IPython and the packages that turn a starter into its page (jupytext,
    nbformat, nbconvert, mistune, Pygments, Jinja2, BeautifulSoup, mkdocs-jupyter; README's
    "Warm builds" names exactly these): an upgrade of any of them runs and converts the
    notebooks again (``hooks.notebook_cache_key``, the folder ``on_config`` gives
    mkdocs-jupyter), with the new versions in a new build process (``mkdocs serve`` keeps
    the modules it imported)."""
    import sys

    from infralens_docs import hooks, serving

    base = hooks.notebook_cache_key()
    assert hooks.notebook_cache_key() == base  # the same inputs, the same folder
    exporters = {"jupytext", "nbformat", "nbconvert", "mistune", "pygments", "jinja2"}
    assert exporters | {"numpy", "ipython", "beautifulsoup4"} <= set(hooks.NOTEBOOK_PACKAGES)
    real = serving._version
    for name in hooks.NOTEBOOK_PACKAGES:
        monkeypatch.setattr(serving, "_version", lambda n, name=name: "0" if n == name else real(n))  # fmt: skip
        assert hooks.notebook_cache_key() != base, f"a new {name} keeps the notebook pages"
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"the versions of NumPy, ([^)]*)\)", readme)
    assert said, "README's Warm builds bullet names the notebook pages' packages"
    named = {n.strip().lower() for n in re.split(r",| and ", said.group(1)) if n.strip()}
    aliases = {"beautifulsoup": "beautifulsoup4"}
    assert {aliases.get(n, n) for n in named} | {"numpy"} == set(hooks.NOTEBOOK_PACKAGES)
    monkeypatch.setattr(serving, "_version", real)
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert hooks.notebook_cache_key() != base, "a new Python keeps the notebook pages"


def test_notebook_export_matches_nbconverts(tmp_path, monkeypatch):
    """The notebook pages' export (``notebooks._export_with_a_small_soup``: the ``<pre>``
    blocks held out of BeautifulSoup's parse) gives the page nbconvert's own
    ``HTMLExporter.from_notebook_node`` gives, byte for byte (as ``clean_html`` leaves
    both): for a starter (quotes and entities in its highlighted code, figures in its
    outputs) and for text outputs with ANSI colours, markup characters and quotes."""
    from mkdocs_jupyter import convert
    from nbconvert.exporters.html import HTMLExporter

    from infralens_docs import notebooks
    from infralens_docs.runner import close_zygotes

    notebooks.configure()
    ours = HTMLExporter.from_notebook_node
    probe = tmp_path / "probe.py"
    probe.write_text(
        "# %%\nprint('\\x1b[31mred & <b>\\x1b[0m \\'q\\' \"dq\" &amp;')\n'<i>' + \"&\"\n",
        encoding="utf-8",
    )
    options = dict(
        execute=True, kernel_name="python3", theme="light", allow_errors=False,
        show_input=True, no_input=False, no_prompt=True, remove_tag_config={},
        highlight_extra_classes="highlight", include_requirejs=False, custom_mathjax_url="",
    )  # fmt: skip
    starter = ROOT / "code" / "lab-01-forward-noise-process" / "forward_noise.py"
    try:
        for path in (starter, probe):
            page = convert.nb2html(str(path), **options)
            monkeypatch.setattr(HTMLExporter, "from_notebook_node", ours.nbconvert)
            assert convert.nb2html(str(path), **options) == page, path.name
            monkeypatch.setattr(HTMLExporter, "from_notebook_node", ours)
    finally:
        close_zygotes()


def test_a_starter_that_saves_no_figures_is_run_once(monkeypatch):
    """``runner.starter_figures`` for a starter that exits 0 and saves no figures (lab 17's,
    before its blanks are filled) caches an empty manifest: a later build asks again and
    nothing runs (each warm build ran it again before)."""
    from infralens_docs import runner

    starter = "code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py"
    directory = runner.starter_figures(starter)
    assert json.loads((directory / "figures.json").read_text(encoding="utf-8")) == {}

    def no_run(*_):
        raise AssertionError("ran again")

    monkeypatch.setattr(runner, "_execute_for_build", no_run)
    assert runner.starter_figures(starter) == directory
    runner.close_zygotes()


def test_svg_keys_are_kept_between_builds(tmp_path, monkeypatch):
    """``hooks._svg_key`` gives minidom's key, from the kept file when it holds the SVG's
    text, and ``_save_svg_keys`` writes the keys a build used."""
    from xml.dom import minidom

    from infralens_docs import hooks

    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="2"><rect width="1"/></svg>'
    node = minidom.parseString(svg).getElementsByTagName("svg")[0]
    expected = hashlib.sha256(node.toxml().encode("utf-8")).hexdigest()
    monkeypatch.setattr(hooks, "SVG_KEYS_FILE", tmp_path / "svg-keys.json")
    monkeypatch.setattr(hooks, "_SVG_KEYS", {"loaded": {}, "used": {}})
    assert hooks._svg_key(svg) == expected
    hooks._save_svg_keys()
    kept = json.loads((tmp_path / "svg-keys.json").read_text(encoding="utf-8"))
    assert list(kept.values()) == [expected]
    (text,) = kept
    (tmp_path / "svg-keys.json").write_text(json.dumps({text: "kept"}), encoding="utf-8")
    assert hooks._svg_key(svg) == "kept"  # read from the file, not parsed again


def test_the_notebook_pages_cache_folder_folds_in_the_executor_and_the_export(
    tmp_path, monkeypatch
):
    """An edit to the build's code that runs or exports a notebook page (the events, the
    export, the executor's zygote, the runs' environment) runs and converts the notebooks
    again: each file is part of ``hooks.notebook_cache_key``."""
    from infralens_docs import hooks

    names = {p.name for p in hooks.NOTEBOOK_SOURCES}
    assert {"hooks.py", "notebooks.py", "zygote.py", "runner.py"} <= names
    copies = []
    for source in hooks.NOTEBOOK_SOURCES:
        copy = tmp_path / source.name
        copy.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        copies.append(copy)
    monkeypatch.setattr(hooks, "NOTEBOOK_SOURCES", tuple(copies))
    key = hooks.notebook_cache_key()
    for copy in copies:
        copy.write_text(copy.read_text(encoding="utf-8") + "# an edit\n", encoding="utf-8")
        assert hooks.notebook_cache_key() != key, f"an edit to {copy.name} keeps the pages"
        key = hooks.notebook_cache_key()


def test_a_notebook_pages_key_folds_in_its_starters_path(tmp_path):
    """A notebook page names its starter's path (its figures' alt texts, ``clean_html``),
    so its cache key (mkdocs-jupyter's, as ``notebooks`` wraps it) holds the path: a
    byte-identical copy of a lab in a renamed folder (here outside the repository, so its
    absolute path) gets another key."""
    import collections
    import shutil

    from mkdocs_jupyter import plugin

    from infralens_docs import notebooks

    notebooks.configure()
    assert "(code/lab-99-x/x.py)" in notebooks.clean_html(notebooks.NO_ALT, "code/lab-99-x/x.py")
    lab = ROOT / "code" / "lab-05-vae-latent-space"
    shutil.copytree(lab, tmp_path / "lab-99-renamed", ignore=shutil.ignore_patterns("__pycache__"))
    options = collections.defaultdict(str)  # mkdocs-jupyter's options: the same for both
    keys = {
        plugin._compute_cache_key(str(folder / "vae_latents.py"), options, True)
        for folder in (lab, tmp_path / "lab-99-renamed")
    }
    assert len(keys) == 2


def test_pages_that_sum_up_every_run_render_last_and_are_written_in_order(built_site, monkeypatch):
    """The pages whose directives sum up every page's runs (hooks.SUMMARY_DIRECTIVES: the
    home page's reading paths) render after the others: the hooks' on_nav, which MkDocs
    calls right before it renders the pages in the files' order, moves them last
    (hooks._render_summaries_last); and on_env, which MkDocs calls once every page has
    rendered, puts the files back in their order, in which MkDocs writes the pages, lists
    them in the sitemap and Material indexes them for search: in the built site the home
    page is the sitemap's first address and the search index's first entry, as it is the
    files' first page."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files
    from mkdocs.structure.nav import get_navigation

    from infralens_docs import hooks

    config = load_config(str(ROOT / "mkdocs.yml"))
    files = get_files(config)
    before = list(files)
    pages = [f.src_uri for f in files.documentation_pages()]
    monkeypatch.setattr(hooks, "_labs", load_labs())
    config.nav = None  # every page in the nav (on_config fills the site's from the paths)
    hooks.on_nav(get_navigation(files, config), config, files)
    rendered = [f.src_uri for f in files.documentation_pages()]
    summing = []
    for uri in pages:
        source = ROOT / "docs" / uri
        if uri.endswith(".md") and source.is_file():
            names = {
                m.group("name") for m in hooks.DIRECTIVE_RE.finditer(source.read_text("utf-8"))
            }
            if names & set(hooks.SUMMARY_DIRECTIVES):
                summing.append(uri)
    assert "index.md" in summing
    assert rendered == [uri for uri in pages if uri not in summing] + summing
    assert hooks.on_env("env", config, files) == "env"
    assert list(files) == before
    assert pages[0] == "index.md"
    sitemap = (built_site / "sitemap.xml").read_text(encoding="utf-8")
    assert re.findall(r"<loc>([^<]*)</loc>", sitemap)[0] == config.site_url
    index = json.loads((built_site / "search" / "search_index.json").read_text("utf-8"))
    assert index["docs"][0]["location"] == ""
