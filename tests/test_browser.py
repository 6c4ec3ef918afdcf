"""Real-browser checks: every built page in headless Chromium (Debian's), served
over HTTP from this machine. No console errors, no request to another host,
math and figures render, and the reader-facing controls work."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
from filelock import FileLock

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
    if os.environ.get("CI"):
        pytest.fail("Chromium is required in CI (apt-get install chromium)", pytrace=False)
    pytest.skip(
        "no Chromium at /usr/bin/chromium (apt-get install chromium)", allow_module_level=True
    )

sync_api = pytest.importorskip("playwright.sync_api")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server(built_site):
    handler = functools.partial(QuietHandler, directory=str(built_site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def page_urls(site: Path) -> list[str]:
    urls = []
    for html in sorted(site.rglob("index.html")):
        rel = html.parent.relative_to(site).as_posix()
        urls.append("/" if rel == "." else f"/{rel}/")
    return urls


def watch(page, problems: list[str], responses: list | None = None) -> None:
    """Record in ``problems`` what goes wrong on ``page`` from now on (console errors, page
    errors, requests to another host); ``responses``, if given, receives every response."""
    if responses is not None:
        page.on("response", lambda response: responses.append(response))
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def on_request(request):
        host = urlparse(request.url).hostname
        if request.url.startswith(("http://", "https://")) and host != "127.0.0.1":
            problems.append(f"request to another host: {request.url}")

    page.on("request", on_request)


def visit(browser, url, responses: list | None = None):
    """Open ``url``; return the page and what went wrong (console errors, foreign hosts).
    ``responses``, if given, receives every response the page load fetched."""
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    watch(page, problems, responses)
    response = page.goto(url, wait_until="networkidle")
    assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
    return page, problems


def next_frames(page) -> None:
    """Wait two animation frames (what the page had scheduled for the next frame has
    happened: a pass of a11y.js asked for by then has started, and ``data-settled`` stays
    off until it ends)."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def settled(page) -> None:
    """Wait until a11y.js has laid out every block of the article and made its pass over
    the page as it now is (``<html data-settled>``)."""
    page.wait_for_function(
        "() => document.documentElement.hasAttribute('data-settled')", timeout=10_000
    )


def start_bundle(page) -> None:
    """Interact as a reader would (a pointer move), which starts Material's bundle; wait
    until it has set up the page and a11y.js has made its pass over what it built."""
    page.mouse.move(5, 5)
    page.mouse.move(40, 60)
    page.wait_for_function("() => !!window.component$", timeout=10_000)
    next_frames(page)
    settled(page)


#: What a page may fetch before the reader does anything, gzip-compressed, images aside
#: (issue 9). Each response body is gzipped here as a static host would serve it.
LOAD_BUDGET_BYTES = 120_000


#: The suite runs on several workers (`make test`): the tests that visit every page do so in
#: parts (every PARTS-th page), so that no one test holds a worker for minutes while the
#: others have run out of work.
PARTS = 4
in_parts = pytest.mark.parametrize("part", range(PARTS), ids=lambda k: f"part{k + 1}of{PARTS}")


@functools.cache
def gzipped_size(url: str, body: bytes) -> int:
    """A response body's size gzipped as a static host would serve it (the theme's assets
    are the same bytes on every page: compressed once)."""
    return len(gzip.compress(body, 6))


#: Where the first block left to lay out after load (data-later; in a window at most 480 px
#: wide, data-later="narrow" too) starts on the page, and the window's height
FIRST_LATER = """() => {
    const narrow = matchMedia("(max-width: 480px)").matches;
    const block = document.querySelector(narrow ? "[data-later]" : '[data-later=""]');
    return [block && block.getBoundingClientRect().top + scrollY, innerHeight];
}"""


def first_visit_problems(page, path: str, responses: list) -> tuple[dict[str, list], bool]:
    """What is wrong with ``page`` as a first-time visitor's load of ``path`` left it, at
    1280 px (opened until the network was idle, nothing taken from a cache; ``responses``
    is what it fetched): more than ``LOAD_BUDGET_BYTES`` fetched, an answer from a cache,
    or the first block the browser may leave unrendered at load (later.py) less than 1.5
    windows down (below the first screen, with half a screen to spare: a placeholder there
    moves nothing seen). Also whether the page has such a block."""
    found: dict[str, list] = {}
    top, screen = page.evaluate(FIRST_LATER)
    if top is not None and top < 1.5 * screen:
        found[f"{path} data-later at {top:.0f} px at load ({screen} px window)"] = []
    weight = sum(
        gzipped_size(r.url, r.body())
        for r in responses
        if r.request.resource_type not in {"image", "media"} and r.status == 200
    )
    if weight > LOAD_BUDGET_BYTES:
        found[f"{path} over {LOAD_BUDGET_BYTES:,} bytes (gzip) at load"] = [f"{weight:,} bytes"]
    # (a 304 is a cache's copy revalidated: its bytes would go uncounted)
    cached = [r.url for r in responses if r.status == 304]
    if cached:
        found[f"{path} answered from a cache at a first visit"] = cached
    return found, top is not None


def test_notebook_page_links_back_and_its_downloads_work(server, browser):
    """From a starter page: the guide link lands on its lab page, and both downloads
    (.py and .ipynb) are served; the notebook is valid JSON with the starter's cells."""
    import json

    page, problems = visit(browser, server + "/code/lab-13-few-step-sampling/few_step/")
    links = page.locator("p.starter-links a")
    assert links.count() == 3
    downloads = {}
    for i in range(1, 3):
        url = links.nth(i).evaluate("a => a.href")  # resolved against the page
        assert links.nth(i).get_attribute("download") is not None
        response = page.request.get(url)
        assert response.ok, url
        downloads[url.rsplit("/", 1)[-1]] = response.body()
    notebook = json.loads(downloads["few_step.ipynb"])
    assert notebook["nbformat"] == 4 and len(notebook["cells"]) > 5
    assert downloads["few_step.py"].startswith(b'"""Lab 13: ')
    links.first.click()
    page.wait_for_url("**/labs/lab-13-few-step-sampling/")
    assert page.locator("h1").first.inner_text().startswith("Lab 13")
    assert problems == []
    page.context.close()


DESKTOP, MOBILE = 1280, 390

#: The blocks site.css may leave to the browser to lay out when they come near the screen
#: (content-visibility: auto) until a11y.js has laid them out after load: data-later="narrow"
#: ones only in a window at most 480 px wide (elsewhere they are never skipped)
BLOCKS = "[data-later]"

SKIPPED = """blocks => Array.from(document.querySelectorAll(blocks)).filter(
    b => b.firstElementChild && !b.firstElementChild.checkVisibility({contentVisibilityAuto: true})
).length"""

