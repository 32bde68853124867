"""What an adversarial user tries (issue 21): files that would run code, a diverging run,
damaged cache entries, two runs into one folder, leftovers of a killed write, odd paths.

Every refusal on the command line is exit status 2 and one ``error: ...`` line naming the
file or folder; a diverged run is status 3 and one ``diverged: ...`` line.
"""

import json
import math
import os
import pickle
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import barter_mini.training.cache as cache
from barter_mini.cli import main
from barter_mini.core.barter import BarterSettings
from barter_mini.core.barter_controller import BarterController
from barter_mini.errors import DIVERGED_STATUS, BarterError, TrainingDiverged
from barter_mini.masked.base import MaskedSettings
from barter_mini.masked.rigl import RigL
from barter_mini.training.checkpoints import (CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint,
                                              write_json)
from barter_mini.training.locking import exclusive_lock
from barter_mini.training.sweep import ExecutorSettings, Stage, run_sweep
from barter_mini.training.run_folder import RUN_LOCK
from barter_mini.training.trainer import RunConfig, train

from helpers import TINY_CCT, batch, tiny_model

REPO = Path(__file__).resolve().parents[1]
#: a few seconds of training on digits
SMOKE = ["--dataset", "digits", "--recipe", "smoke", "--epochs", "2", "--density", "0.5", "--seed", "0",
         "--no-progress"]
#: a stock timm ViT made small (tests/test_dense_start.py)
TIMM_SPEC = "timm:vit_tiny_patch16_224:patch_size=2,embed_dim=96,num_heads=6,depth=3"


