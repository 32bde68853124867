"""Measurement primitives and barter-mini bench."""

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from barter_mini.cli import main
from barter_mini.core.counting import counted_training_gflops_per_image, forward_flops_per_image
from barter_mini.core.models import build_model, get_model_config
from barter_mini.measure.bench import bench, build_training_step, check_bench_arguments, graph_cost, update_cost
from barter_mini.measure.bench_report import execution_effects, fixed_work, format_report, ratios, step_ratios
from barter_mini.measure.memory import step_memory, tensor_bytes
from barter_mini.measure.breakdown import CATEGORIES, FIXED, ideal_without_fixed_work, step_profile
from barter_mini.measure.timing import interleaved_times
from barter_mini.training.graphs import GraphedStep

KEYS = {"method", "density", "step_ms", "epoch_s", "peak_mem_mb", "train_gflops_per_image", "params"}


@pytest.fixture(scope="module")
def rows():
    return bench("cct-mini", ["dense", "rigl", "s2vite", "static", "barter"], [0.3], batch=8, steps=2,
                 warmup=1, segment_steps=1, update_samples=1, device="cpu", progress=False)


def test_bench_rows_follow_the_paper_pattern(rows):
    by = {r["method"]: r for r in rows}
    assert [r["method"] for r in rows] == ["dense", "rigl", "s2vite", "static", "barter"]
    assert all(KEYS <= set(r) for r in rows)
    assert by["dense"]["density"] == 1.0 and by["barter"]["density"] == 0.3
    # masked methods execute and (unstructured) export the dense model
    assert by["rigl"]["train_gflops_per_image"] == by["dense"]["train_gflops_per_image"]
    assert by["rigl"]["params"] == by["dense"]["params"]
    assert by["s2vite"]["params"] == by["barter"]["params"] == by["static"]["params"] < by["dense"]["params"]
    assert by["barter"]["train_gflops_per_image"] < 0.5 * by["dense"]["train_gflops_per_image"]
    assert by["barter"]["peak_mem_mb"] < 0.6 * by["rigl"]["peak_mem_mb"]
    assert by["barter"]["update_ms"] > 0 and by["barter"]["updates_per_schedule"] > 0
    assert by["barter"]["update_units_moved"] > 0          # the timed update really moved units
    assert by["static"]["update_ms"] == 0 and by["dense"]["updates_per_schedule"] == 0
    assert all(r["step_ms"] > 0 and r["epoch_s"] > 0 for r in rows)


def test_ratios_and_report(rows):
    (ratio,) = ratios(rows)
    by = {r["method"]: r for r in rows}
    assert ratio["ideal_speedup"] == pytest.approx(by["rigl"]["train_gflops_per_image"]
                                                   / by["barter"]["train_gflops_per_image"])
    assert ratio["speedup"] == pytest.approx(by["rigl"]["step_ms"] / by["barter"]["step_ms"])
    report = format_report(rows)
    assert "rho=0.3: BARTER is" in report and "FLOPs-ideal" in report
    (steps,) = step_ratios(rows)
    assert steps["static"] == pytest.approx(by["barter"]["step_ms"] / by["static"]["step_ms"])
    assert steps["dense"] == pytest.approx(by["barter"]["step_ms"] / by["dense"]["step_ms"])   # dense at rho 1
    assert steps["rigl"] == pytest.approx(1 / ratio["speedup"])
    assert f"rho=0.3: BARTER's step is {steps['static']:.3f}x static's" in report


def test_counter_figure_is_between_two_and_three_forwards():
    model = build_model(get_model_config("cct-mini"), 0.5)
    forward = forward_flops_per_image(model) / 1e9
    assert 2 * forward < counted_training_gflops_per_image(model) <= 3 * forward
    assert all(p.grad is None for p in model.parameters())     # counted on a copy


