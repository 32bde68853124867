"""A compact start cut from a dense model: stock timm ViTs, the one-shot allocation, fine-tuning runs."""

import copy
import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest
import timm
import torch
from hypothesis import given, settings, strategies as st

from barter_mini.book.finetuning import finetune_run, pretraining_run, transfer_task
from barter_mini.book.profiles import resolve_profile
from barter_mini.core.barter import BarterSettings
from barter_mini.core.barter_controller import BarterController
from barter_mini.core.budgets import Budget, compute_budget, initial_allocation
from barter_mini.core.counting import count_parameters, training_gflops_per_image
from barter_mini.core.dense_start import (calibration_importance, cut_to_density, most_important,
                                          oneshot_allocation)
from barter_mini.core.models import build_model, describe_timm_vit, get_model_config
from barter_mini.core.surgery import allocation_of, unit_l1_norms
from barter_mini.errors import BarterError
from barter_mini.masked import RigL, S2ViTE, SRigL
from barter_mini.training.checkpoints import model_from_checkpoint
from barter_mini.training.data import load_dataset, parse_classes
from barter_mini.training.finetune import dense_start, load_dense_weights
from barter_mini.training.trainer import RunConfig, train

from helpers import TINY_CCT, assert_in_sync, train_step

#: a stock timm ViT, small enough for the CPU: 32x32 images, 3 layers of 6 heads of 16
TIMM_KWARGS = dict(img_size=32, patch_size=8, embed_dim=96, num_heads=6, depth=3, num_classes=10)


def stock_vit(seed: int = 0):
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **TIMM_KWARGS)


