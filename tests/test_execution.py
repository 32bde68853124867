"""How a step executes (``--compile``, ``--recompute``): the plain model's function and
gradients either way, and a schedule of topology updates does not recompile the compiled
layers at every update."""

import copy
import math

import pytest
import torch

from barter_mini.core import compilation
from barter_mini.core.compilation import compile_layers, graphs_compiled, is_compiled
from barter_mini.core.execution import EXECUTIONS, Execution
from barter_mini.core.models import build_model, get_model_config
from barter_mini.core.surgery import regather_units, unit_count
from barter_mini.core.unit_statistics import UnitStatistics
from barter_mini.errors import BarterError
from barter_mini.measure.bench import build_training_step, check_bench_arguments
from barter_mini.measure.memory import step_memory
from barter_mini.training.checkpoints import load_checkpoint
from barter_mini.training.step import training_step
from barter_mini.training.trainer import RunConfig, build_training, train, train_step


def outputs_and_gradients(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_inductor_compiled_layers_match_the_plain_model():
    """The real backend (inductor, C++ kernels): outputs and every gradient agree with the
    eager model to float32 rounding, in training and in evaluation."""
    torch.manual_seed(0)
    plain = build_model(get_model_config("cct-mini"), 0.3)
    compiled = compile_layers(copy.deepcopy(plain))
    assert is_compiled(compiled) and not is_compiled(plain)
    assert compiled.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(8, 1, 28, 28)
    out, grads = outputs_and_gradients(compiled, x)
    expected, expected_grads = outputs_and_gradients(plain, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(compiled.eval()(x), plain.eval()(x), rtol=1e-5, atol=1e-5)


@pytest.fixture
def aot_eager(monkeypatch):
    """The same Dynamo graphs and guards without inductor's C++ compile (seconds, not minutes)."""
    monkeypatch.setattr(compilation, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def move_units(model, optimizer, kind: str, donor: int, receiver: int, count: int) -> None:
    """The surgery of one transfer: ``donor`` loses its last ``count`` units, ``receiver``
    gains clones of its first ones (tensors and optimizer state resized, as BARTER does)."""
    have = [unit_count(block, kind) for block in model.blocks]
    regather_units(model.blocks[donor], kind, torch.arange(have[donor] - count),
                   torch.ones(have[donor] - count), optimizer)
    regather_units(model.blocks[receiver], kind, torch.arange(have[receiver] + count) % have[receiver],
                   torch.ones(have[receiver] + count), optimizer)


@pytest.mark.parametrize("model_name", ["cct-mini", "vit-mini"])
def test_a_schedule_of_topology_updates_reuses_a_few_graphs(aot_eager, model_name):
    """Transfers change the layers' head and channel counts at every update; with symbolic
    shapes the layers share a handful of graphs (one-head layers, the first layer's input
    layout, ...) and once those exist an update compiles nothing; the gradients still match
    an eager model holding the same weights."""
    setup = build_training_step(model_name, "static", 0.3, 8, 4000, torch.device("cpu"),
                                execution=Execution(compile=True))
    start = graphs_compiled()
    setup()
    generator = torch.Generator().manual_seed(0)
    allocations, per_update = [setup.model.allocation()], []
    for update in range(16):
        kind = ("heads", "ffn")[update % 2]
        have = [unit_count(block, kind) for block in setup.model.blocks]
        # heads leave layer 0 until it has one (a shape Dynamo specialises), channels the widest layer
        donor = 0 if kind == "heads" and have[0] > 1 else max(range(len(have)), key=have.__getitem__)
        receiver = int(torch.randint(len(have), (1,), generator=generator))
        if receiver == donor:
            receiver = (donor + 1) % len(have)
        move_units(setup.model, setup.optimizer, kind, donor, receiver, 1 if kind == "heads" else 3)
        before = graphs_compiled()
        setup()
        per_update.append(graphs_compiled() - before)
        allocations.append(setup.model.allocation())
    assert all(a != b for a, b in zip(allocations, allocations[1:])), "every update should change shapes"
    assert len(set(allocations)) >= 10
    assert any(1 in allocation.heads for allocation in allocations), "a one-head layer should have occurred"
    assert graphs_compiled() - start <= 8, per_update
    assert sum(per_update[8:]) == 0, per_update
    plain = build_model(setup.model.config, allocation=setup.model.allocation())
    plain.load_state_dict(setup.model.state_dict())
    out, grads = outputs_and_gradients(setup.model, setup.x)
    expected, expected_grads = outputs_and_gradients(plain, setup.x)
    torch.testing.assert_close(out, expected)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)


def test_train_with_compile_or_recompute(aot_eager, tmp_path):
    run = dict(method="barter", model="cct-mini", dataset="digits", density=0.5, seed=1,
               recipe="smoke", epochs=1, progress=False)
    metrics = train(RunConfig(**run, compile=True), tmp_path / "compiled")
    plain = train(RunConfig(**run), tmp_path / "plain")
    assert metrics["run"]["compile"] and not metrics["run"]["recompute"]
    assert metrics["graphs_compiled"] >= 1 and plain["graphs_compiled"] == 0
    assert metrics["transfers_executed"] == plain["transfers_executed"]
    assert metrics["test_acc"] == pytest.approx(plain["test_acc"], abs=0.05)
    # recomputation rebuilds the very tensors it did not keep: the run is the plain one, bit for bit
    recomputed = train(RunConfig(**run, recompute=True), tmp_path / "recomputed")
    for key in ("test_acc", "val_acc", "allocation_history", "transfers_executed", "update_losses"):
        assert recomputed[key] == plain[key], key
    assert recomputed["graphs_compiled"] == 0


def test_executions_and_their_bad_names():
    assert list(EXECUTIONS) == ["eager", "compiled", "recompute", "graphs", "bf16", "compiled+bf16", "recompute+bf16",
                               "bf16+graphs", "fp16", "compiled+fp16", "recompute+fp16"]
    cases = check_bench_arguments("cct-mini", ["dense", "barter"], [0.3], 4, 1, ["eager", "compiled"])
    assert cases == [("dense", 1.0, "eager"), ("barter", 0.3, "eager"),
                     ("dense", 1.0, "compiled"), ("barter", 0.3, "compiled")]
    with pytest.raises(BarterError, match="unknown execution 'fast'"):
        check_bench_arguments("cct-mini", ["barter"], [0.3], 4, 1, ["fast"])
    with pytest.raises(BarterError, match="compile must be true or false"):
        RunConfig(compile="yes").validate()
    with pytest.raises(BarterError, match="cannot be combined"):
        RunConfig(compile=True, recompute=True).validate()
    with pytest.raises(BarterError, match="unknown precision 'fp8': choose one of bf16, fp16, fp32"):
        RunConfig(precision="fp8").validate()
    with pytest.raises(BarterError, match="--cuda-graphs cannot be combined with precision fp16"):
        RunConfig(precision="fp16", cuda_graphs=True).validate()
    cases = check_bench_arguments("cct-mini", ["barter"], [0.3], 4, 1, ["eager", "graphs"], precisions=["bf16", "fp16"])
    assert [case[2] for case in cases] == ["bf16", "bf16+graphs", "fp16"]
    with pytest.raises(BarterError, match="precision fp16 cannot run from CUDA graphs"):
        check_bench_arguments("cct-mini", ["barter"], [0.3], 4, 1, ["graphs"], precisions=["fp16"])
    cases = check_bench_arguments("cct-mini", ["barter"], [0.3], 4, 1, ["eager", "recompute"], precisions=["fp32", "bf16"])
    assert [case[2] for case in cases] == ["eager", "recompute", "bf16", "recompute+bf16"]
    with pytest.raises(BarterError, match="unknown precision 'tf32'"):
        check_bench_arguments("cct-mini", ["barter"], [0.3], 4, 1, precisions=["tf32"])


def test_bf16_autocast_runs_the_forward_in_bf16_and_keeps_fp32_state():
    """Under bf16 the logits come out in bf16 while weights, gradients, Adam's moments and the
    statistics stay fp32; BARTER's update then moves units with the fp32 remap."""
    setup = build_training_step("cct-mini", "barter", 0.5, 4, 200, torch.device("cpu"),
                                execution=EXECUTIONS["bf16"])
    outcome = training_step(setup.model, setup.optimizer, setup.x, setup.y, execution=setup.execution)
    assert outcome.logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in setup.model.parameters())
    moments = [s["exp_avg"] for s in setup.optimizer.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    statistics = setup.controller.statistics
    assert all(t.dtype in (torch.float32, torch.long) for t in statistics.tensors())
    assert int(statistics.layers["ffn"][0].age[0]) == 1


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_train_in_half_precision_moves_units_and_resumes_bitwise(tmp_path, precision):
    """A BARTER run with bf16 or fp16 (loss-scaled) autocast on the CPU: its updates move
    units, its accuracy is the fp32 run's within a few points, and a run stopped mid-way
    resumes bit for bit (under fp16 with the loss scaler's state)."""
    from test_resume import assert_same_run, train_until
    run = dict(method="barter", model="cct-mini", dataset="digits", density=0.5, seed=1,
               recipe="smoke", epochs=2, progress=False)
    half = train(RunConfig(**run, precision=precision), tmp_path / precision)
    fp32 = train(RunConfig(**run), tmp_path / "fp32")
    assert half["run"]["precision"] == precision
    assert sum(half["transfers_executed"].values()) > 0
    assert half["test_acc"] == pytest.approx(fp32["test_acc"], abs=0.1)
    assert half["update_losses"] != fp32["update_losses"]       # the autocast did act
    assert half["steps"] + half["skipped_steps"] == fp32["steps"]
    out = tmp_path / "resumed"
    train_until(RunConfig(**run, precision=precision), 7, out)
    saved = load_checkpoint(out / "last.pt")["scaler"]
    assert (saved is None) == (precision == "bf16") and (saved is None or saved["scale"] > 1)
    train(RunConfig(**run, precision=precision), out, resume=True)
    assert_same_run(tmp_path / precision, out)


def test_fp16_unscales_the_gradients_before_the_statistics_read_them():
    """Under fp16 BARTER's statistics are folded after the gradients are unscaled: the growth
    scores equal those gathered afresh from the gradients the weights hold after the step
    (read while scaled they would be 2**32 times larger; the pruning score, the weights'
    magnitude, was read before the optimizer moved them)."""
    setup = build_training_step("cct-mini", "barter", 0.5, 4, 200, torch.device("cpu"),
                                execution=EXECUTIONS["fp16"])
    outcome = training_step(setup.model, setup.optimizer, setup.x, setup.y, execution=setup.execution,
                            controller=setup.controller, scaler=setup.parts.scaler)
    assert outcome.logits.dtype == torch.float16 and not outcome.skipped
    assert setup.parts.scaler.get_scale() == 2.0 ** 16
    statistics = setup.controller.statistics
    assert not statistics.in_backward and not setup.controller.graph_safe(1)
    afresh = UnitStatistics(setup.model, beta=statistics.beta, pruning_score=statistics.pruning_score,
                            in_backward=False)
    afresh.observe()
    for kind, layers in statistics.layers.items():
        for ours, theirs in zip(layers, afresh.layers[kind]):
            torch.testing.assert_close(ours.growth_ema, theirs.growth_ema, rtol=1e-6, atol=0)
            assert torch.equal(ours.age, theirs.age)
    with pytest.raises(BarterError, match="precision fp16 steps with a loss scaler"):
        training_step(setup.model, setup.optimizer, setup.x, setup.y, execution=setup.execution)


def test_an_fp16_step_whose_gradients_overflow_is_skipped_by_the_optimizer_and_the_method():
    """A scale so large that the fp16 gradients overflow: no weight, moment or statistic
    changes, the scale is halved, the trainer counts the batch as skipped, not as a step."""
    t = build_training(RunConfig(method="barter", model="cct-mini", dataset="digits", density=0.5, seed=1,
                                 recipe="smoke", epochs=1, precision="fp16", progress=False))
    scaler = t.parts.scaler
    scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0 ** 100})
    weights = {name: p.detach().clone() for name, p in t.model.named_parameters()}
    x, y = next(iter(t.loaders[0]))
    loss, _, stepped = train_step(t, x, y)
    assert not stepped and math.isfinite(loss)
    assert (t.progress.step, t.progress.skipped_steps) == (0, 1) and t.progress.train_gflops > 0
    assert scaler.get_scale() == 2.0 ** 99
    assert not t.optimizer.state
    assert int(t.controller.statistics.layers["ffn"][0].age.max()) == 0
    for name, p in t.model.named_parameters():
        assert torch.equal(p, weights[name]), name
    scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0 ** 16})
    assert train_step(t, x, y)[2] and t.progress.step == 1


def test_recompute_rebuilds_the_cct_stem_with_the_same_gradients_and_less_memory():
    torch.manual_seed(0)
    plain = build_model(get_model_config("cct-mini"), 0.3)
    recomputed = Execution(recompute=True).apply(copy.deepcopy(plain))
    assert recomputed.recompute_stem and not plain.recompute_stem
    x = torch.randn(8, 1, 28, 28)
    out, grads = outputs_and_gradients(recomputed, x)
    expected, expected_grads = outputs_and_gradients(plain, x)
    assert torch.equal(out, expected)
    for name, grad in expected_grads.items():
        assert torch.equal(grads[name], grad), name

    def saved_mb(model):
        optimizer = torch.optim.AdamW(model.parameters())
        step = lambda: model(x).square().sum().backward()      # noqa: E731
        return step_memory(step, model, optimizer)["saved_activations_mb"]

    with_stem = saved_mb(recomputed)
    recomputed.recompute_stem = False
    assert with_stem < saved_mb(recomputed) < saved_mb(plain)
