"""The full-tensor masked DST baselines (barter_mini.masked): rules, schedule, exact zeros."""

import math

import pytest
import torch

from barter_mini.core.configs import ModelConfig
from barter_mini.training.data import load_dataset, make_loaders
from barter_mini.errors import BarterError
from barter_mini.masked import MaskedSettings, MaskSchedule, masked_tensors
from barter_mini.masked.selection import apportion

from helpers import MASKED
from barter_mini.core.models import build_model, get_model_config

#: 2 layers, embed 8, 4 heads of 16 (qkv 192 x 8, proj 8 x 64), FFN 12, 8x8 grey images
TINY = ModelConfig(name="tiny-masked", family="cct", img_size=8, in_chans=1, num_classes=5, depth=2,
                   embed_dim=8, heads_per_layer=4, ffn_per_layer=12, conv_layers=1)
FC1 = "blocks.0.mlp.fc1.weight"


def tiny(method, density=0.5, total_steps=400, optimizer="adamw", seed=0, **settings):
    torch.manual_seed(seed)
    model = build_model(TINY, 1.0)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    dst = MASKED[method](model, opt, density, total_steps, MaskedSettings(**settings), seed=seed)
    return model, opt, dst


def batch(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def backward(model, seed=1):
    model.train()
    model.zero_grad(set_to_none=True)
    x, y = batch(seed=seed)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def distinct(n, seed, scale=1.0):
    """n distinct magnitudes scale * (1..n) in random order."""
    return (torch.randperm(n, generator=torch.Generator().manual_seed(seed)).float() + 1) * scale


def active_count(dst):
    return sum(int(m.sum()) for m in dst.masks().values())


# ----------------------------------------------------------------------------- schedule, input

def test_schedule_cosine_decay_and_end():
    s = MaskSchedule(total_steps=400, delta_t=100, t_end=0.75, alpha=0.3)
    assert s.fraction(0) == pytest.approx(0.3)
    assert s.fraction(150) == pytest.approx(0.15)          # T_end / 2
    assert s.fraction(100) == pytest.approx(0.15 * (1 + math.cos(math.pi / 3)))
    assert s.fraction(300) == pytest.approx(0.0, abs=1e-12)
    assert s.fraction(301) == 0.0
    assert s.update_steps == [100, 200, 300]
    assert [s.is_update(t) for t in (99, 100, 150, 200, 300, 400)] == [False, True, False, True, True, False]


@pytest.mark.parametrize("method", sorted(MASKED))
def test_no_update_off_schedule_or_after_t_end(method):
    model, opt, dst = tiny(method, total_steps=40, delta_t=10)
    before = dst.masks()
    for step in (1, 9, 11):
        backward(model)
        dst.before_step()
        assert dst.after_step(step) is None
    dst.step = 39                                    # T_end = 30 (S2ViTE: 32): no update at 40
    backward(model)
    dst.before_step()
    assert dst.after_step(40) is None
    assert dst.history == [] and all(torch.equal(before[n], m) for n, m in dst.masks().items())


def test_s2vite_schedule_is_its_own():
    _, _, dst = tiny("s2vite", total_steps=1000)
    assert dst.schedule.fraction(0) == pytest.approx(0.5)
    assert dst.schedule.end == pytest.approx(800)
    assert dst.schedule.update_steps[-1] == 800


@pytest.mark.parametrize("method", sorted(MASKED))
@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, float("nan")])
def test_bad_density_is_one_line_error(method, density):
    model = build_model(TINY, 1.0)
    with pytest.raises(BarterError) as err:
        MASKED[method](model, None, density, 100)
    assert "\n" not in str(err.value) and "density" in str(err.value)


def test_bad_steps_and_settings_are_errors():
    model = build_model(TINY, 1.0)
    for kwargs in ({"total_steps": 0}, {"settings": MaskedSettings(delta_t=0)},
                   {"settings": MaskedSettings(t_end=0.0)}, {"settings": MaskedSettings(alpha=1.5)}):
        args = {"total_steps": 100, **kwargs}
        with pytest.raises(BarterError):
            MASKED["rigl"](model, None, 0.5, **args)