#: Run before the page's scripts: count the blocks skipped when the load event fires (before
#: a11y.js's first slice, a frame and a task later), the tasks in which blocks were marked
#: laid out, the layout shifts the reader did not cause (with what moved, when, and how
#: far along the page was, for the failure message), and the elements whose width was read
#: inside a block not laid out yet (reading it lays that block out)
WATCH_SETTLE = f"""
window.__slices = 0;
window.__measuredDeferred = [];
const scrollWidth = Object.getOwnPropertyDescriptor(Element.prototype, "scrollWidth");
Object.defineProperty(Element.prototype, "scrollWidth", {{
    configurable: true,
    get() {{
        const marked = matchMedia("(max-width: 480px)").matches ? "[data-later]" : '[data-later=""]';
        if (this.closest(marked + ":not([data-shown])")) {{
            window.__measuredDeferred.push(this.nodeName + "." + String(this.className).slice(0, 40));
        }}
        return scrollWidth.get.call(this);
    }},
}});
window.__shift = 0;
window.__shifts = [];
new MutationObserver(records => {{
    if (records.some(r => r.attributeName === "data-shown")) window.__slices += 1;
}}).observe(document, {{ attributes: true, attributeFilter: ["data-shown"], subtree: true }});
new PerformanceObserver(list => {{
    for (const e of list.getEntries()) {{
        if (e.hadRecentInput) continue;
        window.__shift += e.value;
        window.__shifts.push({{
            value: e.value, at: Math.round(e.startTime), ready: document.readyState,
            shown: document.querySelectorAll("[data-shown]").length,
            moved: e.sources.map(s => [
                s.node ? s.node.nodeName + "." + String(s.node.className).slice(0, 40) : null,
                [s.previousRect.y, s.previousRect.height], [s.currentRect.y, s.currentRect.height],
            ]),
        }});
    }}
}}).observe({{ type: "layout-shift", buffered: true }});
addEventListener("load", () => {{ window.__skippedAtLoad = ({SKIPPED})({BLOCKS!r}); }});
"""


@pytest.mark.parametrize(
    ("path", "width"),
    [
        ("/labs/lab-06-diffusers-pipeline-components/", MOBILE),
        ("/labs/lab-06-diffusers-pipeline-components/", DESKTOP),
        ("/handbook/memory/", MOBILE),
        ("/code/lab-01-forward-noise-process/forward_noise/", DESKTOP),
        ("/code/lab-10-memory-optimization-reading/memory_optimization/", MOBILE),
    ],
)
def test_blocks_off_screen_are_laid_out_after_load_in_slices(server, browser, path, width):
    """While a long page (an article, or a notebook's cells) loads, the browser renders only
    the blocks near the screen; once it has loaded, a11y.js lays out the rest over several
    tasks, nothing on screen moves, and the page settles with no block left skipped."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.add_init_script(WATCH_SETTLE)
    page = context.new_page()
    page.goto(server + path, wait_until="load")
    assert page.evaluate("() => window.__skippedAtLoad") > 3
    settled(page)
    assert page.evaluate(SKIPPED, BLOCKS) == 0
    # every block a11y.js lays out in this window is marked laid out, those with no element
    # to check the skipping of among them (a run of plain text)
    deferred = "[data-later]" if width <= 480 else '[data-later=""]'
    assert (
        page.evaluate(f"() => document.querySelectorAll('{deferred}:not([data-shown])').length")
        == 0
    )
    assert page.evaluate("() => window.__slices") >= 2
    assert page.evaluate("() => window.__shift") == 0, page.evaluate("() => window.__shifts")
    # a block's wide elements are measured at its own turn, not at an enclosing block's (a
    # notebook cell's outputs are a block inside the cell)
    assert page.evaluate("() => window.__measuredDeferred") == []
    context.close()


@pytest.mark.parametrize("runs", ["laid-out", "skipped"])
def test_a_code_block_in_runs_copies_as_written(server, browser, runs):
    """A long code block's lines come in runs, each a block (later.split_code). Material's
    copy button copies the block's text with no line break of the runs' own, once they are
    laid out and while the runs below the button are still skipped (as before the page has
    settled), and a selection of the block reads the same; a run drawn before it is laid
    out clips none of its lines."""
    context = browser.new_context(viewport={"width": DESKTOP, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page = context.new_page()
    # lab 06's guide shows its starter's long sections (8 runs, 172 lines)
    page.goto(server + "/labs/lab-06-diffusers-pipeline-components/", wait_until="load")
    start_bundle(page)  # the copy buttons are the bundle's
    code = page.locator("pre > code:has(> .code-lines:nth-child(5))").first
    if runs == "skipped":
        code.evaluate(
            "c => c.querySelectorAll('.code-lines').forEach(r => r.removeAttribute('data-shown'))"
        )
    button = code.locator("xpath=..").locator("button.md-code__button[data-md-type=copy]")
    button.scroll_into_view_if_needed()
    skipped = code.evaluate(
        "c => [...c.children].filter(r => !r.firstElementChild.checkVisibility("
        "{contentVisibilityAuto: true})).length"
    )
    assert (skipped >= 2) if runs == "skipped" else (skipped == 0)
    page.evaluate("() => navigator.clipboard.writeText('')")  # the browser's, shared
    button.click()
    copied = page.wait_for_function("() => navigator.clipboard.readText()").json_value()
    assert copied == code.evaluate("c => c.textContent").rstrip()
    assert copied.count("\n") > 100
    # a reader's own selection of the block (what Ctrl+C copies) reads the same
    selected = code.evaluate(
        "c => { const range = document.createRange(); range.selectNodeContents(c);"
        " getSelection().removeAllRanges(); getSelection().addRange(range);"
        " return getSelection().toString(); }"
    )
    assert selected.rstrip() == copied
    if runs == "skipped":
        # a run drawn before a11y.js has laid it out has paint containment, which clips
        # what overflows it: it is as wide as its longest line, wider than the column
        widths = code.evaluate(
            "c => [...c.children].filter(r => r.firstElementChild.checkVisibility("
            "{contentVisibilityAuto: true})).map(r => [r.scrollWidth, r.clientWidth, "
            "c.clientWidth])"
        )
        assert widths and all(scroll <= box for scroll, box, _ in widths), widths
        assert max(box - column for _, box, column in widths) > 50, widths
    context.close()


A11Y_JS = Path(__file__).resolve().parents[1] / "tools" / "infralens_docs" / "a11y.js"

#: a11y.js's wide elements (its WIDE list, read from it): those that scroll must take focus
WIDE = ", ".join(
    re.findall(r'"([^"]+)"', A11Y_JS.read_text().split("var WIDE = [", 1)[1].split("]", 1)[0])
)

#: The first closed <details> ("details") holding elements wider than their column once
#: opened that cannot take focus, or the first visible tab set whose later tab ("tab")
#: holds such: those elements marked, the <summary> or tab label to click marked, all shut
#: again. A listener added after a11y.js's records, as the <details> opens or the tab
#: changes, whether they can take focus by then. Code blocks aside: Material's bundle
#: sets their tabindex itself (on a device that can hover).
HIDDEN_WIDE = """([WIDE, kind]) => {
    const wide = scope => [...scope.querySelectorAll(WIDE)].filter(
        e => !e.matches('pre, pre > code') && !e.hasAttribute('tabindex')
             && !e.parentElement.closest('details:not([open])')
             && e.scrollWidth > e.clientWidth + 1);
    const probed = () => [...document.querySelectorAll('[data-probe]')];
    const found = {};
    for (const d of document.querySelectorAll('details:not([open])')) {
        if (kind !== 'details') break;
        if (d.parentElement.closest('details:not([open])')) continue;
        d.open = true;
        const w = wide(d);
        d.open = false;
        if (w.length) {
            w.forEach(e => e.setAttribute('data-probe', ''));
            found.details = d.querySelector(':scope > summary');
            document.addEventListener('toggle', event => {
                if (event.target === d && d.open) window.__focusable = probed().every(
                    e => e.tabIndex === 0);
            }, true);
            break;
        }
    }
    for (const set of document.querySelectorAll('.tabbed-set')) {
        if (kind !== 'tab' || found.tab || set.closest('details:not([open])')) continue;
        const inputs = [...set.querySelectorAll(':scope > input')];
        const labels = set.querySelectorAll(':scope > .tabbed-labels > label');
        const blocks = set.querySelectorAll(':scope > .tabbed-content > .tabbed-block');
        const checked = inputs.find(input => input.checked);
        for (let i = 0; i < blocks.length && !found.tab; i++) {
            if (inputs[i] === checked) continue;
            inputs[i].checked = true;
            const w = wide(blocks[i]);
            checked.checked = true;
            if (w.length) {
                w.forEach(e => e.setAttribute('data-probe', ''));
                found.tab = labels[i];
                document.addEventListener('change', event => {
                    if (event.target === inputs[i]) window.__focusable = probed().every(
                        e => e.tabIndex === 0);
                });
            }
        }
    }
    const shown = found.details || found.tab;
    if (shown) shown.setAttribute('data-probe-opens', '');
    return Object.keys(found);
}"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/labs/lab-03-scheduler-reading/", "details"), ("/handbook/scheduler/", "tab")],
)
def test_a_closed_details_or_a_later_tab_is_measured_when_shown(server, browser, path, kind):
    """The pass that makes wide elements focusable skips what a closed <details> holds
    (measuring it lays the hidden content out: 80-110 ms at a phone's speed on lab 03's
    guide); opening the <details> makes its wide elements focusable there and then, as
    switching to a tab does a wide equation in it (at 390 px)."""
    context = browser.new_context(viewport={"width": MOBILE, "height": 800})
    page = context.new_page()
    page.goto(server + path, wait_until="load")
    # the bundle first: what it adds to the page makes a11y.js pass over the whole page
    # again, which would hide a <details> or a tab left unmeasured once shown
    start_bundle(page)
    # (on lab 03, a pass that measured closed <details> would have left none to find)
    assert page.evaluate(HIDDEN_WIDE, [WIDE, kind]) == [kind]
    page.locator("[data-probe-opens]").click()
    # (what is measured is whether, not how fast: a loaded CI machine took over 30 s once)
    page.wait_for_function("() => window.__focusable !== undefined", timeout=120_000)
    assert page.evaluate("() => window.__focusable") is True
    context.close()


