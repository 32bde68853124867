"""Sweeps: grids of runs through submitit into the run cache, resumable, read-only notebooks."""

import json
from dataclasses import asdict
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

import barter_mini.training.cache as cache
from barter_mini.cli import main
from barter_mini.errors import BarterError
from barter_mini.training.sweep import (ExecutorSettings, Stage, grid_runs, make_executor, read_only_cache,
                                        run_sweep)
from barter_mini.training.trainer import RunConfig

#: the integration runs: small enough for seconds, long enough (100 steps) to be killed midway
SWEEP_SETTINGS = {"model": "vit-mini", "dataset": "digits", "recipe": "smoke", "epochs": 10, "progress": False}


def smoke_run(**changes):
    return RunConfig(**{"method": "barter", "model": "vit-mini", "dataset": "digits", "density": 0.5,
                        "seed": 1, "recipe": "smoke", "epochs": 1, "progress": False, **changes})


def visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def fake_finished(run: RunConfig, cache_dir: Path) -> Path:
    """A complete cache folder holding ``run``'s metrics, without training it."""
    target = cache.run_dir(run.validate(), cache_dir)
    target.mkdir(parents=True)
    (target / "metrics.json").write_text(json.dumps({"test_acc": 0.5, "wall_time_s": 1.0,
                                                     "run": asdict(run.validate())}))
    cache.write_completion_record(target, target.name)
    return target


# ----------------------------------------------------------------------------- the cache

