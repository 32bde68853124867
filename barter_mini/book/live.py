"""``make live``: the built book with live code cells, against a kernel on this machine.

Two servers start, both bound to 127.0.0.1 and nothing else:

* a Jupyter server (``jupyter_server``) whose kernels are this environment's ``python3``,
  guarded by a random token and accepting requests from the book's origin only; its
  working folder, and that of every kernel, is a scratch folder holding a copy of the
  recorded grids (``$BARTER_MINI_RECORDED``), so an edited cell cannot change the book's
  recorded data or the notebooks. The kernels read the run cache, so a chapter's runs come
  from it, and add what they train to it; the cache never rewrites a completed entry
  (:func:`~barter_mini.training.cache.cached_train`);
* a static server for the built HTML, which also answers ``/live.json`` with the Jupyter
  server's address and token for the page's "Live code" button (``book/_static/live.js``):
  a page of another origin cannot read it.

One address is printed; Ctrl-C stops both servers and removes the scratch folder. Opened
from the file system, a page's button says in one line how to start this.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..errors import BarterError
from ..training.cache import CACHE_ENV, default_cache_dir
from ..training.data.info import default_data_root
from .build import REPO, build_book
from .recorded_grid import DATA_ENV, recorded_data_dir

#: the only interface either server listens on
HOST = "127.0.0.1"
#: where a page asks for the Jupyter server's address and token (same origin as the book)
CONFIG_PATH = "/live.json"
#: how long the Jupyter server may take to answer before ``make live`` gives up
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


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
    """A folder for the kernels, removed when ``make live`` stops, with a copy of the
    recorded grids."""
    scratch = Path(tempfile.mkdtemp(prefix="barter-mini-live-"))
    recorded = recorded_data_dir()
    (scratch / "recorded").mkdir()
    for path in recorded.glob("*.csv"):
        shutil.copy2(path, scratch / "recorded" / path.name)
    return scratch


def kernel_environment(scratch: Path) -> dict[str, str]:
    """The environment the Jupyter server and its kernels run in: the scratch folder's
    recorded grids, the run cache and datasets of this checkout (named absolutely, since the
    kernels work elsewhere)."""
    env = dict(os.environ)
    env[CACHE_ENV] = str(default_cache_dir().resolve())
    env[DATA_ENV] = str(scratch / "recorded")
    env["BARTER_MINI_DATA"] = str(default_data_root())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def jupyter_command(port: int, token: str, book_origin: str, scratch: Path) -> list[str]:
    """The Jupyter server: 127.0.0.1 only, ``token`` required, the book's origin allowed,
    the scratch folder its root, no browser opened."""
    command = [sys.executable, "-m", "jupyter_server", f"--ServerApp.ip={HOST}", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.allow_origin={book_origin}", f"--ServerApp.root_dir={scratch}",
               "--ServerApp.open_browser=False", "--ServerApp.log_level=WARN",
               "--ServerApp.jpserver_extensions", "jupyterlab=False"]      # no JupyterLab: kernels only
    if hasattr(os, "geteuid") and os.geteuid() == 0:        # containers often run as root
        command.append("--allow-root")
    return command


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


class BookHandler(SimpleHTTPRequestHandler):
    """The built HTML, and :data:`CONFIG_PATH`: the Jupyter server's address and token."""

    def __init__(self, *args, live: dict, **kwargs):
        self.live = live
        super().__init__(*args, **kwargs)

    def do_GET(self):
        if self.path.split("?")[0] == CONFIG_PATH:
            body = json.dumps(self.live).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format, *args):           # one line per page would bury the address
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(html: Path, port: int | None = None, jupyter_port: int | None = None) -> None:
    """Start both servers for the built book in ``html``, print the address to open, and
    serve until interrupted; then stop the Jupyter server and remove the scratch folder."""
    port, jupyter_port = port or free_port(), jupyter_port or free_port()
    origin = f"http://{HOST}:{port}"
    token = secrets.token_urlsafe(32)
    scratch = scratch_folder()
    jupyter = subprocess.Popen(jupyter_command(jupyter_port, token, origin, scratch), cwd=scratch,
                               env=kernel_environment(scratch), start_new_session=True)
    try:
        jupyter_url = f"http://{HOST}:{jupyter_port}/"
        wait_until_answering(jupyter_url + "api/status", token, jupyter)
        live = {"baseUrl": jupyter_url, "wsUrl": f"ws://{HOST}:{jupyter_port}/", "token": token}
        handler = functools.partial(BookHandler, directory=str(html), live=live)
        with ThreadingHTTPServer((HOST, port), handler) as server:
            print(f"the book with live code: open {origin}/index.html  (Ctrl-C stops it)", flush=True)
            signal.signal(signal.SIGTERM, _interrupt)       # a terminated make live cleans up too
            server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        jupyter.terminate()                       # the server then shuts its kernels down
        with contextlib.suppress(subprocess.TimeoutExpired):
            jupyter.wait(timeout=10)
        if jupyter.poll() is None:
            jupyter.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barter_mini.book.live", description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, help="a built book's html folder (default: build one if needed)")
    parser.add_argument("--profile", default="smoke", help="the profile to build the book at if none is built")
    parser.add_argument("--build-dir", type=Path, help="where the book is built (default: _build)")
    parser.add_argument("--port", type=int, help="the book's port (default: a free one)")
    args = parser.parse_args(argv)
    try:
        serve(ensure_book(args.html, args.profile, args.build_dir), args.port)
    except BarterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