def without_scroll_anchoring(page, url: str) -> None:
    """Serve ``url`` to ``page`` with scroll anchoring off, as Safari has none: Chromium's
    anchoring would otherwise hold the reader's place by itself."""

    def route(route):
        body = (
            route.fetch()
            .text()
            .replace("</head>", "<style>html, body { overflow-anchor: none; }</style></head>")
        )
        route.fulfill(body=body, content_type="text/html")

    page.route(url, route)


ANCHORING = "() => getComputedStyle(document.documentElement).overflowAnchor"


def test_a_fragment_stays_in_view_without_scroll_anchoring(server, browser):
    """A page opened at a #fragment deep in it is scrolled there while the blocks above are
    placeholders; the heading is at the top of the window once the page has settled."""
    context = browser.new_context(viewport={"width": MOBILE, "height": 800})
    page = context.new_page()
    path = "/labs/lab-06-diffusers-pipeline-components/"
    without_scroll_anchoring(page, server + path)
    page.goto(server + path + "#common-misunderstandings", wait_until="load")
    assert page.evaluate(ANCHORING) == "none"
    settled(page)
    top = page.evaluate(
        "() => document.getElementById('common-misunderstandings').getBoundingClientRect().top"
    )
    assert 0 <= top < 120, top
    context.close()


def test_a_reload_comes_back_to_where_the_reader_was(server, browser):
    """A reloaded page read halfway, with scroll anchoring off (as in Safari): once it has
    settled the reader sees what they saw before (Chromium restores the position late
    enough for the deferred blocks not to move it; a11y.js does nothing for it)."""
    context = browser.new_context(viewport={"width": MOBILE, "height": 800})
    page = context.new_page()
    path = "/labs/lab-06-diffusers-pipeline-components/"
    without_scroll_anchoring(page, server + path)
    page.goto(server + path, wait_until="load")
    settled(page)
    where = "() => document.getElementById('the-code-explained').getBoundingClientRect().top"
    page.evaluate("() => document.getElementById('the-code-explained').scrollIntoView()")
    before = page.evaluate(where)
    page.reload(wait_until="load")
    assert page.evaluate(ANCHORING) == "none"
    settled(page)
    assert abs(page.evaluate(where) - before) < 5, (before, page.evaluate(where))
    context.close()


def test_back_comes_back_to_where_the_reader_was(server, browser):
    """Back to a page read halfway, through Material's instant navigation and with scroll
    anchoring off: once the article swapped back in has settled, the reader sees what they
    saw before they left (a11y.js does nothing for it)."""
    context = browser.new_context(viewport={"width": MOBILE, "height": 800})
    page = context.new_page()
    path = "/labs/lab-06-diffusers-pipeline-components/"
    without_scroll_anchoring(page, server + path)
    page.goto(server + path, wait_until="load")
    settled(page)
    start_bundle(page)
    where = "() => document.getElementById('the-code-explained').getBoundingClientRect().top"
    page.evaluate("() => document.getElementById('the-code-explained').scrollIntoView()")
    page.wait_for_timeout(300)  # Material saves the position as the reader scrolls
    before = page.evaluate(where)
    page.evaluate("() => document.querySelector('a.md-footer__link--next').click()")
    page.wait_for_function("() => !document.getElementById('the-code-explained')")
    settled(page)
    page.go_back()
    page.wait_for_function("() => !!document.getElementById('the-code-explained')")
    settled(page)
    assert page.evaluate(ANCHORING) == "none"
    assert abs(page.evaluate(where) - before) < 5, (before, page.evaluate(where))
    context.close()