def test_initial_masks_uniform_and_seeded():
    model, _, dst = tiny("rigl", density=0.3)
    for t in masked_tensors(model):
        mask = dst.masks()[t.name]
        assert int(mask.sum()) == round(0.3 * mask.numel())
        assert (t.param[~mask] == 0).all()
    _, _, same = tiny("rigl", density=0.3)
    _, _, other = tiny("set", density=0.3, seed=1)
    assert all(torch.equal(dst.masks()[n], m) for n, m in same.masks().items())
    assert not torch.equal(dst.masks()[FC1], other.masks()[FC1])


def test_apportion_by_hand():
    assert apportion(10, [3, 1, 1], [100, 100, 1]) == [7, 2, 1]   # 6|2|2 -> cap 1 -> 6.75|2.25|1
    assert apportion(5, [0, 0], [10, 10]) == [3, 2]               # equal shares, tie -> lower index
    assert apportion(50, [1, 1], [10, 20]) == [10, 20]            # no more than fits
    assert apportion(7, [1, 2, 4], [9, 9, 9]) == [1, 2, 4]


# ----------------------------------------------------------------------------- hand-made updates
#
# fc1 of layer 0 is 12 x 8 = 96 weights; at density 0.5 it holds 48. At step 100 of 400 the
# drop fraction is 0.15 * (1 + cos(pi / 3)) = 0.225, so n = round(0.225 * 48) = 11.

def _hand_made_fc1(model, dst):
    """Distinct |w| on fc1's active weights, distinct |grad| on its inactive ones.

    The 11 smallest active weights get the largest gradients of all, so a rule that let a
    just-dropped weight compete would re-pick them.
    """
    backward(model)
    w = model.blocks[0].mlp.fc1.weight
    mask = dst.masks()[FC1].flatten()
    active, inactive = torch.nonzero(mask).flatten(), torch.nonzero(~mask).flatten()
    mags = distinct(48, seed=3, scale=0.01)
    signs = torch.tensor([1.0, -1.0]).repeat(24)
    grads = distinct(48, seed=4, scale=0.001)
    dense = torch.zeros(96)
    dense[inactive] = grads * signs
    dense[active] = torch.where(mags <= 0.11 + 1e-6, 10.0, 0.5)
    with torch.no_grad():
        w.zero_()
        w.view(-1)[active] = mags * signs
    w.grad = dense.view_as(w).clone()
    dropped = torch.zeros(96, dtype=torch.bool)
    dropped[active[mags <= 0.11 + 1e-6]] = True
    return mask.view_as(w), dropped.view_as(w), (inactive, grads)


def _run_update(dst, step=100):
    dst.step = step - 1
    dst.before_step()
    return dst.after_step(step)


def test_rigl_drops_smallest_and_grows_largest_gradient():
    model, _, dst = tiny("rigl")
    mask, dropped, (inactive, grads) = _hand_made_fc1(model, dst)
    grown = torch.zeros(96, dtype=torch.bool)
    grown[inactive[torch.topk(grads, 11).indices]] = True
    counts = {n: int(m.sum()) for n, m in dst.masks().items()}
    record = _run_update(dst)
    new = dst.masks()[FC1]
    torch.testing.assert_close(new, (mask & ~dropped) | grown.view_as(mask), rtol=0, atol=0)
    assert record["fraction"] == pytest.approx(0.225)
    assert record["dropped"][FC1] == record["grown"][FC1] == 11
    assert {n: int(m.sum()) for n, m in dst.masks().items()} == counts      # per tensor, exactly
    w = model.blocks[0].mlp.fc1.weight
    assert (w[dropped] == 0).all() and (w[grown.view_as(w)] == 0).all()
    assert dst.history == [record] and dst.summary()["updates"] == 1


def test_set_drops_smallest_and_grows_at_random_among_inactive():
    chosen = []
    for seed in (0, 0, 1):
        model, _, dst = tiny("set", seed=seed)
        mask, dropped, _ = _hand_made_fc1(model, dst)
        counts = active_count(dst)
        record = _run_update(dst)
        new = dst.masks()[FC1]
        grown = new & ~mask
        assert torch.equal(new & mask, mask & ~dropped)        # exactly the smallest went
        assert int(grown.sum()) == 11 and record["grown"][FC1] == 11
        assert active_count(dst) == counts
        chosen.append((mask, grown))
    assert torch.equal(chosen[0][1], chosen[1][1])              # seeded
    assert not torch.equal(chosen[0][0], chosen[2][0]) or not torch.equal(chosen[0][1], chosen[2][1])


