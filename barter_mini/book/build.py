"""Build the book: execute every notebook with papermill, then Jupyter Book 1 -> HTML.

``build_book(profile)`` stages the book in ``_build/book/``: the top-level ``_config.yml``
and ``_toc.yml``, the ``book/`` chapters, MathJax 3 for offline math, and every notebook of
``notebooks/`` executed with papermill (kernel ``python3``, ``profile`` set) next to the
CSV/JSON files it writes. A notebook that raises stops the build with its name and cell,
and its half-executed copy is deleted, so a failing notebook is never published. Then
``jupyter-book build -W -n --keep-going`` turns any Sphinx warning into a failure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from ..errors import BarterError, choose
from .profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
MATHJAX_PACKAGE = "mathjax@3"


def source_notebooks(repo: Path = REPO) -> list[Path]:
    """The book's notebooks, in chapter order (their file names start with a number)."""
    return sorted((repo / "notebooks").glob("[0-9]*.ipynb"))


def stage_sources(stage: Path, repo: Path = REPO) -> None:
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "notebooks").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(repo / name, stage / name)
    shutil.copytree(repo / "book", stage / "book")


def vendor_mathjax(stage: Path, cache: Path) -> None:
    """Put MathJax 3's ``es5/`` at ``stage/_mathjax/mathjax`` (fetched once with ``npm pack``)."""
    cache.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(cache.glob("mathjax-3*.tgz"))
    if not tarballs:
        npm = shutil.which("npm")
        if npm is None:
            raise BarterError("npm is needed once to fetch MathJax for offline pages: "
                              "apt-get install npm (or put mathjax-3.x.tgz in " f"{cache})")
        subprocess.run([npm, "pack", MATHJAX_PACKAGE, "--silent"], cwd=cache, check=True,
                       stdout=subprocess.DEVNULL)
        tarballs = sorted(cache.glob("mathjax-3*.tgz"))
    target = stage / "_mathjax" / "mathjax"
    with tarfile.open(tarballs[-1]) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith("package/es5/")]
        for member in members:
            member.name = member.name[len("package/es5/"):]
        archive.extractall(target, members=members, filter="data")


def execute_notebook(source: Path, target: Path, parameters: dict) -> float:
    """Run one notebook with papermill into ``target``; on failure delete it and raise."""
    import papermill

    started = time.perf_counter()
    try:
        papermill.execute_notebook(str(source), str(target), parameters=parameters,
                                   kernel_name="python3", cwd=str(target.parent),
                                   progress_bar=False, log_output=False)
    except papermill.PapermillExecutionError as error:
        target.unlink(missing_ok=True)
        message = str(error.evalue).strip().splitlines()[0] if error.evalue else ""
        raise BarterError(f"notebook {source.name} failed in cell {error.exec_count}: "
                          f"{error.ename}: {message}") from None
    return time.perf_counter() - started


def build_html(stage: Path) -> Path:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
               "build", str(stage), "-W", "-n", "--keep-going"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-8000:] + result.stderr[-8000:])
        raise BarterError(f"jupyter-book build failed (exit {result.returncode}): see the log above")
    return stage / "_build" / "html" / "index.html"


def build_book(profile: str = "quick", build_dir: Path | None = None, log=print,
               repo: Path = REPO) -> Path:
    """Execute every notebook of ``repo`` at ``profile`` and build the HTML book; return ``index.html``."""
    choose("profile", profile, PROFILES)
    build_dir = Path(build_dir or repo / "_build")
    stage = build_dir / "book"
    stage_sources(stage, repo)
    vendor_mathjax(stage, build_dir / "vendor")
    for notebook in source_notebooks(repo):
        seconds = execute_notebook(notebook, stage / "notebooks" / notebook.name, {"profile": profile})
        log(f"executed {notebook.name} ({profile}) in {seconds:.0f} s")
    index = build_html(stage)
    log(f"book: {index}")
    return index
