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
    # the recipe counts as resolved: restating its values names the same run, changing one does not
    assert cache.run_key(smoke_run(lr=2e-3).with_method_settings(clone_moments="fresh")) == base
    assert cache.run_key(smoke_run(epochs=None)) == base                  # the smoke recipe's epochs is 1
    assert cache.run_key(smoke_run().with_method_settings(clone_moments="split")) != base
    assert cache.run_key(smoke_run().with_method_settings(delta_t=3)) != cache.run_key(smoke_run(delta_t=4)) != base
    assert cache.run_key(smoke_run().with_method_settings(delta_t=4)) == cache.run_key(smoke_run(delta_t=4))
    monkeypatch.setattr(cache, "__version__", "9.9.9")
    assert cache.run_key(smoke_run()) != base
    monkeypatch.undo()
    monkeypatch.setattr(cache, "source_digest", lambda: "changed code")
    assert cache.run_key(smoke_run()) != base


def test_failed_run_leaves_no_cache_entry(tmp_path, monkeypatch):
    """Only a complete run gets a cache folder; what an interrupted one leaves is hidden (its
    partial folder, kept to resume from when it holds a last.pt: tests/test_sweep.py)."""
    def broken(run, out, **settings):
        out.mkdir(parents=True)
        (out / "partial.txt").write_text("half")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(cache, "train", broken)
    with pytest.raises(RuntimeError):
        cache.cached_train(smoke_run(), tmp_path)
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
    assert cache.cached_metrics(smoke_run(), tmp_path) is None


def test_digest_follows_the_training_layers_only(tmp_path, monkeypatch):
    """Editing core, masked or training changes every run's key; editing measure, book or the
    command line does not."""
    package = tmp_path / "barter_mini"
    for layer in ("core", "masked", "training", "measure", "book", "cli"):
        (package / layer).mkdir(parents=True)
        (package / layer / "module.py").write_text("x = 1\n")
    monkeypatch.setattr(cache, "PACKAGE", package)
    base = cache.source_digest()
    for name in ("measure/module.py", "book/module.py", "cli/module.py"):
        (package / name).write_text("x = 2\n")
        assert cache.source_digest() == base, name
    for name in ("core/module.py", "masked/module.py", "training/module.py"):
        (package / name).write_text("x = 3\n")
        assert cache.source_digest() != base, name
        base = cache.source_digest()
