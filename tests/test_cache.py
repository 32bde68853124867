"""Runs are cached by their full configuration and the package version."""

import pytest

import barter_mini.training.cache as cache
from barter_mini.training.trainer import RunConfig


def smoke_run(**changes):
    return RunConfig(**{"method": "barter", "model": "vit-mini", "dataset": "digits", "density": 0.5,
                        "seed": 1, "recipe": "smoke", "epochs": 1, "progress": False, **changes})


def test_second_call_reads_the_cache(tmp_path, monkeypatch):
    first = cache.cached_train(smoke_run(), tmp_path)
    monkeypatch.setattr(cache, "train", lambda *a, **k: pytest.fail("retrained a cached run"))
    assert cache.cached_train(smoke_run(progress=True, data_root=None), tmp_path) == first
    assert len(list(tmp_path.iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_key_changes_with_configuration_and_version(monkeypatch):
    base = cache.run_key(smoke_run())
    assert cache.run_key(smoke_run(seed=2)) != base
    assert cache.run_key(smoke_run(density=0.3)) != base
    assert cache.run_key(smoke_run(progress=True)) == base
    monkeypatch.setattr(cache, "__version__", "9.9.9")
    assert cache.run_key(smoke_run()) != base
    monkeypatch.undo()
    monkeypatch.setattr(cache, "source_digest", lambda: "changed code")
    assert cache.run_key(smoke_run()) != base


def test_failed_run_leaves_no_cache_entry(tmp_path, monkeypatch):
    def broken(run, out):
        (out / "partial.txt").write_text("half")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(cache, "train", broken)
    with pytest.raises(RuntimeError):
        cache.cached_train(smoke_run(), tmp_path)
    assert list(tmp_path.iterdir()) == []
