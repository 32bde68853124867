"""``make live`` in a real browser: a tab that has not opened the printed address gets no
kernel; once it has (the key in the address's fragment), chapter 00 goes live, a cell edited
on the page runs in a local kernel and its new output appears under it; nothing leaves
127.0.0.1; the kernel server refuses a request without the printed token; a page opened from
a file says in one line how to start ``make live``.

The smoke book is conftest.py's ``book_html`` (built once for the browser tests, or
``$BARTER_MINI_BOOK_HTML``); ``make live LIVE_ARGS="--html ... --port ..."`` serves it.
Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright's sync API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers import HOST, free_port

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FROM_SCRATCH_PAGE = "notebooks/00_barter_from_scratch.html"
#: how long make live may take to answer (make checks its prerequisites first) and how long
#: chapter 00's cells may take to run in the live kernel
START_S, RUN_S = 180, 300

pytestmark = pytest.mark.slow

from playwright import sync_api  # noqa: E402


@pytest.fixture(scope="module")
def live(book_html, tmp_path_factory):
    """``make live`` on the built book: the address it printed (its key in the fragment) and
    what ``/live.json`` says (the kernel server's address); stopped (its whole process group)
    at the end."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("live") / "make-live.log"
    log = open(log_path, "w")
    server = subprocess.Popen(["make", "-s", "live", f"LIVE_ARGS=--html {book_html} --port {port}"], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_S
    try:
        while "#live=" not in log_path.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"make live printed no address:\n{log_path.read_text()}")
            time.sleep(0.5)
        address = next(word for word in log_path.read_text().split() if "#live=" in word)
        with urllib.request.urlopen(f"http://{HOST}:{port}/live.json", timeout=5) as answer:
            settings = json.load(answer)
        yield address, settings
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--headless=new", "--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def status_of(page) -> tuple[str | None, str]:
    status = page.locator(".live-code-status")
    return status.get_attribute("data-state"), status.text_content() or ""


def wait_for_state(page, states, seconds: float) -> tuple[str | None, str]:
    deadline = time.monotonic() + seconds
    while True:
        state, text = status_of(page)
        if state in states or time.monotonic() > deadline:
            return state, text
        time.sleep(0.5)


def test_the_servers_listen_on_127_0_0_1_and_want_the_token_of_the_printed_address(live):
    address, settings = live
    assert urlsplit(settings["baseUrl"]).hostname == HOST and urlsplit(address).hostname == HOST
    token = urlsplit(address).fragment.removeprefix("live=")
    assert token and token not in json.dumps(settings)
    kernels = settings["baseUrl"] + "api/kernels"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(kernels, timeout=5)
    assert refused.value.code == 403
    with urllib.request.urlopen(urllib.request.Request(
            kernels, headers={"Authorization": f"token {token}"}), timeout=5) as answer:
        assert answer.status == 200


def test_chapter_00_goes_live_and_an_edited_cell_runs_on_the_page(live, browser):
    address, settings = live
    url = f"http://{HOST}:{urlsplit(address).port}/"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    hosts = []
    page.on("request", lambda request: hosts.append(urlsplit(request.url)))
    page.on("websocket", lambda socket: hosts.append(urlsplit(socket.url)))
    page.goto(url + FROM_SCRATCH_PAGE)                     # not yet the printed address: no key
    page.click("button.live-code-button")
    state, text = wait_for_state(page, ("instruction", "ready", "failed"), 10)
    assert state == "instruction" and "#live=" in text, text
    page.goto(address)                                     # the printed address: the tab keeps its key
    assert "#live=" not in page.url                        # and the address bar forgets it
    page.goto(url + FROM_SCRATCH_PAGE)
    page.click("button.live-code-button")
    state, text = wait_for_state(page, ("ready", "failed"), RUN_S)
    assert state == "ready" and "failed" not in text, text
    assert "parameters cell" in text                      # the page says where to change a density
    cells = page.locator(".thebe-cell")
    assert cells.count() >= 10                             # every code cell of the chapter is live
    # edit the first cell: a value computed in the kernel, and where the kernel works and
    # reads the recorded grids (the scratch folder of make live, never the repository)
    page.evaluate("""() => {
        const editor = document.querySelector('.thebe-cell .CodeMirror').CodeMirror;
        editor.setValue('import os\\nprint("live:", 6 * 7, os.getcwd(), os.environ["BARTER_MINI_RECORDED"])');
    }""")
    cells.first.locator("button.thebe-run-button").click()
    output = page.locator("[data-output]").first
    output.get_by_text("live: 42").wait_for(timeout=30_000)
    printed = output.inner_text().split()
    assert printed[:2] == ["live:", "42"] and all("barter-mini-live-" in path for path in printed[2:4]), printed
    assert not any(path.startswith(str(REPO)) for path in printed[2:4]), printed
    context.close()
    outside = sorted({f"{parts.scheme}://{parts.netloc}" for parts in hosts
                      if parts.scheme not in ("data", "blob", "about") and parts.hostname != HOST})
    assert outside == [], f"requests left 127.0.0.1: {outside}"
    assert any(parts.scheme == "ws" and parts.port == urlsplit(settings["baseUrl"]).port for parts in hosts)


def test_a_page_opened_from_a_file_says_how_to_start_make_live(book_html, browser):
    page = browser.new_page()
    page.goto((book_html / FROM_SCRATCH_PAGE).as_uri())
    page.click("button.live-code-button")
    state, text = wait_for_state(page, ("instruction",), 10)
    assert state == "instruction" and "make live" in text and "\n" not in text.strip()
    page.close()