#: At the page's width, what a phone reader cannot read: chart text under 8 px (its font
#: size times the chart's scale), an identifier (a run of word characters and dots) in a
#: table's code split across lines, and a code block whose lines wrap (it scrolls instead)
UNREADABLE = r"""() => {
    const problems = [];
    document.querySelectorAll("details").forEach(d => { d.open = true; });
    const seen = {charts: 0, cells: 0, blocks: 0};
    for (const svg of document.querySelectorAll("svg.lab-chart")) {
        const box = svg.getBoundingClientRect(), view = svg.viewBox.baseVal;
        if (!box.width) continue;  // in a tab not shown
        seen.charts += 1;
        let least = Infinity;
        for (const text of svg.querySelectorAll("text")) {
            const px = parseFloat(getComputedStyle(text).fontSize) * box.width / view.width;
            least = Math.min(least, px);
        }
        if (least < 8) problems.push(`chart ${view.width} wide at ${box.width}: ${least} px`);
    }
    const range = document.createRange();
    for (const code of document.querySelectorAll("td code, th code")) {
        if (!code.getClientRects().length) continue;
        seen.cells += 1;
        const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (const word of node.data.matchAll(/[\w.]+/g)) {
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                const lines = new Set(Array.from(range.getClientRects())
                    .filter(r => r.width > 0).map(r => Math.round(r.top)));
                if (lines.size > 1) problems.push(`${word[0]} split over ${lines.size} lines`);
            }
        }
    }
    for (const code of document.querySelectorAll("pre > code")) {
        if (!code.getClientRects().length) continue;
        seen.blocks += 1;
        const style = getComputedStyle(code);
        const lines = code.textContent.replace(/\n$/, "").split("\n").length;
        const inner = code.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
        if (inner > (lines + 0.5) * parseFloat(style.lineHeight)) {
            problems.push(`a code block of ${lines} lines wraps: ${code.textContent.slice(0, 40)}`);
        }
    }
    return [seen, problems];
}"""


@pytest.mark.parametrize(
    ("path", "width"),
    [
        ("/labs/lab-04-cfg-code-reading/", MOBILE),
        ("/handbook/forward-reverse/", MOBILE),
        ("/handbook/adapters/", 844),  # a phone held sideways (iPhone 14: 844 x 390)
    ],
)
def test_figures_tables_and_code_read_on_a_phone(server, browser, path, width):
    """At 390 px, and on a phone held sideways, every chart's text renders at 8 px or more
    (a multi-panel figure and a diagram among them), no identifier in a table is split
    across lines, and code blocks scroll rather than wrap. (tests/test_diagrams.py holds
    every chart on every page to the min-width that this checks the effect of.)"""
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    page.goto(server + path, wait_until="load")
    settled(page)
    seen, problems = page.evaluate(UNREADABLE)
    assert seen["charts"] >= 1 and seen["cells"] >= 10, seen
    assert problems == []
    context.close()


def test_tables_fit_their_column_at_desktop_width(server, browser):
    """The phone rule that keeps a table's identifiers whole (site.css) leaves desktop alone:
    at 1280 px the forward-reverse page's tables, code in their cells, fit their column."""
    context = browser.new_context(viewport={"width": DESKTOP, "height": 800})
    page = context.new_page()
    page.goto(server + "/handbook/forward-reverse/", wait_until="load")
    widths = page.evaluate(
        "() => [...document.querySelectorAll('.md-typeset table')]"
        ".map(t => [t.scrollWidth, t.clientWidth])"
    )
    assert len(widths) >= 2 and [w for w in widths if w[0] > w[1] + 1] == []
    context.close()


def test_mathml_renders_with_size(server, browser):
    page, problems = visit(browser, server + "/handbook/objective/")
    settled(page)  # an equation below the first screen is laid out once the page settles
    box = page.locator("math").first.bounding_box()
    assert box and box["width"] > 5 and box["height"] > 5
    assert problems == []
    page.context.close()


def test_notebook_pages_show_their_figures_styled(server, browser):
    """Notebook figures are the site's own: SVG charts inline, coloured by site.css (a
    plotted line has a visible stroke, a frame is not filled black), PNGs as loaded files."""
    page, _ = visit(browser, server + "/code/lab-01-forward-noise-process/forward_noise/")
    start_bundle(page)  # the copy buttons are the bundle's
    chart = page.locator(".jp-OutputArea-output .lab-figure__chart svg").first
    box = chart.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 50
    assert chart.locator("polyline").first.evaluate("l => getComputedStyle(l).stroke") not in (
        "none",
        "",
    )
    assert chart.locator(".frame").first.evaluate("r => getComputedStyle(r).fill") == "none"
    assert (
        page.locator(".jp-InputArea-editor button.md-code__button[data-md-type=copy]").count() > 3
    )
    page.context.close()
    page, _ = visit(browser, server + "/code/lab-12-end-to-end-inference-trace/pipeline_trace/")
    img = page.locator(".jp-OutputArea-output img").first
    img.scroll_into_view_if_needed()  # lazy: loads when it nears the viewport
    page.wait_for_function("i => i.complete && i.naturalWidth > 100", arg=img.element_handle())
    page.context.close()


def test_palette_toggle_switches_to_dark(server, browser):
    page, _ = visit(browser, server + "/labs/")
    before = page.locator("body").get_attribute("data-md-color-scheme")
    page.locator("label.md-header__button[for^='__palette']:visible").first.click()
    after = page.locator("body").get_attribute("data-md-color-scheme")
    assert {before, after} == {"default", "slate"}
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_bundle_waits_for_the_first_interaction(server, browser, scheme):
    """Material's bundle is not fetched at load; the page is already in the reader's
    colour scheme with its toggle shown. A toggle clicked before the bundle starts is
    applied and remembered; the first pointer move starts the bundle, whose features
    (copy buttons) appear, with no console error."""
    expected = {"light": "default", "dark": "slate"}[scheme]
    context = browser.new_context(color_scheme=scheme)
    page = context.new_page()
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requested.append(urlparse(r.url).path))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/labs/lab-04-cfg-code-reading/", wait_until="networkidle")
    page.wait_for_timeout(300)
    assert not [u for u in requested if "/assets/javascripts/" in u], requested
    assert page.locator("body").get_attribute("data-md-color-scheme") == expected
    assert page.locator("label[for^='__palette']:visible").count() == 1
    assert page.locator("button.md-code__button").count() == 0
    # a click that is not a pointer event (assistive technology, scripts)
    page.evaluate("document.querySelector('label[for^=__palette]:not([hidden])').click()")
    switched = page.locator("body").get_attribute("data-md-color-scheme")
    assert switched != expected
    page.reload(wait_until="networkidle")
    assert page.locator("body").get_attribute("data-md-color-scheme") == switched
    start_bundle(page)
    assert sum("/assets/javascripts/bundle." in u for u in requested) >= 1
    assert page.locator("button.md-code__button").count() > 3
    assert page.locator("body").get_attribute("data-md-color-scheme") == switched
    assert errors == []
    context.close()


