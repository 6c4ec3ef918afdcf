"""The reading paths (docs/paths.yml) and what is generated from them: the home page's
map, the footer's previous/next links (and ``<link rel>``) and each page's "you are
here" line. They cannot disagree because they come from one file; these tests check
that the file covers every page and that the built site follows it."""

from __future__ import annotations

import html
import itertools
import math
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
        if s.page
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


def test_reading_time_counts_code_snippets_and_run_output(tmp_path, monkeypatch):
    """Code counts at CODE_LINES_PER_MINUTE: a code block's non-blank lines, the starter
    section a snippet pulls in and a run's command and output; in a fold, as depth."""
    from infralens_docs import runner

    (tmp_path / "s.py").write_text("x = 0\n# --8<-- [start:a]\ny = 1\n\nz = 2\n# --8<-- [end:a]\n")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    out = runner.Run(command="python s.py", stdout="one\ntwo\n\nthree\n", stderr="", returncode=0)
    monkeypatch.setattr(runner, "run_starter", lambda starter, flags: out)
    text = "\n".join(
        [
            "# T", "```python", "a = 1", "", "b = 2", "```",
            "```python", '--8<-- "s.py:a"', "```",
            "<!-- infralens:run s.py --flag 1 -->",
            '??? note "Depth"', "", "    ```python", "    c = 3", "    ```", "",
            "Prose again.",
        ]
    )  # fmt: skip
    assert paths.reading_code(text) == (2 + 2 + 1 + 3, 1, 0, 0)
    words = paths.reading_words(text)[0]
    expected = math.ceil(words / paths.WORDS_PER_MINUTE + 8 / paths.CODE_LINES_PER_MINUTE)
    assert paths._minutes.__wrapped__("x.md", text)[0] == expected


def test_interview_questions_each_carry_one_path_tag():
    """Each question of the interview page has exactly one ``taught-by`` directive, the
    line right above it (the tag is generated from docs/paths.yml: tests below)."""
    lines = (paths.DOCS / "handbook/interview.md").read_text(encoding="utf-8").splitlines()
    questions = [i for i, line in enumerate(lines) if line.startswith("??? question ")]
    tags = [i for i, line in enumerate(lines) if "infralens:taught-by" in line]
    assert questions and len(tags) == len(questions)
    for at in questions:
        above = next(line for line in reversed(lines[:at]) if line.strip())
        assert re.fullmatch(r"<!-- infralens:taught-by \S+ -->", above), lines[at]


def test_interview_tags_name_the_path_of_the_page_they_link(built_site):
    """The built tag above each question names the path its linked page is on (a core
    tag: the evening, and the page is on the core path; else the track)."""
    text = html_of(built_site, "/handbook/interview/")
    tags = re.findall(
        r'<p class="taught-by"[^>]*>(.*?)</p>\s*<details class="question"', text, re.S
    )
    assert tags and len(tags) == text.count('<details class="question"')
    pages = {url_of(page): page for page in READING.order}
    core = {page for evening in READING.evenings for page in evening.items}
    for tag in tags:
        href = re.search(r'<a href="([^"#]+)', tag).group(1)
        page = pages[resolve("/handbook/interview/", href)]
        step = READING.step(page)
        said = re.sub(r"<[^>]+>", "", tag)
        if said.startswith("Taught on the core path"):
            assert page in core and f"core path, {step.part.split(':')[0]}:" in said, said
        else:
            assert page not in core and f"the {step.part} track:" in said, said


_QUOTED_NUMBER_RE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+%?|(?<![\w.])\d+(?:\.\d+)?%")


def visible_text(site: Path, url: str) -> str:
    """A built page's article as a reader sees it: tags (and attributes) dropped."""
    text = html_of(site, url)
    article = text[text.find("<article") : text.rfind("</article>")]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", article)).split())


def test_core_tagged_answers_quote_only_what_the_core_path_shows(built_site):
    """A question tagged with the core path is answerable from it: each decimal and
    percentage its answer quotes is on screen on the tagged page or on a core page the
    answer links (a chart's alt text does not count)."""
    url = "/handbook/interview/"
    text = html_of(built_site, url)
    blocks = re.findall(
        r'<p class="taught-by"[^>]*>(.*?)</p>\s*<details class="question"[^>]*>(.*?)</details>',
        text,
        re.S,
    )
    core_urls = {url_of(page) for evening in READING.evenings for page in evening.items} - {url}
    checked = 0
    for tag, body in blocks:
        if not re.sub(r"<[^>]+>", "", tag).startswith("Taught on the core path"):
            continue
        hrefs = re.findall(r'href="([^"#]+)', tag + body)
        pages = {resolve(url, h) for h in hrefs if "://" not in h} & core_urls
        shown = " ".join(visible_text(built_site, page) for page in sorted(pages))
        answer = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())
        missing = [
            number
            for number in dict.fromkeys(_QUOTED_NUMBER_RE.findall(answer))
            if not re.search(rf"(?<![\d.]){re.escape(number)}(?![\d%])", shown)
        ]
        assert not missing, (answer[:70], missing)
        checked += 1
    assert checked


