"""Exact resume: a run stopped anywhere and continued from its last.pt ends bitwise where an
uninterrupted run ends (weights and metrics.json but its wall times).

The conditions under which this holds, and which these tests keep: the same machine (CPU),
the same number of threads (one here, so no reduction order can change), the data loaded in
the training process (``num_workers=0``), the same data files and package source.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from barter_mini.cli import main
from barter_mini.training.checkpoints import load_checkpoint, save_checkpoint
from barter_mini.training.trainer import RunConfig, build_training, fit_one_epoch, save_epoch, train

REPO = Path(__file__).resolve().parents[1]
#: metrics.json entries that are wall-clock measurements, not results
TIMINGS = ("wall_time_s", "train_time_s", "update_time_s", "update_ms_per_step")
#: a run of 6 epochs of 10 steps on digits; BARTER and the masked methods update every 2 steps
SMOKE = ["--dataset", "digits", "--recipe", "smoke", "--epochs", "6", "--density", "0.3", "--seed", "1",
         "--no-progress"]


def results(metrics: dict) -> dict:
    """metrics.json without its wall-clock measurements."""
    metrics = json.loads(json.dumps(metrics))
    for key in TIMINGS:
        metrics.pop(key)
    for entry in metrics["history"]:
        entry.pop("elapsed_s")
    return metrics


def assert_same_run(a: Path, b: Path) -> None:
    assert results(json.loads((a / "metrics.json").read_text())) == \
        results(json.loads((b / "metrics.json").read_text()))
    for name in ("best.pt", "last.pt"):
        wa, wb = load_checkpoint(a / name)["model"], load_checkpoint(b / name)["model"]
        assert wa.keys() == wb.keys()
        for key in wa:
            assert torch.equal(wa[key], wb[key]), (name, key)


class Stop(Exception):
    pass


def train_until(run: RunConfig, step: int, out: Path) -> None:
    """Train ``run`` as ``train`` does, write last.pt at the end of ``step`` and stop there."""
    def stop_after(t):
        if t.progress.step == step:
            save_checkpoint(out / "last.pt", t.checkpoint())
            raise Stop
    out.mkdir()
    t = build_training(run)
    with pytest.raises(Stop):
        while t.progress.epoch <= t.recipe.epochs:
            fit_one_epoch(t, stop_after)
            save_epoch(t, out)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("method, stop", [
    ("barter", 7), ("barter", 10), ("random-pair", 13), ("static", 5), ("dense", 11),
    ("set", 9), ("snfs", 12), ("rigl", 3), ("srigl", 15), ("s2vite", 10)])
def test_a_run_stopped_at_any_step_resumes_bitwise(tmp_path, one_thread, method, stop):
    """Inside an epoch (7, 13), at its last step before validation (10), for every kind of method."""
    run = RunConfig(method=method, dataset="digits", recipe="smoke", epochs=2, seed=2, progress=False)
    train(run, tmp_path / "whole")
    out = tmp_path / "resumed"
    train_until(run, stop, out)
    train(run, out, resume=True)
    assert_same_run(tmp_path / "whole", out)


def test_warmup_policies_resume_bitwise(tmp_path, one_thread):
    """The optimizer-state warm-up keeps per-element ages in the optimizer state."""
    run = RunConfig(method="barter", dataset="digits", recipe="smoke", epochs=2, seed=0,
                    progress=False).with_method_settings(clone_moments="warmup")
    train(run, tmp_path / "whole")
    out = tmp_path / "resumed"
    train_until(run, 9, out)
    train(run, out, resume=True)
    assert_same_run(tmp_path / "whole", out)


# ------------------------------------------------------------------ real processes, real signals

def start(method: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "barter_mini.cli", "train", "--method", method, *SMOKE, "--out", str(out), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def finish(method: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    process = start(method, out, *extra)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def saved_step(out: Path) -> int:
    try:
        return load_checkpoint(out / "last.pt")["step"]
    except Exception:                  # not written yet
        return -1


def wait_for_step(process: subprocess.Popen, out: Path, step: int) -> None:
    deadline = time.monotonic() + 300
    while saved_step(out) < step:
        assert process.poll() is None, f"the run ended before step {step}: {process.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["barter", "rigl"])
def test_sigkill_at_a_random_step_then_resume_is_bitwise(tmp_path, method):
    finish(method, tmp_path / "whole")
    seed = random.randrange(2**16)
    first_update = 2                     # smoke's delta_t: the first topology or mask update
    out = tmp_path / "killed"
    process = start(method, out, "--checkpoint-every", "1")
    wait_for_step(process, out, first_update + 1)
    time.sleep(random.Random(seed).uniform(0.0, 0.5))      # somewhere later, mid-step or mid-write
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL, f"the run finished before it was killed (seed {seed})"
    killed_at = saved_step(out)
    assert killed_at > first_update and not (out / "metrics.json").exists()
    resumed = finish(method, out, "--resume")
    assert "transfers" in resumed.stdout or "masked density" in resumed.stdout
    assert_same_run(tmp_path / "whole", out)


@pytest.mark.slow
def test_sigterm_writes_last_pt_at_the_step_and_resume_is_bitwise(tmp_path):
    finish("barter", tmp_path / "whole")
    out = tmp_path / "stopped"
    process = start("barter", out, "--checkpoint-every", "1")
    wait_for_step(process, out, 5)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.startswith("interrupted: SIGTERM at step ") and len(stderr.strip().splitlines()) == 1
    stopped_at = int(stderr.split("at step ")[1].split(":")[0])
    assert load_checkpoint(out / "last.pt")["step"] == stopped_at >= 5
    finish("barter", out, "--resume")
    assert_same_run(tmp_path / "whole", out)


# ------------------------------------------------------------------ what resume refuses or skips

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "--method", "barter", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                 "--out", str(out), "--no-progress"]) == 0
    return out


def test_a_finished_run_is_not_retrained(finished_run, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()}
    started = time.perf_counter()
    assert main(["train", "--method", "barter", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                 "--out", str(finished_run), "--no-progress", "--resume"]) == 0
    assert time.perf_counter() - started < 5
    assert {p.name: p.stat().st_mtime_ns for p in finished_run.iterdir()} == before
    assert "test acc" in capsys.readouterr().out


@pytest.mark.parametrize("args, named", [
    (["--epochs", "2"], "epochs 1 there, 2 here"),
    (["--epochs", "1", "--density", "0.5"], "density 0.3 there, 0.5 here"),
    (["--epochs", "1", "--method", "rigl"], "method 'barter' there, 'rigl' here"),
])
def test_a_folder_of_other_settings_is_refused(finished_run, capsys, args, named):
    for folder_holds in ("metrics.json", "last.pt"):
        out = finished_run if folder_holds == "metrics.json" else finished_run.with_name("unfinished")
        if folder_holds == "last.pt" and not out.exists():
            out.mkdir()
            (out / "last.pt").write_bytes((finished_run / "last.pt").read_bytes())
        command = ["train", "--dataset", "digits", "--recipe", "smoke", "--out", str(out), "--resume", *args]
        if "--method" not in args:
            command += ["--method", "barter"]
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert named in err and "other settings" in err


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", "truncated", "foreign"])
def test_a_damaged_or_foreign_last_pt_is_a_one_line_error(finished_run, tmp_path, capsys, content):
    out = tmp_path / "run"
    out.mkdir()
    data = (finished_run / "last.pt").read_bytes()
    if content == "truncated":
        content = data[: len(data) // 2]
    elif content == "foreign":
        torch.save({"model": {}, "epoch": 3}, out / "last.pt")
    if isinstance(content, bytes):
        (out / "last.pt").write_bytes(content)
    assert main(["train", "--method", "barter", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                 "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "last.pt" in err
    assert sorted(p.name for p in out.iterdir()) == ["last.pt"]     # nothing else written