def test_read_only_cache_names_the_run_and_the_sweep_that_trains_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "train", lambda *a, **k: pytest.fail("trained in read-only mode"))
    monkeypatch.setenv(cache.TRAIN_ENV, "0")
    run = smoke_run()
    with pytest.raises(BarterError) as error:
        cache.cached_train(run, tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert cache.run_dir(run.validate(), tmp_path).name in message
    assert ("barter-mini sweep --methods barter --densities 0.5 --seeds 1 --model vit-mini --dataset digits "
            "--recipe smoke --epochs 1") in message
    assert list(tmp_path.iterdir()) == []                        # nothing created
    # a notebook's run that no grid flag can express points at the book's sweep
    with pytest.raises(BarterError, match=r"barter-mini sweep --book PROFILE"):
        cache.cached_train(smoke_run().with_method_settings(clone_moments="split"), tmp_path)
    # what the cache holds is read as usual
    fake_finished(run, tmp_path)
    assert cache.cached_train(run, tmp_path)["test_acc"] == 0.5
    monkeypatch.setenv(cache.TRAIN_ENV, "sometimes")
    with pytest.raises(BarterError, match="BARTER_MINI_TRAIN must be 1"):
        cache.cached_train(smoke_run(seed=2), tmp_path)


def test_interrupted_run_continues_in_its_partial_folder(tmp_path, monkeypatch):
    calls = []

    def interrupted(run, out, resume, checkpoint_every):
        calls.append((out, resume, checkpoint_every))
        out.mkdir(parents=True)
        (out / "last.pt").write_text("epoch 1")
        raise KeyboardInterrupt

    def finishing(run, out, resume, checkpoint_every):
        calls.append((out, resume, checkpoint_every))
        assert (out / "last.pt").read_text() == "epoch 1"        # continues where it stopped
        (out / "metrics.json").write_text(json.dumps({"test_acc": 0.75}))

    monkeypatch.setattr(cache, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.cached_train(smoke_run(), tmp_path, checkpoint_every=7)
    assert visible(tmp_path) == []                               # no cache entry for half a run
    assert cache.cached_metrics(smoke_run(), tmp_path) is None
    monkeypatch.setattr(cache, "train", finishing)
    assert cache.cached_train(smoke_run(), tmp_path)["test_acc"] == 0.75
    target = cache.run_dir(smoke_run().validate(), tmp_path)
    assert calls == [(cache.partial_dir(target), True, 7), (cache.partial_dir(target), True, None)]
    assert os.listdir(tmp_path) == [target.name]                 # partial renamed, lock removed


def test_run_without_a_checkpoint_leaves_no_partial_folder(tmp_path, monkeypatch):
    def broken(run, out, resume, checkpoint_every):
        out.mkdir(parents=True)
        raise RuntimeError("bad data")

    monkeypatch.setattr(cache, "train", broken)
    with pytest.raises(RuntimeError):
        cache.cached_train(smoke_run(), tmp_path)
    assert not cache.partial_dir(cache.run_dir(smoke_run().validate(), tmp_path)).exists()
    assert visible(tmp_path) == []


def test_a_second_process_is_refused_while_one_trains(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "train", lambda *a, **k: pytest.fail("trained a locked run"))
    target = cache.run_dir(smoke_run().validate(), tmp_path)
    assert not cache.run_is_locked(target)
    with cache.run_lock(target):
        assert cache.run_is_locked(target)
        assert f"process {os.getpid()}" in cache.lock_path(target).read_text()
        # flock conflicts between open file descriptions, so this process stands in for another
        with pytest.raises(BarterError, match=rf"run {target.name} is being trained by process {os.getpid()}"):
            cache.cached_train(smoke_run(), tmp_path)
    assert not cache.run_is_locked(target)


def test_orchestration_modules_and_the_cache_location_leave_keys_alone(tmp_path, monkeypatch):
    package = tmp_path / "barter_mini"
    (package / "training").mkdir(parents=True)
    for name in ("trainer.py", "cache.py", "sweep.py", "locking.py"):
        (package / "training" / name).write_text("x = 1\n")
    monkeypatch.setattr(cache, "PACKAGE", package)
    base = cache.source_digest()
    for name in ("cache.py", "sweep.py", "locking.py"):
        (package / "training" / name).write_text("x = 2\n")
        assert cache.source_digest() == base, name
    (package / "training" / "trainer.py").write_text("x = 2\n")
    assert cache.source_digest() != base
    monkeypatch.undo()
    # an init checkpoint is known by its SHA-256, wherever it lies: the same file in two caches is
    # one key, and a file replaced under a cache folder's name is another
    folder = "dense-cct-mini-fashion-mnist-rho1-seed0-0123456789abcdef"
    copies = [tmp_path / root / folder / "best.pt" for root in ("home-cache", "cluster-cache")]
    for copy in copies:
        copy.parent.mkdir(parents=True)
        copy.write_bytes(b"the same pretrained weights")
    here, there = (cache.run_key(smoke_run(init=str(copy))) for copy in copies)
    assert here == there
    copies[1].write_bytes(b"other weights under the same name")
    assert cache.run_key(smoke_run(init=str(copies[1]))) != here
    assert cache.run_key(smoke_run(init="/a/pretrained/best.pt")) != cache.run_key(smoke_run(init="/b/pretrained/best.pt"))


# ----------------------------------------------------------------------------- grids and settings

def test_grid_trains_dense_once_per_seed_and_refuses_bad_values():
    runs = grid_runs(["dense", "barter"], [0.1, 0.5], [0, 1], **SWEEP_SETTINGS)
    assert [(r.method, r.density, r.seed) for r in runs] == [
        ("dense", 1.0, 0), ("dense", 1.0, 1), ("barter", 0.1, 0), ("barter", 0.1, 1), ("barter", 0.5, 0), ("barter", 0.5, 1)]
    for bad in ({"methods": ["nope"]}, {"densities": [1.5]}, {"seeds": [-1]}, {"densities": []}):
        with pytest.raises(BarterError):
            grid_runs(**{"methods": ["barter"], "densities": [0.3], "seeds": [0], **bad})
    for bad in (ExecutorSettings(kind="kubernetes"), ExecutorSettings(jobs=0), ExecutorSettings(partition="gpu"),
                ExecutorSettings(kind="slurm", jobs=4), ExecutorSettings(time_min=0)):
        with pytest.raises(BarterError):
            bad.validate()


def test_slurm_jobs_get_the_resources_asked_for(tmp_path, monkeypatch):
    """No cluster here: stand-in ``srun``/``sbatch`` let submitit build the batch script it would submit."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BarterError, match="needs Slurm's sbatch and srun"):
        make_executor(ExecutorSettings(kind="slurm", logs=tmp_path / "logs"))
    for tool in ("srun", "sbatch"):
        (tmp_path / tool).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / tool).chmod(stat.S_IRWXU)
    executor = make_executor(ExecutorSettings(kind="slurm", logs=tmp_path / "logs", partition="gpu", gpus_per_job=2,
                                              cpus_per_job=8, time_min=90, array_parallelism=4))
    script = executor._make_submission_file_text("python -m job", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --time=90", "#SBATCH --signal=USR2@"):
        assert line in script, line
    assert executor.parameters["array_parallelism"] == 4


def test_local_jobs_share_the_cores_and_slurm_jobs_use_their_cpus():
    cores = len(os.sched_getaffinity(0))
    assert ExecutorSettings(jobs=1).threads() == cores
    assert ExecutorSettings(jobs=cores + 1).threads() == 1
    assert ExecutorSettings(jobs=2).threads(runs=1) == cores                # a lone run gets every core
    assert ExecutorSettings(jobs=2, threads_per_job=3).threads() == 3
    assert ExecutorSettings(kind="slurm", cpus_per_job=8).threads() == 8
    assert ExecutorSettings(kind="slurm").threads() is None
    with pytest.raises(BarterError, match="threads per job"):
        ExecutorSettings(threads_per_job=0).validate()


def test_book_stages_list_dependent_runs_once_their_sources_exist(tmp_path, monkeypatch):
    from barter_mini.book.experiments import grid_runs as notebook_grid
    from barter_mini.book.plans import book_stages, chapter_plan, notebook_defaults
    from barter_mini.book.profiles import resolve_profile

    monkeypatch.setenv("BARTER_MINI_CACHE", str(tmp_path))
    stages = book_stages("smoke")
    assert len(stages) == 3
    first = {cache.run_dir(r.validate()).name for r in stages[0].runs()}
    setup = resolve_profile("smoke")
    methods = notebook_defaults(chapter_plan("02").notebook)["methods"]
    scratch = notebook_grid(setup, methods, [0.3], [0])
    assert len(scratch) == len(methods) and {cache.run_dir(r.validate()).name for r in scratch} <= first  # 02's own runs
    with read_only_cache(), pytest.raises(BarterError, match="barter-mini sweep"):
        stages[1].runs()             # fine-tuning needs the pretrained model of stage 1
    with pytest.raises(BarterError, match="unknown chapter"):
        book_stages("smoke", ["99"])


def test_cli_refuses_bad_sweeps_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))                    # no Slurm here
    monkeypatch.setenv("BARTER_MINI_CACHE", str(tmp_path / "cache"))
    for args in (["--methods", "barter", "--executor", "slurm"], ["--book", "smoke", "--methods", "barter"],
                 ["--methods", "barter", "--partition", "gpu"], ["--chapters", "02", "--methods", "barter"],
                 ["--methods", "barter", "--executor", "pbs"], ["--densities", "0.3"], ["--methods", "nope"],
                 ["--methods", "barter", "--jobs", "2", "--executor", "slurm"],
                 ["--methods", "barter", "--parameter", "seeds=[0,1]"],
                 ["--book", "smoke", "--chapters", "07", "--parameter", "seed=[1]"],
                 ["--book", "smoke", "--chapters", "07", "--parameter", "profile=quick"]):
        assert main(["sweep", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
    assert not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- a real sweep

def wait_for(condition, timeout: float, what: str, logs: Path, sweep: threading.Thread):
    """Poll ``condition``; fail with the jobs' logs if the sweep ends or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or not sweep.is_alive():
            tails = {p.name: p.read_text()[-600:] for p in sorted(logs.glob("*_log.*"))}
            pytest.fail(f"no {what} (sweep {'ended' if not sweep.is_alive() else 'still running'}); logs: {tails}")
        time.sleep(0.05)


def test_sweep_survives_a_killed_run_and_a_failed_one(tmp_path, monkeypatch, capsys):
    """Three runs through submitit's local executor, all at once: one is killed (SIGKILL)
    midway, one fails (its dataset is missing), one completes. A rerun through the command
    line (in this process; the jobs are processes of their own) resumes the killed run from its checkpoint, skips the completed one and reports a
    run another process holds as busy; every result is then in the cache exactly once."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")                   # three jobs on two cores
    monkeypatch.setenv("BARTER_MINI_CACHE", str(tmp_path / "cache"))
    cache_dir, logs = tmp_path / "cache", tmp_path / "logs"
    killed, completed = (RunConfig(method=m, density=0.5, seed=0, **SWEEP_SETTINGS) for m in ("barter", "static"))
    failing = RunConfig(method="static", density=0.5, seed=0, model="vit-mini", dataset="cifar100",
                        data_root=str(tmp_path / "no-data"), recipe="smoke", epochs=1)
    (tmp_path / "no-data").mkdir()
    killed_dir, completed_dir = (cache.run_dir(r.validate(), cache_dir) for r in (killed, completed))

    reports = []
    sweep = threading.Thread(target=lambda: reports.append(run_sweep(
        [Stage("grid", lambda: [killed, completed, failing])], ExecutorSettings(logs=logs, jobs=3), cache_dir,
        checkpoint_every=2, log=lambda line: None)))
    sweep.start()
    checkpoint = cache.partial_dir(killed_dir) / "last.pt"
    wait_for(checkpoint.exists, 120, "first checkpoint", logs, sweep)
    holder = int(cache.lock_path(killed_dir).read_text().split()[1])      # "process PID on HOST"
    os.kill(holder, signal.SIGKILL)
    sweep.join(timeout=120)
    assert not sweep.is_alive()
    (report,) = reports
    outcomes = {o.name: o for o in report.outcomes}
    assert outcomes[killed_dir.name].state == "failed"
    assert outcomes[completed_dir.name].state == "trained"
    failed = [o for o in report.outcomes if o.name.startswith("static-vit-mini-cifar100")]
    assert [o.state for o in failed] == ["failed"] and "CIFAR-100 not found" in failed[0].error
    assert failed[0].log.is_file() and "CIFAR-100 not found" in failed[0].log.read_text()
    assert not report.complete and report.summary().startswith("sweep: 3 runs: 1 trained, 0 skipped, 2 failed")
    assert visible(cache_dir) == [completed_dir.name]
    assert checkpoint.exists() and not (cache.partial_dir(killed_dir) / "metrics.json").exists()
    completed_at = (completed_dir / "metrics.json").stat().st_mtime_ns

    # the rerun, from the command line; a third grid run is held by "another process" (this one)
    busy_dir = cache.run_dir(RunConfig(method="dense", seed=0, **SWEEP_SETTINGS).validate(), cache_dir)
    with cache.run_lock(busy_dir):
        status = main(["sweep", "--methods", "barter,static,dense", "--densities", "0.5", "--seeds", "0",
                       "--model", "vit-mini", "--dataset", "digits", "--recipe", "smoke", "--epochs", "10",
                       "--jobs", "2", "--cache-dir", str(cache_dir), "--logs", str(logs)])
    out = capsys.readouterr().out
    assert status == 1, out                                      # the busy run is not in the cache
    assert out.splitlines()[-1] == "sweep: 3 runs: 1 trained, 1 skipped, 0 failed, 1 busy", out
    assert f"trained {killed_dir.name}" in out and f"busy {busy_dir.name}" in out
    assert (completed_dir / "metrics.json").stat().st_mtime_ns == completed_at        # not retrained
    metrics = json.loads((killed_dir / "metrics.json").read_text())
    assert metrics["threads"] == len(os.sched_getaffinity(0))     # the one run to train gets every core
    assert metrics["steps"] == 100 and len(metrics["history"]) == 10
    assert visible(cache_dir) == sorted([killed_dir.name, completed_dir.name])        # each result once
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(f".{killed_dir.name}")]