def test_snfs_redistributes_by_momentum_and_grows_by_momentum():
    """Density 0.25: drops qkv 86, proj 29, fc1 5, fc2 5 per layer (250 in all).

    Momentum (SGD's first buffer = the gradient) is 1 on every tensor but fc1 of layer 0,
    whose active weights have momentum 2: shares 2/9 and 1/9, i.e. 55.6 and 27.8 each ->
    55 for fc1.0, 28 for the first six others in tensor order and 27 for the last.
    """
    model, _, dst = tiny("snfs", density=0.25, optimizer="sgd")
    backward(model)
    w = model.blocks[0].mlp.fc1.weight
    mask = dst.masks()[FC1].flatten()
    active, inactive = torch.nonzero(mask).flatten(), torch.nonzero(~mask).flatten()
    assert len(active) == 24
    for t in masked_tensors(model):
        t.param.grad = torch.ones_like(t.param)
    dense = torch.zeros(96)
    dense[active] = 2.0
    dense[inactive] = distinct(72, seed=5, scale=0.01)
    w.grad = dense.view_as(w).clone()
    total = active_count(dst)
    record = _run_update(dst)
    names = [t.name for t in masked_tensors(model)]
    expected = dict(zip(names, [28, 28, 55, 28, 28, 28, 28, 27]))
    assert record["grown"] == expected
    assert sum(record["dropped"].values()) == sum(record["grown"].values()) == 250
    assert active_count(dst) == total                                   # overall, exactly
    new = dst.masks()[FC1].flatten()
    assert int(new.sum()) == 24 - 5 + 55
    top = inactive[torch.topk(dense[inactive], 55).indices]
    torch.testing.assert_close(torch.nonzero(new & ~mask).flatten().sort().values, top.sort().values,
                               rtol=0, atol=0)


def test_snfs_dense_momentum_matches_adam_state_on_active_weights():
    model, opt, dst = tiny("snfs", total_steps=100, delta_t=50)
    for step in range(1, 6):
        backward(model, seed=step)
        dst.before_step()
        opt.step()
        dst.after_step(step)
    for t in masked_tensors(model):
        mask = dst.masks()[t.name]
        ema = dst._moments[t.name]
        state = opt.state[t.param]
        torch.testing.assert_close(ema["exp_avg"][mask], state["exp_avg"][mask], rtol=1e-5, atol=1e-7)
        assert (state["exp_avg"][~mask] == 0).all()
        assert (ema["exp_avg"][~mask] != 0).any()          # the dense history the optimizer lacks


def test_srigl_ablates_the_unsalient_row_and_keeps_constant_fan_in():
    """fc1.0 at density 0.5: fan-in 4 per row, budget 48, salience threshold int(0.95 * 4) = 3.

    Row 0: its 4 weights are the smallest of all and no inactive weight of it has a large
    gradient -> 0 salient -> ablated. Rows 1-7 lose one small weight each (7 + 4 = 11 drops),
    rows 1-11 each hold one of the 11 largest inactive gradients. New fan-in round(48 / 11) = 4.
    """
    model, _, dst = tiny("srigl")
    backward(model)
    w = model.blocks[0].mlp.fc1.weight
    mask = dst.masks()[FC1]
    assert (mask.sum(dim=1) == 4).all() and dst.fan_in[FC1] == 4 and dst.threshold(FC1) == 3
    weights = torch.zeros(12, 8)
    grads = distinct(96, seed=6, scale=1e-4).view(12, 8)
    expected = mask.clone()
    expected[0] = False
    for r in range(12):
        cols = torch.nonzero(mask[r]).flatten()
        free = torch.nonzero(~mask[r]).flatten()
        weights[r, cols] = 1.0 + 0.1 * torch.arange(4) + 0.01 * r
        if r == 0:
            weights[r, cols] = 0.001 * (torch.arange(4) + 1)
            continue
        grads[r, free[0]] = 10.0 + r
        if r <= 7:
            weights[r, cols[0]] = 0.01 + 0.001 * r
            expected[r, cols[0]] = False
            expected[r, free[0]] = True
    with torch.no_grad():
        w.copy_(weights)
    w.grad = grads.clone()
    record = _run_update(dst)
    new = dst.masks()[FC1]
    torch.testing.assert_close(new, expected, rtol=0, atol=0)
    assert dst.ablated[FC1].tolist() == [True] + [False] * 11
    assert record["fan_in"][FC1] == 4 and record["ablated_rows"][FC1] == 1
    for t in masked_tensors(model):                     # constant fan-in everywhere
        m, k = dst.masks()[t.name], dst.fan_in[t.name]
        counts = m.sum(dim=1)
        assert ((counts == k) | (counts == 0)).all()
        torch.testing.assert_close(counts == 0, dst.ablated[t.name], rtol=0, atol=0)


