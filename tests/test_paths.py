"""The reading paths (docs/paths.yml) and what is generated from them: the home page's
map, the footer's previous/next links (and ``<link rel>``) and each page's "you are
here" line. They cannot disagree because they come from one file; these tests check
that the file covers every page and that the built site follows it."""

from __future__ import annotations

import html
import itertools
import posixpath
import re
from pathlib import Path

import pytest

from infralens_docs import paths
from infralens_docs.registry import ROOT, load_labs, read_front_matter

READING = paths.load_paths()


def url_of(page: str) -> str:
    """A docs page's site URL (directory URLs): ``labs/index.md`` -> ``/labs/``."""
    stem = page.removesuffix(".md").removesuffix("index").rstrip("/")
    return "/" + stem + "/" if stem else "/"


def walk() -> list[str]:
    """The reading order as site URLs (directory URLs): the pages on the paths, in order."""
    return [url_of(page) for page in READING.order]


def starter_urls() -> dict[str, str]:
    """Each starter page's URL -> its lab page's URL (starters are off the walk)."""
    return {
        "/" + s.path.with_suffix("").as_posix() + "/": url_of(lab.page.as_posix())
        for lab in load_labs()
        for s in lab.starters
        if s.path.suffix in {".py", ".md"}
    }


def html_of(site: Path, url: str) -> str:
    return (site / url.strip("/") / "index.html").read_text(encoding="utf-8")


def rel_link(text: str, rel: str) -> str | None:
    match = re.search(rf'<link rel="{rel}" href="([^"]*)">', text)
    return match.group(1) if match else None


def resolve(url: str, href: str) -> str:
    return posixpath.normpath(posixpath.join(url, href)).rstrip("/") + "/"


def test_every_page_is_on_one_path_or_listed_as_reference():
    docs = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    on_paths = READING.order
    assert len(on_paths) == len(set(on_paths))
    assert docs == set(on_paths) | set(READING.reference) | {"index.md"}
    handbook = {p for p in docs if p.startswith("handbook/")}
    labs = {lab.page.as_posix() for lab in load_labs()}
    assert handbook | labs <= set(on_paths)


def test_a_page_left_off_every_path_fails_the_load(tmp_path):
    (tmp_path / "handbook").mkdir()
    for name in ("a", "b"):
        (tmp_path / "handbook" / f"{name}.md").write_text(f"# {name}\n")
    file = tmp_path / "paths.yml"
    file.write_text("core:\n  evenings:\n    - title: one\n      items: [handbook/a.md]\n")
    with pytest.raises(paths.PathsError, match=r"on no path.*handbook/b\.md"):
        paths.load_paths.__wrapped__(file)
    file.write_text(
        "core:\n  evenings:\n    - title: one\n      items: [handbook/a.md, handbook/b.md]\n"
        "tracks:\n  - title: t\n    items: [handbook/a.md]\n"
    )
    with pytest.raises(paths.PathsError, match=r"more than one path: handbook/a\.md"):
        paths.load_paths.__wrapped__(file)


def test_reading_time_counts_shown_prose_and_collapsed_depth_apart():
    text = "\n".join(
        [
            "---", "title: T", "description: not counted", "---",
            "# Four words of title",
            "<!-- infralens:run code/x.py -->",
            "```python", "code = 'is not read'", "```",
            "A [linked phrase](https://example.com/not/counted) here.",
            '??? note "Depth"', "", "    five words of hidden depth", "",
            "Back to shown.",
        ]
    )  # fmt: skip
    shown, depth = paths.reading_words(text)
    assert (shown, depth) == (4 + 4 + 3 + 1, 5)  # a collapsed block's title is on screen


def test_footer_and_rel_links_walk_the_paths(built_site):
    order = walk()
    home = html_of(built_site, "/")
    assert resolve("/", rel_link(home, "next")) == order[0]
    for before, after in itertools.pairwise(order):
        text = html_of(built_site, before)
        assert resolve(before, rel_link(text, "next")) == after, before
        assert resolve(after, rel_link(html_of(built_site, after), "prev")) == before, after
        assert 'class="md-footer__link md-footer__link--next"' in text
    for page in READING.reference:
        text = html_of(built_site, url_of(page))
        assert rel_link(text, "next") is None and rel_link(text, "prev") is None, page
    following = dict(itertools.pairwise(order))
    for starter, lab in starter_urls().items():
        text = html_of(built_site, starter)
        assert resolve(starter, rel_link(text, "prev")) == lab, starter
        after, link = following.get(lab), rel_link(text, "next")
        assert (link is None) if after is None else resolve(starter, link) == after, starter


def test_every_page_on_a_path_says_where_it_is(built_site):
    for part in READING.parts:
        for index, page in enumerate(part.items, 1):
            text = html_of(built_site, url_of(page))
            line = re.search(r'<p class="path-here">(.*?)</p>', text)
            assert line, page
            said = re.sub(r"<[^>]+>", "", line.group(1))
            assert f"{part.title}, step {index} of {len(part.items)}" in said, said
            assert f"{paths.reading_minutes(page)[0]} min read" in said, said
            if index < len(part.items):
                assert "next " + paths.page_title(part.items[index]) in said
            elif page != READING.order[-1]:  # the last page of a part leads on to the next part
                following = READING.order[READING.order.index(page) + 1]
                assert paths.page_title(following) in said.split(" then ")[-1], said


def test_every_page_on_a_path_opens_with_what_and_why(built_site):
    """Its first screen, under the "you are here" line: the outcome, why it matters and
    what to read first (a lab page's card), generated from its front matter."""
    for page in READING.order:
        text = html_of(built_site, url_of(page))
        first = text[text.index('class="path-here"') :][:6000]
        first = re.sub(r"</?(?:abbr|code|a|em|strong)\b[^>]*>", "", first)  # inline: no gap
        said = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", first)).split())
        said = said.replace("\u2019", "'").replace("\u2018", "'")  # typographic apostrophes
        for label in ("You will be able to", "Why it matters for inference work.", "Read first"):
            assert label in said, (page, label)
        meta = read_front_matter(paths.DOCS / page)
        outcome = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", str(meta["outcome"]))
        outcome = re.sub(r"[`*]|\$[^$]*\$", "", outcome)  # what renders as other markup
        assert " ".join(outcome.split()[:3]) in said, page


def test_home_page_map_lists_each_path_in_order_with_times(built_site):
    text = html_of(built_site, "/")
    start = text.index('id="the-two-evening-core-path"')
    end = text.index('id="what-problem-diffusion-models-solve"')
    hrefs = re.findall(r'<a href="([^"#]+)">', text[start:end])
    linked = [resolve("/", h) for h in hrefs]
    assert linked == [url_of(p) for p in READING.order]
    plain = re.sub(r"<[^>]+>", "", text[start:end])
    for part in READING.parts:
        assert f"{part.title} ({paths.as_duration(paths.total_minutes(part.items))})" in plain
