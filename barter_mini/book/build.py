"""Build the book: execute every notebook with papermill, then Jupyter Book 1 -> HTML.

``build_book(profile)`` stages the book in ``_build/book/``: the top-level ``_config.yml``
and ``_toc.yml``, the ``book/`` chapters, the package's source (which the method chapter
includes beside its formulas), MathJax 3 for offline math, Thebe for live code (``make
live``), and every notebook of
``notebooks/`` executed with papermill (kernel ``python3``, ``profile`` set) next to the
CSV/JSON files it writes. A notebook that raises stops the build with its name and cell,
and its half-executed copy is deleted, so a failing notebook is never published. Then
``jupyter-book build -W -n --keep-going`` turns any Sphinx warning into a failure.

Progress goes to stderr: a line when each notebook starts and when it ends (with its time),
papermill's tqdm bar over the running notebook's cells on a terminal (tqdm's own rule:
none when stderr is not a TTY, so logs stay clean), and at the end :func:`format_times`'s
table of seconds per notebook, for the HTML build and in total (``barter-mini book``
prints it).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import BarterError, choose, shown_path
from ..training.checkpoints import check_can_create
from .mechanism import write_mechanism_figures
from .paper_numbers import book_substitutions
from .profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
MATHJAX_PACKAGE = "mathjax@3"
#: Thebe, which turns a page's code cells into live ones (``make live``,
#: :mod:`barter_mini.book.live`), pinned
THEBE_PACKAGE = "thebe@0.9.3"
#: the npm registry's integrity (SHA-512) of :data:`THEBE_PACKAGE`'s tarball
THEBE_INTEGRITY = "sha512-Rb/7kVhtlffXra3kIe7OuIGE7awsm2/fGWxw21DiNfnWLnUQiDl9AWqYdshPwZPG/5DzLpsJRPix2xtCPtJmQQ=="
#: the stage's folder of vendored JavaScript, whose contents land at the HTML root
#: (``html_extra_path``): ``mathjax/`` and ``thebe/``
VENDOR_DIR = "_vendor"


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
    stage_package_source(stage)
    write_substitutions(stage / "_config.yml", book_substitutions())


#: the package the book documents: its imported source, whatever repo the pages come from
PACKAGE = Path(__file__).resolve().parents[1]


def stage_package_source(stage: Path, package: Path = PACKAGE) -> None:
    """Copy the package's ``.py`` files to ``stage/barter_mini/``: the method chapter shows
    the update's functions with ``literalinclude`` (``../barter_mini/core/barter.py``,
    ``:pyobject:``), read from this copy of the code the book documents."""
    def not_source(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or (Path(folder, n).is_file() and not n.endswith(".py"))]

    shutil.copytree(package, stage / package.name, ignore=not_source)


def write_substitutions(config: Path, substitutions: dict[str, str]) -> None:
    """Add ``substitutions`` to the staged ``_config.yml`` (``parse.myst_substitutions``), so
    that ``{{ key }}`` in a page reads its value (:mod:`barter_mini.book.paper_numbers`)."""
    settings = yaml.safe_load(config.read_text())
    settings.setdefault("parse", {})["myst_substitutions"] = dict(substitutions)
    config.write_text(yaml.safe_dump(settings, sort_keys=False, allow_unicode=True))


def npm_tarball(package: str, pattern: str, cache: Path, integrity: str | None = None) -> Path:
    """The npm tarball of ``package`` in ``cache`` (``pattern``: its file name), fetched once
    with ``npm pack``; with ``integrity`` (the registry's ``sha512-...``), a tarball whose
    digest differs is refused in one line."""
    cache.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(cache.glob(pattern))
    if not tarballs:
        npm = shutil.which("npm")
        if npm is None:
            raise BarterError(f"npm is needed once to fetch {package} for offline pages: "
                              f"apt-get install npm (or put its tarball in {cache})")
        subprocess.run([npm, "pack", package, "--silent"], cwd=cache, check=True, stdout=subprocess.DEVNULL)
        tarballs = sorted(cache.glob(pattern))
    tarball = tarballs[-1]
    if integrity is not None:
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if digest != integrity:
            raise BarterError(f"{tarball} is not {package} as the npm registry published it "
                              f"({digest[:20]}... instead of {integrity[:20]}...): delete it to fetch it again")
    return tarball


def unpack(tarball: Path, folder: str, target: Path) -> None:
    """The files under ``package/FOLDER/`` of an npm ``tarball``, unpacked into ``target``."""
    prefix = f"package/{folder}/"
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(prefix):]
        archive.extractall(target, members=members, filter="data")


def vendor_mathjax(stage: Path, cache: Path) -> None:
    """Put MathJax 3's ``es5/`` at ``stage/_vendor/mathjax`` (fetched once with ``npm pack``)."""
    unpack(npm_tarball(MATHJAX_PACKAGE, "mathjax-3*.tgz", cache), "es5", stage / VENDOR_DIR / "mathjax")


def vendor_thebe(stage: Path, cache: Path) -> None:
    """Put Thebe's ``lib/`` (its script, its chunks and its style sheet) at
    ``stage/_vendor/thebe``, from the pinned tarball (:data:`THEBE_PACKAGE`, checked against
    :data:`THEBE_INTEGRITY`)."""
    version = THEBE_PACKAGE.split("@")[1]
    unpack(npm_tarball(THEBE_PACKAGE, f"thebe-{version}.tgz", cache, THEBE_INTEGRITY), "lib",
           stage / VENDOR_DIR / "thebe")


#: the row of the HTML build in :attr:`BookBuild.times`
HTML_STEP = "HTML (jupyter-book)"


def log_to_stderr(message: str) -> None:
    """Progress lines go to stderr, so stdout holds only what the command reports."""
    print(message, file=sys.stderr, flush=True)


def cell_progress(notebook: str, stream=None) -> dict:
    """papermill's ``progress_bar`` settings: a tqdm bar over the cells named after the
    notebook, on stderr, gone when the notebook ends (its end line replaces it); ``disable=None``
    is tqdm's rule of no bar when the stream is not a terminal."""
    return {"desc": notebook, "unit": "cell", "leave": False, "disable": None, "file": stream or sys.stderr}


#: the terminal colours of an IPython traceback
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def cell_traceback(traceback) -> tuple[str, ...]:
    """The lines of a failed cell's traceback, without their colours; none for a
    :class:`~barter_mini.errors.BarterError`, whose traceback is its one line."""
    lines = [line for entry in traceback or [] for line in COLOURS.sub("", str(entry)).splitlines()]
    return () if len(lines) == 1 and lines[0].startswith("error: ") else tuple(lines)


#: the kernel's arguments: its warnings (ipykernel's on a TCP connection without encryption, at
#: every start) would stand on stderr beside a failure's one line, before or after it
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]


