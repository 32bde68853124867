"""End-to-end training through the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from barter_mini.training.checkpoints import load_checkpoint
from barter_mini.training.checkpoints import model_from_checkpoint
from barter_mini.training.evaluation import evaluate
from barter_mini.training.trainer import RunConfig, train
from barter_mini.training.data import load_dataset, make_loaders

REPO = Path(__file__).resolve().parents[1]
METRIC_KEYS = ("val_acc", "val_macro_f1", "test_acc", "test_macro_f1")


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "barter_mini.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for method in ("barter", "dense"):
        out = root / method
        result = cli("train", "--method", method, "--model", "cct-mini", "--dataset", "digits",
                     "--density", "0.3", "--epochs", "4", "--seed", "3", "--recipe", "smoke",
                     "--train-subset", "1293", "--out", str(out), "--no-progress")
        assert result.returncode == 0, result.stderr
        runs[method] = (out, json.loads((out / "metrics.json").read_text()), result.stdout)
    return runs


@pytest.mark.parametrize("method", ["barter", "dense"])
def test_train_writes_metrics_and_checkpoints(digits_runs, method):
    out, metrics, stdout = digits_runs[method]
    assert (out / "best.pt").is_file() and (out / "last.pt").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]     # no temporary files left
    for key in METRIC_KEYS:
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["test_acc"] > 0.3                                     # chance is 0.1
    assert metrics["wall_time_s"] > 0 and len(metrics["history"]) == 4
    assert "test acc" in stdout


def test_barter_run_executes_and_records_transfers(digits_runs):
    _, metrics, _ = digits_runs["barter"]
    executed, planned = metrics["transfers_executed"], metrics["transfers_planned"]
    assert executed["ffn"] > 0 and executed["heads"] > 0
    assert executed["ffn"] <= planned["ffn"]
    history = metrics["allocation_history"]
    assert len(history) > 1 and history[0]["step"] == 0
    budgets = {(sum(h["heads"]), sum(h["ffn"])) for h in history}
    assert len(budgets) == 1                                             # budgets fixed throughout
    assert any(h["heads"] != history[0]["heads"] or h["ffn"] != history[0]["ffn"] for h in history)
    assert sum(e["transfers"]["ffn"]["executed"] for e in history[1:]) == executed["ffn"]


def test_dense_is_full_width_and_never_updates(digits_runs):
    _, dense, _ = digits_runs["dense"]
    _, barter, _ = digits_runs["barter"]
    assert dense["density"] == 1.0 and dense["allocation"]["heads"] == [10] * 4
    assert dense["transfers_executed"] == {"heads": 0, "ffn": 0}
    assert dense["params"] > 2 * barter["params"]
    assert dense["train_gflops_per_image"] > 1.8 * barter["train_gflops_per_image"]


def test_best_checkpoint_rebuilds_the_model_and_its_test_score(digits_runs):
    out, metrics, _ = digits_runs["barter"]
    checkpoint = load_checkpoint(out / "best.pt")
    model = model_from_checkpoint(checkpoint)
    assert model.allocation().as_dict() == metrics["allocation"]
    splits = load_dataset("digits", seed=3, train_subset=1293)
    _, _, test_loader = make_loaders(splits, 64, seed=3)
    assert evaluate(model, test_loader, torch.device("cpu"))["acc"] == pytest.approx(metrics["test_acc"])


def test_training_is_reproducible(tmp_path):
    run = dict(method="barter", model="vit-mini", dataset="digits", density=0.5, seed=5,
               recipe="smoke", epochs=2, progress=False)
    first = train(RunConfig(**run), tmp_path / "a")
    second = train(RunConfig(**run), tmp_path / "b")
    def untimed(metrics):
        return [{k: v for k, v in h.items() if k != "elapsed_s"} for h in metrics["history"]]

    assert untimed(first) == untimed(second)
    assert first["allocation_history"] == second["allocation_history"]
    assert first["test_acc"] == second["test_acc"]


def test_issue_command_on_fashion_mnist(tmp_path):
    """The issue's command, on real Fashion-MNIST (a training subset keeps it short)."""
    out = tmp_path / "fm"
    result = cli("train", "--method", "barter", "--model", "cct-mini", "--dataset", "fashion-mnist",
                 "--density", "0.3", "--epochs", "2", "--seed", "0", "--train-subset", "4096",
                 "--batch-size", "64", "--delta-t", "8", "--out", str(out), "--no-progress",
                 env={"BARTER_MINI_DATA": str(tmp_path / "data")})
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "fashion-mnist" and metrics["test_acc"] > 0.5
    assert metrics["transfers_executed"]["ffn"] > 0


@pytest.mark.parametrize("args, message", [
    (("--method", "magic"), "unknown method 'magic'"),
    (("--dataset", "mnist"), "unknown dataset 'mnist'"),
    (("--density", "0"), "density must be in (0, 1]"),
    (("--recipe", "slow"), "unknown recipe 'slow'"),
])
def test_bad_train_input_is_a_one_line_error_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    result = cli("train", "--dataset", "digits", *args, "--out", str(out))
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.strip().count("\n") == 0
    assert not out.exists()


def test_missing_dataset_says_how_to_get_it(tmp_path):
    result = cli("train", "--dataset", "cifar100", "--model", "cct-paper", "--out", str(tmp_path / "r"),
                 "--data-root", str(tmp_path / "empty"))
    assert result.returncode == 2 and "cifar-100" in result.stderr.lower()
    assert result.stderr.strip().count("\n") == 0


def test_a_piled_start_is_where_a_compact_run_begins(tmp_path):
    from barter_mini.core.budgets import compute_budget, starting_allocation
    from barter_mini.core.models import get_model_config
    result = cli("train", "--method", "static", "--dataset", "digits", "--density", "0.3", "--epochs", "1",
                 "--recipe", "smoke", "--start", "first", "--out", str(tmp_path / "run"), "--no-progress")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    config = get_model_config("cct-mini")
    piled = starting_allocation(config, compute_budget(config, 0.3), "first")
    assert metrics["allocation"] == piled.as_dict() and metrics["run"]["start"] == "first"
    refused = cli("train", "--method", "rigl", "--dataset", "digits", "--start", "first", "--recipe", "smoke",
                  "--out", str(tmp_path / "rigl"), "--no-progress")
    assert refused.returncode != 0 and "needs a compact method" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "rigl").exists()
