"""``sweep --profile gpu-pair`` (measure.gpu_pair): the plan sized to a budget from measured
step times, and the runs trained one process each with each finished run's row written at
once. On the CPU the pair itself is refused; its machinery runs on a small CPU setting."""

import csv
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from barter_mini.errors import BarterError
from barter_mini.measure import gpu_pair
from barter_mini.training.sweep import default_gpus_per_job

REPO = Path(__file__).resolve().parents[1]


def test_the_plan_fits_the_most_epochs_within_the_budget():
    """The paper's CCT on CIFAR-10 (45,000 training images, batch 128: 351 steps an epoch),
    both methods on five seeds: epochs is the largest whole number whose estimate stays in
    the budget, and one more epoch would not."""
    setting = gpu_pair.PairSetting()
    assert gpu_pair.steps_per_epoch(setting) == 45_000 // 128 == 351
    step_s = {"static": 0.012, "barter": 0.0125}
    plan = gpu_pair.plan_pair(setting, step_s, budget_s=540, jobs=5)

    def estimate(epochs):
        return (10 * gpu_pair.RUN_FIXED_S / 5
                + epochs * 5 * 351 * (0.012 + 0.0125) * (1 + gpu_pair.EVAL_SHARE))
    assert plan.estimated_s == pytest.approx(estimate(plan.epochs))
    assert estimate(plan.epochs) <= 540 < estimate(plan.epochs + 1)
    assert [(run.method, run.seed) for run in plan.runs] == [(m, s) for s in range(5) for m in ("static", "barter")]
    assert {(run.model, run.dataset, run.density, run.epochs, run.precision, run.cuda_graphs, run.device)
            for run in plan.runs} == {("cct-paper", "cifar10", 0.1, plan.epochs, "bf16", True, "cuda")}
    assert plan.describe().startswith(f"gpu-pair: 10 runs (static, barter x seeds 0, 1, 2, 3, 4), cct-paper on "
                                      f"cifar10 at rho 0.1, {plan.epochs} epochs of 351 steps each")
    # one job at a time pays every run's fixed seconds in turn: fewer epochs fit
    assert gpu_pair.plan_pair(setting, step_s, budget_s=540, jobs=1).epochs <= plan.epochs


def test_a_budget_that_fits_no_epoch_is_a_one_line_error():
    with pytest.raises(BarterError, match=r"budget of 1.0 min fits no epoch: one epoch of every run takes about"):
        gpu_pair.plan_pair(gpu_pair.PairSetting(), {"static": 0.05, "barter": 0.05}, budget_s=60)
    with pytest.raises(BarterError, match="no measured step time for barter"):
        gpu_pair.plan_pair(gpu_pair.PairSetting(), {"static": 0.05}, budget_s=600)


def test_local_jobs_see_the_gpu_when_the_runs_train_on_cuda():
    assert default_gpus_per_job("local", "cuda", None) == 1        # every job sees GPU 0, shared
    assert default_gpus_per_job("local", "cpu", None) == 0
    assert default_gpus_per_job("local", "auto", None) == int(torch.cuda.is_available())
    assert default_gpus_per_job("slurm", "cpu", None) == 1
    assert default_gpus_per_job("local", "cuda", 1) == 1
    with pytest.raises(BarterError, match="--device cuda needs the jobs to see the GPU"):
        default_gpus_per_job("local", "cuda", 0)


def test_the_gpu_pair_command_refuses_a_machine_without_a_gpu_and_flags_of_other_grids():
    def run(*flags):
        return subprocess.run([sys.executable, "-m", "barter_mini.cli", "sweep", *flags], cwd=REPO,
                              capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                                   "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    refused = run("--profile", "gpu-pair", "--dry-run")
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        "error: the gpu-pair profile trains on a CUDA GPU and there is none here: on the CPU, sweep a grid "
        "(--methods static,barter ...) instead"]
    assert "not --model" in run("--profile", "gpu-pair", "--model", "cct-mini").stderr
    assert "--budget-min belongs to --profile gpu-pair" in run("--methods", "static", "--budget-min", "3").stderr


@pytest.mark.slow
def test_the_pair_writes_each_finished_run_at_once_on_a_small_cpu_setting(tmp_path):
    """The machinery on the CPU: step times measured, a plan within a budget, two jobs at a
    time, each run a `barter-mini train` process; the CSV grows by one row as each run
    finishes, in the map's columns with the device, torch's version and the commit."""
    from barter_mini.book.reallocation_map import COLUMNS as MAP_COLUMNS

    setting = replace(gpu_pair.PairSetting(), model="cct-mini", recipe="smoke", precision="fp32", cuda_graphs=False,
                      device="cpu", seeds=(0, 1), train_subset=256)
    step_s = gpu_pair.measure_step_seconds(setting, steps=2, warmup=1)
    assert set(step_s) == {"static", "barter"} and all(0 < s < 5 for s in step_s.values())
    one_epoch = sum(2 * gpu_pair.steps_per_epoch(setting) * s * (1 + gpu_pair.EVAL_SHARE) for s in step_s.values())
    plan = gpu_pair.plan_pair(setting, step_s, budget_s=2 * gpu_pair.RUN_FIXED_S + 1.5 * one_epoch, jobs=2)
    assert plan.epochs == 1 and len(plan.runs) == 4
    out, seen = tmp_path / "pair.csv", []

    def log(line):
        seen.append((line, len(list(csv.DictReader(out.open()))) if out.exists() else 0))

    rows = gpu_pair.run_pair(plan, out, tmp_path / "runs", commit="abc123", log=log)
    assert [count for _, count in seen] == [1, 2, 3, 4], seen
    written = list(csv.DictReader(out.open()))
    assert len(rows) == 4 and tuple(written[0]) == gpu_pair.COLUMNS
    assert set(MAP_COLUMNS) <= set(gpu_pair.COLUMNS)
    assert {(r["method"], r["seed"]) for r in written} == {(m, str(s)) for m in ("static", "barter") for s in (0, 1)}
    assert all(r["device"] == "cpu" and r["torch"] == torch.__version__ and r["commit"] == "abc123"
               and int(r["epochs"]) == plan.epochs and 0 <= float(r["val_acc"]) <= 1 for r in written)
    metrics = json.loads((tmp_path / "runs" / "barter-seed1" / "metrics.json").read_text())
    assert metrics["run"]["epochs"] == plan.epochs and metrics["run"]["train_subset"] == 256
