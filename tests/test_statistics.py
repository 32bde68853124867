"""Statistics come from hooks on the compact tensors during the ordinary backward pass."""

import pytest
import torch

from barter_mini.core.unit_statistics import UnitStatistics

from helpers import batch, tiny_model


def activations_and_grads(model, x, y):
    """Head outputs (proj inputs) and FFN hidden activations (fc2 inputs) with their gradients."""
    captured = {}

    def keep(name):
        def hook(module, inputs):
            inputs[0].retain_grad()
            captured[name] = inputs[0]
        return hook

    handles = []
    for i, block in enumerate(model.blocks):
        handles.append(block.attn.proj.register_forward_pre_hook(keep(("heads", i))))
        handles.append(block.mlp.fc2.register_forward_pre_hook(keep(("ffn", i))))
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for h in handles:
        h.remove()
    return captured


def test_pruning_score_is_the_taylor_importance_of_the_unit_activation(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model, beta=0.9, pruning_score="taylor-squared")
    x, y = batch(tiny_config)
    captured = activations_and_grads(model, x, y)
    for (kind, i), a in captured.items():
        per_unit = (a * a.grad).sum(dim=(0, 1))                 # sum over batch and tokens
        if kind == "heads":
            per_unit = per_unit.view(-1, model.blocks[i].attn.head_dim).sum(1)
        expected = per_unit.square()
        layer_stats = stats.layers[kind][i]
        torch.testing.assert_close(layer_stats.pruning_scores(), expected, rtol=1e-4, atol=1e-12)
        assert (layer_stats.age == 1).all()


def test_growth_score_is_the_input_gradient_energy(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model)
    x, y = batch(tiny_config)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    block = model.blocks[1]
    g = block.attn.qkv.weight.grad
    heads, d = block.attn.num_heads, block.attn.head_dim
    expected = g.square().sum(1).view(3, heads, d).sum(dim=(0, 2))
    torch.testing.assert_close(stats.layers["heads"][1].growth_scores(), expected, rtol=1e-5, atol=1e-8)
    expected_ffn = block.mlp.fc1.weight.grad.square().sum(1)
    torch.testing.assert_close(stats.layers["ffn"][1].growth_scores(), expected_ffn, rtol=1e-5, atol=1e-8)


def test_ema_and_bias_correction_over_steps(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model, beta=0.5, pruning_score="taylor-squared")
    observed = []
    for seed in (1, 2, 3):
        x, y = batch(tiny_config, seed=seed)
        captured = activations_and_grads(model, x, y)
        a = captured[("ffn", 0)]
        observed.append((a * a.grad).sum(dim=(0, 1)).square())
    ema = torch.zeros_like(observed[0])
    for value in observed:
        ema = 0.5 * ema + 0.5 * value
    torch.testing.assert_close(stats.layers["ffn"][0].pruning_scores(), ema / (1 - 0.5 ** 3),
                               rtol=1e-4, atol=1e-8)
    assert (stats.layers["ffn"][0].age == 3).all()


def test_no_extra_forward_and_detach_stops_collection(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model)
    calls = []
    model.blocks[0].register_forward_hook(lambda *args: calls.append(1))
    x, y = batch(tiny_config)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert len(calls) == 1 and (stats.layers["heads"][0].age == 1).all()
    stats.detach()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert (stats.layers["heads"][0].age == 1).all()


def test_units_without_statistics_are_nan_and_ignored_by_priority(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model)
    layer = stats.layers["heads"][1]
    assert torch.isnan(layer.pruning_scores()).all() and layer.growth_priority() == 0.0
    x, y = batch(tiny_config)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    layer.regather(torch.tensor([0, 1, 2, 0]), reset=torch.tensor([True, False, False, True]))
    scores = layer.pruning_scores()
    assert torch.isnan(scores[[0, 3]]).all() and not torch.isnan(scores[[1, 2]]).any()
    assert layer.growth_priority() == pytest.approx(scores[[1, 2]].mean().item())


@pytest.mark.parametrize("score", ["taylor-abs", "magnitude"])
def test_alternative_pruning_scores(tiny_config, score):
    """``taylor-abs`` averages |sum_j W_j g_j|, ``magnitude`` the output-weight energy."""
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model, beta=0.9, pruning_score=score)
    x, y = batch(tiny_config)
    captured = activations_and_grads(model, x, y)
    for (kind, i), a in captured.items():
        block = model.blocks[i]
        if score == "taylor-abs":
            per_unit = (a * a.grad).sum(dim=(0, 1))
            if kind == "heads":
                per_unit = per_unit.view(-1, block.attn.head_dim).sum(1)
            expected = per_unit.abs()
        else:
            weight = block.attn.proj.weight if kind == "heads" else block.mlp.fc2.weight
            expected = weight.detach().square().sum(0)
            if kind == "heads":
                expected = expected.view(-1, block.attn.head_dim).sum(1)
        torch.testing.assert_close(stats.layers[kind][i].pruning_scores(), expected, rtol=1e-4, atol=1e-12)