def test_search_index_waits_for_the_reader(server, browser):
    """No page fetches the search index or starts the search worker at load; reaching for
    search (hovering the field, then typing) fetches both once, and results appear."""
    page = browser.new_context().new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(urlparse(r.url).path))
    page.goto(server + "/labs/lab-11-scheduler-loop-reading/", wait_until="networkidle")
    start_bundle(page)  # the bundle runs, and still fetches nothing for search
    page.wait_for_load_state("networkidle")
    assert any("/assets/javascripts/bundle." in u for u in requested), requested
    assert not [u for u in requested if "search" in u], requested
    box = page.locator("input.md-search__input")
    box.hover()
    box.click()
    box.press_sequentially("guidance", delay=20)
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    searched = [u for u in requested if "search" in u]
    assert sum(u.endswith("/search/search_index.json") for u in searched) == 1, searched
    assert any("/workers/search." in u for u in searched), searched
    # Results land on sections and carry the query for highlighting on the target page.
    links = page.locator(".md-search-result a").evaluate_all("els => els.map(e => e.href)")
    assert any("#" in link and "h=guidance" in link for link in links), links
    # Opened fresh (no search worker yet), a result page still highlights the query.
    target = next(link for link in links if "#" in link and "h=guidance" in link)
    page.goto(target, wait_until="networkidle")
    page.wait_for_selector("mark[data-md-highlight]", timeout=30_000)
    page.context.close()


#: Notes, on the page, when the search worker has built its index (Material's READY message)
SEARCH_READY_PROBE = """
const NativeWorker = window.Worker;
window.Worker = function (url, options) {
  const worker = new NativeWorker(url, options);
  worker.addEventListener('message', e => { if (e.data && e.data.type === 1) window.__searchReady = true; });
  return worker;
};
"""


def test_search_index_builds_while_the_bundle_loads(server, browser):
    """Reaching for search starts the search worker, which fetches the index and builds its
    lunr index without waiting for Material's bundle (still loading and starting then, on a
    reader's first interaction); the bundle, once started, searches
    with that worker and shows results, and the index is downloaded once."""
    context = browser.new_context()
    held = []  # the bundle's request, held until the index is built
    context.route("**/assets/javascripts/bundle.*.min.js", lambda route: held.append(route))
    page = context.new_page()
    page.add_init_script(SEARCH_READY_PROBE)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(urlparse(r.url).path))
    page.goto(server + "/", wait_until="networkidle")
    box = page.locator("input.md-search__input")
    box.hover()  # starts the bundle (held) and, reaching for search, the search worker
    page.wait_for_function("() => window.__searchReady === true", timeout=60_000)
    assert len(held) == 1 and page.evaluate("() => !window.component$")
    held[0].continue_()
    box.click()
    box.press_sequentially("strength", delay=20)
    shown = page.wait_for_function(FIRST_RESULT_FOR, arg="strength", timeout=60_000)
    assert shown.json_value() == SEARCH_FIRST["strength"]
    assert sum(u.endswith("/search/search_index.json") for u in requested) == 1, requested
    context.close()


def test_search_finds_a_lab(server, browser):
    page, problems = visit(browser, server + "/")
    page.locator("input.md-search__input").click()
    page.locator("input.md-search__input").press_sequentially("alphas_cumprod", delay=20)
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    assert page.locator(".md-search-result__item").count() > 0
    assert problems == []
    page.context.close()


#: A topic's word -> the handbook section that teaches it, which search lists first, above
#: the labs that use the word (the glossary's ``taught_in`` and a page's ``search_terms``
#: make the section's tags; the starters' notebook pages are not in the index:
#: infralens_docs.search_terms)
SEARCH_FIRST = {
    "strength": "/handbook/img2img/",
    "guidance_scale": "/handbook/cfg/",
    "sigma": "/handbook/scheduler/",
    "offload": "/handbook/memory/",
    "cache_context": "/handbook/acceleration/",
    "enable_model_cpu_offload": "/handbook/memory/",
    "torch.compile": "/handbook/compilation/",
    "trailing": "/handbook/scheduler/",
    "apg": "/labs/lab-22-guidance-beyond-cfg/",  # lower case: results carry ?h= lower-cased
    "perturbed attention guidance": "/labs/lab-22-guidance-beyond-cfg/",  # a "-" splits words in ?h=
    "modular pipeline": "/labs/lab-23-modular-diffusers/",
    "flux.3": "/handbook/models/",
}
#: the first result's address, once the results shown are the query ``q``'s (their links to
#: a matching section carry ``?h=q``)
FIRST_RESULT_FOR = """q => { const links = [...document.querySelectorAll('.md-search-result__item a')];
    return links.some(a => new URL(a.href).searchParams.get('h') === q)
        && new URL(links[0].href).pathname; }"""


def test_search_lists_the_teaching_section_first(server, browser):
    """For a topic's word, the first search result is the handbook section that teaches it,
    and no result is a starter's notebook page."""
    page = browser.new_context().new_page()
    page.goto(server + "/", wait_until="networkidle")
    box = page.locator("input.md-search__input")
    box.click()
    first, listed = {}, set()
    for query in SEARCH_FIRST:
        box.fill(query)  # the whole query at once (results for no partial word)
        box.press("End")  # Material searches on a key's keyup, not on input
        shown = page.wait_for_function(FIRST_RESULT_FOR, arg=query, timeout=60_000)
        first[query] = shown.json_value()
        links = page.locator(".md-search-result__item a")
        listed.update(urlparse(a).path for a in links.evaluate_all("e => e.map(a => a.href)"))
    page.context.close()
    assert first == SEARCH_FIRST
    assert listed and not [path for path in listed if path.startswith("/code/")], listed


def test_search_finds_words_only_code_or_claims_had(server, browser, built_site):
    """With code blocks and verified-claims lists out of the search index's text
    (infralens_docs.search_slim; test_build checks that), a word with a letter a-z that only
    they had and that begins no word of the page's shown text is in the section's
    ``keywords``, which Material's worker searches too: searching it lists that section."""
    from infralens_docs.search_slim import FIELD

    index = json.loads((built_site / "search" / "search_index.json").read_text(encoding="utf-8"))
    shown = " ".join(e["title"] + " " + e["text"] for e in index["docs"]).lower()
    sections: dict[str, list[str]] = {}  # keyword -> the sections that have it
    for entry in index["docs"]:
        for word in entry.get(FIELD, "").split():
            sections.setdefault(word, []).append(entry["location"])
    # identifiers a reader might search, each in one section's keywords and no shown text
    chosen = [
        (word, places[0])
        for word, places in sections.items()
        if len(places) == 1 and re.fullmatch(r"[a-z][a-z0-9]*_[a-z0-9_]{3,}", word)
        and word not in shown
    ][:3]  # fmt: skip
    assert len(chosen) == 3, chosen
    page = browser.new_context().new_page()
    page.goto(server + "/", wait_until="networkidle")
    box = page.locator("input.md-search__input")
    box.click()
    listed = {}
    for word, _ in chosen:
        box.fill(word)
        box.press("End")  # Material searches on a key's keyup
        page.wait_for_function(FIRST_RESULT_FOR, arg=word, timeout=60_000)
        links = page.locator(".md-search-result__item a").evaluate_all("e => e.map(a => a.href)")
        listed[word] = {index_location(link) for link in links}
    page.context.close()
    assert all(location in listed[word] for word, location in chosen), (chosen, listed)