def test_interview_practice_counts_on_the_core_path():
    """Interview practice's minutes on the core path count what the page asks of a core
    reader: each core-tagged question said out loud (about a minute) and its answer read
    to compare, as the page's exercise minutes, not as optional depth."""
    lines = (paths.DOCS / "handbook/interview.md").read_text(encoding="utf-8").splitlines()
    core = {page for evening in READING.evenings for page in evening.items}
    questions = words = 0
    tag = None
    for at, line in enumerate(lines):
        if match := re.fullmatch(r"<!-- infralens:taught-by ([^#\s]+)\S* -->", line.strip()):
            tag = match.group(1)
        elif line.startswith("??? question ") and tag in core:
            end = next(
                (i for i in range(at + 1, len(lines)) if lines[i].strip() and lines[i][0] != " "),
                len(lines),
            )
            questions += 1
            words += paths.reading_words("\n".join(lines[at:end]))[1]
    assert questions
    need = questions + math.ceil(words / paths.WORDS_PER_MINUTE)
    assert paths.exercise_minutes("handbook/interview.md") >= need, (questions, words)


def test_interview_optional_minutes_come_on_top_of_its_exercise(built_site):
    """The home page's optional minutes "come on top": Interview practice's count only the
    answers its exercise minutes do not (those of the questions not tagged with the core path)."""
    lines = (paths.DOCS / "handbook/interview.md").read_text(encoding="utf-8").splitlines()
    core = {page for evening in READING.evenings for page in evening.items}
    rest, tag = 0, None
    for at, line in enumerate(lines):
        if match := re.fullmatch(r"<!-- infralens:taught-by ([^#\s]+)\S* -->", line.strip()):
            tag = match.group(1)
        elif line.lstrip().startswith("???") and tag not in core:
            end = next(
                (i for i in range(at + 1, len(lines)) if lines[i].strip() and lines[i][0] != " "),
                len(lines),
            )
            rest += paths.reading_words("\n".join(lines[at:end]))[1]
    said = re.search(
        r"Interview practice · section, \d+ min, \+(\d+) min optional",
        visible_text(built_site, "/"),
    )
    assert said and int(said.group(1)) == math.ceil(rest / paths.WORDS_PER_MINUTE), (said, rest)


def test_tracks_said_to_go_in_any_order_need_no_other_track_first(built_site):
    """The home page says the tracks may be taken in any order only if no track page's
    "Read first" names a page of another track."""
    core = {page for evening in READING.evenings for page in evening.items}
    crossing = [
        (page, before)
        for track in READING.tracks
        for page in track.items
        for before in read_front_matter(paths.DOCS / page).get("prereqs") or []
        if before not in core and before not in track.items
    ]
    said = visible_text(built_site, "/")
    assert "Tracks that go deeper" in said
    assert not crossing or "any order" not in said, crossing


def test_core_evenings_fit_and_teach_what_the_interview_asks(built_site):
    """Two timed evenings (DESIGN.md), Evening 2 with compilation and few-step sampling,
    since the interview asks them; this test's own bound: each at most 2.5 h by the site's
    labels (the home page's, code and exercises counted)."""
    text = visible_text(built_site, "/")
    for evening, after in itertools.pairwise([*READING.evenings, None]):
        said = re.search(re.escape(evening.title) + r" ¶? ?\((?:(\d+) h )?(\d+) min\)", text)
        assert said, evening.title
        total = int(said.group(1) or 0) * 60 + int(said.group(2))
        assert total <= 150, said.group(0)
        # the heading is the sum of the minutes its items show, exercises included
        items = text[said.end() : text.find(after.title) if after else None]
        items = items[: items.find("Tracks that go deeper")] if not after else items
        shown = re.findall(r"· (?:section|lab), (\d+) min|\+(\d+) min exercise", items)
        assert sum(int(a or b) for a, b in shown) == total, (evening.title, shown)
    assert {"handbook/few-step.md", "handbook/compilation.md"} <= set(READING.evenings[-1].items)


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
        step = READING.step(page)
        if step.on_core and page != READING.order[0]:  # an evening leads on from the one before
            assert "Read first nothing on this site" not in said, page
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


def footer_link(text: str, direction: str) -> str | None:
    match = re.search(
        rf'<a href="([^"]*)" class="md-footer__link md-footer__link--{direction}"', text
    )
    return match.group(1) if match else None


def test_home_page_says_what_the_footer_does(built_site):
    """The home page's sentence on the footer holds on the built site: its Next link walks
    the paths' order and skips the labs' starter pages, whose own footer leads back to
    their lab (Previous) and on to the page after it (Next)."""
    home = html_of(built_site, "/")
    said = " ".join(html.unescape(re.sub(r"<[^>]+>", "", home)).split()).replace("\u2019", "'")
    assert (
        "the footer's Next link walks the same order and skips the labs' starter pages, whose "
        "own footer leads back to their lab and on to the page after it." in said
    )
    seen, url = [], "/"
    while (link := footer_link(html_of(built_site, url), "next")) is not None:
        url = resolve(url, link)
        assert url not in seen, f"the footer's Next link loops at {url}"
        seen.append(url)
    assert seen == walk(), "the footer's Next walk from the home page is not the paths' order"
    following = dict(itertools.pairwise(walk()))
    for starter, lab in starter_urls().items():
        text = html_of(built_site, starter)
        assert resolve(starter, footer_link(text, "prev")) == lab, starter
        after, link = following.get(lab), footer_link(text, "next")
        assert (link is None) if after is None else resolve(starter, link) == after, starter


def test_every_lab_with_an_exercise_counts_its_minutes(labs):
    """The home page's map counts a lab's exercise (a checker the reader runs) in its time
    label and its track's total: every lab whose starters list a runnable checker served as
    a file (`page: false`) has `exercise_minutes`."""
    with_checker = [lab for lab in labs if any(s.runnable and not s.page for s in lab.starters)]
    assert len(with_checker) >= 6  # labs 03, 13, 16, 17, 19, 20
    missing = [lab.page.as_posix() for lab in with_checker if not paths.exercise_minutes(lab.page.as_posix())]  # fmt: skip
    assert missing == []