def test_mean_pressure_priority_averages_growth_scores(tiny_config):
    model = tiny_model(tiny_config).eval()
    stats = UnitStatistics(model)
    x, y = batch(tiny_config)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    layer = stats.layers["ffn"][0]
    assert layer.growth_priority("mean-pressure") == pytest.approx(layer.growth_scores().mean().item())
    assert layer.growth_priority("mean-importance") == pytest.approx(layer.pruning_scores().mean().item())


def test_unknown_pruning_score_is_refused_in_one_line(tiny_config):
    from barter_mini.errors import BarterError
    with pytest.raises(BarterError, match="unknown pruning_score .fisher.: choose one of magnitude, taylor-abs, taylor-squared"):
        UnitStatistics(tiny_model(tiny_config), pruning_score="fisher")


@pytest.mark.parametrize("score", ["taylor-squared", "magnitude"])
def test_statistics_read_after_backward_equal_those_of_the_hooks(tiny_config, score):
    """A data-parallel run reads the gradients once DDP has averaged them (``in_backward=False``,
    then ``observe()``); on the same gradients that gives what the hooks give."""
    hooked_model, read_model = tiny_model(tiny_config), tiny_model(tiny_config)
    hooked = UnitStatistics(hooked_model, pruning_score=score)
    read = UnitStatistics(read_model, pruning_score=score, in_backward=False)
    for step in range(3):
        x, y = batch(tiny_config, seed=step)
        for model in (hooked_model, read_model):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        unobserved = [t.clone() for t in read.tensors()]
        read.observe()
        assert any(not torch.equal(a, b) for a, b in zip(unobserved, read.tensors()))
    for a, b in zip(hooked.tensors(), read.tensors()):
        assert torch.equal(a, b)


def _reference_step(model, layers, score: str, beta: float) -> None:
    """The statistics as one hook per parameter computed them before they were batched:
    each layer's reductions on its own tensors (``PruningScore.of_units`` and the growth score)."""
    from barter_mini.core.strategies import PRUNING_SCORES
    from barter_mini.core.surgery import UNIT_KINDS, unit_parameters
    with torch.no_grad():
        for kind in UNIT_KINDS:
            for block, stats in zip(model.blocks, layers[kind]):
                for spec in unit_parameters(block, kind):
                    if spec.name != "weight":
                        continue
                    if spec.role == "out":
                        value = PRUNING_SCORES[score].of_units(spec.tensor, spec.groups, spec.width, spec.axis)
                        stats["pruning"].mul_(beta).add_(value, alpha=1 - beta)
                        stats["age"] += 1
                    else:
                        grad_sq = spec.tensor.grad.square().sum(dim=1)
                        units = stats["age"].numel()
                        value = grad_sq.view(spec.groups, units, spec.width).sum(dim=(0, 2))
                        stats["growth"].mul_(beta).add_(value, alpha=1 - beta)