def test_step_memory_counts_what_a_step_holds():
    def measured(batch, method="static"):
        setup = build_training_step("cct-mini", method, 0.3, batch, 1000, torch.device("cpu"))
        return step_memory(setup, setup.model, setup.optimizer, setup.controller), setup

    small, setup = measured(4)
    large, _ = measured(16)
    params = sum(p.numel() for p in setup.model.parameters()) * 4 / 1024 ** 2
    assert small["params_mb"] == pytest.approx(params)
    assert small["grads_mb"] == pytest.approx(params)
    assert small["optimizer_mb"] == pytest.approx(2 * params, rel=1e-3)   # exp_avg and exp_avg_sq
    # activations grow with the batch; parameters do not
    assert large["saved_activations_mb"] == pytest.approx(4 * small["saved_activations_mb"], rel=0.1)
    assert large["params_mb"] == small["params_mb"]
    rigl, _ = measured(4, "rigl")
    assert rigl["method_state_mb"] > 0 and small["method_state_mb"] == 0   # RigL's masks


def test_tensor_bytes_counts_shared_storage_once():
    base = torch.zeros(100)
    assert tensor_bytes([base, base[:10], base.view(10, 10)]) == 400
    assert tensor_bytes([base, torch.zeros(5)]) == 420


def test_interleaving_rotates_the_order():
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = interleaved_times(steps, rounds=3, warmup=1)
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert [calls[i] for i in (0, 3, 6, 9)] == ["a", "b", "c", "a"]


def test_bench_command_line(capsys, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "cct-mini", "--methods", "static,barter", "--densities", "0.5",
                 "--batch", "4", "--steps", "1", "--warmup", "0", "--segment-steps", "1",
                 "--update-samples", "1", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["density"]) for r in printed] == [("static", 0.5), ("barter", 0.5)]
    assert json.loads(out.read_text()) == printed
    assert main(["bench", "--model", "cct-mini", "--methods", "lottery"]) == 2
    assert "unknown method 'lottery'" in capsys.readouterr().err


def test_profile_charges_every_operator_to_one_category():
    """The categories add up to the profiled total, every kind of work of a step is seen, and
    the method's own work is its own. Nothing here compares measured durations (under load
    they can come out in any order): the speed comparison is the bench's."""
    profiles = {}
    for method, density in (("rigl", 0.3), ("barter", 0.1)):
        setup = build_training_step("cct-mini", method, density, 8, 1000, torch.device("cpu"))
        setup()
        profiles[method] = step_profile(setup, steps=2)
    for profile in profiles.values():
        assert set(profile) == set(CATEGORIES) | {"total"}
        assert profile["total"] == pytest.approx(sum(profile[c] for c in CATEGORIES))
        assert all(profile[c] > 0 for c in ("matmul", "attention", "layernorm", "stem", "elementwise", "optimizer"))
    assert profiles["barter"]["method"] > 0 and profiles["rigl"]["method"] > 0   # statistics hooks; masking
    fixed = ideal_without_fixed_work(profiles["barter"], profiles["rigl"], ideal_speedup=4.0)
    assert 0 < fixed["fixed_share"] < 1


def test_fixed_work_is_taken_out_of_both_steps():
    """``(T_theirs - F_theirs) / (T_ours - F_ours)`` on made-up profiles (ms)."""
    ours = {c: 0.0 for c in CATEGORIES} | {"matmul": 2.0, "layernorm": 1.0, "stem": 1.0, "total": 4.0}
    theirs = {c: 0.0 for c in CATEGORIES} | {"matmul": 8.0, "layernorm": 1.0, "stem": 1.0, "total": 10.0}
    fixed_ms = sum(ours[c] for c in FIXED)
    result = ideal_without_fixed_work(ours, theirs, ideal_speedup=4.0)
    assert result["fixed_ms"] == fixed_ms and result["profiled_speedup"] == 2.5
    assert result["speedup_without_fixed"] == pytest.approx((10.0 - fixed_ms) / (4.0 - fixed_ms))
    assert result["efficiency_without_fixed"] == pytest.approx(result["speedup_without_fixed"] / 4.0)
    assert result["speedup_without_fixed"] > result["profiled_speedup"]  # fixed work narrows the gap