def test_srigl_keeps_enough_rows_for_its_budget():
    """gamma_sal = 1 asks for every kept weight to stay salient; at least ceil(48 / 8) = 6 rows
    of fc1.0 must survive anyway, each with the same fan-in, at most 8."""
    model, _, dst = tiny("srigl", srigl_gamma_sal=1.0)
    backward(model)
    for step in (100, 200):
        _run_update(dst, step)
        m = dst.masks()[FC1]
        live = int((~dst.ablated[FC1]).sum())
        assert live >= 6 and dst.fan_in[FC1] == min(8, round(48 / live))
        assert ((m.sum(dim=1) == dst.fan_in[FC1]) | dst.ablated[FC1]).all()


@pytest.mark.parametrize("method", ["set", "rigl", "snfs"])
def test_density_exact_even_when_just_dropped_weights_must_be_regrown(method):
    """At density 0.9 fc1.0 has 86 active and 10 inactive weights but drops 19: nine of the
    dropped weights have to come back, and every tensor still ends where it started."""
    model, _, dst = tiny(method, density=0.9, optimizer="sgd")
    backward(model)
    counts = {n: int(m.sum()) for n, m in dst.masks().items()}
    record = _run_update(dst)
    assert sum(record["grown"].values()) <= sum(record["dropped"].values())
    if method == "snfs":
        assert active_count(dst) == sum(counts.values())
    else:
        assert {n: int(m.sum()) for n, m in dst.masks().items()} == counts
        assert record["dropped"][FC1] == record["grown"][FC1] == 10


