"""What ``make live`` starts, checked without a browser: the Jupyter server's settings, the
token's hand-over, the printed address, the kernels' scratch folder and environment, the
refusal of a folder that holds no book."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from barter_mini.book import live, live_kernels
from barter_mini.errors import BarterError


def test_the_jupyter_server_listens_on_127_0_0_1_for_the_books_origin_with_no_secret_on_its_command_line(tmp_path):
    command = live.jupyter_command(tmp_path, 8123, 8000)
    assert command[1:] == ["-m", "barter_mini.book.live_kernels", str(tmp_path), "8123", "8000"]
    settings = live_kernels.server_arguments(tmp_path, 8123, 8000, "secret")
    assert "--ServerApp.ip=127.0.0.1" in settings and "--ServerApp.port=8123" in settings
    assert "--IdentityProvider.token=secret" in settings and "--ServerApp.terminals_enabled=False" in settings
    assert "--ServerApp.allow_remote_access=False" in settings and "--ServerApp.port_retries=0" in settings
    pattern = re.compile(live_kernels.book_origin_pattern(8000))           # the book's origin, not *
    assert pattern.match("http://127.0.0.1:8000") and pattern.match("http://localhost:8000")
    assert not pattern.match("http://evil.example:8000") and not pattern.match("http://127.0.0.1:8001")


def test_the_token_is_handed_over_in_a_private_file_read_once(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    live.hand_over_token(scratch, "secret")
    assert stat.S_IMODE((scratch / live_kernels.TOKEN_FILE).stat().st_mode) == 0o600
    assert live_kernels.take_token(scratch) == "secret" and list(scratch.iterdir()) == []
    assert not any(name.startswith("JUPYTER_TOKEN") for name in live.kernel_environment(scratch))


def test_the_printed_address_carries_the_token_in_its_fragment_only():
    address = urlsplit(live.live_address(8000, "secret"))
    assert (address.hostname, address.port, address.path) == ("127.0.0.1", 8000, "/index.html")
    assert address.fragment == "live=secret" and address.query == ""


def test_the_kernels_work_in_a_scratch_copy():
    scratch = live.scratch_folder()
    try:
        env = live.kernel_environment(scratch)
        assert Path(env["BARTER_MINI_CACHE"]).is_absolute()         # the checkout's cache, wherever kernels work
        copied = sorted(path.name for path in (scratch / "recorded").glob("*.csv"))
        assert "from_scratch_grid.csv" in copied and Path(env["BARTER_MINI_RECORDED"]) == scratch / "recorded"
        assert str(live.REPO) in env["PYTHONPATH"].split(os.pathsep)
    finally:
        import shutil
        shutil.rmtree(scratch)


def test_a_folder_without_a_book_is_one_line(tmp_path):
    with pytest.raises(BarterError, match=r"^.* holds no index.html: give the html folder of a built book$"):
        live.ensure_book(tmp_path, "smoke", None)
    assert live.main(["--html", str(tmp_path)]) == 2


def test_a_kernel_server_without_its_token_is_one_line_and_removes_its_folder(tmp_path, capsys):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    assert live_kernels.main([str(scratch), "8123", "8000"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: make live's Jupyter server found no token")
    assert not scratch.exists()


def test_the_printed_address_is_the_first_page_not_a_redirect_that_would_drop_the_key(tmp_path):
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    assert live.start_page(tmp_path) == "book/intro.html"
    assert live.live_address(8000, "k", live.start_page(tmp_path)) == "http://127.0.0.1:8000/book/intro.html#live=k"
    (tmp_path / "index.html").write_text("<p>a book</p>")
    assert live.start_page(tmp_path) == "index.html"
