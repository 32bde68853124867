"""The built book in a real browser: every page loads offline and cleanly, navigation works.

The smoke book is built once per module (``build_book("smoke", tmp)``), unless the
environment variable ``BARTER_MINI_BOOK_HTML`` names an already built ``_build/html``
folder. The folder is served with ``python -m http.server`` on 127.0.0.1 and opened in
Debian's Chromium (``/usr/bin/chromium``) through Playwright's sync API; Playwright's own
browsers are never used (``playwright install`` downloads them and fails offline).

Every page of ``_toc.yml`` must load with no failed request (network error or HTTP status
>= 400), no request to any host but 127.0.0.1 (the book must work fully offline), no
console error, no uncaught exception, no broken image and no internal link to a missing file; the method page must have math
typeset by the locally served MathJax. The theme's next/previous links must walk the table
of contents in order, and the search page must find "clone". On a 1280-pixel-wide screen no
table of the from-scratch, ablation and efficiency chapters may be wider than the content
column. The API reference is several pages, one per layer of the package, whose ``[source]``
links (sphinx.ext.viewcode) open the module's code, highlighted and served by the book
itself; the method page shows the update's functions beside their formulas; the chapter
"BARTER from scratch" is in the navigation.

Fixture names (``book_html``, ``book_url``, ``chromium_browser``, ``tab``) deliberately
differ from pytest-playwright's ``browser``/``page``/``base_url``, so that plugin, when
installed, is never involved.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from helpers import HOST, free_port, running_server

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
#: pages with their own checks (paths relative to the html folder)
METHOD_PAGE = "book/method.html"
WALKTHROUGH_PAGE = "notebooks/01_walkthrough.html"
SCREENSHOT = Path("/tmp/barter_mini_book_walkthrough.png")
#: the landing page of the API reference and its pages, one per layer of the package
API_PAGE = "book/api.html"
API_LAYER_PAGES = ("book/api/core.html", "book/api/masked.html", "book/api/training.html",
                   "book/api/measure.html", "book/api/book.html", "book/api/cli.html")
FROM_SCRATCH_PAGE = "notebooks/00_barter_from_scratch.html"
FROM_SCRATCH_TITLE = "BARTER from scratch"
#: the update's functions whose code the method page shows beside their formulas
METHOD_CODE = ("select_receiver", "receiver_room", "select_donors", "select_parents", "prune", "clone",
               "remap_optimizer_state")
TIMEOUT_MS = 20_000

pytestmark = pytest.mark.slow

# make test installs both (pyproject's test extra, the Makefile's apt step): a missing one
# is a failure, never a skip
from playwright import sync_api  # noqa: E402

assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium"


# --- table of contents --------------------------------------------------------------------

def find_toc(html_dir: Path) -> Path:
    """The ``_toc.yml`` the book was built from: the stage's copy (``html/../../``), else the repo's."""
    for candidate in (html_dir.parent.parent / "_toc.yml", REPO / "_toc.yml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no _toc.yml beside {html_dir} nor in {REPO}")


def toc_pages(toc_file: Path, html_dir: Path) -> list[str]:
    """Every page of a jb-book/jb-article ``_toc.yml`` as an html path, root first, in reading order."""
    toc = yaml.safe_load(toc_file.read_text(encoding="utf-8"))

    def as_html(docname: str) -> str:
        docname = str(docname).strip("/")
        for suffix in (".md", ".ipynb", ".rst", ".myst"):
            if docname.endswith(suffix):
                docname = docname[: -len(suffix)]
        return docname + ".html"

    found = [as_html(toc["root"])]

    def walk(entries) -> None:
        for entry in entries or []:
            if "file" in entry:
                found.append(as_html(entry["file"]))
            elif "glob" in entry:  # Sphinx sorts glob matches by name
                pattern = as_html(entry["glob"])
                built = sorted(p.relative_to(html_dir).as_posix() for p in html_dir.rglob("*.html"))
                found.extend(p for p in built if fnmatch.fnmatch(p, pattern) and p not in found)
            # "url" entries are external links, not pages of the book
            for key in ("parts", "chapters", "sections"):
                walk(entry.get(key))

    walk([{key: toc[key] for key in ("parts", "chapters", "sections") if key in toc}])
    return found


def pages_for_parametrize() -> list[str]:
    """The pages to parametrize over, read at collection time from the repo's ``_toc.yml``.

    The book is not built yet then; ``test_toc_is_the_left_navigation`` checks that this
    list equals the built book's.
    """
    try:
        return toc_pages(REPO / "_toc.yml", REPO / "_build" / "book" / "_build" / "html")
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError) as error:
        return [f"unreadable _toc.yml: {error}"]


# --- fixtures -----------------------------------------------------------------------------

# book_html (the built smoke book, shared with test_live_book.py) is conftest.py's


@pytest.fixture(scope="module")
def book_pages(book_html) -> list[str]:
    """The html paths of every ``_toc.yml`` page of the built book, root first."""
    listed = toc_pages(find_toc(book_html), book_html)
    missing = [path for path in listed if not (book_html / path).is_file()]
    assert not missing, f"pages of _toc.yml missing from {book_html}: {missing}"
    assert len(listed) == len(set(listed)), f"a page appears twice in _toc.yml: {listed}"
    return listed


@pytest.fixture(scope="module")
def book_url(book_html):
    """``http://127.0.0.1:PORT/`` serving the html folder with http.server (stopped at teardown)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", HOST, str(port), "--directory", str(book_html)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}/"

    def serves_index() -> bool:
        with urllib.request.urlopen(url + "index.html", timeout=2) as response:
            return response.status == 200

    with running_server(server, serves_index, 20, f"http.server on {url}"):
        yield url


