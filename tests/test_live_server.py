"""What ``make live`` starts, checked without a browser: the Jupyter server's flags, the
kernels' scratch folder and environment, the refusal of a folder that holds no book."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from barter_mini.book import live
from barter_mini.errors import BarterError


def test_the_jupyter_server_listens_on_127_0_0_1_with_a_token_and_the_books_origin(tmp_path):
    command = live.jupyter_command(8123, "secret", "http://127.0.0.1:8000", tmp_path)
    assert "--ServerApp.ip=127.0.0.1" in command and "--ServerApp.port=8123" in command
    assert "--IdentityProvider.token=secret" in command
    assert "--ServerApp.allow_origin=http://127.0.0.1:8000" in command      # the book's origin, not *
    assert f"--ServerApp.root_dir={tmp_path}" in command and "--ServerApp.port_retries=0" in command


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
