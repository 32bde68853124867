"""Prune/clone surgery on timm modules and the optimizer-state remap."""

import copy

import pytest
import torch
from sklearn.datasets import load_digits
from timm.scheduler import CosineLRScheduler

from barter_mini.core.barter import BarterSettings, clone, prune, select_parents, topology_update
from barter_mini.core.models import build_model
from barter_mini.core.unit_statistics import UnitStatistics
from barter_mini.core.surgery import unit_parameters

from helpers import assert_in_sync, batch, tiny_model, train_step


def warmed_up(config, optimizer_cls=torch.optim.AdamW, steps=3, **kwargs):
    model = tiny_model(config).eval()  # eval: no dropout, exact comparisons
    optimizer = optimizer_cls(model.parameters(), lr=1e-2, **kwargs)
    stats = UnitStatistics(model)
    x, y = batch(config)
    for _ in range(steps):
        train_step(model, optimizer, x, y)
    return model, optimizer, stats, x, y


@pytest.mark.parametrize("kind, layer, parents", [("heads", 1, [0, 2]), ("ffn", 0, [1, 3, 4])])
def test_clone_preserves_the_function(tiny_config, kind, layer, parents):
    model, optimizer, stats, x, _ = warmed_up(tiny_config)
    with torch.no_grad():
        before = model(x)
    clone(model.blocks[layer], kind, parents, stats.layers[kind][layer], optimizer,
          alpha=0.3, symmetry_noise=0.0)
    with torch.no_grad():
        after = model(x)
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)
    counts = model.allocation().heads if kind == "heads" else model.allocation().ffn
    assert counts[layer] == (3 if kind == "heads" else 5) + len(parents)
    assert_in_sync(model, optimizer)