def calibration(n: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def test_describe_reads_a_stock_timm_vit():
    config = describe_timm_vit(stock_vit())
    assert (config.depth, config.heads_per_layer, config.ffn_per_layer, config.head_dim) == (3, 6, 384, 16)
    assert config.timm_model == "vit_tiny_patch16_224" and config.num_tokens == 17
    with pytest.raises(BarterError, match="no .blocks"):
        describe_timm_vit(torch.nn.Linear(2, 2))


def test_cut_keeps_the_budgets_and_the_chosen_units_weights_exactly():
    model = stock_vit()
    dense = copy.deepcopy(model)
    batches = calibration()
    importance = calibration_importance(dense, batches)
    cut = cut_to_density(model, 0.3, batches)
    assert cut is model                                         # the same object, smaller tensors
    budget = compute_budget(model.config, 0.3)
    allocation = allocation_of(model)
    assert allocation == initial_allocation(model.config, budget)
    assert (sum(allocation.heads), sum(allocation.ffn)) == (budget.heads, budget.ffn)
    keep = most_important(importance, allocation)
    d, hd = model.config.embed_dim, model.config.head_dim
    for layer, (old, new) in enumerate(zip(dense.blocks, model.blocks)):
        heads = keep["heads"][layer]
        rows = (torch.arange(3)[:, None, None] * 6 * hd + heads[None, :, None] * hd + torch.arange(hd)).flatten()
        torch.testing.assert_close(new.attn.qkv.weight, old.attn.qkv.weight[rows], rtol=0, atol=0)
        torch.testing.assert_close(new.attn.qkv.bias, old.attn.qkv.bias[rows], rtol=0, atol=0)
        columns = (heads[:, None] * hd + torch.arange(hd)).flatten()
        torch.testing.assert_close(new.attn.proj.weight, old.attn.proj.weight[:, columns], rtol=0, atol=0)
        channels = keep["ffn"][layer]
        torch.testing.assert_close(new.mlp.fc1.weight, old.mlp.fc1.weight[channels], rtol=0, atol=0)
        torch.testing.assert_close(new.mlp.fc2.weight, old.mlp.fc2.weight[:, channels], rtol=0, atol=0)
        torch.testing.assert_close(new.mlp.fc2.bias, old.mlp.fc2.bias, rtol=0, atol=0)
        assert new.attn.qkv.weight.shape == (3 * len(heads) * hd, d)
        # the most important heads survive: none left out scores above one kept
        scores = importance["heads"][layer]
        assert scores[heads].min() >= scores[[h for h in range(6) if h not in heads.tolist()]].max()
    with pytest.raises(BarterError, match="already compact"):
        cut_to_density(model, 0.3, batches)


def test_barter_trains_a_cut_timm_vit_moves_units_and_rebuilds_from_its_checkpoint():
    model = cut_to_density(stock_vit(), 0.3, calibration())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    controller = BarterController(model, optimizer, total_steps=40,
                                  settings=BarterSettings(delta_t=5, transfer_multiplier=20.0, min_age=1))
    start = allocation_of(model)
    x, y = calibration(1, seed=7)[0]
    for step in range(1, 41):
        train_step(model, optimizer, x, y)
        controller.after_step(step)
        assert_in_sync(model, optimizer)
    assert controller.executed["ffn"] > 0 and allocation_of(model) != start
    budget = compute_budget(model.config, 0.3)
    final = allocation_of(model)
    assert (sum(final.heads), sum(final.ffn)) == (budget.heads, budget.ffn)
    assert all(1 <= h <= 6 for h in final.heads) and all(1 <= c <= 384 for c in final.ffn)
    # export: the checkpoint format rebuilds the stock timm model at its trained widths
    state = json.loads(json.dumps({"model_config": asdict(model.config), "allocation": final.as_dict()}))
    rebuilt = model_from_checkpoint({**state, "model": model.state_dict()}).eval()
    model.eval()
    torch.testing.assert_close(rebuilt(x), model(x))
    assert count_parameters(rebuilt) < count_parameters(stock_vit())
    assert training_gflops_per_image(rebuilt) > 0


def _unequal_vit():
    """A stock ViT whose first layer barely matters: its residual branches are scaled down."""
    model = stock_vit()
    with torch.no_grad():
        model.blocks[0].attn.proj.weight.mul_(1e-3)
        model.blocks[0].mlp.fc2.weight.mul_(1e-3)
    return model


def test_oneshot_and_even_allocations_differ_where_layers_matter_unequally():
    even = cut_to_density(_unequal_vit(), 0.3, calibration(), "even")
    oneshot = cut_to_density(_unequal_vit(), 0.3, calibration(), "oneshot")
    a, b = allocation_of(even), allocation_of(oneshot)
    assert a != b
    assert (sum(a.heads), sum(a.ffn)) == (sum(b.heads), sum(b.ffn))
    assert b.ffn[0] < a.ffn[0] and b.heads[0] <= a.heads[0]      # capacity leaves the idle layer


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_oneshot_allocation_keeps_budgets_bounds_and_the_global_top(data):
    layers = data.draw(st.integers(1, 4))
    full = data.draw(st.integers(1, 6))
    total = data.draw(st.integers(layers, layers * full))
    scores = [torch.tensor(data.draw(st.lists(st.floats(0, 10), min_size=full, max_size=full)))
              for _ in range(layers)]
    config = TINY_CCT.__class__(**{**asdict(TINY_CCT), "depth": layers, "heads_per_layer": full,
                                   "ffn_per_layer": full})
    allocation = oneshot_allocation({"heads": scores, "ffn": scores}, Budget(total, total), config)
    assert sum(allocation.heads) == total and all(1 <= c <= full for c in allocation.heads)
    keep = most_important({"heads": scores, "ffn": scores}, allocation)["heads"]
    kept = {(l, int(u)) for l, units in enumerate(keep) for u in units}
    dropped = [float(scores[l][u]) for l in range(layers) for u in range(full) if (l, u) not in kept]
    # a dropped unit never beats a kept unit that was not its layer's forced best
    forced = {(l, int(scores[l].argmax())) for l in range(layers)}
    if dropped:
        assert all(float(scores[l][u]) >= max(dropped) for l, u in kept - forced)


@pytest.mark.parametrize("controller", [RigL, SRigL, S2ViTE])
def test_masked_methods_start_from_the_largest_weights(controller):
    torch.manual_seed(0)
    model = build_model(TINY_CCT, 1.0)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    norms = {kind: [unit_l1_norms(block, kind) for block in model.blocks] for kind in ("heads", "ffn")}
    dst = controller(model, None, 0.4, total_steps=10, init_from_weights=True)
    if controller is S2ViTE:        # per layer: the heads and neurons of largest L1 norm
        for kind, masks in (("heads", dst.head_masks), ("ffn", dst.ffn_masks)):
            for layer_norms, kept in zip(norms[kind], masks):
                assert layer_norms[kept].min() >= layer_norms[~kept].max()
        return
    for t in dst.tensors:
        mask, magnitude = dst._masks[t.name], weights[t.name].abs()
        if controller is RigL:      # per tensor: every kept weight at least as large as every dropped one
            assert magnitude[mask].min() >= magnitude[~mask].max()
        else:                       # SRigL, per row
            for row, row_mask in zip(magnitude, mask):
                assert row[row_mask].min() >= row[~row_mask].max()


# ----------------------------------------------------------------------------- fine-tuning runs

@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dense")
    train(RunConfig(method="dense", dataset="digits", recipe="smoke", epochs=2, seed=1, progress=False), out)
    return out


@pytest.mark.parametrize("method", ["barter", "oneshot", "rigl", "s2vite"])
def test_every_kind_of_method_fine_tunes_from_the_dense_run(dense_run, tmp_path, method):
    metrics = train(RunConfig(method=method, dataset="digits", recipe="smoke", epochs=1, density=0.3,
                              init=str(dense_run / "best.pt"), progress=False), tmp_path)
    assert metrics["run"]["init"] == str(dense_run / "best.pt")
    assert metrics["test_acc"] > 0.2                                # chance is 0.1
    if method in ("barter", "oneshot"):
        config = model_from_checkpoint(torch.load(tmp_path / "best.pt", weights_only=False)).config
        budget = compute_budget(config, 0.3)
        assert (sum(metrics["allocation"]["heads"]), sum(metrics["allocation"]["ffn"])) == (budget.heads, budget.ffn)


def test_a_dense_start_is_the_checkpoint_and_a_new_class_count_reinitialises_the_classifier(dense_run, tmp_path):
    state = torch.load(dense_run / "best.pt", weights_only=False)
    config = model_from_checkpoint(state).config
    weights, reinitialised = load_dense_weights(dense_run / "best.pt", config)
    assert not reinitialised and set(weights) == set(state["model"])
    three = {**state, "model_config": {**state["model_config"], "num_classes": 3},
             "model": {**state["model"], "head.weight": state["model"]["head.weight"][:3],
                       "head.bias": state["model"]["head.bias"][:3]}}
    torch.save(three, tmp_path / "three.pt")
    weights, reinitialised = load_dense_weights(tmp_path / "three.pt", config)
    assert reinitialised and not any(k.startswith("head.") for k in weights)
    with pytest.raises(BarterError, match="differs from"):
        load_dense_weights(dense_run / "best.pt", config.for_data(16, 1, 10))


def test_a_model_fine_tunes_on_another_datasets_images_resized_to_its_size(dense_run, tmp_path, caplog):
    """Digits (8 px) -> Fashion-MNIST's first five classes resized to 8 px: the paper's
    Tiny-ImageNet -> CIFAR-100 in miniature; without the resize the checkpoint is refused."""
    run = RunConfig(method="barter", dataset="fashion-mnist", classes=(0, 1, 2, 3, 4), recipe="smoke", epochs=1,
                    train_subset=256, density=0.3, init=str(dense_run / "best.pt"), progress=False)
    with pytest.raises(BarterError, match="img_size"):
        train(run, tmp_path / "native")
    with caplog.at_level("INFO", logger="barter_mini.training.run_inputs"):
        metrics = train(replace(run, img_size=8), tmp_path / "resized")
    assert "classifier was re-initialised for the 5 classes" in caplog.text
    assert metrics["run"]["img_size"] == 8 and metrics["dataset"] == "fashion-mnist"
    with pytest.raises(BarterError, match="img_size"):
        RunConfig(img_size=0).validate()


def test_the_paper_profile_fine_tunes_the_papers_vit_from_tiny_imagenet_on_cifar100_at_64_px():
    paper = resolve_profile("paper")
    pretraining = pretraining_run(paper, seed=2)
    assert (pretraining.model, pretraining.dataset, pretraining.classes) == ("vit-paper", "tiny-imagenet", None)
    run = finetune_run(paper, "barter", 0.1, 2, init="pretrained.pt")
    assert (run.model, run.dataset, run.img_size, run.classes, run.init) == ("vit-paper", "cifar100", 64, None,
                                                                          "pretrained.pt")
    assert run.lr == pytest.approx(1e-3)                                   # Table 5's fine-tuning peak
    quick = transfer_task(resolve_profile("quick"))
    assert (quick.pretrain_classes, quick.finetune_classes, quick.img_size) == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9), None)