def index_location(href: str) -> str:
    """A search result's address as the search index's ``location`` ("labs/x/#anchor")."""
    url = urlparse(href)
    return url.path.lstrip("/") + (f"#{url.fragment}" if url.fragment else "")


@pytest.mark.parametrize("key", ["/", "s"])
def test_first_key_press_opens_search(server, browser, key):
    """On a freshly loaded page (bundle not started), one press of a search shortcut opens
    search with the focus in the field, and the word typed next shows results: the key
    that starts the bundle is not lost, and not typed into the field either."""
    page = browser.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server + "/handbook/cfg/", wait_until="networkidle")
    assert page.evaluate("() => !window.component$")  # nothing has started the bundle
    page.keyboard.press(key)
    box = page.locator("input.md-search__input")
    assert page.evaluate("() => document.activeElement.matches('input.md-search__input')")
    page.keyboard.type("guidance", delay=20)
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    assert box.input_value() == "guidance"  # the shortcut itself was not typed
    assert page.locator("input[data-md-toggle=search]").is_checked()
    assert errors == []
    page.context.close()


def test_first_key_press_follows_next_page(server, browser):
    """The previous/next page shortcuts work on the first key press too."""
    page = browser.new_context().new_page()
    start = server + "/handbook/cfg/"
    page.goto(start, wait_until="networkidle")
    target = urljoin(start, page.locator("link[rel=next]").get_attribute("href"))
    assert target != start
    page.keyboard.press("n")
    page.wait_for_url(target, timeout=10_000)
    page.context.close()


AXE_VERSION = "4.14.1"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]


@pytest.fixture(scope="module")
def axe_source() -> str:
    """axe-core from npm, installed into .cache/axe on first use (CI has npm); one install
    when several test workers ask at once."""
    from infralens_docs.runner import CACHE_ROOT

    prefix = CACHE_ROOT / "axe"
    script = prefix / "node_modules" / "axe-core" / "axe.min.js"
    prefix.mkdir(parents=True, exist_ok=True)
    with FileLock(prefix.with_suffix(".lock")):
        if not script.is_file():
            if not shutil.which("npm"):
                if os.environ.get("CI"):
                    pytest.fail("npm is required in CI for axe-core (apt-get install npm)")
                pytest.skip("npm is not installed: cannot fetch axe-core")
            subprocess.run(
                ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                 str(prefix), f"axe-core@{AXE_VERSION}"],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
    return script.read_text(encoding="utf-8")


#: The rules whose result depends on the colour scheme: text contrast, and a link told
#: apart from its paragraph by colour alone. The dark scheme changes colours only (Material's
#: `slate` palette is CSS custom properties; the DOM and layout are the light scheme's), so
#: in dark the colour rules run; where each rule runs is ``axe_passes``'.
AXE_COLOUR_RULES = ["color-contrast", "link-in-text-block"]
AXE_ALL = {"runOnly": {"type": "tag", "values": AXE_TAGS}, "resultTypes": ["violations"]}
AXE_COLOUR = {
    "runOnly": {"type": "rule", "values": AXE_COLOUR_RULES},
    "resultTypes": ["violations"],
}

#: Pages axe judges at once, each in its own browser context (its own renderer process):
#: axe's work is JavaScript on one thread per page, so two pages keep both cores busy.
AXE_PAGES_AT_ONCE = 2


#: INFRALENS_AXE_EVERYWHERE=1 (the weekly run of the Tests workflow): every pass on every page
AXE_EVERYWHERE = bool(os.environ.get("INFRALENS_AXE_EVERYWHERE"))


def axe_passes(
    width: int, on_cover: bool, everywhere: bool = AXE_EVERYWHERE
) -> list[tuple[str, dict]]:
    """(state, axe options) for one page, in the order they run on one load of it: which
    rules run where.

    On every page at both widths, once the first interaction has started Material's bundle
    (the state a reader's first touch or pointer move brings), in light: every rule. As
    loaded (light and dark) and in dark, the rules run on the fewest pages that together
    show every kind of element of the site (``colour_pages``), and on every page in the
    weekly run (``AXE_EVERYWHERE``). On those pages the states follow one another on one
    load (``reach``): as loaded in light, in dark before the bundle has started (the
    palette set as the page sets it at load), in dark once the bundle has started, back to
    light. The weekly run opens the page afresh for each state as loaded, with the reader's
    system preferring the scheme.

    That rests on assumptions, each measured once and re-checked by the weekly run:
    - The bundle changes no page's content, only Material's own parts, whose as-loaded forms
      are element kinds the covering pages show. Measured 2026-11-29 on the site's 71 pages
      at 1280 px: every element present at load and gone or changed once the bundle ran was
      a tab, navigation, footer, search, logo, skip or heading-anchor link whose address the
      bundle rewrites, a code block, or content tabs' labels.
    - A text's colours in the content do not depend on the width or on the bundle, only on
      the CSS, which tells elements apart by their tag, classes, ancestors and attributes;
      the dark scheme is the light one's CSS with other values of its custom properties, so
      a colour pair in dark belongs to a kind of element as it does in light. Measured
      2026-11-26 (the site's 70 pages, every element's computed colour, background, opacity
      and font in the content, at load, after the first interaction and at 390 px): the
      differences were Material's own parts, present on the covering pages (the header and
      drawer at mobile, content tabs before the bundle turns them into tabs, and their
      scroll gradient at mobile).
    - What 390 px changes is which parts the CSS shows and how it lays them out, which
      depends on the kinds of element (Material's drawer and header among them).
    - A page switched to dark before the bundle has started is the page opened in dark: the
      page sets its palette at load and on a change of the palette's input with one
      function (bundle_on_interaction.js, ``applyPalette``), and the switch starts no
      bundle (``reach`` asserts it).
    What the kinds (tag, classes, parent, inline style) cannot see, such as a background that
    lies behind a text at one width only, is what the weekly run is for."""
    if everywhere:
        return [
            ("dark at load", AXE_COLOUR),
            ("at load", AXE_ALL),
            ("after interaction", AXE_ALL),
            ("dark", AXE_COLOUR),
        ]
    if on_cover:
        return [
            ("at load", AXE_ALL),
            ("dark at load", AXE_COLOUR),
            ("dark", AXE_COLOUR),
            ("after interaction", AXE_ALL),
        ]
    return [("after interaction", AXE_ALL)]


#: Set the palette before Material's bundle has started, as the page sets it at load from
#: the reader's preference (bundle_on_interaction.js applies it on the input's change):
#: unlike a click on the toggle, this is no interaction that starts the bundle
PALETTE_AT_LOAD = """scheme => {
    const input = [...document.querySelectorAll("[data-md-component=palette] input[name=__palette]")]
        .find(i => i.getAttribute("data-md-color-scheme") === scheme);
    input.checked = true;
    input.dispatchEvent(new Event("change"));
}"""


