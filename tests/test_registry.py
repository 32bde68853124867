"""The method registry is the one list of methods: a new row reaches the palette, the
bench's default set, the GPU check, the book's recorded grids and the trainer, and every
row's method is defined in the glossary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from barter_mini.book.efficiency import BenchGrid
from barter_mini.book.palette import method_legend, method_markers, method_order, method_palette, method_style
from barter_mini.book.plans import chapter_plan
from barter_mini.core.method import Static
from barter_mini.errors import BarterError
from barter_mini.measure.bench import check_bench_arguments
from barter_mini.measure.gpu_check import GpuCase
from barter_mini.training import methods as registry
from barter_mini.training.methods import GRIDS, METHODS, Look, Method, bench_methods, grid_methods
from barter_mini.training.run_config import RunConfig
from barter_mini.training.trainer import train

GLOSSARY = Path(__file__).resolve().parents[1] / "book" / "glossary.md"


class Toy(Static):
    """A compact method that never moves capacity: Static under another name."""

    name = "toy"


@pytest.fixture
def toy(monkeypatch):
    """A temporary registry row for a new method, in both grids and the bench's set."""
    row = Method("toy", "Toy", Toy, full_width=False, build=lambda setup: Toy(), look=Look("D", hue_slot=10),
                 grids=frozenset(GRIDS), in_bench=True)
    monkeypatch.setitem(METHODS, "toy", row)
    return row


def test_a_new_row_reaches_the_palette_and_the_legends(toy):
    assert method_order()[-1] == "toy" and method_markers()["toy"] == "D"
    palette = method_palette()
    assert len(set(palette.values())) == len(palette)                  # a colour of its own
    assert method_style("toy")["color"] == palette["toy"]
    from barter_mini.book.palette import METHOD_PALETTE               # a name read from the registry
    assert METHOD_PALETTE["toy"] == palette["toy"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(layout="constrained")
    ax.plot([0, 1], [0, 1], label="toy", **method_style("toy"))
    ax.plot([0, 1], [1, 0], label="barter", **method_style("barter"))
    legend = method_legend(fig)
    assert [text.get_text() for text in legend.get_texts()] == ["barter", "toy"]
    plt.close(fig)


def test_a_new_row_reaches_the_bench_and_the_gpu_check(toy):
    assert "toy" in bench_methods()
    cases = check_bench_arguments("cct-mini", None, (0.3,), batch=2, steps=1)
    assert ("toy", 0.3, "eager") in cases
    assert "toy" in BenchGrid().methods and "toy" in GpuCase("cct-paper", 128).methods


def test_a_new_row_reaches_the_books_recorded_grids(toy):
    for chapter, grid in (("02", "from_scratch"), ("06", "finetuning")):
        recorded = chapter_plan(chapter).recorded_grid(grid)
        assert "toy" in recorded.parameters["methods"], grid
    assert "toy" in grid_methods("from_scratch")


def test_a_new_row_trains(toy, tmp_path):
    metrics = train(RunConfig(method="toy", model="cct-mini", dataset="digits", density=0.3, recipe="smoke",
                              epochs=1, train_subset=64, progress=False), tmp_path / "toy")
    assert metrics["method"] == "toy" and metrics["transfers_executed"]["ffn"] == 0


def test_the_grids_and_the_bench_set_are_read_from_the_rows():
    assert grid_methods("from_scratch") == ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "barter")
    assert grid_methods("finetuning") == ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "oneshot",
                                          "barter")
    assert bench_methods() == ("dense", "set", "rigl", "srigl", "s2vite", "static", "barter")
    with pytest.raises(BarterError, match="unknown grid .ablations.: choose one of finetuning, from_scratch"):
        grid_methods("ablations")
    with pytest.raises(BarterError, match="unknown grid .everything."):
        Method("bad", "Bad", Toy, full_width=False, build=lambda setup: Toy(), look=Look("D", hue_slot=10),
               grids=frozenset({"everything"}))


def test_every_method_is_a_term_of_the_glossary():
    text = GLOSSARY.read_text()
    block = text[text.index("```{glossary}"):]
    terms = {term.strip() for line in re.findall(r"^(\S.*)$", block, flags=re.M)
             for term in line.split(",")}
    missing = [method.label for method in METHODS.values() if method.label not in terms]
    assert not missing, f"book/glossary.md defines no term for {missing}"


def test_every_row_names_its_controllers_method():
    for name, method in METHODS.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name          # a --method value
        assert method.controller.name == name or method.controller is registry.BarterController, name