def test_s2vite_hand_made_heads_and_neurons():
    """4 heads (budget 2) and 12 neurons (budget 6) per layer; death rate at step 100 of 400
    (updates until 320): 0.25 * (1 + cos(pi * 100 / 320)) = 0.389 -> 1 head, 2 neurons."""
    model, _, dst = tiny("s2vite")
    heads_before = [m.clone() for m in dst.head_masks]
    ffn_before = [m.clone() for m in dst.ffn_masks]
    assert [int(m.sum()) for m in heads_before] == [2, 2] and [int(m.sum()) for m in ffn_before] == [6, 6]

    # independent measurement of the head statistics on the update step's batch
    captured = {}

    def keep(layer):
        def hook(module, inputs):
            inputs[0].retain_grad()
            captured[layer] = inputs[0]
        return hook
    handles = [b.attn.proj.register_forward_pre_hook(keep(i)) for i, b in enumerate(model.blocks)]
    dst.step = 99
    backward(model)
    for h in handles:
        h.remove()
    expected_heads = []
    for layer, a in captured.items():
        av, gv = a.detach().view(6, -1, 4, 16), a.grad.view(6, -1, 4, 16)   # the reference's scores
        taylor = torch.einsum("bnhl,bnhl->bh", gv, av).abs().mean(dim=0)
        gnorm = gv.norm(dim=(1, 3), p=1).mean(dim=0)
        on, off = torch.nonzero(heads_before[layer]).flatten(), torch.nonzero(~heads_before[layer]).flatten()
        drop, grow = on[taylor[on].argmin()], off[gnorm[off].argmax()]
        assert gnorm[off].min() > 0                               # masked heads still get a signal
        mine = dst.head_scores(layer)
        torch.testing.assert_close(mine[0], taylor, rtol=1e-4, atol=1e-12)
        torch.testing.assert_close(mine[1], gnorm, rtol=1e-4, atol=1e-12)
        expected = heads_before[layer].clone()
        expected[drop], expected[grow] = False, True
        expected_heads.append(expected)

    # neurons of layer 0 by hand: |fc1 row|_1 + |fc2 col|_1 and the same norms of the gradients
    fc1, fc2 = model.blocks[0].mlp.fc1, model.blocks[0].mlp.fc2
    on, off = torch.nonzero(ffn_before[0]).flatten(), torch.nonzero(~ffn_before[0]).flatten()
    norms, gnorms = torch.zeros(12), torch.zeros(12)
    norms[on] = distinct(6, seed=7)
    gnorms[off] = distinct(6, seed=8)
    with torch.no_grad():
        fc1.weight.copy_(norms[:, None].expand(12, 8) / 16)      # row L1 = norms / 2
        fc2.weight.copy_(norms[None, :].expand(8, 12) / 16)      # column L1 = norms / 2
    fc1.weight.grad = gnorms[:, None].expand(12, 8).clone() / 8
    fc2.weight.grad = torch.zeros(8, 12)
    expected_ffn = ffn_before[0].clone()
    expected_ffn[on[torch.topk(norms[on], 2, largest=False).indices]] = False
    expected_ffn[off[torch.topk(gnorms[off], 2).indices]] = True

    dst.before_step()
    record = dst.after_step(100)
    assert record["fraction"] == pytest.approx(0.25 * (1 + math.cos(math.pi * 100 / 320)))
    assert [torch.equal(m, e) for m, e in zip(dst.head_masks, expected_heads)] == [True, True]
    torch.testing.assert_close(dst.ffn_masks[0], expected_ffn, rtol=0, atol=0)
    assert dst.allocation().heads == (2, 2) and dst.allocation().ffn == (6, 6)
    assert [len(u["dropped"]) for u in record["units"]["heads"]] == [1, 1]
    assert [len(u["grown"]) for u in record["units"]["ffn"]] == [2, 2]
    # rows of the dropped units are zero; regrown units start at zero
    qkv = model.blocks[0].attn.qkv.weight.view(3, 4, 16, 8)
    assert (qkv[:, ~dst.head_masks[0]] == 0).all()
    assert (fc1.weight[~dst.ffn_masks[0]] == 0).all() and (fc1.bias[~dst.ffn_masks[0]] == 0).all()
    assert (fc1.weight[expected_ffn & ~ffn_before[0]] == 0).all()


def test_s2vite_masked_heads_and_neurons_output_zero():
    model, opt, dst = tiny("s2vite", total_steps=20, delta_t=2)
    outputs = {}
    hooks = []
    for i, b in enumerate(model.blocks):
        hooks.append(b.attn.proj.register_forward_pre_hook(
            lambda m, inp, i=i: outputs.__setitem__(("heads", i), inp[0].detach())))
        hooks.append(b.mlp.act.register_forward_hook(
            lambda m, inp, out, i=i: outputs.__setitem__(("ffn", i), out.detach())))
    for step in range(1, 17):
        head_masks, ffn_masks = [m.clone() for m in dst.head_masks], [m.clone() for m in dst.ffn_masks]
        backward(model, seed=step)
        for i in range(2):          # the forward of this step ran with these masks
            heads = outputs[("heads", i)].view(-1, 4, 16)
            assert (heads[:, ~head_masks[i]] == 0).all() and (heads[:, head_masks[i]] != 0).any()
            assert (outputs[("ffn", i)][..., ~ffn_masks[i]] == 0).all()
        dst.before_step()
        opt.step()
        dst.after_step(step)
        assert dst.allocation().heads == (2, 2) and dst.allocation().ffn == (6, 6)
    assert len(dst.history) == 8 and sum(len(u["dropped"]) for r in dst.history
                                         for u in r["units"]["heads"]) > 0
    budget_density = (2 * (3 * 16 * 8 + 8 * 16) + 6 * 16) / (192 * 8 + 8 * 64 + 2 * 96)
    assert dst.density() == pytest.approx(budget_density)
    for h in hooks:
        h.remove()


# ----------------------------------------------------------------------------- exact zeros

