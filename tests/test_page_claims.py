"""A page's hand-written conclusions stop the build when the recorded grid they rest on no
longer supports them: a flipped value in a copy of ``data/`` fails chapter 03 in its claim
cell, with one line naming the sentence."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from barter_mini.book.build import execute_notebook
from barter_mini.book.recorded_grid import DATA_ENV
from barter_mini.errors import BarterError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ABLATIONS = REPO / "notebooks" / "03_ablations.ipynb"


def test_a_variant_far_ahead_of_barter_stops_chapter_03_at_its_claim(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(REPO / "data", data, ignore=shutil.ignore_patterns("cifar10", "FashionMNIST"))
    grid = pd.read_csv(data / "ablations_grid.csv", dtype={"commit": "string"})
    donor = grid["method"] == "random-donor"
    grid.loc[donor, "val_acc"] = grid.loc[donor, "val_acc"] + 5.0 + grid.loc[donor, "seed"]   # ahead on every seed
    grid.to_csv(data / "ablations_grid.csv", index=False)
    monkeypatch.setenv(DATA_ENV, str(data))           # the kernel inherits it
    (tmp_path / "out").mkdir()
    with pytest.raises(BarterError) as failure:
        execute_notebook(ABLATIONS, tmp_path / "out" / "03_ablations.ipynb", {"profile": "smoke"})
    message = str(failure.value)
    assert "\n" not in message.strip()
    assert "ClaimNoLongerHolds" in message
    assert "'on validation every variant is level with BARTER'" in message and "random-donor" in message
    assert not (tmp_path / "out" / "03_ablations.ipynb").exists()     # a failed page is not kept


def test_the_recorded_grid_as_it_is_keeps_chapter_03_standing(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(REPO / "data", data, ignore=shutil.ignore_patterns("cifar10", "FashionMNIST"))
    monkeypatch.setenv(DATA_ENV, str(data))
    (tmp_path / "out").mkdir()
    execute_notebook(ABLATIONS, tmp_path / "out" / "03_ablations.ipynb", {"profile": "smoke"})
    assert (tmp_path / "out" / "03_ablations.ipynb").exists()
