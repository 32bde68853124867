"""``make live`` on a shared machine: only the person who started it can run code through it.

Each test is one way in that another local user, or a web page open in the same browser,
could try: the token from ``/live.json``, ``ps``, ``/proc`` or a file; a ``Host`` name that
rebinds to 127.0.0.1; a Jupyter server left running when ``make live`` ends (Ctrl-C, SIGTERM,
SIGHUP, ``kill -9``, or a SIGTERM while it starts); a link, a listing or a dotfile out of the
book's folder; a port in use; a Jupyter server that dies first. The servers are started as
``make live`` starts them (``python -m barter_mini.book.live``) on a small HTML folder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import HOST, free_port

REPO = Path(__file__).resolve().parents[1]
#: how long make live may take to print its address (a Jupyter server starts first)
START_S = 120
#: how long its processes and scratch folder may take to go once it is stopped
GONE_S = 30
#: the account a second local user's probe runs as
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    """A built book's shape: pages, a folder without an index, a dotfile, a link out."""
    root = tmp_path_factory.mktemp("html")
    (root / "index.html").write_text("<p>the book</p>")
    (root / "notebooks").mkdir()
    (root / "notebooks" / "index.html").write_text("<p>a chapter</p>")
    (root / "_static").mkdir()
    (root / "_static" / "live.js").write_text("// live")
    (root / ".buildinfo").write_text("config: private")
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("not the book's")
    (root / "planted.html").symlink_to(outside)
    (root / "planted-folder").symlink_to(outside.parent, target_is_directory=True)
    return root


class Live:
    """One ``python -m barter_mini.book.live`` process: its address, key, children."""

    def __init__(self, html: Path, port: int, log: Path):
        self.port, self.log = port, log
        self.process = subprocess.Popen([sys.executable, "-m", "barter_mini.book.live", "--html", str(html),
                                         "--port", str(port)], cwd=REPO, stdout=open(log, "w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for_address(self) -> str:
        deadline = time.monotonic() + START_S
        while "#live=" not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"make live printed no address:\n{self.output()}")
            time.sleep(0.2)
        return next(word for word in self.output().split() if "#live=" in word)

    @property
    def token(self) -> str:
        return self.wait_for_address().split("#live=", 1)[1]

    def kernel_server(self, timeout: float = START_S) -> tuple[int, Path]:
        """The Jupyter server's process id and its scratch folder (from its command line)."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in children(self.process.pid):
                args = command_line(pid)
                if "barter_mini.book.live_kernels" in args:
                    return pid, Path(args[args.index("barter_mini.book.live_kernels") + 1])
            if time.monotonic() > deadline:
                pytest.fail(f"no Jupyter server started:\n{self.output()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=GONE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_gone(pid: int, scratch: Path) -> None:
    deadline = time.monotonic() + GONE_S
    while (alive(pid) or scratch.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"the Jupyter server {pid} outlived make live"
    assert not scratch.exists(), f"the scratch folder {scratch} outlived make live"


def http(port: int, method: str, path: str, host: str | None = None, headers: dict | None = None) -> tuple[int, str]:
    """One raw HTTP/1.1 request (any ``Host``, any path bytes): the status and the body."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'{HOST}:{port}'}", "Connection: close",
             "Content-Length: 0", *(f"{name}: {value}" for name, value in (headers or {}).items())]
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


@pytest.fixture(scope="module")
def live(html, tmp_path_factory):
    server = Live(html, free_port(), tmp_path_factory.mktemp("live") / "live.log")
    server.wait_for_address()
    yield server
    server.stop()


def jupyter_port(live: Live) -> int:
    status, body = http(live.port, "GET", "/live.json")
    assert status == 200
    return int(json.loads(body)["baseUrl"].rstrip("/").rsplit(":", 1)[1])


def test_live_json_names_the_kernel_server_and_holds_no_token(live):
    status, body = http(live.port, "GET", "/live.json")
    assert status == 200 and live.token not in body
    assert set(json.loads(body)) == {"baseUrl", "wsUrl"}


def test_the_token_is_on_no_command_line_and_in_no_environment_or_file(live):
    pid, scratch = live.kernel_server()
    for process in Path("/proc").iterdir():
        if process.name.isdigit() and int(process.name) != os.getpid():
            for part in ("cmdline", "environ"):
                try:
                    text = (process / part).read_bytes()
                except OSError:
                    continue
                assert live.token.encode() not in text, f"the token is in /proc/{process.name}/{part}"
    assert not (scratch / "token").exists()               # handed over, then deleted
    assert [path.name for path in scratch.iterdir() if path.is_file()] == []
    assert oct(scratch.stat().st_mode & 0o777) == oct(0o700)


def test_the_kernel_server_wants_the_token_and_has_no_terminals(live):
    port, token = jupyter_port(live), live.token
    assert http(port, "POST", "/api/kernels")[0] == 403
    assert http(port, "GET", "/api/kernels", headers={"Authorization": f"token {token}"})[0] == 200
    assert http(port, "POST", "/api/terminals", headers={"Authorization": f"token {token}"})[0] == 404


@pytest.mark.parametrize("host", ["evil.example", "rebound.example.com:{port}", "127.0.0.1.nip.io:{port}"])
def test_a_foreign_host_gets_403_from_both_servers_even_with_the_token(live, host):
    token = live.token
    book_host = host.format(port=live.port)
    for path in ("/live.json", "/index.html", "/"):
        assert http(live.port, "GET", path, host=book_host)[0] == 403
    kernel_port = jupyter_port(live)
    status, _ = http(kernel_port, "POST", f"/api/kernels?token={token}", host=host.format(port=kernel_port),
                     headers={"Origin": f"http://{book_host}"})
    assert status == 403