@pytest.mark.parametrize("family", ["cct", "vit"])
@pytest.mark.parametrize("score", ["magnitude", "taylor-squared", "taylor-abs"])
def test_batched_statistics_equal_the_per_parameter_reductions(family, score):
    """All layers of a kind in one concatenated reduction give the per-layer reductions'
    statistics over training steps: FFN channels bit for bit, heads (whose head_dim entries
    are summed in another order) to float32 rounding, rtol 1e-6."""
    from barter_mini.core.models import build_model, get_model_config
    config = get_model_config(f"{family}-mini").for_data(16, 3, 10)
    torch.manual_seed(0)
    model = build_model(config, 0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = UnitStatistics(model, beta=0.8, pruning_score=score)
    reference = {kind: [{"pruning": torch.zeros_like(s.pruning_ema), "growth": torch.zeros_like(s.growth_ema),
                         "age": torch.zeros_like(s.age)} for s in layers] for kind, layers in stats.layers.items()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(8, 3, 16, 16, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        _reference_step(model, reference, score, 0.8)
        optimizer.step()
    for kind, layers in stats.layers.items():
        for s, ref in zip(layers, reference[kind]):
            assert torch.equal(s.age, ref["age"])
            if kind == "ffn":
                assert torch.equal(s.pruning_ema, ref["pruning"]) and torch.equal(s.growth_ema, ref["growth"])
            else:
                torch.testing.assert_close(s.pruning_ema, ref["pruning"], rtol=1e-6, atol=0)
                torch.testing.assert_close(s.growth_ema, ref["growth"], rtol=1e-6, atol=0)


#: operators that only make views, allocate or ask a dtype: no kernel on a GPU
_NO_KERNEL = ("aten::as_strided", "aten::view", "aten::result_type", "aten::empty", "aten::empty_strided",
              "aten::detach", "aten::alias", "aten::slice", "aten::select", "aten::split", "aten::narrow",
              "aten::unsqueeze", "aten::t", "aten::transpose", "aten::expand", "aten::reshape", "aten::to")


def _leaf_operators(setup) -> tuple:
    """ATen operators without ATen children in one step of ``setup``: the counts outside the
    statistics' label by name, and inside it those that run a kernel (about one launch each
    on a GPU)."""
    import collections
    from torch.profiler import ProfilerActivity, profile
    from barter_mini.core.unit_statistics import PROFILE_LABEL
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        setup()
    outside, inside = collections.Counter(), 0
    for event in prof.events():
        if not event.name.startswith("aten::") or any(c.name.startswith("aten::") for c in event.cpu_children):
            continue
        node, labelled = event.cpu_parent, False
        while node is not None:
            labelled |= node.name == PROFILE_LABEL
            node = node.cpu_parent
        if labelled:
            inside += event.name not in _NO_KERNEL
        else:
            outside[event.name] += 1
    return outside, inside


def test_a_barter_step_is_statics_plus_a_few_batched_operations():
    """BARTER's statistics add no work to Static's step outside their own (no gradient copied
    for a hook), and their own is a fixed few operations whatever the depth: all layers of a
    unit kind are reduced at once."""
    from barter_mini.measure.bench import build_training_step
    inside = {}
    for model in ("cct-paper", "vit-paper"):          # 7 and 9 encoder layers
        barter, static = (build_training_step(model, m, 0.3, 2, 100_000, torch.device("cpu"))
                          for m in ("barter", "static"))
        barter(), static()                                   # optimizer state exists
        (barter_outside, inside[model]), (static_outside, nothing) = _leaf_operators(barter), _leaf_operators(static)
        assert barter_outside == static_outside and nothing == 0
    assert inside["cct-paper"] == inside["vit-paper"] <= 12


@pytest.mark.parametrize("method", ["barter", "static", "rigl", "s2vite"])
def test_a_dropped_training_setup_is_collected_with_its_model(method):
    """Gradient hooks live in C++, out of the garbage collector's sight: a hook that held the
    statistics would keep every dropped model (and its optimizer state) in memory."""
    import gc
    import weakref

    from barter_mini.measure.bench import build_training_step

    setup = build_training_step("cct-mini", method, 0.3, batch=4, total_steps=100, device=torch.device("cpu"))
    setup()
    model, optimizer = weakref.ref(setup.model), weakref.ref(setup.optimizer)
    del setup
    gc.collect()
    assert model() is None and optimizer() is None


def test_statistics_still_gather_while_their_owner_holds_them(tiny_config):
    model = tiny_model(tiny_config)
    statistics = UnitStatistics(model)
    inputs, targets = batch(tiny_config)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    assert all(int(s.age.max()) == 1 for layers in statistics.layers.values() for s in layers)


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_per_unit_sums_run_under_deterministic_algorithms_by_default_and_only_there(tiny_config, monkeypatch,
                                                                                        deterministic):
    """On a GPU ``index_add_`` adds with atomics unless PyTorch's deterministic algorithms are
    on; the statistics turn them on for their sums alone (by default), the same sums on the CPU."""
    seen = []
    original = torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda self, *args: seen.append(
        torch.are_deterministic_algorithms_enabled()) or original(self, *args))
    model = tiny_model(tiny_config)
    stats = UnitStatistics(model, deterministic=deterministic)
    x, y = batch(tiny_config)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert seen == [deterministic] * 2 and not torch.are_deterministic_algorithms_enabled()
    twin = tiny_model(tiny_config)
    twin.load_state_dict(model.state_dict())
    twin_stats = UnitStatistics(twin, deterministic=not deterministic)
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    for kind in stats.layers:
        for ours, theirs in zip(stats.layers[kind], twin_stats.layers[kind]):
            assert torch.equal(ours.pruning_ema, theirs.pruning_ema) and torch.equal(ours.growth_ema, theirs.growth_ema)
