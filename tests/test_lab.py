"""``make lab``: JupyterLab serves the book's notebooks on the venv's ``python3`` kernel.

The test reads the command ``make lab`` runs from ``make -n lab`` (so it checks the
Makefile's target, not a copy of it), starts it headless on a free loopback port with a
token and throwaway Jupyter config, data and runtime folders, waits until it answers,
checks its REST API and stops it (terminate, then kill). Every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import HOST, free_port, running_server

REPO = Path(__file__).resolve().parents[1]
#: seconds JupyterLab may take to answer (it answers in a few)
START_TIMEOUT = 25
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9]*.ipynb"))

pytestmark = pytest.mark.slow


def lab_command(lab_args: str) -> list[str]:
    """The JupyterLab command line of ``make lab LAB_ARGS=...``, from a dry run of make."""
    dry = subprocess.run(["make", "-n", "--no-print-directory", "lab", f"LAB_ARGS={lab_args}"], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, f"make -n lab failed: {dry.stderr}"
    lines = dry.stdout.splitlines()
    labs = [i for i, line in enumerate(lines) if line.split()[1:2] == ["lab"]]
    assert len(labs) == 1, f"make lab should run one `jupyter lab`:\n{dry.stdout}"
    assert any("barter_mini.cli data fashion-mnist" in line for line in lines[:labs[0]]), (
        f"make lab should prepare the data before starting JupyterLab:\n{dry.stdout}")
    command = shlex.split(lines[labs[0]])
    assert command[0] == ".venv/bin/jupyter", f"make lab should run the venv's jupyter: {command}"
    # the venv's jupyter is the one beside the interpreter running the tests (make test)
    jupyter = Path(sys.executable).with_name("jupyter")
    assert jupyter.exists(), f"{jupyter} is missing: pip install -e '.[book]' (JupyterLab)"
    return [str(jupyter), *command[1:]]


def get(url: str, token: str, timeout: float = 5):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


@pytest.fixture
def lab(tmp_path):
    """``(base url, token)`` of a running ``make lab`` server, stopped at teardown."""
    port, token = free_port(), secrets.token_hex(16)
    command = lab_command(f"--no-browser --ip {HOST} --port {port} --port-retries=0 "
                          f"--IdentityProvider.token={token}")
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                 "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        (tmp_path / name).mkdir()
        env[name] = str(tmp_path / name)
    log = tmp_path / "lab.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}/"
    with running_server(server, lambda: get(url + "api/status", token, timeout=2) is not None, START_TIMEOUT,
                        f"jupyter lab on {url}", lambda: log.read_text()[-3000:]):
        yield url, token


def test_make_lab_serves_the_notebooks_on_the_venv_kernel(lab):
    before = sorted(p.name for p in (REPO / "notebooks").iterdir())
    url, token = lab
    listing = get(url + "api/contents/", token)
    served = sorted(item["name"] for item in listing["content"] if item["type"] == "notebook")
    assert len(NOTEBOOKS) == 9 and served == NOTEBOOKS, f"JupyterLab's root lists {served}, not {NOTEBOOKS}"

    specs = get(url + "api/kernelspecs", token)["kernelspecs"]
    assert "python3" in specs, f"no python3 kernel among {sorted(specs)}"
    argv0 = specs["python3"]["spec"]["argv"][0]
    # a bare "python" is replaced by the server's own interpreter, the venv's, at launch
    assert argv0 in ("python", "python3") or Path(argv0).resolve() == Path(sys.executable).resolve(), (
        f"the python3 kernel runs {argv0}, not the venv's interpreter {sys.executable}")

    for name in NOTEBOOKS:
        notebook = get(url + f"api/contents/{name}?content=1", token)
        assert notebook["content"]["metadata"]["kernelspec"]["name"] == "python3", name
    # unauthenticated requests are refused: the token is in force
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "api/contents/", timeout=5)
    assert refused.value.code == 403
    # reading the notebooks wrote nothing next to them
    assert sorted(p.name for p in (REPO / "notebooks").iterdir()) == before
