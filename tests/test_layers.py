"""The package's layers: core <- masked <- training <- measure <- book, the CLI on top (it may
import every layer, and no layer imports it).

Checked two ways: statically (every import statement of every module, resolved to the layer
it names) and for real (the measuring and training commands run in a fresh interpreter in
which pandas, matplotlib, seaborn and papermill cannot be imported, as after ``pip install .`` without
the ``book`` extra).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import barter_mini

PACKAGE = Path(barter_mini.__file__).resolve().parent
#: what each layer may import from the package; errors and version sit below every layer
BASE = {"errors", "version"}
ALLOWED = {
    "core": BASE | {"core"},
    "masked": BASE | {"core", "masked"},
    "training": BASE | {"core", "masked", "training"},
    "measure": BASE | {"core", "masked", "training", "measure"},
    "book": BASE | {"core", "masked", "training", "measure", "book"},
    "cli": BASE | {"core", "masked", "training", "measure", "book", "cli"},
}
BOOK_ONLY_LIBRARIES = {"pandas", "matplotlib", "seaborn", "papermill"}


def module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(absolute dotted name, line) of every import in ``path``, relative ones resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path)[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["barter_mini", *package][: len(package) + 2 - node.level]
                name = ".".join(base + ([node.module] if node.module else []))
                # "from .. import x" may import a submodule x
                found += [(f"{name}.{alias.name}" if not node.module else name, node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
    return found


def layer_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = module_name(path)
        if parts and parts[0] in ALLOWED:
            yield parts[0], path


def test_the_folders_are_the_layers():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ALLOWED)
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "errors", "version"}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer):
    offences = []
    for own, path in layer_modules():
        if own != layer:
            continue
        for name, line in imports_of(path):
            parts = name.split(".")
            if parts[0] == "barter_mini":
                target = parts[1] if len(parts) > 1 else "barter_mini (the top-level package)"
                if target not in ALLOWED[layer]:
                    offences.append(f"{path.relative_to(PACKAGE)}:{line} imports {name}")
            elif layer != "book" and parts[0] in BOOK_ONLY_LIBRARIES:
                offences.append(f"{path.relative_to(PACKAGE)}:{line} imports {name} (book extra only)")
    assert not offences, "\n".join(offences)


def test_no_module_shadows_the_standard_library():
    names = {p.stem for p in PACKAGE.rglob("*.py")}
    assert not names & set(sys.stdlib_module_names)


def test_the_public_api_is_listed():
    assert sorted(barter_mini.__all__) == sorted(set(barter_mini.__all__))
    for name in barter_mini.__all__:
        assert hasattr(barter_mini, name), name
    for starter in ("build_model", "BarterController", "BarterSettings", "train", "RunConfig", "load_dataset"):
        assert starter in barter_mini.__all__


def run_without_book_extra(shadow: Path, *argv: str) -> subprocess.CompletedProcess:
    """``barter-mini ARGV`` in a fresh interpreter where importing a book-only library fails,
    as it does where only the core dependencies are installed: a package of each name that
    raises ImportError comes first on the path."""
    for name in BOOK_ONLY_LIBRARIES:
        (shadow / name).mkdir(parents=True, exist_ok=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed (book extra)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run([sys.executable, "-c", "import pandas"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "book extra" in probe.stderr      # the shadow works
    return subprocess.run([sys.executable, "-m", "barter_mini.cli", *argv], capture_output=True, text=True,
                          timeout=600, env=env)


def test_bench_runs_without_the_book_extra(tmp_path):
    result = run_without_book_extra(tmp_path / "shadow", "bench", "--model", "cct-mini", "--methods", "rigl,barter",
                                    "--densities", "0.3", "--steps", "2", "--warmup", "0",
                                    "--segment-steps", "1", "--update-samples", "1", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert {row["method"] for row in rows} == {"rigl", "barter"}


@pytest.mark.slow
def test_train_describe_and_export_run_without_the_book_extra(tmp_path):
    shadow = tmp_path / "shadow"
    describe = run_without_book_extra(shadow, "describe", "--model", "cct-mini", "--density", "0.3", "--json")
    assert describe.returncode == 0, describe.stderr[-2000:]
    assert json.loads(describe.stdout)["budget"]["heads"] == 12
    out = tmp_path / "run"
    train = run_without_book_extra(shadow, "train", "--method", "barter", "--dataset", "digits", "--recipe", "smoke",
                                   "--no-progress", "--out", str(out))
    assert train.returncode == 0, train.stderr[-2000:]
    export = run_without_book_extra(shadow, "export", str(out), "--out", str(tmp_path / "barter.pt"))
    assert export.returncode == 0, export.stderr[-2000:]
    assert (tmp_path / "barter.pt").is_file()


def package_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its ``__init__``)."""
    return {".".join(["barter_mini", *module_name(path)]): path for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (module level or inside a function):
    ``from a.b import c`` names the module ``a.b.c`` if there is one, else ``a.b``."""
    modules = package_modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for imported, _ in imports_of(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                graph[name].add(".".join(parts))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_the_package():
    """Function-level imports count: they hide a cycle, they do not remove it."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
