"""The Jupyter server that ``make live`` starts (:mod:`barter_mini.book.live`): kernels only,
for the book's pages alone, gone with the ``make live`` that started it.

Run as ``python -m barter_mini.book.live_kernels SCRATCH PORT BOOK_PORT``; everything else
comes from ``SCRATCH``, the private (``0700``) folder ``make live`` made for it:

* the token is read from ``SCRATCH/token`` (``0600``) and the file deleted at once, so it is
  in no file, no command line (``ps``) and no environment (``/proc/PID/environ``) afterwards;
  the server gets it, and its other settings, as command-line configuration passed in this
  process (a user's ``jupyter_server_config`` cannot loosen them: the command line wins);
* it listens on 127.0.0.1, answers only ``Host: 127.0.0.1`` or ``localhost``
  (``allow_remote_access=False``: a name that rebinds to 127.0.0.1 gets 403), accepts
  cross-origin requests from the book's origin only, and has no terminals and no JupyterLab;
* its runtime files (``jpserver-PID.json`` holds the token) go under ``SCRATCH``, and
  ``SCRATCH`` is removed when the server stops, whatever stopped it: ``make live`` starts this
  process with ``PR_SET_PDEATHSIG`` set to ``SIGTERM``, so even ``kill -9`` of ``make live``
  ends it, and a ``SIGTERM`` stops the server, its kernels and then removes the folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: the file in the scratch folder that hands the token over, deleted once read
TOKEN_FILE = "token"
#: the folder of the Jupyter server's runtime files (they carry the token), inside the scratch
RUNTIME_FOLDER = "runtime"
#: the only interface either server of ``make live`` listens on
HOST = "127.0.0.1"


def book_origin_pattern(book_port: int) -> str:
    """The origins whose pages may call the server: the book's, by either local name."""
    return rf"^http://(127\.0\.0\.1|localhost):{book_port}$"


def server_arguments(scratch: Path, port: int, book_port: int, token: str) -> list[str]:
    """The Jupyter server's configuration, as in-process command-line arguments."""
    return [f"--ServerApp.ip={HOST}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", "--ServerApp.allow_remote_access=False",
            "--ServerApp.local_hostnames=localhost",
            f"--ServerApp.allow_origin_pat={book_origin_pattern(book_port)}",
            "--ServerApp.terminals_enabled=False", f"--ServerApp.root_dir={scratch}",
            "--ServerApp.open_browser=False", "--ServerApp.log_level=WARN",
            "--ServerApp.jpserver_extensions", "jupyterlab=False",
            *(["--allow-root"] if os.geteuid() == 0 else [])]       # containers often run as root


def take_token(scratch: Path) -> str:
    """The token ``make live`` left in ``scratch``; the file is gone afterwards."""
    path = scratch / TOKEN_FILE
    token = path.read_text().strip()
    path.unlink()
    return token


def main(argv: list[str] | None = None) -> int:
    scratch_arg, port, book_port = (argv if argv is not None else sys.argv[1:])
    scratch = Path(scratch_arg)
    try:
        try:
            token = take_token(scratch)
        except OSError as error:
            print(f"error: make live's Jupyter server found no token in {scratch} ({error.strerror}): "
                  "start make live again", file=sys.stderr)
            return 2
        os.environ["JUPYTER_RUNTIME_DIR"] = str(scratch / RUNTIME_FOLDER)
        from jupyter_server.serverapp import ServerApp

        ServerApp.launch_instance(argv=server_arguments(scratch, int(port), int(book_port), token))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