@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("method", sorted(MASKED))
def test_masked_weights_and_state_stay_exactly_zero(method, optimizer):
    model, opt, dst = tiny(method, total_steps=12, optimizer=optimizer, delta_t=3)
    params = dict(model.named_parameters())
    changed = 0
    for step in range(1, 13):
        before = dst.enforced_masks()
        backward(model, seed=step)
        dst.before_step()
        opt.step()
        record = dst.after_step(step)
        after = dst.enforced_masks()
        for name, mask in after.items():
            p, state = params[name], opt.state[params[name]]
            moments = [v for v in state.values() if torch.is_tensor(v) and v.shape == p.shape]
            assert moments, name
            assert (p[~mask] == 0).all(), (name, step)
            for v in moments:
                assert (v[~mask] == 0).all(), (name, step)
            if record is not None:
                moved = (before[name] & ~mask) | (mask & ~before[name])    # dropped or grown
                changed += int(moved.sum())
                assert (p[moved] == 0).all()
                for v in moments:
                    assert (v[moved] == 0).all()
    assert len(dst.history) == 3 and changed > 0


# ----------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def digits():
    splits = load_dataset("digits", seed=0)
    return make_loaders(splits, 64, seed=0)


@pytest.mark.parametrize("method", sorted(MASKED))
def test_short_training_on_digits(method, digits):
    train_loader, _, test_loader = digits
    rho, epochs = 0.3, 4
    torch.manual_seed(0)
    model = build_model(get_model_config("cct-mini").for_data(8, 1, 10), 1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    dst = MASKED[method](model, opt, rho, epochs * len(train_loader), MaskedSettings(delta_t=10))
    step = 0
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            dst.before_step()
            opt.step()
            step += 1
            dst.after_step(step)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in test_loader:
            correct += int((model(x).argmax(dim=1) == y).sum())
            total += len(y)
    assert correct / total > 0.2
    assert dst.summary()["updates"] == len(dst.schedule.update_steps) == 6
    params = dict(model.named_parameters())
    for name, mask in dst.enforced_masks().items():
        assert (params[name][~mask] == 0).all()
    tensors = masked_tensors(model)
    masks = dst.masks()
    if method in ("set", "rigl", "snfs"):      # rho within one weight per tensor
        active = sum(int(m.sum()) for m in masks.values())
        assert abs(active - rho * sum(m.numel() for m in masks.values())) <= len(masks)
        if method != "snfs":
            for t in tensors:
                assert int(masks[t.name].sum()) == round(rho * t.param.numel())
    elif method == "srigl":                    # constant fan-in: within one weight per row
        for t in tensors:
            m = masks[t.name]
            assert abs(int(m.sum()) - rho * m.numel()) <= m.shape[0]
            counts = m.sum(dim=1)
            assert ((counts == dst.fan_in[t.name]) | (counts == 0)).all()
    else:                                      # whole units at their per-layer budgets
        # BARTER's initial allocation at rho = 0.3: 12 heads and 154 channels over 4 layers
        assert dst.allocation().heads == (3,) * 4 and dst.allocation().ffn == (39, 39, 38, 38)
        assert abs(dst.density() - rho) < 0.01


@pytest.mark.parametrize("method", ["rigl", "s2vite"])
def test_masks_are_multiplied_in_one_fused_call_of_matching_dtypes(method, monkeypatch):
    """Gradients (before the optimizer step) and weights (after it) are masked by one
    ``torch._foreach_mul_`` each, every mask in its tensor's dtype (a bool mask sends
    ``_foreach_mul_`` down its per-tensor path); the float masks follow an update."""
    model, opt, dst = tiny(method, delta_t=2)
    calls = []
    original = torch._foreach_mul_

    def recording(tensors, others):
        calls.append([(t.dtype, o.dtype) for t, o in zip(tensors, others)])
        return original(tensors, others)

    monkeypatch.setattr(torch, "_foreach_mul_", recording)
    for step in (1, 2, 3):
        backward(model, seed=step)
        calls.clear()
        dst.before_step()
        opt.step()
        dst.after_step(step)
        assert len(calls) == 2 and all(a == b for call in calls for a, b in call), calls
        for name, mask in dst.enforced_masks().items():
            weight = dict(model.named_parameters())[name]
            assert not weight[~mask].any(), f"{name} has weights outside its mask after step {step}"