def execute_notebook(source: Path, target: Path, parameters: dict, progress_bar: dict | bool = False,
                     keep_failed: bool = False) -> float:
    """Run one notebook with papermill into ``target`` (``progress_bar`` as papermill takes
    it, e.g. :func:`cell_progress`); on failure raise a one-line error that names the cell
    and its error. With ``keep_failed`` the executed notebook stays, and the line ends with
    its path (it holds the cell's whole traceback); else it is deleted and the error's
    ``details`` are the cell's traceback (printed after it). Returns its seconds."""
    import papermill

    started = time.perf_counter()
    # papermill logs its input, output and kernel at INFO for every notebook: lines that would
    # stand before a failure's one line; the build's own lines say which notebook runs
    papermill_log = logging.getLogger("papermill")
    level = papermill_log.level
    papermill_log.setLevel(max(level, logging.WARNING))
    try:
        papermill.execute_notebook(str(source), str(target), parameters=parameters,
                                   kernel_name="python3", cwd=str(target.parent),
                                   progress_bar=progress_bar, log_output=False, extra_arguments=QUIET_KERNEL)
    except papermill.PapermillExecutionError as error:
        message = str(error.evalue).strip().splitlines()[0] if error.evalue else ""
        what_failed = f"notebook {source.name} failed in cell {error.exec_count}: {error.ename}: {message}"
        if keep_failed:
            raise BarterError(f"{what_failed} (full log: {shown_path(target)})") from None
        target.unlink(missing_ok=True)
        failure = BarterError(what_failed)
        failure.details = cell_traceback(error.traceback)
        raise failure from None
    finally:
        papermill_log.setLevel(level)
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


@dataclass(frozen=True)
class BookBuild:
    """A built book: its ``index.html`` and the seconds each step took."""

    index: Path
    #: (step, seconds): every notebook in chapter order, then :data:`HTML_STEP`
    times: list[tuple[str, float]]
    #: wall seconds of the whole build (staging and MathJax included)
    total_s: float


def format_times(build: BookBuild) -> str:
    """The table ``barter-mini book`` ends with: seconds per notebook, for the HTML build and in total."""
    rows = [*build.times, ("total", build.total_s)]
    width = max(len("step"), *(len(step) for step, _ in rows))
    lines = [f"{'step':<{width}}  {'seconds':>8}"]
    lines += [f"{step:<{width}}  {seconds:8.1f}" for step, seconds in rows]
    return "\n".join(lines)


def run_book_build(profile: str = "quick", build_dir: Path | None = None, log=log_to_stderr,
                   repo: Path = REPO) -> BookBuild:
    """Execute every notebook of ``repo`` at ``profile`` and build the HTML book, logging a
    line as each notebook starts and ends; return the index and the time of every step."""
    choose("profile", profile, PROFILES)
    started = time.perf_counter()
    build_dir = check_can_create(Path(build_dir or repo / "_build"))    # before any work
    stage = build_dir / "book"
    stage_sources(stage, repo)
    vendor_mathjax(stage, build_dir / "vendor")
    vendor_thebe(stage, build_dir / "vendor")
    log("drawing the mechanism's figures for the introduction and the method page")
    write_mechanism_figures(stage / "book" / "figures")
    notebooks, times = source_notebooks(repo), []
    for number, notebook in enumerate(notebooks, 1):
        log(f"[{number}/{len(notebooks)}] running {notebook.name} ({profile})")
        seconds = execute_notebook(notebook, stage / "notebooks" / notebook.name, {"profile": profile},
                                   progress_bar=cell_progress(notebook.name))
        log(f"[{number}/{len(notebooks)}] executed {notebook.name} in {seconds:.0f} s")
        times.append((notebook.name, seconds))
    log("building the HTML with jupyter-book")
    html_started = time.perf_counter()
    index = build_html(stage)
    times.append((HTML_STEP, time.perf_counter() - html_started))
    log(f"book: {index}")
    return BookBuild(index, times, time.perf_counter() - started)


def build_book(profile: str = "quick", build_dir: Path | None = None, log=log_to_stderr,
               repo: Path = REPO) -> Path:
    """Execute every notebook of ``repo`` at ``profile`` and build the HTML book; return
    ``index.html`` (:func:`run_book_build` also returns the time of every step)."""
    return run_book_build(profile, build_dir, log, repo).index
