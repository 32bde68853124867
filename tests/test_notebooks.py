"""Notebook parameters, their failures, and the book pipeline's refusal to publish a failure."""

import ast
import re
import shutil
from pathlib import Path

import nbformat
import papermill
import pytest

from barter_mini.book.build import build_book, source_notebooks
from barter_mini.errors import BarterError

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = source_notebooks(REPO)
REQUIRED = {("density", "densities"): ("float", "list"), ("seed", "seeds"): ("int", "list"),
            ("dataset",): ("str",), ("profile",): ("str",)}


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:2] == ["00_barter_from_scratch.ipynb", "01_walkthrough.ipynb"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_are_declared_typed_and_explained(notebook):
    cells = nbformat.read(notebook, as_version=4).cells
    assert sum("parameters" in c.metadata.get("tags", []) for c in cells) == 1
    assert not any(c.get("outputs") for c in cells if c.cell_type == "code"), "store notebooks stripped"
    params = papermill.inspect_notebook(str(notebook))
    for names, types in REQUIRED.items():
        present = [n for n in names if n in params]
        assert present, f"{notebook.name} lacks {' or '.join(names)}"
        info = params[present[0]]
        assert any(info["inferred_type_name"].startswith(t) for t in types), info
        assert info["help"].strip(), f"{present[0]} has no help comment"
    assert params["profile"]["default"].strip("'\"") == "quick"
    # every page says how to rerun it (barter-mini notebook: papermill with a one-line failure) and lists its parameters
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert f"barter-mini notebook notebooks/{notebook.name}" in text
    for name in params:
        assert f"`{name}`" in text, f"{name} is not listed on the page"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_stripped_on_the_python3_kernel_and_openable_in_lab(notebook):
    nb = nbformat.read(notebook, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), "store notebooks stripped"
    # the rerun box also says how to open the notebook interactively
    intro = nb.cells[0].source
    start = intro.index("```{admonition} Rerun this notebook")
    box = intro[start:intro.index("\n```", start)]
    assert "make lab" in box and "parameters cell" in box, f"{notebook.name}: the rerun box does not mention make lab"


#: the book layer's public functions and classes that only one chapter uses, still in the
#: package: each belongs in its chapter's cells (d2l's rule), and leaves this list when it moves
ONE_CHAPTER_DEBT = {
    # trains a reader's own map cells in the recorded map's format, with the map's recording tools
    "05": {"train_cells"},
}


def _code_of(notebook: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")


def book_layer_users() -> dict[tuple[str, str], tuple[set[str], bool]]:
    """Per public function or class of ``barter_mini.book`` (module, name): the chapters whose
    cells use it, and whether the package needs it otherwise (another module, the command line,
    the sweep, or a function of its own module that the package or two chapters need)."""
    package = {path: path.read_text() for path in (REPO / "barter_mini").rglob("*.py")}
    chapters = {path.name[:2]: _code_of(path) for path in NOTEBOOKS}
    defined, calls = {}, {}
    for path in sorted((REPO / "barter_mini" / "book").glob("*.py")):
        tree = ast.parse(package[path])
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined[(path, node.name)] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
                                             {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    uses = {}
    for (path, name) in defined:
        word = re.compile(rf"\b{name}\b")
        uses[(path, name)] = ({c for c, code in chapters.items() if word.search(code)},
                              any(word.search(text) for other, text in package.items() if other != path))
    needed = {key for key, (used_by, elsewhere) in uses.items() if elsewhere or len(used_by) > 1}
    changed = True
    while changed:      # what a needed function of the same module calls is needed too
        changed = False
        for (path, name), names in defined.items():
            if (path, name) in needed:
                for (other_path, other) in defined:
                    if other_path == path and other in names and (path, other) not in needed:
                        needed.add((path, other))
                        changed = True
    return {(path.stem, name): (used_by, (path, name) in needed)
            for (path, name), (used_by, _) in uses.items() if not name.startswith("_")}


#: the style every page shares and the book's rules (figure size and fonts, the palette, how a
#: table reads, the seed-noise rule, claims): a page draws and judges with them, whoever uses them
SHARED_BY_DESIGN = {"figures", "palette", "tables", "seed_noise", "claims"}


def test_a_page_defines_what_only_it_uses():
    """A function one chapter needs is written in that chapter's cells; what two chapters, the
    command line or the sweep need lives in the package (d2l's rule)."""
    only_one = {}
    for (module, name), (used_by, needed) in book_layer_users().items():
        if len(used_by) == 1 and not needed and module not in SHARED_BY_DESIGN:
            only_one.setdefault(next(iter(used_by)), set()).add(name)
    for chapter in sorted(set(only_one) | set(ONE_CHAPTER_DEBT)):
        new = only_one.get(chapter, set()) - ONE_CHAPTER_DEBT.get(chapter, set())
        assert not new, f"chapter {chapter} is the only user of {sorted(new)}: define them in its cells"
        moved = ONE_CHAPTER_DEBT.get(chapter, set()) - only_one.get(chapter, set())
        assert not moved, f"{sorted(moved)} no longer serve chapter {chapter} alone: strike them from ONE_CHAPTER_DEBT"


def run_with(notebook, tmp_path, **parameters):
    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(str(notebook), str(tmp_path / "out.ipynb"), kernel_name="python3",
                                   parameters={"profile": "smoke", **parameters}, cwd=str(tmp_path),
                                   progress_bar=False)
    return info.value


def bad_parameter_cases():
    """Per notebook: an out-of-range density (or densities) and an unknown dataset."""
    for notebook in NOTEBOOKS:
        declared = papermill.inspect_notebook(str(notebook))
        density = {"density": 1.5} if "density" in declared else {"densities": [0.3, 1.5]}
        yield pytest.param(notebook, density, "density must be in (0, 1], got 1.5",
                           id=f"{notebook.stem}-density")
        yield pytest.param(notebook, {"dataset": "imagenet-1k"},
                           "unknown dataset 'imagenet-1k': choose one of", id=f"{notebook.stem}-dataset")


@pytest.mark.parametrize("notebook, parameters, message", list(bad_parameter_cases()))
def test_bad_parameter_fails_with_the_library_error(notebook, parameters, message, tmp_path):
    error = run_with(notebook, tmp_path, **parameters)
    assert error.ename == "BarterError"
    assert message in error.evalue and "\n" not in error.evalue.strip()
    # the executed notebook's first output is the one-line error, not a traceback through the library
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    first = next(output for cell in executed.cells for output in cell.get("outputs", []))
    assert first.output_type == "error" and first.traceback == [f"error: {error.evalue}"], first


def test_a_failing_notebook_stops_the_build_and_is_not_published(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(REPO / name, repo / name)
    shutil.copytree(REPO / "book", repo / "book")
    (repo / "notebooks").mkdir()
    good = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}})
    good.cells = [nbformat.v4.new_code_cell("profile: str = 'quick'", metadata={"tags": ["parameters"]}),
                  nbformat.v4.new_code_cell("print('fine')")]
    bad = nbformat.v4.new_notebook(metadata=good.metadata)
    bad.cells = [*good.cells, nbformat.v4.new_code_cell("raise ValueError('broken on purpose')")]
    nbformat.write(good, repo / "notebooks" / "01_good.ipynb")
    nbformat.write(bad, repo / "notebooks" / "02_bad.ipynb")
    build = tmp_path / "build"
    # cell 4: papermill inserts the injected-parameters cell after the parameters cell
    with pytest.raises(BarterError, match=r"notebook 02_bad.ipynb failed in cell 4: ValueError: broken on purpose"):
        build_book("smoke", build, log=lambda *_: None, repo=repo)
    executed = build / "book" / "notebooks"
    assert (executed / "01_good.ipynb").is_file()
    assert not (executed / "02_bad.ipynb").exists()
    assert not (build / "book" / "_build" / "html").exists()


#: a figure a notebook glues: show("fig-...", ...), or show(f"fig-...-{kind}", ...) in a loop
SHOWN = re.compile(r'show\(\s*f?"(fig-[\w{}-]+)"')
#: the page's numbered, captioned place for it
GLUE_FIGURE = re.compile(r"```\{glue:figure\} (fig-[\w-]+)\n:name: (fig-[\w-]+)\n")


def test_every_figure_is_glued_into_a_numbered_captioned_place_with_a_name_unique_in_the_book():
    names = []
    for notebook in NOTEBOOKS:
        cells = nbformat.read(notebook, as_version=4).cells
        shown = {name for c in cells if c.cell_type == "code" for name in SHOWN.findall(c.source)}
        placed = [m.groups() for c in cells if c.cell_type == "markdown" for m in GLUE_FIGURE.finditer(c.source)]
        assert all(key == name for key, name in placed), f"{notebook.name}: a glue key differs from its name"
        keys = [key for key, _ in placed]
        for name in shown:
            pattern = re.compile("^" + re.sub(r"\\\{\w+\\\}", r"[\\w-]+", re.escape(name)) + "$")
            assert any(pattern.match(key) for key in keys), f"{notebook.name} shows {name} but never places it"
        for key in keys:
            assert any(re.fullmatch(re.sub(r"\{\w+\}", r"[\\w-]+", name), key) for name in shown), \
                f"{notebook.name} places {key}, which no cell glues"
        assert all(not re.search(r"^plot_\w+\(", c.source, re.M) for c in cells if c.cell_type == "code"), \
            f"{notebook.name} draws a figure bare (no number, no caption): pass it to show()"
        names += keys
    book = "\n".join(p.read_text() for p in (REPO / "book").glob("*.md"))
    names += re.findall(r"```\{figure\} [^\n]+\n:name: ([\w-]+)", book)
    assert len(names) >= 20 and len(set(names)) == len(names), names


@pytest.mark.parametrize("notebook", [n for n in NOTEBOOKS if not n.name.startswith("00_")], ids=lambda p: p.name)
def test_wiring_cells_are_collapsed_and_the_parameters_stay_open(notebook):
    """Imports and the cells that only hand a figure to the page show their output with the
    input collapsed (hide-input); the parameters a reader changes stay open."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    tags = [set(c.metadata.get("tags", [])) for c in cells]
    assert "parameters" in tags[0] and "hide-input" not in tags[0]
    assert "hide-input" in tags[1] and cells[1].source.lstrip().startswith("import"), notebook.name
    for cell, cell_tags in zip(cells, tags):
        if SHOWN.search(cell.source):
            assert "hide-input" in cell_tags, f"{notebook.name}: {cell.source[:60]!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_is_python(notebook):
    """A syntax error is found here in a second, not after the cells above it have trained."""
    for number, cell in enumerate(nbformat.read(notebook, as_version=4).cells):
        if cell.cell_type == "code":
            source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            compile(source, f"{notebook.name}, cell {number}", "exec")


#: the chapters whose conclusions rest on seeds: a recorded grid, the map or the live study
CONCLUDE_ON_SEEDS = ("02", "03", "05", "06", "07", "08")


@pytest.mark.parametrize("notebook", [n for n in NOTEBOOKS if n.name[:2] in CONCLUDE_ON_SEEDS], ids=lambda p: p.name)
def test_a_page_that_concludes_on_seeds_shows_the_pairing_and_the_standard_error(notebook):
    """In cells the reader sees (not removed): runs paired by seed, sd / sqrt(n), and the 2-SE rule."""
    cells = nbformat.read(notebook, as_version=4).cells
    shown = "\n".join(c.source for c in cells if c.cell_type == "code"
                      and not {"remove-cell", "remove-input"} & set(c.metadata.get("tags", [])))
    removed = "\n".join(c.source for c in cells if c.cell_type == "code" and "remove-cell" in c.metadata.get("tags", []))
    assert re.search(r"\bseed\b", shown) and re.search(r"pivot|by_seed|set_index\(\"seed\"\)", shown), notebook.name
    assert re.search(r"sqrt\(|\.sem\(", shown), f"{notebook.name} never shows how its standard error is computed"
    assert re.search(r"standing\(|STANDARD_ERRORS|2 \* se", shown), f"{notebook.name} never shows the 2-SE rule"
    assert "claim(" in removed, f"{notebook.name} checks none of its conclusions"
