"""``make live``: the built book with live code cells, against a kernel on this machine, for
the person who started it and nobody else.

Two servers start, both bound to 127.0.0.1 and nothing else, both answering only the
``Host`` names ``127.0.0.1:PORT`` and ``localhost:PORT`` (403 otherwise, so a web page whose
name rebinds to 127.0.0.1 reads nothing and runs nothing):

* a Jupyter server (:mod:`barter_mini.book.live_kernels`): this environment's ``python3``
  kernels, no terminals, a random token, the book's origin alone allowed; its working folder,
  and that of every kernel, is a private scratch folder holding a copy of the recorded grids
  (``$BARTER_MINI_RECORDED``), so an edited cell cannot change the book's recorded data or
  the notebooks. The kernels read the run cache, so a chapter's runs come from it, and add
  what they train to it; the cache never rewrites a completed entry
  (:func:`~barter_mini.training.cache.cached_train`);
* a static server for the built HTML (regular files inside the HTML folder only: no link
  leaving it, no folder listing, no dotfiles), which also answers ``/live.json`` with the
  Jupyter server's address, and nothing that lets anyone run code.

The token reaches one person: it is printed in the address to open, after ``#live=`` (a
URL's fragment, which a browser never sends); the page keeps it for its tab
(``sessionStorage``, ``book/_static/live.js``). It is in no command line, no environment
another user can read, no log and no file once the Jupyter server has read it.

The Jupyter server ends with ``make live``, whatever ends it: Ctrl-C, ``SIGTERM`` and
``SIGHUP`` (closing the terminal) stop both servers and remove the scratch folder; the
Jupyter server is started with ``PR_SET_PDEATHSIG``, so a ``kill -9`` of ``make live`` ends
it too, and it removes the scratch folder itself. If it dies first, ``make live`` stops with
one line. Opened from the file system, a page's button says in one line how to start this.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from email.utils import formatdate
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import BarterError
from ..training.cache import CACHE_ENV, default_cache_dir
from ..training.data.info import default_data_root
from .build import REPO, build_book
from .live_kernels import HOST, TOKEN_FILE
from .recorded_grid import DATA_ENV, recorded_data_dir

#: the names a request may give in its ``Host`` header (with the server's port)
LOCAL_NAMES = (HOST, "localhost")
#: where a page asks for the Jupyter server's address (same origin as the book)
CONFIG_PATH = "/live.json"
#: the printed address's fragment key that carries the token to the page
FRAGMENT_KEY = "live"
#: how long the Jupyter server may take to answer before ``make live`` gives up
START_TIMEOUT_S = 60
#: how often the book's server checks that the Jupyter server still runs
WATCH_INTERVAL_S = 0.5
#: Linux's prctl option that sends a signal to a process when its parent dies
PR_SET_PDEATHSIG = 1


class Stopped(KeyboardInterrupt):
    """``make live`` was asked to stop (Ctrl-C, ``SIGTERM``, ``SIGHUP``)."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stopping_on_signals():
    """``SIGTERM`` and ``SIGHUP`` stop ``make live`` as Ctrl-C does (cleaning up), from the
    first moment on: installed before anything is started."""
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_number(text: str) -> int:
    """argparse's type for ``--port``: an integer from 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give an integer from 1 to 65535")
    return port


def ensure_book(html: Path | None, profile: str, build_dir: Path | None) -> Path:
    """The built HTML folder: ``html`` as given, or the build under ``build_dir`` (default
    ``_build``) when it holds a book with Thebe, else a book built now at ``profile``."""
    if html is not None:
        if not (Path(html) / "index.html").is_file():
            raise BarterError(f"{html} holds no index.html: give the html folder of a built book")
        return Path(html)
    folder = Path(build_dir or REPO / "_build") / "book" / "_build" / "html"
    if not (folder / "index.html").is_file() or not (folder / "thebe" / "index.js").is_file():
        build_book(profile, build_dir)
    return folder


def scratch_folder() -> Path:
    """A private folder (``0700``) for the kernels, removed when ``make live`` stops, with a
    copy of the recorded grids."""
    scratch = Path(tempfile.mkdtemp(prefix="barter-mini-live-"))
    recorded = recorded_data_dir()
    (scratch / "recorded").mkdir()
    for path in recorded.glob("*.csv"):
        shutil.copy2(path, scratch / "recorded" / path.name)
    return scratch


def hand_over_token(scratch: Path, token: str) -> None:
    """Write ``token`` where only this user can read it (``0600`` in the ``0700`` scratch
    folder); the Jupyter server deletes the file once read."""
    fd = os.open(scratch / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)


def kernel_environment(scratch: Path) -> dict[str, str]:
    """The environment the Jupyter server and its kernels run in: the scratch folder's
    recorded grids, the run cache and datasets of this checkout (named absolutely, since the
    kernels work elsewhere). No token: the server reads it from a file."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("JUPYTER_TOKEN")}
    env[CACHE_ENV] = str(default_cache_dir().resolve())
    env[DATA_ENV] = str(scratch / "recorded")
    env["BARTER_MINI_DATA"] = str(default_data_root())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def jupyter_command(scratch: Path, port: int, book_port: int) -> list[str]:
    """The Jupyter server's command line: what it needs to find its scratch folder, and no
    secret (``ps`` shows a command line to every user)."""
    return [sys.executable, "-m", "barter_mini.book.live_kernels", str(scratch), str(port), str(book_port)]