def reach(page, state: str) -> None:
    """Bring a page opened as loaded in light to ``state`` (``axe_passes``' order)."""
    started = page.evaluate("() => !!window.component$")
    if state == "dark at load":
        assert not started, "the bundle started before the as-loaded passes ended"
        page.emulate_media(color_scheme="dark")
        page.evaluate(PALETTE_AT_LOAD, "slate")
        assert page.evaluate("() => document.body.getAttribute('data-md-color-scheme')") == "slate"
        next_frames(page)
        assert not page.evaluate("() => !!window.component$")
    elif state in ("dark", "after interaction"):
        if not started:
            start_bundle(page)
        set_scheme(page, "dark" if state == "dark" else "light")


def test_every_rule_judges_every_page_at_each_width():
    """Whatever the covering pages get besides, every page at each width has a pass that
    runs every rule once the bundle has started, in light; the covering pages have each
    state once; the weekly run has every state on every page."""
    states = {"at load", "dark at load", "after interaction", "dark"}
    for width in (DESKTOP, MOBILE):
        for on_cover in (False, True):
            assert ("after interaction", AXE_ALL) in axe_passes(width, on_cover)
        cover = [state for state, _ in axe_passes(width, True)]
        assert sorted(cover) == sorted(states)
        assert {state for state, _ in axe_passes(width, False, everywhere=True)} == states


#: Run in a context's pages before their own scripts: forget the palette the last page saved,
#: so that each page opens as on a first visit
FIRST_VISIT = "try { localStorage.clear(); } catch (error) {}"


def start_opening(page, url: str, scheme: str):
    """Open ``url`` as a first visit (``FIRST_VISIT``) of a reader whose system prefers
    ``scheme``: the page takes its palette from the preference at load, as
    bundle_on_interaction.js does before any interaction. This half navigates until the
    server has answered, so that several pages load (and their network falls idle) at once;
    ``finish_opening`` waits for the rest."""
    page.emulate_media(color_scheme=scheme)
    response = page.goto(url, wait_until="commit")
    assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"


def finish_opening(page, scheme: str, wait_until: str = "load") -> None:
    """``start_opening``'s second half: wait for ``wait_until``, then check the palette."""
    page.wait_for_load_state(wait_until)
    want = "slate" if scheme == "dark" else "default"
    assert page.evaluate("() => document.body.getAttribute('data-md-color-scheme')") == want


def set_scheme(page, scheme: str) -> None:
    """Switch the colour scheme of a started page as a reader does, with the header's
    toggle, their system preferring it too (the site's CSS keys every colour on the
    palette's ``data-md-color-scheme``, none on the media query)."""
    page.emulate_media(color_scheme=scheme)
    want = "slate" if scheme == "dark" else "default"
    page.evaluate(
        """want => { if (document.body.getAttribute("data-md-color-scheme") !== want)
            document.querySelector("[data-md-component=palette] label:not([hidden])").click(); }""",
        want,
    )
    page.wait_for_function(
        "want => document.body.getAttribute('data-md-color-scheme') === want", arg=want
    )
    next_frames(page)


VOID_ELEMENTS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
     "track", "wbr"}
)  # fmt: skip


class ElementKinds(HTMLParser):
    """The kinds of element a page's HTML holds, as CSS selectors tell them apart: tag and
    classes, its parent's tag and classes, and its inline style."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.kinds: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = attrs.get("class") or ""
        me = ".".join([tag, *sorted(classes.split())])
        in_code = any(kind.split(".")[0] == "pre" for kind in self.stack)
        if not (in_code and tag == "span" and classes and "md-" not in classes):
            # (code's token spans are ``token_pages``' to cover: unwrapped on other pages)
            self.kinds.add(
                f"{self.stack[-1] if self.stack else ''}>{me}{{{attrs.get('style') or ''}}}"
            )
        if tag not in VOID_ELEMENTS:
            self.stack.append(me)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].split(".")[0] == tag:
                del self.stack[i:]
                break


def element_kinds(site: Path, path: str) -> set[str]:
    parser = ElementKinds()
    parser.feed((site / path.strip("/") / "index.html").read_text(encoding="utf-8"))
    return parser.kinds


def colour_pages(site: Path, paths: list[str]) -> set[str]:
    """The fewest pages (chosen greedily) that together hold every element kind of the site."""
    kinds = {path: element_kinds(site, path) for path in paths}
    need, chosen = set().union(*kinds.values()), set()
    while need:
        best = max(paths, key=lambda path: len(kinds[path] & need))
        chosen.add(best)
        need -= kinds[best]
    return chosen


def test_colour_pages_hold_every_element_kind(built_site):
    """The pages the colour rules judge at mobile width and at load hold every element kind
    of the site (content tabs and figures among them), and they are not all the pages."""
    paths = page_urls(built_site)
    chosen = colour_pages(built_site, paths)
    everywhere = set().union(*(element_kinds(built_site, path) for path in paths))
    assert set().union(*(element_kinds(built_site, path) for path in chosen)) == everywhere
    assert any("tabbed-set" in kind for kind in everywhere) and len(everywhere) > 300
    assert len(chosen) < len(paths) / 2


#: Pygments' token spans: the only property of theirs a rule reads is their colour, one per
#: token class and kind of page, yet on a page of code they are most of what axe walks
#: (two to three times its time). Each (kind of page, class) is judged on the fewest pages
#: that show them all; elsewhere the spans are unwrapped into their text before axe runs,
#: leaving the code's text, its block and the page's layout as they were (the runs of a
#: long block's lines, later.split_code, stay).
TOKEN_SPANS = "pre span[class]:not([class*='md-'], .code-lines)"
TOKEN_CLASS = re.compile(r'<span class="([a-z][a-z0-9]{0,2})">')
UNWRAP_TOKENS = "selector => { for (const s of document.querySelectorAll(selector)) s.replaceWith(...s.childNodes); }"


def token_kinds(site: Path, path: str) -> set[str]:
    """The (kind of page, Pygments class) pairs of a page's highlighted code."""
    html = (site / path.strip("/") / "index.html").read_text(encoding="utf-8")
    kind = "notebook" if path.startswith("/code/") else "page"
    found = set()
    for pre in re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.DOTALL):
        found |= {f"{kind}:{c}" for c in TOKEN_CLASS.findall(pre)}
    return found


def token_pages(site: Path, paths: list[str]) -> set[str]:
    """The fewest pages (chosen greedily) whose code shows every token kind of the site."""
    kinds = {path: token_kinds(site, path) for path in paths}
    need, chosen = set().union(*kinds.values()), set()
    while need:
        best = max(paths, key=lambda path: len(kinds[path] & need))
        chosen.add(best)
        need -= kinds[best]
    return chosen