def test_fine_tuning_input_is_checked():
    with pytest.raises(BarterError, match="--init"):
        RunConfig(method="oneshot").validate()
    with pytest.raises(BarterError, match="no such file"):
        RunConfig(method="barter", init="/no/such/file.pt").validate()


# ----------------------------------------------------------------------------- timm checkpoint files

#: ``--model`` naming TIMM_KWARGS' architecture at patch 2, sized by the dataset (digits: 8x8, 1 channel)
TIMM_SPEC = "timm:vit_tiny_patch16_224:patch_size=2,embed_dim=96,num_heads=6,depth=3"


def test_a_timm_model_name_describes_the_stock_model_and_bad_names_are_refused():
    named = get_model_config("timm:vit_tiny_patch16_224:" + ",".join(f"{k}={v}" for k, v in TIMM_KWARGS.items()))
    assert named == describe_timm_vit(stock_vit(), "vit_tiny_patch16_224", TIMM_KWARGS)
    for spec, message in [("timm:vit_nope", "unknown timm model"), ("timm:vit_tiny_patch16_224:depth", "key=value"),
                          ("timm:vit_tiny_patch16_224:bogus=1", "unexpected keyword"),
                          ("timm:resnet18", "no .blocks"), ("vit-nope", "timm:ARCH")]:
        with pytest.raises(BarterError, match=message):
            get_model_config(spec)


