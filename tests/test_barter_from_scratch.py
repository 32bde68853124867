"""Chapter 00 builds one BARTER update in plain PyTorch; it must stay barter_mini's update.

The notebook asserts its own checks (a mismatch raises, so papermill fails) and writes
``barter_from_scratch.json``; the first test reads it back. The second one changes the
package's update inside the notebook's kernel (a ``sitecustomize`` on its ``PYTHONPATH``
makes the remap scale AdamW's second moments by ``s`` instead of ``s ** 2``) and requires
the page to fail:
the comparison is strict enough to catch a change of the package's update, not just a
crash.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import papermill
import pytest

from barter_mini.core.barter import BarterSettings

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "00_barter_from_scratch.ipynb"
RESULT = "barter_from_scratch.json"
#: the settings the page changes: its schedule (one update, after its last step)
SCHEDULE = ("delta_t", "t_end")

pytestmark = pytest.mark.slow


def run_page(folder: Path) -> None:
    papermill.execute_notebook(str(NOTEBOOK), str(folder / "out.ipynb"), kernel_name="python3",
                               parameters={"profile": "smoke"}, cwd=str(folder), progress_bar=False)


def test_the_pages_update_is_barter_minis(tmp_path):
    run_page(tmp_path)
    result = json.loads((tmp_path / RESULT).read_text())

    # (c) the package, called as topology_update and run by its controller, made the page's update
    assert [row["package"] for row in result["comparison"]] == ["topology_update", "BarterController"]
    for row in result["comparison"]:
        # every weight and AdamW state tensor, each against its own largest entry (second
        # moments are ~1e-8: an absolute tolerance would let any change of them through)
        assert row["same choices"] and row["largest relative diff"] <= 1e-6, row
        # the statistics followed the units: the same ages, the EMAs to float rounding
        assert row["statistics: relative gap"] <= 1e-5, row
    # ... against the package's defaults, not settings tuned to match the page
    defaults = {key: value for key, value in asdict(BarterSettings()).items() if key not in SCHEDULE}
    assert {key: value for key, value in result["settings"].items() if key not in SCHEDULE} == defaults
    # ... on an update that moved both kinds of unit (an empty update would compare nothing)
    for kind, plan in result["plan"].items():
        assert plan["receiver"] is not None and len(plan["parents"]) == len(plan["donors"]) > 0, kind
        assert all(layer != plan["receiver"] for layer, _ in plan["donors"]), kind
    assert result["statistics_gap"] <= 1e-5

    # (a) the exact clone keeps the function to rounding; pruning changes it
    change = result["output_change"]
    assert change["exact clone"] <= 1e-5 * max(1.0, result["logit_size"])
    assert change["exact clone and prune"] > 100 * change["exact clone"]

    # (b) under the exact remap parents and clones take the unsplit step; fresh moments do not
    rows = {(row["moments"], row["AdamW eps"], row["rows"]): row for row in result["next_step"]}
    step = max(row["max |step|"] for row in result["next_step"])
    for who in ("parents", "clones"):
        assert rows["split", 1e-30, who]["max |step - unsplit step|"] <= 1e-3 * step
        assert rows["split", 1e-8, who]["max |step - unsplit step|"] <= 1e-2 * step
    assert rows["fresh", 1e-8, "parents"]["max |step - unsplit step|"] <= 1e-2 * step
    assert rows["fresh", 1e-8, "clones"]["max |step - unsplit step|"] >= 0.1 * step


#: run at the kernel's start: the package's remap scales second moments by s, not s ** 2
SABOTAGE = """
from barter_mini.core import surgery
surgery.STATE_GRADIENT_POWER["exp_avg_sq"] = 1
"""


def test_a_change_to_the_packages_update_fails_the_page(tmp_path, monkeypatch):
    sabotage = tmp_path / "sabotage"
    sabotage.mkdir()
    (sabotage / "sitecustomize.py").write_text(SABOTAGE)
    monkeypatch.setenv("PYTHONPATH", str(sabotage))
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        run_page(tmp_path)
    assert failure.value.ename == "AssertionError"
    # the same choices and weights, but not the same AdamW state: the comparison caught the remap
    result = json.loads((tmp_path / RESULT).read_text())
    for row in result["comparison"]:
        assert row["same choices"] and row["max |weight diff|"] == 0.0, row
        assert not row["identical tensors"] and row["largest relative diff"] > 1e-6, row