def test_bench_measures_executions_side_by_side(capsys):
    rows = bench("cct-mini", ["rigl", "barter"], [0.3], batch=8, steps=2, warmup=1, segment_steps=1,
                 update_samples=1, device="cpu", progress=False, executions=["eager", "recompute"],
                 profile_steps=1)
    assert [(r["method"], r["execution"]) for r in rows] == [
        ("rigl", "eager"), ("barter", "eager"), ("rigl", "recompute"), ("barter", "recompute")]
    by = {(r["method"], r["execution"]): r for r in rows}
    for method in ("rigl", "barter"):     # the same function, fewer saved activations
        assert by[method, "recompute"]["saved_activations_mb"] < by[method, "eager"]["saved_activations_mb"]
        assert by[method, "recompute"]["train_gflops_per_image"] == by[method, "eager"]["train_gflops_per_image"]
        assert by[method, "recompute"]["compile_s"] == 0
    assert [r["execution"] for r in ratios(rows)] == ["eager", "recompute"]
    effects = execution_effects(rows)
    assert {(e["method"], e["execution"]) for e in effects} == {("rigl", "recompute"), ("barter", "recompute")}
    assert all(e["memory_fraction"] < 1 for e in effects)
    assert [f["execution"] for f in fixed_work(rows)] == ["eager", "recompute"]
    report = format_report(rows)
    assert "rho=0.3 (recompute): BARTER is" in report and "of eager's" in report and "fixed width-D work" in report


def test_bench_measures_each_execution_in_each_precision():
    rows = bench("cct-mini", ["static", "barter"], [0.3], batch=4, steps=1, warmup=1, segment_steps=1,
                 update_samples=1, device="cpu", progress=False, precisions=["fp32", "bf16"])
    assert [(r["method"], r["execution"]) for r in rows] == [
        ("static", "eager"), ("barter", "eager"), ("static", "bf16"), ("barter", "bf16")]
    assert [e["execution"] for e in execution_effects(rows)] == ["bf16", "bf16"]
    assert [r["execution"] for r in step_ratios(rows)] == ["eager", "bf16"]