def test_every_token_kind_is_judged_on_some_page(built_site):
    """The pages axe judges with their token spans show every (kind of page, token class)
    pair of the site's code, and they are a few pages, not all."""
    paths = page_urls(built_site)
    chosen = token_pages(built_site, paths)
    everywhere = set().union(*(token_kinds(built_site, path) for path in paths))
    judged = set().union(*(token_kinds(built_site, path) for path in chosen))
    assert len(everywhere) > 20 and judged == everywhere
    assert len(chosen) < len(paths) / 4


@pytest.fixture(scope="module")
def axe_pages(built_site) -> tuple[list[str], set[str], set[str]]:
    """Every page, the pages judged with their token spans, the pages the colour rules
    judge at mobile width and at load."""
    paths = page_urls(built_site)
    return paths, token_pages(built_site, paths), colour_pages(built_site, paths)


@in_parts
@pytest.mark.parametrize("width", [DESKTOP, MOBILE], ids=["desktop", "mobile"])
def test_axe_finds_no_violation_on_any_page(server, browser, axe_source, axe_pages, width,
                                            part):  # fmt: skip
    """axe-core's WCAG 2.0-2.2 A/AA and best-practice rules pass on every page at desktop
    and mobile width once the first interaction has started Material's bundle; as loaded
    and in dark, on the pages ``axe_passes`` says (every page weekly); code's token colours
    on the pages that show every token class (``token_pages``). Through all of it no console
    error, page error or request to another host. The first block left to lay out after
    load (later.py) starts 1.2 windows down or more. And at desktop width the page's first
    load is a first-time visitor's, held to ``first_visit_problems`` (bytes at load within
    the budget, that block 1.5 windows down)."""
    # Reduced motion, which Material's CSS honours by turning every transition off: axe
    # scrolls elements into view to measure them, Material hides its tabs while the page is
    # scrolled and fades them back in (0.25 s, 20 ms later per tab), and a measurement taken
    # mid-fade saw a tab link at partial opacity (a color-contrast failure that came and
    # went with CPU load). The settled states axe must judge are the same either way; so is
    # the switch to dark, which would otherwise fade every colour over 0.25 s.
    contexts = [
        browser.new_context(
            viewport={"width": width, "height": 800}, color_scheme="light", reduced_motion="reduce"
        )
        for _ in range(AXE_PAGES_AT_ONCE)
    ]
    first_visits = width == DESKTOP
    tabs = []
    for context in contexts:
        context.add_init_script(FIRST_VISIT)
        page = context.new_page()
        if first_visits:
            # bytes at load as a first-time visitor's: every fetch goes to the server (the
            # context's cache would serve the next page the theme's assets, or the server answer
            # 304); a CDP session of the test's own applies this only once its Network is on
            cdp = context.new_cdp_session(page)
            cdp.send("Network.enable")
            cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        errors: list[str] = []
        responses: list = []
        watch(page, errors, responses if first_visits else None)
        tabs.append((page, errors, responses))
    found, marked = {}, []
    paths, with_tokens, cover = axe_pages
    plans = {path: axe_passes(width, path in cover) for path in paths}
    paths = paths[part::PARTS]
    assert paths
    for i in range(0, len(paths), AXE_PAGES_AT_ONCE):
        batch = list(zip(paths[i : i + AXE_PAGES_AT_ONCE], tabs, strict=False))
        for step in range(max(len(plans[path]) for path, _ in batch)):
            # start axe on every page of the batch, then collect: the pages run at once
            running = [(path, tab) for path, tab in batch if step < len(plans[path])]
            opening = {}
            for path, (page, _, responses) in running:  # (re)open the pages: they load at once
                state = plans[path][step][0]
                if step == 0 or (AXE_EVERYWHERE and state.endswith("at load")):
                    responses.clear()
                    scheme = "dark" if state == "dark at load" else "light"
                    start_opening(page, server + path, scheme)
                    opening[path] = scheme
            for path, (page, _, responses) in running:
                state, options = plans[path][step]
                fresh = path in opening
                if fresh:
                    dark = state == "dark at load"
                    first_visit = first_visits and step == 0
                    finish_opening(page, opening[path], "networkidle" if first_visit else "load")
                    if first_visit:
                        problems, has_later = first_visit_problems(page, path, responses)
                        found.update(problems)
                        marked += [path] if has_later else []
                    page.add_script_tag(content=axe_source)
                    if path not in with_tokens:
                        page.evaluate(UNWRAP_TOKENS, TOKEN_SPANS)
                    settled(page)  # every block laid out, a11y.js's pass made
                    top, screen = page.evaluate(FIRST_LATER)
                    if not dark and top is not None and top < 1.2 * screen:
                        found[f"{path} data-later at {top:.0f} px ({screen} px window)"] = []
                if not (fresh and state.endswith("at load")):
                    reach(page, state)
                page.evaluate("options => { window.__axe = axe.run(document, options); }", options)
            for path, (page, _, _) in running:
                state = plans[path][step][0]
                for violation in page.evaluate("() => window.__axe")["violations"]:
                    targets = [node["target"] for node in violation["nodes"]][:3]
                    found.setdefault(f"{path} {state}", []).append(f"{violation['id']}: {targets}")
        for path, (_, errors, _) in batch:
            if errors:
                found[f"{path} errors"] = errors[:]
                errors.clear()
    for context in contexts:
        context.close()
    if first_visits and len(marked) <= 5:  # every part holds long pages
        found["5 pages or fewer with a data-later block"] = marked
    # (each page and what failed on it in full, which pytest's diff of a dict would cut)
    assert not found, "\n".join(f"{where}: {what}" for where, what in found.items())


def test_offline_copy_reads_and_searches_from_the_file_system(offline_site, browser):
    """The offline build opened from disk (file://): the tabs lead to pages, a notebook
    page's PNG figure loads, a starter page's downloads are files beside it, and
    search finds results (its worker runs in a frame) with no request to any host."""
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on(
        "request",
        lambda r: (
            None if r.url.startswith(("file:", "data:", "about:")) else problems.append(r.url)
        ),
    )
    page.goto((offline_site / "index.html").as_uri(), wait_until="load")
    page.locator("a.md-tabs__link", has_text="Labs").click()
    page.wait_for_url("**/labs/index.html")
    # (every link of every page is checked to name a file by test_build.py)
    page.goto(
        (offline_site / "code/lab-12-end-to-end-inference-trace/pipeline_trace.html").as_uri()
    )
    for href in page.locator("p.starter-links a").evaluate_all("els => els.map(e => e.href)"):
        assert Path(urlparse(href).path).is_file(), href
    img = page.locator(".jp-OutputArea-output img").first
    img.scroll_into_view_if_needed()
    page.wait_for_function("i => i.complete && i.naturalWidth > 100", arg=img.element_handle())
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("guidance", delay=20)
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    page.locator(".md-search-result a").first.click()
    page.wait_for_url("**/*.html*")
    assert page.locator("h1").count() == 1
    assert problems == []
    context.close()