def _die_with_parent(parent: int):
    """``preexec_fn`` of the Jupyter server: ``SIGTERM`` it when ``make live`` dies (Linux);
    exit at once if ``make live`` died before this ran."""
    libc_name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and libc_name:
        def tie() -> None:
            ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
        return tie
    return None


def start_jupyter(scratch: Path, port: int, book_port: int) -> subprocess.Popen:
    """The Jupyter server, in a session of its own (a Ctrl-C on the terminal reaches
    ``make live``, which stops it) and tied to this process's life."""
    return subprocess.Popen(jupyter_command(scratch, port, book_port), cwd=scratch, env=kernel_environment(scratch),
                            start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))


def stop_jupyter(jupyter: subprocess.Popen) -> None:
    jupyter.terminate()                       # the server then shuts its kernels down
    with contextlib.suppress(subprocess.TimeoutExpired):
        jupyter.wait(timeout=10)
    if jupyter.poll() is None:
        jupyter.kill()
        jupyter.wait()


def wait_until_answering(url: str, token: str, process: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> None:
    """Return once ``url`` answers a request with ``token``; a one-line error if the server
    exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    while True:
        try:
            urllib.request.urlopen(request, timeout=2).close()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if process.poll() is not None:
            raise BarterError(f"the Jupyter server exited with {process.returncode} before answering on {url}")
        if time.monotonic() > deadline:
            raise BarterError(f"the Jupyter server did not answer on {url} within {timeout:.0f} s")
        time.sleep(0.2)


def served_file(root: Path, url_path: str) -> Path | None:
    """The regular file inside ``root`` that ``url_path`` names (a folder's ``index.html``),
    or None: a name with a part starting with a dot (dotfiles, ``..``), a NUL or a backslash,
    or one that leaves ``root`` through a link, names nothing."""
    try:
        relative = unquote(urlsplit(url_path).path, errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    parts = [part for part in relative.split("/") if part]
    if any(part.startswith(".") or "\x00" in part or "\\" in part for part in parts):
        return None
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, *parts))
    if os.path.isdir(real):
        real = os.path.realpath(os.path.join(real, "index.html"))
    if os.path.commonpath([real_root, real]) != real_root:
        return None
    try:
        return Path(real) if stat.S_ISREG(os.stat(real).st_mode) else None
    except OSError:
        return None


class BookHandler(SimpleHTTPRequestHandler):
    """The built HTML (:func:`served_file`) and :data:`CONFIG_PATH`, to requests whose
    ``Host`` is this server's."""

    server: "BookServer"

    def send_head(self):
        if self.headers.get("Host", "").lower() not in self.server.hosts:
            self.send_error(403, "this server answers only requests for 127.0.0.1 or localhost")
            return None
        asked = urlsplit(self.path).path
        if asked == CONFIG_PATH:
            return self._send_bytes(json.dumps(self.server.live).encode(), "application/json")
        if self.server.html is None:
            self.send_error(503, "the book is not ready yet")
            return None
        path = served_file(self.server.html, self.path)
        if path is None:
            self.send_error(404)
            return None
        if path.name == "index.html" and not asked.endswith(("/", "/index.html")):
            self.send_response(301)                 # a folder: its index, with its relative links intact
            self.send_header("Location", asked + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        try:
            file = open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW))
        except OSError:
            self.send_error(404)
            return None
        found = os.fstat(file.fileno())
        if not stat.S_ISREG(found.st_mode):
            file.close()
            self.send_error(404)
            return None
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Length", str(found.st_size))
        self.send_header("Last-Modified", formatdate(found.st_mtime, usegmt=True))
        self._security_headers()
        self.end_headers()
        return file

    def _send_bytes(self, body: bytes, content_type: str):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self._security_headers()
        self.end_headers()
        return io.BytesIO(body)

    def _security_headers(self) -> None:
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")

    def list_directory(self, path):                 # never a listing, whatever calls it
        self.send_error(404)
        return None

    def log_message(self, format, *args):           # one line per page would bury the address
        pass


class BookServer(ThreadingHTTPServer):
    """The book's server on 127.0.0.1: bound first (a port in use is one line before anything
    starts), serving once :func:`serve` gives it the HTML folder and the Jupyter server
    it watches."""

    daemon_threads = True

    def __init__(self, port: int | None):
        port = port or free_port()
        try:
            super().__init__((HOST, port), BookHandler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise BarterError(f"port {port} on {HOST} is in use: give another with --port (1-65535), "
                                  "or leave --port out for a free one") from None
            raise BarterError(f"cannot listen on {HOST}:{port} ({error.strerror}): give another --port") from None
        self.port = port
        self.hosts = {f"{name}:{port}" for name in LOCAL_NAMES}
        self.html: Path | None = None
        self.live: dict = {}
        self.jupyter: subprocess.Popen | None = None

    def service_actions(self) -> None:
        if self.jupyter is not None and self.jupyter.poll() is not None:
            raise BarterError(f"the Jupyter server stopped (exit code {self.jupyter.returncode}), "
                              "so live code no longer runs: make live stopped; start it again")

    def handle_error(self, request, client_address) -> None:      # a malformed request: no traceback
        pass


#: Jupyter Book's root ``index.html``: a redirect to the first page, which would drop a fragment
REDIRECT = re.compile(r'<meta\s+http-equiv="Refresh"\s+content="0;\s*url=([^"\s]+)"', re.IGNORECASE)


def start_page(html: Path) -> str:
    """The book's first page, relative to ``html``: where ``index.html`` redirects, if it does."""
    found = REDIRECT.search((Path(html) / "index.html").read_text(errors="replace"))
    return found.group(1) if found and "://" not in found.group(1) else "index.html"


def live_address(port: int, token: str, page: str = "index.html") -> str:
    """The address printed to the person who started ``make live``: the token in its fragment."""
    return f"http://{HOST}:{port}/{page}#{FRAGMENT_KEY}={token}"


def serve(server: BookServer, html: Path) -> None:
    """Start the Jupyter server, print the address to open, and serve the built book in
    ``html`` until stopped; then stop the Jupyter server and remove the scratch folder."""
    token = secrets.token_urlsafe(32)
    scratch = scratch_folder()
    try:
        hand_over_token(scratch, token)
        jupyter_port = free_port()
        jupyter = start_jupyter(scratch, jupyter_port, server.port)
        try:
            jupyter_url = f"http://{HOST}:{jupyter_port}/"
            wait_until_answering(jupyter_url + "api/status", token, jupyter)
            server.html, server.jupyter = html, jupyter
            server.live = {"baseUrl": jupyter_url, "wsUrl": f"ws://{HOST}:{jupyter_port}/"}
            print(f"the book with live code: open {live_address(server.port, token, start_page(html))}\n"
                  "(the address carries this session's key: keep it to yourself; Ctrl-C stops it)", flush=True)
            server.serve_forever(poll_interval=WATCH_INTERVAL_S)
        finally:
            stop_jupyter(jupyter)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barter_mini.book.live", description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, help="a built book's html folder (default: build one if needed)")
    parser.add_argument("--profile", default="smoke", help="the profile to build the book at if none is built")
    parser.add_argument("--build-dir", type=Path, help="where the book is built (default: _build)")
    parser.add_argument("--port", type=port_number, help="the book's port, 1-65535 (default: a free one)")
    args = parser.parse_args(argv)
    with stopping_on_signals():
        try:
            with BookServer(args.port) as server:
                serve(server, ensure_book(args.html, args.profile, args.build_dir))
        except BarterError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