def test_both_local_names_of_the_book_are_served(live):
    for name in (HOST, "localhost"):
        assert http(live.port, "GET", "/index.html", host=f"{name}:{live.port}") == (200, "<p>the book</p>")


@pytest.mark.parametrize("path", ["/planted.html", "/planted-folder/secret.txt", "/.buildinfo", "/_static/",
                                  "/%2e%2e/outside/secret.txt", "/..%2f..%2fetc/passwd", "/%00", "/index.html%00",
                                  "/%ff%fe", "/_static/..%5c..%5cindex.html"])
def test_the_static_server_serves_regular_files_inside_the_book_only(live, path):
    status, body = http(live.port, "GET", path)
    assert status == 404 and "not the book" not in body and "config: private" not in body
    assert "Traceback" not in live.output()


def test_a_folder_is_its_index_and_a_file_is_served(live):
    assert http(live.port, "GET", "/notebooks/") == (200, "<p>a chapter</p>")
    assert http(live.port, "GET", "/notebooks")[0] == 301
    assert http(live.port, "GET", "/_static/live.js") == (200, "// live")


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="changing user needs root, and a python the other user can run")
def test_a_second_local_user_gets_neither_the_token_nor_a_kernel(live):
    """As ``nobody``: everything another account can read (``/live.json``, ``ps``, every
    ``/proc/PID/cmdline`` and ``environ``, the files under /tmp, /var/tmp, /dev/shm and the
    repository), searched for the token it is handed on stdin; then a kernel asked for."""
    kernel_port = jupyter_port(live)
    probe = r"""
import json, os, socket, subprocess, sys
token, book, kernels, repo = sys.stdin.read(), int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def http(port, method, path):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split()[1]), data.decode(errors="replace")
found, read = [], 0
live_json = http(book, "GET", "/live.json")[1]
if token in live_json:
    found.append("/live.json")
ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
if token in ps:
    found.append("ps")
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if token.encode() in f.read():
                        found.append(f"/proc/{pid}/{part}")
            except OSError:
                pass
for top in ("/tmp", "/var/tmp", "/dev/shm", repo):
    for folder, subfolders, files in os.walk(top):
        subfolders[:] = [s for s in subfolders if s not in (".venv", ".git", "data", "node_modules")]
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    read += 1
                    if token.encode() in f.read(1 << 20):
                        found.append(os.path.join(folder, name))
            except OSError:
                pass
print(json.dumps({"found": found, "files_read": read, "uid": os.getuid(),
                  "kernel": http(kernels, "POST", "/api/kernels")[0],
                  "kernel_with_guess": http(kernels, "POST", "/api/kernels?token=")[0]}))
"""
    answer = subprocess.run([SYSTEM_PYTHON, "-c", probe, str(live.port), str(kernel_port), str(REPO)],
                            input=live.token, capture_output=True, text=True, user=NOBODY, group=NOBODY,
                            extra_groups=[], cwd="/", timeout=120)
    assert answer.returncode == 0, answer.stderr
    seen = json.loads(answer.stdout)
    assert seen["uid"] == NOBODY and seen["files_read"] > 0
    assert seen["found"] == []
    assert seen["kernel"] == 403 and seen["kernel_with_guess"] == 403


@pytest.mark.parametrize("how, when", [("SIGHUP", "serving"), ("SIGTERM", "serving"), ("SIGINT", "serving"),
                                       ("SIGKILL", "serving"), ("SIGTERM", "starting")])
def test_the_kernel_server_and_its_scratch_folder_end_with_make_live(html, tmp_path, how, when):
    """The parent alone gets the signal (the terminal's SIGHUP, Ctrl-C's SIGINT, a kill), while
    it serves or while its Jupyter server starts."""
    server = Live(html, free_port(), tmp_path / "live.log")
    try:
        if when == "serving":
            server.wait_for_address()
        pid, scratch = server.kernel_server()
        assert alive(pid) and scratch.is_dir() and ("#live=" in server.output()) == (when == "serving")
        os.kill(server.process.pid, getattr(signal, how))
        server.process.wait(timeout=GONE_S)
        wait_until_gone(pid, scratch)
        assert "Traceback" not in server.output()
    finally:
        server.stop()


def test_a_kernel_server_that_dies_first_stops_make_live_in_one_line(html, tmp_path):
    server = Live(html, free_port(), tmp_path / "live.log")
    try:
        server.wait_for_address()
        pid, scratch = server.kernel_server()
        os.kill(pid, signal.SIGKILL)
        assert server.process.wait(timeout=GONE_S) == 2
        errors = [line for line in server.output().splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Jupyter server stopped" in errors[0], server.output()
        assert "Traceback" not in server.output()
        deadline = time.monotonic() + GONE_S
        while scratch.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not scratch.exists()
    finally:
        server.stop()


def test_a_port_in_use_is_one_line_before_anything_starts(html, tmp_path):
    """Nothing started: no scratch folder was made (its temporary folder stays empty)."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        answer = subprocess.run([sys.executable, "-m", "barter_mini.book.live", "--html", str(html), "--port",
                                 str(port)], cwd=REPO, capture_output=True, text=True, timeout=120,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
    assert answer.returncode == 2 and answer.stdout == ""
    assert answer.stderr.splitlines() == [f"error: port {port} on {HOST} is in use: give another with --port "
                                          "(1-65535), or leave --port out for a free one"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_port_that_is_no_port_is_one_line(html, port):
    answer = subprocess.run([sys.executable, "-m", "barter_mini.book.live", "--html", str(html), "--port", port],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2 and "from 1 to 65535" in answer.stderr.splitlines()[-1]
    assert "Traceback" not in answer.stderr