def test_the_profiler_writes_no_log_lines_to_stderr():
    """Kineto logs each profiler start and stop (and, without a GPU, an error) to stderr,
    which the book's pages would show; importing the breakdown module silences it."""
    import subprocess
    import sys

    code = ("import os; os.environ.pop('KINETO_LOG_LEVEL', None)\n"
            "import torch, barter_mini.measure.breakdown\n"
            "from torch.profiler import profile, ProfilerActivity\n"
            "with profile(activities=[ProfilerActivity.CPU]):\n"
            "    torch.ones(4, 4) @ torch.ones(4, 4)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "profiler_start" not in result.stderr and "gpuGetDeviceCount" not in result.stderr, result.stderr


def test_the_gpu_check_plans_every_case_and_refuses_a_machine_without_a_gpu(monkeypatch):
    from barter_mini.errors import BarterError
    from barter_mini.measure.bench import check_bench_arguments
    from barter_mini.measure.gpu_check import GPU_CHECK, GPU_EXECUTIONS, run_gpu_check
    planned = {case.model: check_bench_arguments(case.model, case.methods, case.densities, case.batch, 1,
                                                 GPU_EXECUTIONS) for case in GPU_CHECK}
    cct = planned["cct-paper"]
    assert {e for _, _, e in cct} == {"eager", "bf16", "bf16+graphs"}
    graphed = {m for m, _, e in cct if e == "bf16+graphs"}
    assert graphed == {m for m, _, e in cct if e == "eager"} >= {"dense", "rigl", "s2vite", "static", "barter"}
    # per execution dense once, then each method at each density
    assert len(planned["timm:vit_small_patch16_224"]) == 3 * (1 + 3 * 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BarterError, match="measures a CUDA GPU"):
        run_gpu_check()
    with pytest.raises(BarterError, match="needs a CUDA device"):
        bench("cct-mini", ["barter"], [0.3], batch=2, steps=1, device="cpu", progress=False, executions=["graphs"])


def test_the_bench_reports_what_recording_graphs_costs_over_a_schedule():
    """Under graphs (the host stand-in of test_graphs, whose graph pool holds 1 MiB once recorded)
    every sampled update is followed by a recording; the schedule's cost is one recording at
    the start and one after each update, and the graph's memory is its pool's size.
    Without graphs every column is zero."""
    from test_graphs import HostBackend

    class Reserving(HostBackend):
        pool = 0

        def capture(self, graph, body):
            super().capture(graph, body)
            self.pool = 2**20                     # each recording's pool: the same size

        def pool_bytes(self):
            return self.pool

    setup = build_training_step("cct-mini", "barter", 0.5, 4, 400, torch.device("cpu"))
    setup.parts = replace(setup.parts, graphed=GraphedStep(setup.model, setup.optimizer, setup.parts.criterion,
                                                           setup.controller, setup.execution, Reserving(setup)))
    for _ in range(3):
        setup()
    assert (setup.graphed.captures, setup.graphed.eager_steps, setup.graphed.replays) == (1, 1, 2)
    updates = update_cost(setup, 2, torch.device("cpu"))
    assert updates["update_units_moved"] > 0 and len(updates["capture_s"]) == 2
    assert setup.graphed.captures == 3
    cost = graph_cost(setup, updates)
    assert cost["capture_ms"] == pytest.approx(1000 * statistics.median(updates["capture_s"]))
    assert cost["capture_s_per_schedule"] == pytest.approx(cost["capture_ms"] / 1000 * (1 + updates["updates_per_schedule"]))
    assert cost["graph_memory_mb"] == 1.0
    assert cost["replayed"] and cost["graph_replays"] == setup.graphed.replays > 0
    assert (cost["graph_captures"], cost["graph_fallbacks"]) == (3, 0)
    eager = build_training_step("cct-mini", "barter", 0.5, 4, 400, torch.device("cpu"))
    assert graph_cost(eager, update_cost(eager, 1, torch.device("cpu"))) == {
        "capture_ms": 0.0, "capture_s_per_schedule": 0.0, "graph_memory_mb": 0.0, "replayed": False}


def test_a_graphs_row_that_never_replayed_says_so_and_its_peak_holds_the_graph_pool():
    """A graphs case whose every recording failed timed eager steps: its row says
    ``replayed`` False and counts the fallbacks. A replayed row's peak adds the pool's
    reserved bytes that no live tensor holds (a replay's activations), not the whole pool."""
    from test_graphs import HostBackend

    from barter_mini.measure.bench import replay_columns, with_graph_pool

    class Failing(HostBackend):
        def capture(self, graph, body):
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    setup = build_training_step("cct-mini", "static", 0.5, 4, 400, torch.device("cpu"))
    setup.parts = replace(setup.parts, graphed=GraphedStep(setup.model, setup.optimizer, setup.parts.criterion,
                                                           setup.controller, setup.execution, Failing(setup)))
    for _ in range(4):
        setup()
    assert replay_columns(setup) == {"replayed": False, "graph_captures": 0, "graph_replays": 0,
                                     "graph_eager_steps": 4, "graph_fallbacks": 1}

    class Pool:
        def pool_usage(self):
            return 48 * 2**20, 16 * 2**20      # 48 MiB reserved, 16 held by the graph's outputs and gradients

    memory = with_graph_pool({"peak_mem_mb": 100.0, "peak_source": "torch.cuda.max_memory_allocated"}, Pool())
    assert memory["peak_mem_mb"] == 132.0 and memory["graph_pool_mb"] == 48.0
    assert memory["peak_source"] == "torch.cuda.max_memory_allocated + the graph pool's reserve"


def test_the_gpu_check_fits_its_budget_by_count():
    """Its steps at its models' training FLOPs, its cases and updates at the assumed rates of
    an H100-class GPU: within BUDGET_S (five minutes); the plan prints the estimate."""
    from barter_mini.measure import gpu_check
    estimate = gpu_check.estimated_seconds()
    assert 60 < estimate < gpu_check.BUDGET_S == 300
    one_case = (gpu_check.GpuCase("cct-mini", 8, ("barter",), (0.5,)),)
    fixed = len(gpu_check.GPU_EXECUTIONS) * (gpu_check.ASSUMED_CASE_S + 2 * gpu_check.ASSUMED_UPDATE_S)
    assert fixed < gpu_check.estimated_seconds(one_case) < fixed + 0.01
    assert f"estimated {gpu_check.estimated_seconds(one_case) / 60:.1f} min" in gpu_check.check_plan(one_case)


def test_the_gpu_check_writes_each_group_as_it_finishes_and_loses_only_the_failing_methods_rows(
        monkeypatch, tmp_path, capsys):
    """On a machine without a GPU the measurement is replaced, nothing else: in one group
    BARTER's recording fails (the group is measured method by method: RigL's rows keep their
    graphs, BARTER's are measured again without graphs, both marked), another group fails
    entirely (one row per case with its one-line error), and the rows of every group before
    are already on disk when the next one starts."""
    import json

    from barter_mini.measure import gpu_check

    cases = (gpu_check.GpuCase("cct-mini", 8, ("dense", "rigl", "barter"), (0.3, 0.5, 0.7)),)
    out = tmp_path / "gpu.json"
    seen_on_disk = []

    def measure(model, methods, densities, executions, **settings):
        seen_on_disk.append(len(json.loads(out.read_text())) if out.exists() else 0)
        if densities == [0.5] and "barter" in methods and "bf16+graphs" in executions:
            raise RuntimeError("CUDA graph capture failed: operation not permitted when stream is capturing\nmore")
        if densities == [0.7]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return [{"model": model, "method": m, "density": d, "execution": e, "step_ms": 1.0}
                for m, d, e in check_bench_arguments(model, methods, densities, 8, 1, executions)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    rows = gpu_check.run_gpu_check(progress=False, cases=cases, out=out,
                                   measure_one=lambda case, target: gpu_check.measure_model(case, target, measure))
    assert capsys.readouterr().out.startswith("paper-gpu: 3 groups, 21 cases, about 546 training steps")
    assert json.loads(out.read_text()) == rows
    first = [r for r in rows if r["density"] in (0.3, 1.0)]
    assert len(first) == 3 * 3 and not any("fallback" in r or "error" in r or "measured_alone" in r for r in first)
    failed_together = "after RuntimeError: CUDA graph capture failed: operation not permitted when stream is capturing"
    rigl = [r for r in rows if r["density"] == 0.5 and r["method"] == "rigl"]
    assert [r["execution"] for r in rigl] == list(gpu_check.GPU_EXECUTIONS)
    assert all(r["measured_alone"] == failed_together and "fallback" not in r for r in rigl)
    barter = [r for r in rows if r["density"] == 0.5 and r["method"] == "barter"]
    assert [r["execution"] for r in barter] == ["eager", "bf16"]
    assert all(r["fallback"] == "without graphs " + failed_together for r in barter)
    failed = [r for r in rows if r["density"] == 0.7]
    assert len(failed) == 6 and all(r["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
                                    for r in failed)
    assert seen_on_disk == [0, 9, 9, 9, 9] + [14] * 5   # each group's rows were on disk before the next began
    assert all(row["group_s"] >= 0 for row in rows)


def test_a_model_whose_process_dies_keeps_what_it_wrote_and_the_next_model_is_measured(monkeypatch, tmp_path):
    """One process per model: the first dies after writing one row (as a sticky CUDA error
    ends a process), and every case it did not measure gets an error row naming its last
    error line; the second model's process runs and its rows follow."""
    import json
    import sys

    from barter_mini.measure import gpu_check

    cases = (gpu_check.GpuCase("cct-mini", 8, ("rigl", "barter"), (0.5,)),
             gpu_check.GpuCase("vit-mini", 8, ("barter",), (0.5,)))
    script = """
import json, sys
from pathlib import Path
case, out = json.loads(sys.argv[1]), Path(sys.argv[2])
rows = json.loads(out.read_text()) if out.exists() else []
new = [{"model": case["model"], "method": "barter", "density": 0.5, "execution": e, "step_ms": 1.0}
       for e in ("eager", "bf16", "bf16+graphs")]
if case["model"] == "cct-mini":
    out.write_text(json.dumps(rows + new[:1]))
    print("Traceback (most recent call last):", file=sys.stderr)
    print("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
    print("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", file=sys.stderr)
    sys.exit(1)
out.write_text(json.dumps(rows + new))
"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "gpu.json"
    rows = gpu_check.run_gpu_check(progress=False, cases=cases, out=out, measure_one=lambda case, target: (
        gpu_check.model_in_own_process(case, target, lambda c, o: [sys.executable, "-c", script,
                                                                  json.dumps({"model": c.model}), str(o)])))
    assert json.loads(out.read_text()) == rows
    cct = [r for r in rows if r["model"] == "cct-mini"]
    assert len(cct) == 6 and [r for r in cct if "error" not in r] == [
        {"model": "cct-mini", "method": "barter", "density": 0.5, "execution": "eager", "step_ms": 1.0}]
    assert {r["error"] for r in cct if "error" in r} == {
        "the measuring process failed: torch.AcceleratorError: CUDA error: an illegal memory access was encountered"}
    vit = [r for r in rows if r["model"] == "vit-mini"]
    assert len(vit) == 3 and not any("error" in r for r in vit)


def test_the_paper_gpu_report_reads_past_error_rows_and_the_command_exits_0(rows, monkeypatch, tmp_path, capsys):
    """A complete check with failed cases: the report reads the measured rows (BARTER against
    RigL), lists each failed case in one line, marks a graphs row that never replayed, and
    ``bench --profile paper-gpu`` exits 0 having written every row."""
    import json

    from barter_mini import cli
    from barter_mini.measure import gpu_check

    checked = [dict(row, execution="bf16") for row in rows]
    checked += [dict(row, execution="bf16+graphs", replayed=row["method"] != "rigl") for row in rows]
    checked += [{"model": "cct-mini", "method": "barter", "density": 0.5, "execution": "bf16", "batch": 8,
                 "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}]
    monkeypatch.setattr(gpu_check, "run_gpu_check", lambda *args, **kwargs: checked)
    assert cli.main(["bench", "--profile", "paper-gpu", "--out", str(tmp_path / "gpu.json")]) == 0
    report = capsys.readouterr().out
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["method"], r["execution"], r.get("error")) for r in written] == [
        (r["method"], r["execution"], r.get("error")) for r in checked]
    assert "rho=0.3 (bf16): BARTER is" in report and "rho=0.3 (bf16+graphs): BARTER is" in report
    assert report.count("(never replayed: eager steps)") == 1
    assert report.splitlines()[-1] == ("not measured: barter rho=0.5 bf16: OutOfMemoryError: CUDA out of memory. "
                                       "Tried to allocate 2 GiB")


def test_the_gpu_check_runs_from_the_source_tree_with_the_machines_own_python(tmp_path):
    """The documented offline form: no install, the repository on PYTHONPATH; on a machine
    without a GPU it stops with its one-line reason and writes nothing."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "barter_mini.cli", "bench", "--profile", "paper-gpu", "--out",
                             str(tmp_path / "gpu.json")], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(repo), "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert result.returncode != 0 and "measures a CUDA GPU" in result.stderr and not (tmp_path / "gpu.json").exists()
    assert "PYTHONPATH=. python3 -m barter_mini.cli bench --profile paper-gpu" in (repo / "README.md").read_text()