class Payload:
    """Unpickling this calls ``os.system``: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def plant(path: Path, marker: Path, how: str = "zip") -> Path:
    """A checkpoint-shaped file at ``path`` whose model, once unpickled, runs the payload."""
    path.parent.mkdir(parents=True, exist_ok=True)
    evil = {"format": CHECKPOINT_FORMAT, "model_config": {}, "allocation": {}, "model": Payload(marker),
            "run": {}, "controller": {}, "epoch": 0, "val": {}, "recipe": {}, "optimizer": {}, "step": 0,
            "resume": {}}
    if how == "pickle":
        with open(path, "wb") as f:
            pickle.dump(evil, f)
    else:
        torch.save(evil, path, _use_new_zipfile_serialization=(how == "zip"))
    return path


def run_cli(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    status = main([str(arg) for arg in argv])
    return status, capsys.readouterr().err


def one_line(stderr: str, prefix: str = "error: ") -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in stderr, stderr
    return lines[0]


def finished_run(out: Path, *extra) -> Path:
    assert main(["train", "--method", "barter", *SMOKE, "--out", str(out), *extra]) == 0
    return out


# ----------------------------------------------------------------------------- 1. files that would run code

@pytest.mark.parametrize("how", ["zip", "legacy", "pickle"])
def test_init_from_a_file_that_would_run_code_is_refused(tmp_path, capsys, how):
    marker = tmp_path / "payload-ran"
    evil = plant(tmp_path / "downloaded.pt", marker, how)
    status, err = run_cli(["train", "--method", "dense", *SMOKE, "--init", evil, "--out", tmp_path / "run"], capsys)
    assert status == 2 and not marker.exists()
    line = one_line(err)
    assert str(evil) in line
    if how != "pickle":         # a bare pickle's protocol-4 frames are refused before its payload is seen
        assert "(it names posix.system)" in line and "can run any code" in line
    assert not (tmp_path / "run").exists()


def test_every_load_site_refuses_a_planted_payload(tmp_path, capsys, monkeypatch):
    """``--init`` into a timm model, ``export`` of a planted best.pt, ``--resume`` of a
    planted last.pt, and a sweep that finds a planted partial run in the cache."""
    marker = tmp_path / "payload-ran"

    evil = plant(tmp_path / "vit.pth", marker)
    status, err = run_cli(["train", "--method", "dense", "--model", TIMM_SPEC, *SMOKE, "--init", evil,
                           "--out", tmp_path / "timm-run"], capsys)
    assert status == 2 and str(evil) in one_line(err) and "can run any code" in err

    run_dir = tmp_path / "exported-run"
    evil = plant(run_dir / "best.pt", marker)
    status, err = run_cli(["export", run_dir, "--out", tmp_path / "model.pt"], capsys)
    assert status == 2 and str(evil) in one_line(err) and not (tmp_path / "model.pt").exists()

    resumed = tmp_path / "resumed-run"
    evil = plant(resumed / "last.pt", marker)
    status, err = run_cli(["train", "--method", "barter", *SMOKE, "--resume", "--out", resumed], capsys)
    assert status == 2 and str(evil) in one_line(err)
    assert sorted(p.name for p in resumed.iterdir()) == ["last.pt"]        # left as it was

    cache_dir = tmp_path / "cache"
    run = RunConfig(method="static", model="vit-mini", dataset="digits", density=0.5, seed=0, recipe="smoke",
                    epochs=1, progress=False)
    evil = plant(cache.partial_dir(cache.run_dir(run.validate(), cache_dir)) / "last.pt", marker)
    with pytest.raises(BarterError, match=str(evil)) as error:
        cache.cached_train(run, cache_dir)
    assert "\n" not in str(error.value)
    lines = []
    report = run_sweep([Stage("grid", lambda: [run])], ExecutorSettings(logs=tmp_path / "logs", jobs=1), cache_dir,
                       log=lines.append)
    (outcome,) = report.outcomes
    assert outcome.state == "failed" and str(evil) in outcome.error and "can run any code" in outcome.error
    assert not marker.exists()


def test_a_checkpoint_that_lacks_keys_is_one_line(tmp_path, capsys):
    partial = tmp_path / "partial.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "model": {}}, partial)
    status, err = run_cli(["train", "--method", "dense", *SMOKE, "--init", partial, "--out", tmp_path / "a"], capsys)
    assert status == 2 and "lacks model_config, allocation" in one_line(err) and str(partial) in err

    source = finished_run(tmp_path / "run")
    assert main(["export", str(source), "--out", str(tmp_path / "exported.pt")]) == 0
    exported = tmp_path / "exported"        # an exported file is a model, not a run: no settings
    exported.mkdir()
    (tmp_path / "exported.pt").rename(exported / "best.pt")
    status, err = run_cli(["export", exported, "--out", tmp_path / "again.pt"], capsys)
    assert status == 2 and "lacks run, controller, epoch, val" in one_line(err)
    assert str(exported / "best.pt") in err


def test_checkpoints_hold_only_plain_types(tmp_path):
    """What every method writes loads with the restricted unpickler (weights_only=True)."""
    out = finished_run(tmp_path / "run")
    for name in ("best.pt", "last.pt"):
        checkpoint = torch.load(out / name, weights_only=True)
        assert checkpoint["format"] == CHECKPOINT_FORMAT
        assert isinstance(checkpoint["rng"][0]["numpy"]["state"]["key"], list)


# ----------------------------------------------------------------------------- 2. a diverged run

def test_a_non_finite_loss_stops_the_run_with_its_step(tmp_path, capsys):
    out = tmp_path / "run"
    status, err = run_cli(["train", "--method", "barter", *SMOKE, "--lr", "1e30", "--out", out], capsys)
    line = one_line(err, "diverged: ")
    assert status == DIVERGED_STATUS == 3
    step = int(line.split("step ")[1].split(":")[0])
    assert "the training loss is nan" in line or "the training loss is inf" in line
    assert f"holds step {step - 1}, the last with finite values" in line
    last = load_checkpoint(out / "last.pt")
    assert last["step"] == step - 1
    assert all(torch.isfinite(torch.as_tensor(l)) for l in last["progress"]["step_losses"])
    assert not (out / "metrics.json").exists()
    assert sorted(p.name for p in out.iterdir()) == ["last.pt"]


def test_a_loss_far_above_chance_stops_the_run(tmp_path, capsys):
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--lr", "10", "--out", tmp_path / "run"], capsys)
    assert status == DIVERGED_STATUS
    assert "times that of a uniform guess" in one_line(err, "diverged: ")


def test_metrics_json_is_strict_json(tmp_path):
    path = write_json(tmp_path / "metrics.json", {"loss": math.nan, "history": [{"x": math.inf}, 1.5], "n": 2})

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"loss": None, "history": [{"x": None}, 1.5], "n": 2}


def test_barter_never_decides_on_non_finite_statistics():
    model = tiny_model(TINY_CCT)
    optimizer = torch.optim.AdamW(model.parameters())
    controller = BarterController(model, optimizer, total_steps=100, settings=BarterSettings(delta_t=5))
    first = controller.changing_steps()[0]              # the first update that moves units
    quiet = controller.schedule.update_steps[0]         # an update step on which nothing is due
    assert quiet < first
    controller.statistics.layers["heads"][1].pruning_ema[0] = math.nan
    for before in (first - 2, quiet - 1):               # the next step decides nothing: no check
        controller.step = before
        controller.before_step()
    controller.step = first - 1
    with pytest.raises(TrainingDiverged, match=rf"step {first}: BARTER's unit statistics hold a non-finite"):
        controller.before_step()


def test_masked_methods_never_decide_on_non_finite_gradients():
    model = tiny_model(TINY_CCT, heads=(4, 4, 4), ffn=(12, 12, 12))
    optimizer = torch.optim.AdamW(model.parameters())
    controller = RigL(model, optimizer, density=0.5, total_steps=100, settings=MaskedSettings(delta_t=5))
    x, y = batch(TINY_CCT)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    next(p for p in model.parameters() if p.grad is not None and p.dim() == 2).grad[0, 0] = math.inf
    update = next(s for s in range(1, 100) if controller.schedule.is_update(s))
    controller.step = update - 1
    with pytest.raises(TrainingDiverged, match=rf"step {update}: rigl's gradients"):
        controller.before_step()


# ----------------------------------------------------------------------------- 3. damaged cache entries

def test_a_damaged_cache_entry_is_reported_and_trained_again(tmp_path, capsys, monkeypatch):
    cache_dir = tmp_path / "cache"
    runs = [RunConfig(method=method, model="vit-mini", dataset="digits", density=0.5, seed=0, recipe="smoke",
                      epochs=1, progress=False) for method in ("static", "barter")]
    first = [cache.cached_train(run, cache_dir) for run in runs]
    truncated, deleted = (cache.run_dir(run.validate(), cache_dir) for run in runs)
    metrics = truncated / "metrics.json"
    metrics.write_bytes(metrics.read_bytes()[:100])
    (deleted / "best.pt").unlink()
    assert cache.entry_state(truncated) == ("damaged", f"metrics.json has 100 bytes, {len(json.dumps(first[0], indent=2, sort_keys=True)) + 1} when it was written")
    assert cache.entry_state(deleted) == ("damaged", "best.pt is missing")
    assert cache.cached_metrics(runs[0], cache_dir) is None

    monkeypatch.setenv(cache.TRAIN_ENV, "0")                    # a read-only cache says so
    with pytest.raises(BarterError, match=r"is damaged in the run cache .*metrics.json has 100 bytes"):
        cache.cached_train(runs[0], cache_dir)
    monkeypatch.delenv(cache.TRAIN_ENV)

    lines = []
    report = run_sweep([Stage("grid", lambda: runs)], ExecutorSettings(logs=tmp_path / "logs", jobs=2), cache_dir,
                       log=lines.append)
    assert report.summary() == "sweep: 2 runs: 2 trained, 0 skipped, 0 failed, 0 busy"
    assert f"damaged {truncated.name}: metrics.json has 100 bytes" in "\n".join(lines)
    assert f"damaged {deleted.name}: best.pt is missing" in "\n".join(lines)
    for target in (truncated, deleted):
        assert cache.entry_state(target) == ("complete", None)

    (truncated / cache.COMPLETION_RECORD).unlink()               # no record: not finished either
    capsys.readouterr()
    again = cache.cached_train(runs[0], cache_dir)
    assert f"run {truncated.name} in the run cache is damaged (no complete.json" in capsys.readouterr().err
    assert again["test_acc"] == first[0]["test_acc"] and cache.entry_state(truncated)[0] == "complete"


# ----------------------------------------------------------------------------- 4. one run per folder

def test_two_runs_started_together_into_one_folder(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = {method: subprocess.Popen([sys.executable, "-m", "barter_mini.cli", "train", "--method", method, *SMOKE,
                                       "--epochs", "4", "--out", str(out)],
                                      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for method in ("barter", "rigl")}
    results = {method: (p.wait(timeout=300), p.stderr.read()) for method, p in procs.items()}
    winners = [method for method, (status, _) in results.items() if status == 0]
    assert len(winners) == 1, results
    (loser,) = set(results) - set(winners)
    status, err = results[loser]
    assert status == 2 and ("is being trained by process" in err or "already holds a run" in err), err
    assert json.loads((out / "metrics.json").read_text())["method"] == winners[0]
    assert load_checkpoint(out / "last.pt")["run"]["method"] == winners[0]


def test_a_folder_held_or_holding_another_run_is_refused(tmp_path, capsys):
    out = finished_run(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    status, err = run_cli(["train", "--method", "rigl", *SMOKE, "--out", out], capsys)
    assert status == 2 and "already holds a run (best.pt, last.pt, metrics.json)" in one_line(err)
    status, err = run_cli(["train", "--method", "rigl", *SMOKE, "--resume", "--out", out], capsys)
    assert status == 2 and "is a run of other settings (method 'barter' there, 'rigl' here" in one_line(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with exclusive_lock(fresh / RUN_LOCK, "another", remove=True):        # this process stands in for another one
        status, err = run_cli(["train", "--method", "barter", *SMOKE, "--out", fresh], capsys)
    assert status == 2 and f"run folder {fresh} is being trained by process {os.getpid()}" in one_line(err)
    assert list(fresh.iterdir()) == []


def test_temporary_files_of_a_killed_write_are_removed(tmp_path):
    run = RunConfig(method="barter", dataset="digits", recipe="smoke", epochs=1, progress=False)
    out = tmp_path / "run"
    out.mkdir()
    stale = [out / ".last.pt.k3x9_q1a", out / ".metrics.json.0a1b2c3d", out / ".best.pt.zz"]
    for path in stale:
        path.write_bytes(b"\x00" * 1000)
    keep = out / ".notes.txt"
    keep.write_text("the user's own")
    train(run, out)
    assert not any(p.exists() for p in stale) and keep.exists()
    for path in stale:                                           # and on --resume of a finished run
        path.write_bytes(b"\x00")
    train(run, out, resume=True)
    assert not any(p.exists() for p in stale)
    assert sorted(p.name for p in out.iterdir()) == [".notes.txt", "best.pt", "last.pt", "metrics.json"]


# ----------------------------------------------------------------------------- 5. smaller ones

def test_a_data_root_that_is_no_folder_of_ours_is_one_line(tmp_path, capsys):
    status, err = run_cli(["train", "--method", "static", "--dataset", "fashion-mnist", "--recipe", "smoke",
                           "--epochs", "1", "--no-progress", "--data-root", "/proc/self", "--out", tmp_path / "r"],
                          capsys)
    assert status == 2 and "/proc/self" in one_line(err)
    assert not (tmp_path / "r").exists()


def test_a_cache_that_is_a_file_is_one_line_before_any_job(tmp_path, capsys, monkeypatch):
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(not_a_folder))
    status, err = run_cli(["sweep", "--methods", "static", "--densities", "0.5", "--seeds", "0", "--model",
                           "vit-mini", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                           "--logs", tmp_path / "logs"], capsys)
    assert status == 2 and f"the run cache ($BARTER_MINI_CACHE): cannot create the folder {not_a_folder}" in one_line(err)
    assert not (tmp_path / "logs").exists()
    run = RunConfig(method="static", model="vit-mini", dataset="digits", recipe="smoke", epochs=1)
    with pytest.raises(BarterError, match=r"^the run cache \(\$BARTER_MINI_CACHE\): .* is a file"):
        cache.cached_train(run)


@pytest.mark.parametrize("umask", [0o002, 0o022, 0o077])
def test_results_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        written = [write_json(tmp_path / "metrics.json", {"a": 1}), save_checkpoint(tmp_path / "last.pt", {"b": 2})]
    finally:
        os.umask(previous)
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