def test_a_timm_checkpoint_file_is_fitted_to_the_runs_images_and_keeps_the_layers_exactly(tmp_path):
    """A 3-channel, 32-pixel, patch-8 timm file into a 1-channel, 8-pixel, patch-2 model:
    timm's adapt_input_conv and checkpoint_filter_fn refit the embeddings, the layers load
    unchanged, and a classifier of the run's class count is kept."""
    pretrained = stock_vit(seed=3)
    torch.save(pretrained.state_dict(), tmp_path / "vit.pth")
    splits = load_dataset("digits", seed=0)
    config = get_model_config(TIMM_SPEC).for_data(8, 1, 10)
    model, reinitialised = dense_start(tmp_path / "vit.pth", config, "digits", None, 1.0, compact=False,
                                       allocation="even", splits=splits, batch_size=16, seed=0,
                                       device=torch.device("cpu"))
    assert not reinitialised                                          # 10 classes in the file and the run
    ours, theirs = model.state_dict(), pretrained.state_dict()
    assert ours["patch_embed.proj.weight"].shape == (96, 1, 2, 2) and ours["pos_embed"].shape == (1, 17, 96)
    for key in theirs:
        if key.startswith(("blocks.", "norm.", "head.", "cls_token")):
            assert torch.equal(ours[key], theirs[key]), key


