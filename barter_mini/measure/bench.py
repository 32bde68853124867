"""``barter-mini bench``: what each method costs to train, measured side by side in one run.

For every method and density, on synthetic input of the model's shape (Tables 6-9, 14, 15,
17; Figures 3, 4 and 7):

* ``step_ms``: median of timed optimizer steps (forward, backward, the method's per-step
  work, AdamW), methods interleaved round by round after warm-up
  (:func:`~barter_mini.measure.timing.interleaved_times`);
* ``epoch_s``: a contiguous measured segment of steps, per step, plus the amortised cost of
  the topology updates (and of compiling or recording graphs), times the steps of one epoch
  of the model's paper dataset;
* under CUDA graphs: one recording's milliseconds after an update (``capture_ms``), the
  recordings of a whole paper schedule (``capture_s_per_schedule``) and the graph's own
  memory (``graph_memory_mb``) (:func:`graph_cost`);
* with ``profile_steps`` on a GPU: kernel launches per step and the share of the step the GPU
  was busy (:func:`~barter_mini.measure.breakdown.device_activity`);
* ``peak_mem_mb``: the peak of one real step (:func:`~barter_mini.measure.memory.step_memory`);
* ``train_gflops_per_image``: what the dense kernels execute, in the paper's convention
  (3 x forward), and FlopCounterMode's own forward + backward count beside it; the masked
  methods execute the dense model's FLOPs whatever their density;
* ``params``: parameters of the exported model (its smallest dense form, as ``barter-mini
  export`` writes it) and that model's GFLOPs;
* for BARTER and its variants, the topology updates: the median time of one update at the start of the
  schedule (where the cosine schedule moves the most units), per training step and over a
  whole schedule of the paper's recipe, and as a share of training time (Table 17).

The ratio that matters is BARTER's speedup over RigL beside the FLOPs-ideal one,
``FLOPs(RigL) / FLOPs(BARTER)``: dense kernels on masked tensors do all the dense work.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import torch
from tqdm import tqdm

from ..core.barter_controller import BarterController
from ..core.budgets import check_density, compute_budget
from ..core.compilation import cold_compile, graphs_compiled
from ..core.counting import count_parameters, counted_training_gflops_per_image, training_gflops_per_image
from ..core.execution import EXECUTIONS, LOSS_SCALED, PRECISIONS, Execution
from ..core.models import get_model_config
from ..errors import BarterError, check_integer, choose
from ..training.methods import bench_methods, check_methods, get_method
from ..training.recipes import get_recipe
from ..training.parts import RunParts, parts_for_new_model
from ..training.run_config import RunConfig
from ..training.optimization import resolve_device
from .memory import step_memory
from .breakdown import device_activity, step_profile
from .timing import interleaved_times, timed

#: what one epoch of each paper dataset holds (training images), for seconds per epoch
EPOCH_IMAGES = {"cifar10": 50_000, "cifar100": 50_000, "tiny-imagenet": 100_000, "fashion-mnist": 60_000}
DEFAULT_DENSITIES = (0.1, 0.3, 0.5, 0.7)


@dataclass
class TrainingStep:
    """One method's parts (:class:`~barter_mini.training.parts.RunParts`, as ``train`` builds
    them) on a fixed synthetic batch.

    Calling it performs one optimizer step through the run's own
    :meth:`~barter_mini.training.parts.RunParts.step`, numbered so that no topology update is
    due (steady-state steps); :meth:`run` performs a step of a chosen number.
    """

    method: str
    density: float
    parts: RunParts
    x: torch.Tensor
    y: torch.Tensor
    step: int = 0
    #: the steps at which the controller changes the model (asked once: BARTER scans its schedule)
    changing_steps: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.changing_steps = self.controller.changing_steps()
        self._changing = set(self.changing_steps)

    model = property(lambda self: self.parts.model)
    optimizer = property(lambda self: self.parts.optimizer)
    controller = property(lambda self: self.parts.controller)
    execution = property(lambda self: self.parts.execution)
    graphed = property(lambda self: self.parts.graphed)

    def __call__(self) -> None:
        self.step += 1
        while self.step in self._changing:
            self.step += 1
        self.run(self.step)

    def run(self, step: int, controller_after_step: bool = True) -> None:
        """Optimizer step number ``step``; without ``controller_after_step`` the controller's
        update is not run (and the step runs eagerly: a graph's step ends with it)."""
        self.parts.step(self.x, self.y, step if controller_after_step else None)


def bench_run(model_name: str, method: str, density: float, seed: int = 0,
              execution: Execution = Execution(), device: torch.device = torch.device("cpu")) -> RunConfig:
    """The run whose parts the bench measures: ``method`` on ``model_name`` with the paper
    recipe (learning rate 1e-4, so that timed steps stay finite on random data)."""
    return RunConfig(method=method, model=model_name, density=density, seed=seed, recipe="paper", lr=1e-4,
                     compile=execution.compile, recompute=execution.recompute, precision=execution.precision,
                     cuda_graphs=execution.graphs, device=device.type).validate()


def build_training_step(model_name: str, method: str, density: float, batch: int, total_steps: int,
                        device: torch.device, seed: int = 0, execution: Execution = Execution()) -> TrainingStep:
    """:func:`run_step` of :func:`bench_run`: the parts that ``barter-mini train --method
    METHOD`` would build, with the paper recipe's update schedule over ``total_steps``,
    executed as ``execution`` says (``--compile``, ``--recompute``, ...)."""
    return run_step(bench_run(model_name, method, density, seed, execution, device), batch, total_steps, device)


def run_step(run: RunConfig, batch: int, total_steps: int, device: torch.device) -> TrainingStep:
    """``run``'s parts as the trainer builds them (:func:`~barter_mini.training.parts.build_parts`,
    the same optimizer, controller, loss and execution) on a fixed synthetic batch of the
    model's own input shape, the update schedule laid over ``total_steps``."""
    config = get_model_config(run.model)
    torch.manual_seed(run.seed)
    parts = parts_for_new_model(run, config, total_steps, device)
    generator = torch.Generator().manual_seed(run.seed)
    x = torch.randn(batch, config.in_chans, config.img_size, config.img_size, generator=generator).to(device)
    y = torch.randint(0, config.num_classes, (batch,), generator=generator).to(device)
    return TrainingStep(run.method, run.density, parts, x, y)


def check_bench_arguments(model: str, methods, densities, batch: int, steps: int,
                          executions=("eager",), profile_steps: int = 0,
                          precisions=None) -> list[tuple[str, float, str]]:
    """The (method, density, execution) cases to measure, dense once at rho = 1 (per
    execution); with ``precisions``, each execution in each of them (``eager`` in bf16 is
    ``bf16``; fp16 has no graphs rows); ``methods`` None: the registry's
    :func:`~barter_mini.training.methods.bench_methods`; one-line errors otherwise."""
    config = get_model_config(model)
    methods = check_methods(bench_methods() if methods is None else methods)
    if not densities:
        raise BarterError("--densities must list at least one density in (0, 1]")
    for density in densities:          # every one, even where only dense runs; and before any is measured
        check_density(density)
        if any(not get_method(m).full_width for m in methods):
            compute_budget(config, density)
    check_integer("batch", batch)
    check_integer("steps", steps)
    check_integer("profile_steps", profile_steps, minimum=0)
    if isinstance(executions, str) or not executions:
        raise BarterError(f"executions must list at least one of {', '.join(EXECUTIONS)}")
    for execution in executions:
        choose("execution", execution, EXECUTIONS)
    if precisions is not None:
        if isinstance(precisions, str) or not precisions:
            raise BarterError(f"precisions must list at least one of {', '.join(PRECISIONS)}")
        for precision in precisions:
            choose("precision", precision, PRECISIONS)
        # a loss-scaled precision decides on the host whether to step: it has no graphs rows
        executions = [replace(EXECUTIONS[e], precision=p).name for p in precisions for e in executions
                      if not (EXECUTIONS[e].graphs and p in LOSS_SCALED)]
        if not executions:
            raise BarterError(f"precision {', '.join(precisions)} cannot run from CUDA graphs: "
                              "add an execution without graphs (eager) or bf16")
    executions = list(dict.fromkeys(executions))
    fixed = [(m, get_method(m).fixed_density) for m in methods if get_method(m).fixed_density is not None]
    cases = [(m, check_density(d)) for d in densities for m in methods if get_method(m).fixed_density is None]
    # a method whose steps cannot be replayed (none of the registry's today) has no rows under graphs
    return [(m, d, e) for e in executions for m, d in fixed + cases
            if not EXECUTIONS[e].graphs or get_method(m).replayable]


def compute_and_size(setup: TrainingStep) -> dict:
    """FLOPs the dense kernels execute and the exported model's size (Figure 4, Tables 7, 9, 15)."""
    exported = setup.controller.smallest_dense_form(setup.model, setup.controller.state_dict())
    return {"train_gflops_per_image": training_gflops_per_image(setup.model),
            "counted_train_gflops_per_image": counted_training_gflops_per_image(setup.model),
            "params": count_parameters(exported),
            "exported_train_gflops_per_image": training_gflops_per_image(exported)}


def compute_and_size_rows(model: str = "cct-paper", methods=None, densities=DEFAULT_DENSITIES) -> list[dict]:
    """:func:`compute_and_size` of every method and density, without timing anything."""
    rows = []
    for method, density, _ in check_bench_arguments(model, methods, densities, 1, 1):
        setup = build_training_step(model, method, density, 1, 1000, torch.device("cpu"))
        rows.append({"model": model, "method": method, "density": density, **compute_and_size(setup)})
    return rows


def update_cost(setup: TrainingStep, samples: int, device: torch.device) -> dict:
    """Median seconds of one ``after_step`` at an update step that changes the topology
    (the first ``samples`` such steps of the schedule, where the cosine schedule moves the
    most units; training steps before each so statistics and gradients are current), and
    that cost times the number of such steps over the whole schedule (Table 17).

    ``after_update_step_s`` are the seconds of the first training step after each of those
    updates and the graphs compiled during it: where the layers are compiled, that step
    recompiles whatever graph the new shapes need (none where a graph for their shape class
    exists); ``update_graphs_compiled`` is their sum. Under CUDA graphs that step is the
    replayed step's: an eager warm-up, then the new shapes' graph recorded;
    ``capture_s`` are the recordings' seconds.
    """
    times, after, captures, moved = [], [], [], 0
    graphs_before = graphs_compiled()
    for step in setup.changing_steps[:samples]:
        setup.run(step - 1)                        # the method's bookkeeping sees step - 1
        setup.run(step, controller_after_step=False)
        if isinstance(setup.controller, BarterController):
            _age_statistics(setup.controller, step)
        records = {}
        times.append(timed(lambda: records.update(setup.controller.after_step(step) or {}), device))
        moved += sum(record.executed for record in records.values() if hasattr(record, "executed"))
        graphs = graphs_compiled()
        if setup.graphed is not None:
            recorded = setup.graphed.captures, setup.graphed.capture_seconds
            seconds = timed(lambda: setup.run(step + 1), device)
            if setup.graphed.captures > recorded[0]:
                captures.append(setup.graphed.capture_seconds - recorded[1])
        else:
            seconds = timed(lambda: setup.run(step + 1, controller_after_step=False), device)
        after.append((seconds, graphs_compiled() - graphs))
    median = statistics.median(times)
    return {"update_ms": 1000 * median, "updates_per_schedule": len(setup.changing_steps),
            "update_s_per_schedule": median * len(setup.changing_steps), "update_units_moved": moved,
            "after_update_step_s": after, "update_graphs_compiled": graphs_compiled() - graphs_before,
            "capture_s": captures}


NO_UPDATES = {"update_ms": 0.0, "updates_per_schedule": 0, "update_s_per_schedule": 0.0, "update_units_moved": 0,
              "after_update_step_s": [], "update_graphs_compiled": 0, "capture_s": []}


def graph_cost(setup: TrainingStep, updates: dict) -> dict:
    """What replaying from CUDA graphs costs a run of the paper's schedule: the median
    recording after an update (``updates["capture_s"]``; without updates, the mean of the
    recordings so far), one recording at the start plus one after each of the schedule's
    ``updates_per_schedule`` updates (21 / 61 / 103 / 147 for BARTER's CCT at rho 0.1 / 0.3 /
    0.5 / 0.7 in the paper), and the graph's own memory. Zero without graphs."""
    graphed = setup.graphed
    replays = replay_columns(setup)
    if graphed is None or not graphed.captures:
        return {"capture_ms": 0.0, "capture_s_per_schedule": 0.0, "graph_memory_mb": 0.0, **replays}
    per_capture = (statistics.median(updates["capture_s"]) if updates["capture_s"]
                   else graphed.capture_seconds / graphed.captures)
    return {"capture_ms": 1000 * per_capture,
            "capture_s_per_schedule": per_capture * (1 + updates["updates_per_schedule"]),
            "graph_memory_mb": graphed.memory_bytes / 2**20, **replays}


def replay_columns(setup: TrainingStep) -> dict:
    """Whether a case's steps were replayed from graphs: its recordings, replays, eager steps
    and failed recordings (:meth:`~barter_mini.training.graphs.GraphedStep.metrics`), and
    ``replayed``, true where a graph was replayed at all. A graphs row that did not replay
    timed eager steps, and says so."""
    if setup.graphed is None:
        return {"replayed": False}
    metrics = setup.graphed.metrics()
    return {"replayed": metrics["graph_replays"] > 0,
            **{k: metrics[k] for k in ("graph_captures", "graph_replays", "graph_eager_steps", "graph_fallbacks")}}


def with_graph_pool(memory: dict, backend) -> dict:
    """A replayed step's peak with its graph's pool in it. A replay allocates nothing: the
    recorded step's activations and temporaries sit in the graph's private pool, reserved
    but not counted as allocated once the recording freed them, so
    ``max_memory_allocated`` over a replay leaves them out. Their bytes (the pool's
    reserved less its allocated) are added, so a graphs row's peak compares with an eager
    row's (which counts its activations as allocated)."""
    reserved, allocated = backend.pool_usage()
    mb = 2**20
    return {**memory, "peak_mem_mb": memory["peak_mem_mb"] + (reserved - allocated) / mb,
            "graph_pool_mb": reserved / mb, "peak_source": memory["peak_source"] + " + the graph pool's reserve"}


def compile_cost(first_step_s: float, step_s: float, updates: dict, total_steps: int) -> dict:
    """What compiling costs a whole run of the paper's schedule: the first step's excess over
    a compiled step (tracing and compiling every graph), plus each update's recompilation
    (the excess of the step after it, where that step compiled a graph), the sampled
    updates' mean times every update of the schedule (BARTER's 21 / 61 / 103 / 147 at rho
    0.1 / 0.3 / 0.5 / 0.7 in the paper). That is an upper bound: a graph, once compiled for
    a shape class, is reused, so later updates recompile less than the first ones sampled."""
    compile_s = max(0.0, first_step_s - step_s)
    after = updates["after_update_step_s"]
    # a step that compiled nothing recompiled nothing: its excess is noise, counted as 0
    excess = [max(0.0, seconds - step_s) if graphs else 0.0 for seconds, graphs in after]
    recompile_s = statistics.mean(excess) if excess else 0.0
    per_schedule = compile_s + recompile_s * updates["updates_per_schedule"]
    return {"compile_s": compile_s, "recompile_s_per_update": recompile_s,
            "compile_s_per_schedule": per_schedule, "compile_ms_per_step": 1000 * per_schedule / total_steps}


def _age_statistics(controller, step: int) -> None:
    """Make every unit's statistics as old as they would be at ``step`` of a real run.

    A bench setup has trained a handful of steps, fewer than the ``min_age`` a unit needs
    before it may be pruned, so without this an update would find no donor and time an
    update that moves nothing. The scores themselves are the real ones from those steps.
    """
    for layers in controller.statistics.layers.values():
        for stats in layers:
            stats.age.clamp_(min=min(step, controller.settings.protected_steps))


def timing_columns(setup: TrainingStep, times: list[float], device: torch.device, *, segment_steps: int,
                   update_samples: int, total_steps: int, steps_per_epoch: int, first_step_s: float | None,
                   profile_steps: int) -> dict:
    """One case's timing columns (see the module): its interleaved step ``times`` (median and
    quartiles), a contiguous segment of ``segment_steps``, its updates, its compilation
    (``first_step_s``: the timed first step of a compiled setup), the epoch they add up to,
    and with ``profile_steps`` the profiler's categories."""
    step_s = statistics.median(times)
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [step_s] * 3
    segment_s = timed(lambda: [setup() for _ in range(segment_steps)], device) / segment_steps
    # BARTER's update cost is a target (Table 17); a masked method's is timed once, so
    # that its epoch time includes it too
    samples = update_samples if isinstance(setup.controller, BarterController) else 1
    updates = update_cost(setup, samples, device) if setup.changing_steps else dict(NO_UPDATES)
    compiling = (compile_cost(first_step_s, step_s, updates, total_steps) if setup.execution.compile
                 else compile_cost(0.0, 0.0, NO_UPDATES, total_steps))
    recording = graph_cost(setup, updates)
    update_s_per_step = updates["update_s_per_schedule"] / total_steps
    per_step_s = (segment_s + update_s_per_step + compiling["compile_ms_per_step"] / 1000
                  + recording["capture_s_per_schedule"] / total_steps)
    columns = {"step_ms": 1000 * step_s, "step_ms_q1": 1000 * quartiles[0], "step_ms_q3": 1000 * quartiles[2],
               "segment_ms_per_step": 1000 * segment_s, "steps_per_epoch": steps_per_epoch,
               "epoch_s": per_step_s * steps_per_epoch,
               **updates, "update_ms_per_step": 1000 * update_s_per_step,
               "update_percent_of_training": 100 * update_s_per_step / per_step_s, **compiling, **recording}
    if profile_steps:
        columns.update({f"profile_{category}_ms": ms for category, ms in step_profile(setup, profile_steps).items()})
        if device.type == "cuda":
            columns.update({f"profile_{name}": value for name, value in device_activity(setup, profile_steps).items()})
    return columns


def bench(model: str = "cct-paper", methods=None, densities=DEFAULT_DENSITIES, batch: int = 32,
          steps: int = 5, warmup: int = 2, segment_steps: int = 3, update_samples: int = 3,
          device: str = "auto", seed: int = 0, progress: bool = True, executions=("eager",),
          profile_steps: int = 0, precisions=None) -> list[dict]:
    """Measure every (method, density, execution) of the grid in one run; one row each (see
    the module). ``executions`` are names of :data:`~barter_mini.core.execution.EXECUTIONS`:
    ``eager``, ``compiled``, ``recompute``, ``graphs``, ``bf16``, ...; with ``precisions``
    (``fp32``, ``bf16``), each of them in each precision. With ``profile_steps``,
    each case also runs that many steps under the profiler: ``profile_CATEGORY_ms`` columns
    (:func:`~barter_mini.measure.breakdown.step_profile`)."""
    cases = check_bench_arguments(model, methods, densities, batch, steps, executions, profile_steps, precisions)
    device = resolve_device(device)
    config = get_model_config(model)
    recipe = get_recipe("paper", config.family)
    steps_per_epoch = math.ceil(EPOCH_IMAGES[config.default_dataset] / batch)
    total_steps = recipe.epochs * steps_per_epoch
    bar = tqdm(total=len(cases) * 2 + 1, desc="bench", disable=not progress)

    def build(case) -> TrainingStep:
        method, density, execution = case
        return build_training_step(model, method, density, batch, total_steps, device, seed, EXECUTIONS[execution])

    # Memory first, each setup's first step. On a GPU one setup at a time (built, measured,
    # freed) so that the allocator's peak holds nothing of the others; on the CPU the
    # saved-tensor accounting needs no isolation, and the setups are kept for timing. A
    # compiled setup takes one step first: that step compiles, and it is timed.
    rows, setups, first_step_s = {}, {}, {}
    for case in cases:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        setup = build(case)
        if setup.execution.compile:
            with cold_compile():
                first_step_s[case] = timed(setup, device)
        elif device.type == "cuda":
            setup()                                # so that optimizer state exists during the peak
        memory = step_memory(setup, setup.model, setup.optimizer, setup.controller, device, before)
        if setup.graphed is not None and device.type == "cuda":
            memory = with_graph_pool(memory, setup.graphed.backend)
        rows[case] = {"model": model, "method": case[0], "density": case[1], "execution": case[2],
                      "batch": batch, "device": device.type, **compute_and_size(setup), **memory}
        if device.type != "cuda":
            setups[case] = setup
        del setup
        bar.update()

    # Then time all of them interleaved, and a contiguous segment each.
    if device.type == "cuda":
        setups = {case: build(case) for case in cases}
    for setup in setups.values():
        if setup.execution.compile:    # a later cold compile forgot its graphs: none is compiled in a timed step
            setup()
    times = interleaved_times(setups, steps, warmup, device)
    bar.update()
    for case in cases:            # each setup is let go once measured: the bench holds only what it still measures
        setup = setups.pop(case)
        rows[case].update(timing_columns(setup, times[case], device, segment_steps=segment_steps,
                                         update_samples=update_samples, total_steps=total_steps,
                                         steps_per_epoch=steps_per_epoch, first_step_s=first_step_s.get(case),
                                         profile_steps=profile_steps))
        del setup
        bar.update()
    bar.close()
    return [rows[case] for case in cases]