@pytest.fixture(scope="module")
def chromium_browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def tab(chromium_browser):
    """A page in a fresh context (empty localStorage and cache: a first-time visitor)."""
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


# --- helpers ------------------------------------------------------------------------------

class Recorder:
    """Everything a page does that the book must not: failures, remote requests, errors."""

    def __init__(self, page):
        self.failed: list[str] = []
        self.remote: list[str] = []
        self.console: list[str] = []
        self.exceptions: list[str] = []
        page.on("request", self.on_request)
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        page.on("response", self.on_response)
        page.on("console", self.on_console)
        page.on("pageerror", lambda error: self.exceptions.append(str(error)))

    def on_request(self, request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("data", "blob", "about"):
            return
        if parts.scheme not in ("http", "https", "ws", "wss") or parts.hostname != HOST:
            self.remote.append(request.url)

    def on_response(self, response) -> None:
        if response.status >= 400:
            self.failed.append(f"{response.url} (HTTP {response.status})")

    def on_console(self, message) -> None:
        if message.type == "error":
            where = message.location or {}
            # Chromium asks for /favicon.ico on its own now and then; no page of the book links one
            if urlsplit(where.get("url", "")).path == "/favicon.ico":
                return
            self.console.append(f"{message.text} [at {where.get('url', '?')}:{where.get('lineNumber', '?')}]")

    def problems(self) -> dict[str, list[str]]:
        return {name: items for name, items in (
            ("failed requests", self.failed), ("requests leaving 127.0.0.1", self.remote),
            ("console errors", self.console), ("uncaught exceptions", self.exceptions)) if items}

    def report(self) -> str:
        return "; ".join(f"{kind}: {items}" for kind, items in self.problems().items())


def page_path(url: str, book_url: str) -> str:
    """The html path of ``url`` relative to the book's root, without query and fragment."""
    path, base = urlsplit(url).path, urlsplit(book_url).path
    assert path.startswith(base), f"{url} is outside the book at {book_url}"
    return path[len(base):] or "index.html"


BROKEN_IMAGES_JS = """async () => {
    const images = Array.from(document.images);
    for (const img of images) img.loading = "eager";
    await Promise.all(images.map(img => img.complete ? null :
        new Promise(done => { img.addEventListener("load", done); img.addEventListener("error", done); })));
    return images.filter(img => !img.complete || img.naturalWidth === 0)
                 .map(img => img.currentSrc || img.src || img.outerHTML.slice(0, 200));
}"""


#: what a reader must never meet in a cell's output: a stream written to stderr, a traceback,
#: a warning or a log line (myst-nb marks stderr and error outputs with these classes)
OUTPUT_NOISE_JS = """() => {
    const found = [];
    for (const el of document.querySelectorAll(".output.stderr, .output.traceback, .output.error"))
        found.push(el.className + ": " + el.textContent.trim().slice(0, 160));
    const noise = /(Traceback \\(most recent call last\\)|\\w+Warning:|\\bUSDT\\b|^\\s*(ERROR|WARNING)\\b|\\[\\w+\\] (WARNING|ERROR))/m;
    for (const el of document.querySelectorAll(".cell_output"))
        if (noise.test(el.textContent)) found.push("output text: " + el.textContent.trim().slice(0, 160));
    return found;
}"""


#: what a reader must never meet in a table a cell displays: an index column of row numbers
#: (pandas writes the index as th cells in the body), a raw column name, a missing value
#: spelled out, a Markdown table left as text
TABLE_NOISE_JS = """() => {
    const found = [];
    for (const table of document.querySelectorAll(".cell_output table")) {
        const where = (table.querySelector("thead") || table).textContent.trim().replace(/\\s+/g, " ").slice(0, 80);
        if (table.querySelector("tbody th")) found.push("an index column in the table headed " + where);
        for (const th of table.querySelectorAll("thead th"))
            if (/\\w_\\w/.test(th.textContent)) found.push("a raw column name: " + th.textContent.trim());
        for (const td of table.querySelectorAll("td"))
            if (/^(NaN|nan|<NA>|None|NaT)$/.test(td.textContent.trim()))
                found.push(td.textContent.trim() + " in the table headed " + where);
    }
    // a Markdown table a cell displayed but the page did not parse: its pipes as text
    for (const el of document.querySelectorAll(".cell_output p"))
        if (/\\|\\s*(---|\\u2014)\\s*\\|/.test(el.textContent))
            found.push("a Markdown table shown as text: " + el.textContent.trim().slice(0, 80));
    return found;
}"""


def broken_internal_links(tab, book_url: str) -> list[str]:
    """Links of the page into the book whose target file does not answer 200."""
    hrefs = tab.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    targets = sorted({href.split("#")[0] for href in hrefs if href.startswith(book_url)})
    dead = []
    for target in targets:
        try:
            with urllib.request.urlopen(target, timeout=5) as response:
                if response.status != 200:
                    dead.append(f"{target} (HTTP {response.status})")
        except urllib.error.URLError as error:
            dead.append(f"{target} ({error})")
    return dead


# --- tests --------------------------------------------------------------------------------

def test_toc_is_the_left_navigation(tab, book_url, book_pages):
    """index.html lands on the root page, whose left navigation links every page of _toc.yml."""
    tab.goto(book_url + "index.html")
    tab.wait_for_url(book_url + book_pages[0] + "*")
    tab.wait_for_load_state("networkidle")
    hrefs = tab.eval_on_selector_all("nav.bd-links a[href]", "links => links.map(a => a.href)")
    linked = {page_path(href, book_url) for href in hrefs if href.startswith(book_url)}
    missing = [path for path in book_pages if path not in linked]
    assert not missing, (f"pages of _toc.yml not linked from the left navigation of index.html: "
                         f"{missing}; linked: {sorted(linked)}")
    assert METHOD_PAGE in book_pages and WALKTHROUGH_PAGE in book_pages, (
        f"{METHOD_PAGE} and {WALKTHROUGH_PAGE} (checked below) must be in _toc.yml: {book_pages}")
    assert pages_for_parametrize() == book_pages, (
        "the repo's _toc.yml (which parametrizes the page tests) differs from the one the book "
        f"was built from: {pages_for_parametrize()} vs {book_pages}")


@pytest.mark.parametrize("path", pages_for_parametrize())
def test_page_loads_cleanly_offline(tab, book_url, book_pages, path):
    assert path in book_pages, f"{path} is not a page of the built book's _toc.yml: {book_pages}"
    recorder = Recorder(tab)
    response = tab.goto(book_url + path, wait_until="load")
    assert response is not None and response.ok, f"{path}: HTTP {response and response.status}"
    tab.wait_for_load_state("networkidle")
    typeset = 0
    if path == METHOD_PAGE and tab.locator(".math").count():  # no math at all: reported below
        try:
            tab.wait_for_selector("mjx-container", state="attached")
        except sync_api.TimeoutError:
            pass  # reported below, with the requests and errors that explain it
        tab.wait_for_load_state("networkidle")  # MathJax fetches its fonts after typesetting
        typeset = tab.locator("mjx-container").count()
    broken = tab.evaluate(BROKEN_IMAGES_JS)
    dead_links = broken_internal_links(tab, book_url)
    noise = tab.evaluate(OUTPUT_NOISE_JS)
    table_noise = tab.evaluate(TABLE_NOISE_JS)
    launch = tab.eval_on_selector_all("a[href*='mybinder.org'], a[href*='colab.research.google.com']",
                                      "links => links.map(a => a.href)")
    if path == WALKTHROUGH_PAGE:
        tab.screenshot(path=str(SCREENSHOT), full_page=True)
    issues = [recorder.report()] if recorder.problems() else []
    if broken:
        issues.append(f"images that did not load: {broken}")
    if dead_links:
        issues.append(f"internal links that do not resolve: {dead_links}")
    if noise:
        issues.append(f"stderr, warnings, log lines or tracebacks in cell outputs: {noise}")
    if table_noise:
        issues.append(f"tables a reader cannot read: {sorted(set(table_noise))}")
    if launch:
        issues.append(f"launch buttons to a repository nobody checked: {launch}")
    if path == METHOD_PAGE and typeset == 0:
        scripts = tab.eval_on_selector_all("script[src*=mathjax i]", "s => s.map(e => e.src)")
        issues.append(f"no mjx-container: MathJax typeset nothing ({tab.locator('.math').count()} "
                      f".math elements, MathJax scripts: {scripts})")
    assert not issues, f"{path}: " + "; ".join(issues)


def test_next_and_previous_links_walk_the_toc(tab, book_url, book_pages):
    tab.goto(book_url + book_pages[0])
    visited = [page_path(tab.url, book_url)]
    for expected in book_pages[1:]:
        link = tab.locator("a.right-next")
        assert link.count() == 1, f"no single a.right-next on {visited[-1]} (walk so far: {visited})"
        with tab.expect_navigation():
            link.click()
        visited.append(page_path(tab.url, book_url))
        assert visited[-1] == expected, f"next from {visited[-2]} went to {visited[-1]}, not {expected}"
    if len(book_pages) > 1:
        link = tab.locator("a.left-prev")
        assert link.count() == 1, f"no single a.left-prev on {visited[-1]}"
        with tab.expect_navigation():
            link.click()
        back = page_path(tab.url, book_url)
        assert back == book_pages[-2], f"previous from {book_pages[-1]} went to {back}, not {book_pages[-2]}"


def test_search_finds_clone(tab, book_url):
    recorder = Recorder(tab)
    tab.goto(book_url + "search.html?q=clone")
    try:
        tab.wait_for_selector("#search-results ul.search li a", state="attached")
    except sync_api.TimeoutError:
        results = tab.locator("#search-results")
        summary = results.inner_text() if results.count() else "(no #search-results)"
        pytest.fail(f"search.html?q=clone listed no result within {TIMEOUT_MS} ms: {summary!r}; "
                    f"{recorder.report()}")
    tab.wait_for_load_state("networkidle")
    hrefs = tab.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    found = {page_path(href, book_url) for href in hrefs if href.startswith(book_url)}
    wanted = {METHOD_PAGE, WALKTHROUGH_PAGE}
    assert found & wanted, f"the search for 'clone' links none of {sorted(wanted)}; results: {hrefs}"
    problems = recorder.report()
    assert not problems, f"search.html?q=clone: {problems}"


#: chapters with wide tables, checked on a 1280 x 800 screen
TABLE_PAGES = ("notebooks/02_from_scratch.html", "notebooks/03_ablations.html", "notebooks/04_efficiency.html",
               "notebooks/06_finetuning.html")
TABLE_WIDTHS_JS = """() => {
    const article = document.querySelector("article.bd-article");
    const style = getComputedStyle(article);
    const column = article.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const tables = Array.from(article.querySelectorAll("table")).map(table => {
        const scroller = table.closest(".output, .cell_output") || table.parentElement;
        return {width: table.getBoundingClientRect().width,
                overflow: scroller.scrollWidth - scroller.clientWidth,
                header: Array.from(table.querySelectorAll("thead th")).map(th => th.innerText.trim())
                             .filter(Boolean).slice(0, 5).join(" | ")};
    });
    return {page: document.documentElement.scrollWidth, column, tables};
}"""


#: per code block a reader copies (cell inputs, Markdown code: not outputs), its sideways overflow
CODE_OVERFLOW_JS = """() => Array.from(document.querySelectorAll(
        'article div[class*="highlight-ipython"] pre, article div[class*="highlight-python"] pre, '
        + 'article div[class*="highlight-bash"] pre'))
    .map(pre => ({overflow: pre.scrollWidth - pre.clientWidth, start: pre.textContent.trim().slice(0, 60)}))
    .filter(block => block.overflow > 1)"""


def test_no_code_block_scrolls_sideways_at_1280_pixels(chromium_browser, book_url, book_pages):
    """Code cells, papermill commands and answers wrap at the column (book/_static/book.css)
    on every page: a long command is the first thing a reader copies."""
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        tab = context.new_page()
        wide = {}
        for path in book_pages:
            tab.goto(book_url + path, wait_until="load")
            found = tab.evaluate(CODE_OVERFLOW_JS)
            if found:
                wide[path] = found[:3]
        assert not wide, f"code blocks wider than the column: {wide}"
    finally:
        context.close()


def test_tables_fit_the_content_column_at_1280_pixels(chromium_browser, book_url, book_pages):
    """No table is wider than the content column (none needs a scroll bar), nor the page wider
    than the screen, in the chapters whose tables used to run off it."""
    issues = []
    for path in TABLE_PAGES:
        assert path in book_pages, f"{path} is not a page of the book: {book_pages}"
        # a browser context of its own per page: Chromium 156 (Playwright 1.65) never reports
        # idle a page whose resources a context has cached, where a fresh one's is within seconds
        context = chromium_browser.new_context(viewport={"width": 1280, "height": 800})
        context.set_default_timeout(TIMEOUT_MS)
        try:
            tab = context.new_page()
            tab.goto(book_url + path, wait_until="load")
            tab.wait_for_load_state("networkidle")
            found = tab.evaluate(TABLE_WIDTHS_JS)
        finally:
            context.close()
        assert len(found["tables"]) >= 3, f"{path}: expected its tables, found {found['tables']}"
        if found["page"] > 1280:
            issues.append(f"{path}: the page is {found['page']} px wide")
        issues += [f"{path}: table [{t['header']}] is {t['width']:.0f} px wide, the column "
                   f"{found['column']:.0f} px (overflow {t['overflow']} px)"
                   for t in found["tables"] if t["width"] > found["column"] + 1 or t["overflow"] > 1]
    assert not issues, "; ".join(issues)


# --- the source on the page ---------------------------------------------------------------

#: per [source] link of the page (sphinx.ext.viewcode): its target, and the object it documents
SOURCE_LINKS_JS = """() => Array.from(document.querySelectorAll("span.viewcode-link"))
    .map(span => span.closest("a"))
    .filter(a => a !== null)
    .map(a => ({href: a.href, object: (a.closest("dt") || {}).id || ""}))"""

#: what a viewcode page shows at its fragment: Pygments' tokens and the [docs] link back
HIGHLIGHTED_JS = """(anchor) => {
    const block = document.getElementById(anchor);
    return {tokens: document.querySelectorAll("div.highlight pre span.k, div.highlight pre span.nf").length,
            block: block ? block.textContent.trim().slice(0, 200) : null,
            back: block ? Array.from(block.querySelectorAll("a.viewcode-back")).map(a => a.href) : []};
}"""


def test_the_api_is_split_into_pages_whose_objects_link_their_highlighted_source(tab, book_url, book_pages):
    """The API reference is a landing page and one page per layer, in that order in the table
    of contents, none holding most of the reference; every object's [source] link opens its
    module's code on a page of the book (offline, highlighted, the object at the link's
    fragment, a [docs] link back to where the object is documented)."""
    assert API_PAGE in book_pages, f"{API_PAGE} is not a page of the book: {book_pages}"
    start = book_pages.index(API_PAGE)
    assert tuple(book_pages[start + 1:start + 1 + len(API_LAYER_PAGES)]) == API_LAYER_PAGES, (
        f"the API's pages do not follow {API_PAGE} in the table of contents: {book_pages[start:]}")
    heights, links = {}, {}
    for path in (API_PAGE, *API_LAYER_PAGES):
        tab.goto(book_url + path, wait_until="load")
        heights[path] = tab.evaluate("document.documentElement.scrollHeight")
        links[path] = tab.evaluate(SOURCE_LINKS_JS)
    empty = [path for path in API_LAYER_PAGES if not links[path]]
    assert not empty, f"API pages without a [source] link: {empty}"
    tallest = max(heights, key=heights.get)
    assert heights[tallest] < 0.5 * sum(heights.values()), (
        f"{tallest} holds most of the API reference: page heights {heights}")

    # every target is a page of the book with the module's code, highlighted, and the object at its fragment
    issues, first_of_page = [], {}
    for path, found in links.items():
        for link in found:
            assert link["href"].startswith(book_url + "_modules/"), (
                f"{path}: the [source] of {link['object']} leaves the book: {link['href']}")
            first_of_page.setdefault(path, link)
    modules = {}
    for path, found in links.items():
        for link in found:
            target, _, anchor = link["href"].partition("#")
            if target not in modules:
                with urllib.request.urlopen(target, timeout=5) as response:
                    modules[target] = response.read().decode("utf-8") if response.status == 200 else ""
            html = modules[target]
            if 'class="highlight"' not in html:
                issues.append(f"{target} (from {path}) shows no highlighted code")
            elif anchor and f'id="{anchor}"' not in html:
                issues.append(f"{target} has no {anchor!r} for the [source] of {link['object']} on {path}")
    assert not issues, f"{len(issues)} [source] targets wrong: {issues[:10]}"

    # the first [source] of each page opened in the browser: offline, clean, highlighted, and back
    for path, link in first_of_page.items():
        recorder = Recorder(tab)
        response = tab.goto(link["href"], wait_until="load")
        assert response is not None and response.ok, f"{link['href']}: HTTP {response and response.status}"
        tab.wait_for_load_state("networkidle")
        shown = tab.evaluate(HIGHLIGHTED_JS, urlsplit(link["href"]).fragment)
        assert not recorder.problems(), f"{link['href']} (from {path}): {recorder.report()}"
        assert shown["tokens"] > 0, f"{link['href']}: the code is not highlighted"
        name = link["object"].rsplit(".", 1)[-1]
        assert shown["block"] and name in shown["block"], (
            f"{link['href']}: the object {link['object']} is not at the fragment: {shown['block']!r}")
        back = {page_path(href, book_url) for href in shown["back"] if href.startswith(book_url)}
        assert back == {path}, f"{link['href']}: [docs] leads to {shown['back']}, not back to {path}"


def test_the_method_page_shows_the_updates_code_beside_its_formulas(tab, book_url, book_pages):
    """Each named step of the update appears on the method page as its own code, highlighted,
    in an open dropdown (included from the package when the book is built)."""
    assert METHOD_PAGE in book_pages
    tab.goto(book_url + METHOD_PAGE, wait_until="load")
    blocks = tab.eval_on_selector_all(
        "details.sd-dropdown div.highlight",
        "blocks => blocks.map(b => {const pre = b.querySelector('pre');"
        " return {text: b.textContent, open: b.closest('details').open,"
        " tokens: b.querySelectorAll('span.nf').length,"
        " overflow: pre.scrollWidth - pre.clientWidth,"
        " font: parseFloat(getComputedStyle(pre).fontSize)};})")
    shown = {name: [block for block in blocks if f"def {name}(" in block["text"]] for name in METHOD_CODE}
    missing = [name for name, found in shown.items() if not found]
    assert not missing, f"{METHOD_PAGE} does not show the code of {missing}"
    folded = [name for name, found in shown.items() if not any(block["open"] for block in found)]
    assert not folded, f"{METHOD_PAGE} folds the code of {folded} away"
    plain = [name for name, found in shown.items() if not any(block["tokens"] > 0 for block in found)]
    assert not plain, f"{METHOD_PAGE} shows the code of {plain} without highlighting"
    # read at the book's default screen, the code fits the column: no scroll bar, legible text
    wide = {name: max(block["overflow"] for block in found) for name, found in shown.items()
            if any(block["overflow"] > 1 for block in found)}
    assert not wide, f"{METHOD_PAGE}: code wider than its column (px of horizontal scroll): {wide}"
    small = {name: min(block["font"] for block in found) for name, found in shown.items()
             if any(block["font"] < 10 for block in found)}
    assert not small, f"{METHOD_PAGE}: code set below 10 px: {small}"


def test_the_from_scratch_chapter_is_in_the_book_and_its_navigation(tab, book_url, book_pages):
    assert FROM_SCRATCH_PAGE in book_pages, f"{FROM_SCRATCH_PAGE} is not a page of the book: {book_pages}"
    tab.goto(book_url + "index.html")
    tab.wait_for_url(book_url + book_pages[0] + "*")
    linked = tab.eval_on_selector_all(
        "nav.bd-links a[href]", "links => links.map(a => ({href: a.href, text: a.textContent.trim()}))")
    titles = [link["text"] for link in linked
              if link["href"].startswith(book_url) and page_path(link["href"], book_url) == FROM_SCRATCH_PAGE]
    assert titles and FROM_SCRATCH_TITLE in titles[0], (
        f"the left navigation does not link {FROM_SCRATCH_PAGE} as {FROM_SCRATCH_TITLE!r}: {titles}")
    response = tab.goto(book_url + FROM_SCRATCH_PAGE, wait_until="load")
    assert response is not None and response.ok
    heading = tab.locator("article.bd-article h1").first.inner_text()
    assert FROM_SCRATCH_TITLE in heading and FROM_SCRATCH_TITLE in tab.title(), (heading, tab.title())


#: the chapters whose last section is the exercises (every page of the book but the front and back matter)
EXERCISE_PAGES = (METHOD_PAGE,) + tuple(f"notebooks/{path.stem}.html" for path in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")))
EXERCISES_JS = """() => {
  const heading = Array.from(document.querySelectorAll("article.bd-article h2")).find(h => h.textContent.startsWith("Exercises"));
  if (!heading) return null;
  const section = heading.closest("section");
  return Array.from(section.querySelectorAll("details.sd-dropdown")).map(d => ({
    title: d.querySelector("summary").textContent.trim(), open: d.open,
    hidden: !d.querySelector(".sd-summary-content").checkVisibility()}));
}"""


def test_every_chapter_ends_with_exercises_whose_hints_and_answers_open_on_purpose(tab, book_url, book_pages):
    """Each chapter's Exercises section holds a hint and an answer per exercise, in dropdowns
    that are closed (their content not shown) until the reader opens one; opening shows it."""
    for path in EXERCISE_PAGES:
        assert path in book_pages, f"{path} is not a page of the book"
        tab.goto(book_url + path, wait_until="load")
        dropdowns = tab.evaluate(EXERCISES_JS)
        assert dropdowns is not None, f"{path} has no Exercises section"
        titles = [d["title"] for d in dropdowns]
        assert titles.count("Answer") >= 3 and titles.count("Hint") == titles.count("Answer"), (path, titles)
        shown = [d["title"] for d in dropdowns if d["open"] or not d["hidden"]]
        assert not shown, f"{path} shows {shown} before the reader opens them"
    answer = tab.locator("details.sd-dropdown summary", has_text="Answer").last
    answer.click()
    assert answer.locator("xpath=..").evaluate("d => d.open && d.querySelector('.sd-summary-content').checkVisibility()")


# --- figures a reader can read ------------------------------------------------------------

#: every image of the page's text: where it comes from, its width on the page and its own,
#: and the number and caption of the figure it belongs to
FIGURES_JS = """() => Array.from(document.querySelectorAll("article img")).map(img => {
    const figure = img.closest("figure");
    const caption = figure ? figure.querySelector("figcaption") : null;
    const number = caption ? caption.querySelector(".caption-number") : null;
    return {src: img.src, shown: img.getBoundingClientRect().width, natural: img.naturalWidth,
            id: figure ? figure.id : "", number: number ? number.innerText.trim() : "",
            caption: caption ? caption.innerText.trim() : ""};
})"""

#: in an SVG opened by itself at its natural size: each text's rendered font size (CSS px,
#: its font size times the scale of its coordinates on the screen) and its words
SVG_TEXT_JS = """() => Array.from(document.querySelectorAll("text"))
    .filter(text => text.textContent.trim())
    .map(text => {
        const m = text.getScreenCTM();
        return {px: parseFloat(getComputedStyle(text).fontSize) * Math.hypot(m.a, m.b),
                text: text.textContent.trim().slice(0, 40)};
    })"""

#: the smallest text a figure may show (barter_mini.book.figures.TEXT_FLOOR_PX)
TEXT_FLOOR_PX = 10.0


def test_every_figure_is_numbered_captioned_and_its_text_at_least_10_px(chromium_browser, book_url, book_pages):
    """At 1280 px every figure of every page is SVG with its text kept as text, fits the
    column, has a number ("Book fig. N") and a caption that says what to look at, and shows
    no text below 10 px: each text's font size is measured in the SVG opened by itself, then
    scaled by how much the page shrinks the image."""
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        tab, svg_tab = context.new_page(), context.new_page()
        figures, problems, smallest = [], [], {}
        for path in book_pages:
            tab.goto(book_url + path, wait_until="load")
            column = tab.evaluate("() => document.querySelector('article').clientWidth")
            for figure in tab.evaluate(FIGURES_JS):
                figures.append(figure)
                where = f"{path} {figure['id'] or figure['src'].rsplit('/', 1)[-1]}"
                if not figure["src"].endswith(".svg"):
                    problems.append(f"{where}: not SVG, so its text cannot be measured")
                    continue
                if not figure["number"].startswith("Book fig. ") or len(figure["caption"]) < 60:
                    problems.append(f"{where}: number {figure['number']!r}, caption {figure['caption'][:60]!r}")
                if figure["shown"] > column + 1:
                    problems.append(f"{where}: {figure['shown']:.0f} px wide in a {column} px column")
                if figure["src"] not in smallest:
                    svg_tab.goto(figure["src"], wait_until="load")
                    texts = svg_tab.evaluate(SVG_TEXT_JS)
                    smallest[figure["src"]] = min(texts, key=lambda t: t["px"]) if texts else None
                text = smallest[figure["src"]]
                if text is None:
                    problems.append(f"{where}: no text element (drawn as paths, not measurable)")
                    continue
                on_page = text["px"] * figure["shown"] / figure["natural"]
                if on_page < TEXT_FLOOR_PX - 0.05:
                    problems.append(f"{where}: {text['text']!r} at {on_page:.1f} px")
        assert len(figures) >= 20, f"only {len(figures)} figures in the book: {[f['src'] for f in figures]}"
        numbers = [f["number"] for f in figures]
        assert len(set(numbers)) == len(numbers), f"figure numbers repeat: {numbers}"
        assert not problems, "; ".join(problems)
    finally:
        context.close()
