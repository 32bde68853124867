"""What runs on a lent GPU machine, where nothing can be installed: the source tree on
PYTHONPATH, the machine's own torch, timm (with its dependencies), numpy and scikit-learn,
and nothing else. Every other installed package is hidden here (an import of it fails as it
would there), in the commands' child processes too, and the GPU commands must get as far as
their one-line refusal of a machine without a GPU, and a small CPU run must train."""

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: what the GPU machines are known to hold, with everything these require
ON_THE_GPU_MACHINE = ("torch", "timm", "numpy", "scikit-learn")

HIDER = """
import importlib.machinery, json, sys
ALLOWED = set(json.loads({allowed!r}))


class HideTheRest(importlib.machinery.PathFinder):
    \"\"\"The path finder, blind to top-level packages the GPU machine does not hold: an import
    of one fails, and importlib.util.find_spec says it is absent, as there.\"\"\"

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if (path is None and name not in ALLOWED and name not in sys.stdlib_module_names
                and not name.startswith("_") and name not in ("barter_mini", "sitecustomize")):
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [HideTheRest if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
"""


def allowed_modules() -> set[str]:
    """The import names of :data:`ON_THE_GPU_MACHINE` and of everything they require
    (their extras left out)."""
    seen, todo = set(), list(ON_THE_GPU_MACHINE)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        seen.add(name)
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return {module for module, dists in packages_distributions().items()
            if any(canonicalize_name(d) in seen for d in dists)}


@pytest.fixture(scope="module")
def hidden(tmp_path_factory):
    """A folder whose sitecustomize hides every package but the allowed ones; with it first
    on PYTHONPATH, every Python process started from the test (and its children) sees only those."""
    folder = tmp_path_factory.mktemp("gpu-machine")
    modules = allowed_modules()
    assert {"torch", "timm", "numpy", "sklearn", "yaml", "huggingface_hub", "tqdm"} <= modules
    assert not {"pandas", "submitit", "papermill", "matplotlib", "seaborn", "hypothesis", "pytest"} & modules
    (folder / "sitecustomize.py").write_text(HIDER.format(allowed=json.dumps(sorted(modules))))
    return folder


def run(hidden, *args, timeout=300):
    import os

    env = {**os.environ, "PYTHONPATH": f"{hidden}{os.pathsep}{REPO}", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


def test_the_hiding_works(hidden):
    result = run(hidden, "-c", "import pandas")
    assert result.returncode != 0 and "No module named 'pandas'" in result.stderr
    assert run(hidden, "-c", "import torch, timm, numpy, sklearn").returncode == 0


@pytest.mark.parametrize("command, refusal", [
    (["gpu-lend", "--out", "OUT"], "error: gpu-lend measures a CUDA GPU and there is none here"),
    (["sweep", "--profile", "gpu-pair", "--dry-run"], "error: the gpu-pair profile trains on a CUDA GPU"),
    (["bench", "--profile", "paper-gpu", "--out", "OUT/gpu.json"], "error: the paper-gpu profile measures a CUDA GPU"),
])
def test_the_gpu_commands_import_and_reach_their_refusal(hidden, tmp_path, command, refusal):
    result = run(hidden, "-m", "barter_mini.cli", *[str(tmp_path) if a == "OUT" else
                                                   a.replace("OUT", str(tmp_path)) for a in command])
    assert result.returncode != 0 and result.stderr.startswith(refusal), result.stderr[-2000:]


def test_what_the_gpu_commands_start_imports_there(hidden):
    """The measuring processes (the check's per-model child, the graph check, a pair's
    ``train``) and the modules they load."""
    result = run(hidden, "-c", "import barter_mini.measure.gpu_check, barter_mini.measure.graph_check, "
                               "barter_mini.measure.gpu_pair, barter_mini.measure.gpu_lend, barter_mini.training.trainer")
    assert result.returncode == 0, result.stderr[-2000:]
    checked = run(hidden, "-m", "barter_mini.measure.graph_check", "barter")
    assert checked.returncode != 0 and "there is no CUDA GPU here" in checked.stderr
    assert "ModuleNotFoundError" not in checked.stderr


@pytest.mark.slow
def test_a_run_trains_there_on_the_cpu(hidden, tmp_path):
    """A pair's run as ``run_pair`` starts it, on the CPU with a small setting."""
    result = run(hidden, "-m", "barter_mini.cli", "train", "--method", "barter", "--model", "cct-mini", "--dataset",
                 "cifar10", "--recipe", "smoke", "--train-subset", "128", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["method"] == "barter"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the lend would really run (make test-gpu)")
def test_a_lend_reports_each_failed_stage_in_one_line_and_runs_the_next(tmp_path):
    """Without a GPU every stage of ``gpu-lend`` fails: each says why in one line, the
    later stages still run, and the summary and the graph results are on disk."""
    from barter_mini.measure.gpu_lend import run_lend

    lines = []
    summary = run_lend(tmp_path, minutes=5, jobs=2, log=lines.append)
    assert [r["method"] for r in summary["graphs"]] == ["barter", "rigl", "static"]
    assert all(r["error"].endswith("the graph check records CUDA graphs and there is no CUDA GPU here")
               for r in summary["graphs"])
    assert summary["check"] == ["failed: BarterError: the paper-gpu profile measures a CUDA GPU (bf16 and CUDA "
                                "graphs) and there is none here: run `barter-mini bench` without --profile on the CPU"]
    assert "error" in summary["pair"] and "\n" not in summary["pair"]["error"]
    assert summary["failed"] == ["graphs", "check", "pair"]
    assert [line.split(":")[0] for line in lines] == ["graphs"] * 3 + ["check", "pair"]
    assert json.loads((tmp_path / "lend.json").read_text()) == summary
    assert len(json.loads((tmp_path / "graphs.json").read_text())) == 3