def test_symmetry_noise_changes_the_clone_only_slightly(tiny_config):
    model, optimizer, stats, x, _ = warmed_up(tiny_config)
    with torch.no_grad():
        before = model(x)
    clone(model.blocks[1], "heads", [1], stats.layers["heads"][1], optimizer, symmetry_noise=1e-2,
          generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        after = model(x)
    assert 0 < (before - after).abs().max() < 1e-2


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_split_remaps_adam_moments(tiny_config, alpha):
    model, optimizer, stats, _, _ = warmed_up(tiny_config)
    block = model.blocks[2]  # one head, three FFN channels
    old = {s.role: (s.tensor, {k: v.clone() for k, v in optimizer.state[s.tensor].items()})
           for s in unit_parameters(block, "ffn") if s.name == "weight"}
    clone(block, "ffn", [1], stats.layers["ffn"][2], optimizer, alpha=alpha, symmetry_noise=0.0,
          clone_moments="split")
    fc1, fc2 = block.mlp.fc1.weight, block.mlp.fc2.weight
    (_, s_in), (_, s_out) = old["in"], old["out"]
    # input row: first moment x s, second moment x s^2 (parent s = alpha, clone s = 1 - alpha)
    for row, s in ((1, alpha), (3, 1 - alpha)):
        torch.testing.assert_close(optimizer.state[fc1]["exp_avg"][row], s * s_in["exp_avg"][1],
                                   rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(optimizer.state[fc1]["exp_avg_sq"][row], s ** 2 * s_in["exp_avg_sq"][1],
                                   rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(optimizer.state[fc2]["exp_avg"][:, row], s_out["exp_avg"][:, 1],
                                   rtol=0, atol=0)
        torch.testing.assert_close(optimizer.state[fc2]["exp_avg_sq"][:, row], s_out["exp_avg_sq"][:, 1],
                                   rtol=0, atol=0)
    torch.testing.assert_close(optimizer.state[fc1]["step"], s_in["step"], rtol=0, atol=0)
    # untouched units keep their state exactly
    torch.testing.assert_close(optimizer.state[fc1]["exp_avg"][0], s_in["exp_avg"][0], rtol=0, atol=0)


def test_split_gradients_match_the_remapped_moments(tiny_config):
    """The premise of the remap: input gradients scale with the output share, outputs copy."""
    model, optimizer, stats, x, y = warmed_up(tiny_config)
    block = model.blocks[0]
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    g_in, g_out = block.attn.qkv.weight.grad.clone(), block.attn.proj.weight.grad.clone()
    clone(block, "heads", [1], stats.layers["heads"][0], optimizer, alpha=0.3, symmetry_noise=0.0,
          clone_moments="split")
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    d, heads = block.attn.head_dim, 3

    def rows(grad, head, total):
        return torch.cat([grad[(s * total + head) * d:(s * total + head + 1) * d] for s in range(3)])

    torch.testing.assert_close(rows(block.attn.qkv.weight.grad, 1, heads), 0.3 * rows(g_in, 1, 2),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows(block.attn.qkv.weight.grad, 2, heads), 0.7 * rows(g_in, 1, 2),
                               rtol=1e-5, atol=1e-6)
    for head in (1, 2):
        torch.testing.assert_close(block.attn.proj.weight.grad[:, head * d:(head + 1) * d], g_out[:, d:2 * d],
                                   rtol=1e-5, atol=1e-6)


def test_prune_removes_units_and_their_state(tiny_config):
    model, optimizer, stats, x, y = warmed_up(tiny_config)
    block = model.blocks[1]
    kept_rows = block.mlp.fc1.weight[[0, 2, 5, 6, 7]].detach().clone()
    kept_state = optimizer.state[block.mlp.fc1.weight]["exp_avg"][[0, 2, 5, 6, 7]].clone()
    prune(block, "ffn", [1, 3, 4], stats.layers["ffn"][1], optimizer)
    assert block.mlp.fc1.weight.shape[0] == 5 and block.mlp.fc2.weight.shape[1] == 5
    torch.testing.assert_close(block.mlp.fc1.weight.detach(), kept_rows, rtol=0, atol=0)
    torch.testing.assert_close(optimizer.state[block.mlp.fc1.weight]["exp_avg"], kept_state, rtol=0, atol=0)
    assert_in_sync(model, optimizer)
    train_step(model, optimizer, x, y)  # still trains


def _digits_batches(count, n=64, seed=0):
    """Real images (scikit-learn's 8x8 digits), so the gradients mean something."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16 - 0.3
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        index = torch.randint(0, len(x), (n,), generator=g)
        yield x[index], y[index]


def _pair_gaps(config, kind, noise, steps=100):
    """Input-weight difference of a parent and its clone right after cloning and ``steps`` later."""
    config = config.for_data(8, 1, 10)
    model = tiny_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stats = UnitStatistics(model)
    for x, y in _digits_batches(20):
        train_step(model, optimizer, x, y)
    layer = 1
    block, layer_stats = model.blocks[layer], stats.layers[kind][layer]
    parent = select_parents(layer_stats, 1)[0]   # the unit BARTER would clone
    clone(block, kind, [parent], layer_stats, optimizer, symmetry_noise=noise,
          generator=torch.Generator().manual_seed(0), clone_moments="split")   # the exact surgery
    stats.attach()
    spec = next(s for s in unit_parameters(block, kind) if s.role == "in" and s.name == "weight")
    count = model.allocation().heads[layer] if kind == "heads" else model.allocation().ffn[layer]

    def gap():
        w = spec.tensor.detach()
        parent_rows, clone_rows = (spec.element_index(torch.tensor([u]), count) for u in (parent, count - 1))
        return w[parent_rows] - w[clone_rows]

    initial = gap()
    for x, y in _digits_batches(steps, seed=1):
        train_step(model, optimizer, x, y)
    return initial, gap()


@pytest.mark.parametrize("kind", ["heads", "ffn"])
def test_parent_and_clone_diverge_under_adamw_only_with_symmetry_breaking(tiny_config, kind):
    initial, final = _pair_gaps(tiny_config, kind, noise=0.0)
    assert initial.abs().max() == 0 and final.abs().max() < 1e-6   # Adam keeps an exact copy exact
    initial, final = _pair_gaps(tiny_config, kind, noise=1e-2)
    # with the perturbation the copies receive different updates and drift further apart
    assert final.norm() > 1.2 * initial.norm() > 0
    assert (final - initial).norm() > 0.3 * initial.norm()


@pytest.mark.parametrize("optimizer_cls, kwargs", [(torch.optim.AdamW, {"weight_decay": 0.05}),
                                                   (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 1e-4})])
def test_step_after_update_equals_step_of_a_fresh_model(tiny_config, optimizer_cls, kwargs):
    model, optimizer, stats, x, y = warmed_up(tiny_config, optimizer_cls, **kwargs)
    settings = BarterSettings(min_age=1, symmetry_noise=1e-2)
    records = topology_update(model, {"heads": 1, "ffn": 3}, stats, optimizer, settings,
                              generator=torch.Generator().manual_seed(0))
    assert records["heads"].executed == 1 and records["ffn"].executed == 3
    assert_in_sync(model, optimizer)

    fresh = build_model(model.config, allocation=model.allocation()).eval()
    fresh.load_state_dict(model.state_dict())
    fresh_optimizer = optimizer_cls(fresh.parameters(), lr=1e-2, **kwargs)
    # deepcopy: load_state_dict keeps the very tensors, which both optimizers would then update
    fresh_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))

    x2, y2 = batch(tiny_config, seed=7)
    train_step(model, optimizer, x2, y2)
    train_step(fresh, fresh_optimizer, x2, y2)
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_lr_scheduler_keeps_driving_the_new_tensors(tiny_config):
    model, optimizer, stats, x, y = warmed_up(tiny_config)
    scheduler = CosineLRScheduler(optimizer, t_initial=100, lr_min=0.0, t_in_epochs=False)
    topology_update(model, {"heads": 1, "ffn": 2}, stats, optimizer, BarterSettings(min_age=1))
    scheduler.step_update(50)
    new_qkv = model.blocks[0].attn.qkv.weight
    group = next(g for g in optimizer.param_groups if any(p is new_qkv for p in g["params"]))
    assert group["lr"] == pytest.approx(0.5e-2, rel=1e-6)
    before = new_qkv.detach().clone()
    train_step(model, optimizer, x, y)
    assert not torch.equal(before, model.blocks[0].attn.qkv.weight.detach())


def test_fresh_clone_moments_are_zero_and_the_parent_keeps_its_own(tiny_config):
    model, optimizer, stats, x, y = warmed_up(tiny_config)
    block = model.blocks[1]
    fc1 = block.mlp.fc1.weight
    parent_state = optimizer.state[fc1]["exp_avg"][2].clone()
    count = block.mlp.fc1.out_features
    clone(block, "ffn", [2], stats.layers["ffn"][1], optimizer, alpha=0.5, symmetry_noise=0.0, clone_moments="fresh")
    state = optimizer.state[block.mlp.fc1.weight]
    assert not state["exp_avg"][count].any() and not state["exp_avg_sq"][count].any()
    assert not optimizer.state[block.mlp.fc2.weight]["exp_avg"][:, count].any()
    torch.testing.assert_close(state["exp_avg"][2], 0.5 * parent_state, rtol=1e-6, atol=1e-9)
    assert_in_sync(model, optimizer)


def test_zero_momentum_clones_keep_their_split_second_moment(tiny_config):
    model, optimizer, stats, x, y = warmed_up(tiny_config)
    block = model.blocks[1]
    parent_sq = optimizer.state[block.mlp.fc1.weight]["exp_avg_sq"][2].clone()
    count = block.mlp.fc1.out_features
    clone(block, "ffn", [2], stats.layers["ffn"][1], optimizer, alpha=0.5, symmetry_noise=0.0,
          clone_moments="zero-momentum")
    state = optimizer.state[block.mlp.fc1.weight]
    assert not state["exp_avg"][count].any() and state["exp_avg"][2].any()
    # the split's second moment: the clone's gradient is (1 - alpha) of the parent's old one
    torch.testing.assert_close(state["exp_avg_sq"][count], 0.25 * parent_sq, rtol=1e-6, atol=1e-12)
    assert not optimizer.state[block.mlp.fc2.weight]["exp_avg"][:, count].any()
    assert optimizer.state[block.mlp.fc2.weight]["exp_avg_sq"][:, count].any()
    assert_in_sync(model, optimizer)
    train_step(model, optimizer, x, y)
    assert_in_sync(model, optimizer)


def test_each_knob_has_one_default_and_clone_takes_its_knobs_by_name():
    """clone's knobs default to BarterSettings' values and UnitStatistics' score to BARTER's,
    so a call that leaves a knob out runs what the method runs."""
    import inspect

    settings, parameters = BarterSettings(), inspect.signature(clone).parameters
    knobs = {"alpha": settings.split_alpha, "symmetry_noise": settings.symmetry_noise,
             "clone_moments": settings.clone_moments}
    assert {name: parameters[name].default for name in knobs} == knobs
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
               for name in ("alpha", "symmetry_noise", "generator", "clone_moments", "warmup_steps"))
    assert UnitStatistics.__dataclass_fields__["pruning_score"].default == settings.pruning_score


def test_the_unit_table_describes_every_kind_a_layer_holds(tiny_config):
    """UNITS: each kind's count, full width, parameters and set_count agree with the model."""
    from barter_mini.core.surgery import UNITS, allocation_of, unit_kind
    from barter_mini.errors import BarterError

    model = tiny_model(tiny_config)
    assert set(UNITS) == set(allocation_of(model).as_dict())
    for kind, entry in UNITS.items():
        for block, count in zip(model.blocks, getattr(allocation_of(model), kind)):
            assert entry.count(block) == count <= entry.full_width(tiny_config)
            for spec in entry.parameters(block):
                assert spec.tensor.shape[spec.axis] == spec.groups * count * spec.width
    with pytest.raises(BarterError, match="unknown unit kind 'channels': choose one of heads, ffn"):
        unit_kind("channels")