def test_the_cli_fine_tunes_barter_from_a_timm_checkpoint_file(tmp_path):
    torch.manual_seed(0)
    imagenet = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**TIMM_KWARGS, "num_classes": 1000})
    torch.save(imagenet.state_dict(), tmp_path / "vit.pth")
    result = subprocess.run([sys.executable, "-m", "barter_mini.cli", "train", "--model", TIMM_SPEC,
                             "--init", str(tmp_path / "vit.pth"), "--dataset", "digits", "--recipe", "smoke",
                             "--epochs", "1", "--density", "0.3", "--delta-t", "5", "--no-progress",
                             "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "classifier was re-initialised for the 10 classes" in result.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    budget = compute_budget(get_model_config(TIMM_SPEC).for_data(8, 1, 10), 0.3)
    assert (sum(metrics["allocation"]["heads"]), sum(metrics["allocation"]["ffn"])) == (budget.heads, budget.ffn)
    assert metrics["transfers_executed"]["ffn"] > 0                    # updates moved units
    rebuilt = model_from_checkpoint(torch.load(tmp_path / "run" / "best.pt", weights_only=False))
    assert rebuilt.patch_embed.proj.in_channels == 1


# ----------------------------------------------------------------------------- compute

def test_vit_paper_costs_per_image_keep_the_papers_compute_ratio():
    """Table 11: at rho 0.1 BARTER's 100 epochs cost 1.68580 PFLOPs, RigL's (dense tensors)
    15.27612, so compute-matched BARTER trains 906.17 epochs; our counts give the same ratio."""
    config = get_model_config("vit-paper")
    ratio = training_gflops_per_image(build_model(config, 1.0)) / training_gflops_per_image(build_model(config, 0.1))
    assert ratio * 100 == pytest.approx(15.27612 / 1.68580 * 100, rel=0.02)


def test_compute_matched_training_stops_at_the_reference_runs_pflops(tmp_path):
    common = dict(dataset="digits", recipe="smoke", density=0.1, seed=0, progress=False)
    reference = train(RunConfig(method="rigl", epochs=2, **common), tmp_path / "rigl")
    gflops = reference["train_gflops_per_image"]
    assert reference["train_pflops"] == pytest.approx(gflops * reference["steps"] * 64 / 1e6)
    matched = train(RunConfig(method="barter", pflops=reference["train_pflops"], **common), tmp_path / "barter")
    assert matched["train_pflops"] >= reference["train_pflops"]
    one_batch = matched["train_gflops_per_image"] * 64 / 1e6
    assert matched["train_pflops"] - reference["train_pflops"] < one_batch
    assert matched["steps"] > 3 * reference["steps"]                 # a compact step costs a fraction
    assert matched["run"]["pflops"] == reference["train_pflops"]
    with pytest.raises(BarterError, match="either epochs or a PFLOPs budget"):
        RunConfig(method="barter", epochs=2, pflops=1.0).validate()


# ----------------------------------------------------------------------------- transfer task

def test_class_selection_keeps_and_relabels_only_the_chosen_classes():
    full = load_dataset("digits", seed=0)
    half = load_dataset("digits", seed=0, classes=(7, 5, 9))
    assert half.info.num_classes == 3
    for name in ("train", "val", "test"):
        original = [int(y) for _, y in getattr(full, name)]
        kept = [int(y) for _, y in getattr(half, name)]
        assert sorted(kept) == sorted({7: 0, 5: 1, 9: 2}[y] for y in original if y in (7, 5, 9))
    image, label = half.test[0]
    assert image.shape == (1, 8, 8) and 0 <= label < 3
    assert parse_classes("0-2,7") == (0, 1, 2, 7)
    with pytest.raises(BarterError, match="distinct class indices"):
        load_dataset("digits", classes=(3, 3))


def test_other_classes_reinitialise_the_classifier_even_at_the_same_count(tmp_path):
    pretrained = train(RunConfig(method="dense", dataset="digits", recipe="smoke", classes=(0, 1, 2, 3, 4),
                                 progress=False), tmp_path / "pre")
    assert list(pretrained["run"]["classes"]) == [0, 1, 2, 3, 4]
    config = model_from_checkpoint(torch.load(tmp_path / "pre" / "best.pt", weights_only=False)).config
    _, same = load_dense_weights(tmp_path / "pre" / "best.pt", config, "digits", [0, 1, 2, 3, 4])
    _, other = load_dense_weights(tmp_path / "pre" / "best.pt", config, "digits", (5, 6, 7, 8, 9))
    assert not same and other
