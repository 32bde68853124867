"""What each ``barter-mini`` subcommand does with its parsed flags (``cmd_NAME``); the flags
themselves are declared in :mod:`barter_mini.cli`."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import PAPER_TABLE3, compute_budget, full_allocation, initial_allocation
from ..core.counting import count_parameters, training_gflops_per_image
from ..core.models import build_model, get_model_config
from ..training.checkpoints import write_json
from ..training.data import fetch_dataset, load_dataset
from ..training.export import export_run
from ..training.run_inputs import read_train_pflops
from ..training.trainer import train
from .arguments import GRID_SETTINGS, run_from_args
from ..errors import BarterError, printable, shown_path


def _describe(args) -> dict:
    config = get_model_config(args.model)
    budget = compute_budget(config, args.density)
    allocation = initial_allocation(config, budget) if args.density < 1 else full_allocation(config)
    model = build_model(config, allocation=allocation)
    planned = TransferSchedule(1, budget, BarterSettings()).planned_totals()
    paper = PAPER_TABLE3.get((config.name, round(args.density, 3)))
    return {
        "model": config.name, "density": args.density,
        "budget": {"heads": budget.heads, "ffn": budget.ffn},
        "full": {"heads": config.depth * config.heads_per_layer, "ffn": config.depth * config.ffn_per_layer},
        "allocation": allocation.as_dict(),
        "params": count_parameters(model),
        "train_gflops_per_image": training_gflops_per_image(model),
        "transfers_planned": planned,
        "paper_table3": None if paper is None else
        {"heads": paper[0], "ffn": paper[1], "K_H": paper[2], "K_C": paper[3]},
    }


def _print_description(d: dict) -> None:
    print(f"{d['model']} at density {d['density']:g}")
    print(f"  budget        heads {d['budget']['heads']} of {d['full']['heads']}, "
          f"FFN channels {d['budget']['ffn']} of {d['full']['ffn']}")
    if d["paper_table3"]:
        p = d["paper_table3"]
        print(f"  paper Table 3 heads {p['heads']}, FFN channels {p['ffn']}, K_H {p['K_H']}, K_C {p['K_C']}")
    print(f"  transfers     K_H {d['transfers_planned']['heads']}, K_C {d['transfers_planned']['ffn']} (planned, 1x)")
    print("  layer  heads  FFN channels")
    for i, (h, c) in enumerate(zip(d["allocation"]["heads"], d["allocation"]["ffn"])):
        print(f"  {i:5d}  {h:5d}  {c:12d}")
    print(f"  parameters    {d['params']:,} ({d['params'] / 1e6:.4f} M)")
    print(f"  training      {d['train_gflops_per_image']:.4f} GFLOPs/image (3 x forward)")


def cmd_describe(args) -> int:
    description = _describe(args)
    if args.json:
        print(json.dumps(description, indent=2))
    else:
        _print_description(description)
    return 0


def matched_pflops(run_dir: str) -> float:
    """The training PFLOPs the finished run ``run_dir`` recorded (``--match-compute``); a value
    that is no positive finite number is refused in one line naming its metrics.json."""
    try:
        pflops = read_train_pflops(run_dir)
    except BarterError:
        raise
    except (TypeError, ValueError, OverflowError, LookupError):      # a list, None, text: float() of it
        pflops = math.nan
    if not (math.isfinite(pflops) and pflops > 0):
        raise BarterError(f"{Path(run_dir) / 'metrics.json'} records a train_pflops that is no positive number: "
                          "the file is damaged; retrain that run with this version")
    return pflops


def cmd_train(args) -> int:
    if args.pflops is not None and args.match_compute:
        raise BarterError("give either --pflops or --match-compute, not both")
    if args.match_compute:
        args.pflops = matched_pflops(args.match_compute)
    run = run_from_args(args)
    metrics = train(run, args.out, resume=args.resume, checkpoint_every=args.checkpoint_every)
    if os.environ.get("RANK", "0") != "0":      # under torchrun, rank 0 alone reports
        return 0
    if metrics["mask"]:
        changes = (f"masked density {metrics['mask']['density']:.4f} after "
                   f"{metrics['mask']['updates']} mask updates")
    else:
        changes = (f"transfers {metrics['transfers_executed']['heads']} heads / "
                   f"{metrics['transfers_executed']['ffn']} FFN channels")
    print(printable(f"{metrics['method']} {metrics['model']} rho={metrics['density']:g} on {metrics['dataset']}: "
                    f"test acc {metrics['test_acc']:.4f}, test macro-F1 {metrics['test_macro_f1']:.4f}, "
                    f"val acc {metrics['val_acc']:.4f}, wall time {metrics['wall_time_s']:.1f} s, "
                    f"{changes} -> {Path(args.out) / 'metrics.json'}"))
    return 0


def cmd_export(args) -> int:
    summary = export_run(args.run_dir, args.out, args.checkpoint)
    print(printable(f"{summary['method']} rho={summary['density']:g}: {summary['params']:,} parameters, heads "
                    f"{summary['allocation']['heads']}, FFN channels {summary['allocation']['ffn']} -> {summary['out']}"))
    return 0


def cmd_data(args) -> int:
    fetch_dataset(args.dataset, args.data_root, download=args.download, log=lambda line: print(line, file=sys.stderr))
    splits = load_dataset(args.dataset, args.data_root, download=args.download)
    print(f"{args.dataset}: {len(splits.train)} train / {len(splits.val)} val / {len(splits.test)} test "
          f"images of {splits.info.in_chans}x{splits.info.img_size}x{splits.info.img_size}, "
          f"{splits.info.num_classes} classes")
    return 0


def cmd_book(args) -> int:
    from contextlib import nullcontext

    from ..book.build import format_times, run_book_build
    from ..training.sweep import read_only_cache

    # the notebooks' kernels inherit the environment: read_only_cache makes them only read the run cache
    with read_only_cache() if args.cached_only else nullcontext():
        build = run_book_build(args.profile, args.build_dir)       # progress on stderr
    print(format_times(build))
    print(f"built in {build.total_s:.0f} s; open {build.index}")
    return 0


def cmd_notebook(args) -> int:
    from ..book.plans import chapter_parameters
    from .arguments import BOOK_INSTALL, papermill_value

    try:
        from ..book.build import cell_progress, execute_notebook
    except ImportError as missing:
        raise BarterError(f"barter-mini notebook needs {missing.name or missing}, one of the book's libraries: {BOOK_INSTALL}")
    source, target = Path(args.notebook), Path(args.out)
    if source.suffix != ".ipynb" or not source.is_file():
        raise BarterError(f"{shown_path(source)} is no notebook file: give one of notebooks/*.ipynb")
    if target.resolve() == source.resolve():
        raise BarterError(f"{shown_path(target)} is the notebook to run: give another file to write it into")
    overrides = {name: value for mapping in args.parameters_yaml for name, value in mapping.items()}
    overrides.update((name, papermill_value(value)) for name, value in args.parameters)
    profile = overrides.pop("profile", None)
    try:
        parameters = chapter_parameters(source, overrides, profile)
    except BarterError:
        raise
    except (ValueError, KeyError, TypeError, SyntaxError) as error:      # not JSON, no cells, a cell not Python
        raise BarterError(f"{shown_path(source)} is no notebook whose parameters can be read "
                          f"({type(error).__name__}): give one of notebooks/*.ipynb") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    seconds = execute_notebook(source, target, parameters, progress_bar=cell_progress(source.name), keep_failed=True)
    print(printable(f"{target} ({seconds:.0f} s)"))
    return 0


def cmd_overhead(args) -> int:
    from ..measure.timing import statistics_overhead

    result = statistics_overhead(args.model, args.density, args.batch, args.steps, args.warmup)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['model']} rho={result['density']:g} batch {result['batch']} on {result['device']}: "
              f"step {1e3 * result['step_s_without_hooks']:.1f} ms without statistics, "
              f"{1e3 * result['step_s_with_hooks']:.1f} ms with (median of {result['steps']}); "
              f"overhead {result['overhead_percent']:+.2f} %; time inside the hooks "
              f"{result['hook_time_percent']:.2f} % of a step")
    return 0


def cmd_bench(args) -> int:
    from ..measure.bench import bench
    from ..measure.bench_report import format_report

    grid = {name: value for name, value in (("methods", args.methods), ("densities", args.densities))
            if value is not None}                  # unset: bench's own defaults
    executions = list(args.executions or ["eager"])
    executions += [name for name, wanted in (("compiled", args.compile), ("recompute", args.recompute),
                                             ("graphs", args.cuda_graphs))
                   if wanted and name not in executions]
    if args.profile == "paper-gpu":
        from ..measure.gpu_check import run_gpu_check
        rows = run_gpu_check(args.device, progress=not args.json, out=Path(args.out) if args.out else None)
    else:
        rows = bench(args.model, batch=args.batch, steps=args.steps, warmup=args.warmup,
                     segment_steps=args.segment_steps, update_samples=args.update_samples, device=args.device,
                     seed=args.seed, progress=not args.json, executions=executions,
                     profile_steps=args.profile_steps, precisions=args.precision, **grid)
    if args.out:
        write_json(Path(args.out), rows)
    models = list(dict.fromkeys(row["model"] for row in rows))
    print(json.dumps(rows, indent=2) if args.json else
          "\n\n".join(f"== {model}\n" + format_report([r for r in rows if r["model"] == model]) for model in models)
          if len(models) > 1 else format_report(rows))
    return 0


def cmd_gpu_pair(args) -> int:
    """``sweep --profile gpu-pair`` (:mod:`~barter_mini.measure.gpu_pair`): no submitit, one
    ``train`` process per run, so it runs where only torch and timm are installed."""
    import torch

    from ..measure import gpu_pair

    allowed = {"jobs", "seeds", "data_root", "budget_min", "out", "runs_dir", "dry_run", "profile", "func",
               "command", "executor", "commit"}
    given = sorted(f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                   if name not in allowed and value not in (None, False, []))
    if given or args.executor != "local":
        raise BarterError(f"--profile gpu-pair trains its own grid (the paper's CCT, CIFAR-10, rho 0.1, BARTER and "
                          f"Static); it takes --jobs, --seeds, --data-root, --budget-min, --out, --runs-dir, "
                          f"--commit and --dry-run, not {', '.join(given) or '--executor ' + args.executor}")
    if not torch.cuda.is_available():
        raise BarterError("the gpu-pair profile trains on a CUDA GPU and there is none here: on the CPU, sweep a "
                          "grid (--methods static,barter ...) instead")
    setting = gpu_pair.PairSetting(seeds=tuple(args.seeds or gpu_pair.SEEDS), data_root=args.data_root)
    print("gpu-pair: measuring each method's step on this GPU ...", flush=True)
    budget_s = 60 * args.budget_min if args.budget_min is not None else gpu_pair.DEFAULT_BUDGET_S
    plan = gpu_pair.plan_pair(setting, gpu_pair.measure_step_seconds(setting), budget_s, args.jobs)
    print(plan.describe(), flush=True)
    if args.dry_run:
        return 0
    rows = gpu_pair.run_pair(plan, Path(args.out or "gpu-pair.csv"), Path(args.runs_dir or "runs/gpu-pair"),
                             commit=args.commit, log=lambda line: print(line, flush=True))
    print(f"gpu-pair: {len(rows)} of {len(plan.runs)} runs finished", flush=True)
    return 0 if len(rows) == len(plan.runs) else 1


def cmd_gpu_lend(args) -> int:
    from ..measure.gpu_lend import run_lend

    import torch

    if not torch.cuda.is_available():
        raise BarterError("gpu-lend measures a CUDA GPU and there is none here: run it on the lent GPU machine")
    summary = run_lend(Path(args.out), minutes=args.minutes, jobs=args.jobs, log=lambda line: print(line, flush=True))
    failed = summary["failed"]
    print(f"gpu-lend: results in {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def cmd_sweep(args) -> int:
    if args.profile == "gpu-pair":
        return cmd_gpu_pair(args)
    for flag, value in (("--budget-min", args.budget_min), ("--out", args.out), ("--runs-dir", args.runs_dir),
                        ("--commit", args.commit)):
        if value is not None:
            raise BarterError(f"{flag} belongs to --profile gpu-pair")
    from ..training.cache import default_cache_dir
    from ..training.sweep import ExecutorSettings, default_gpus_per_job, default_logs, run_sweep, sweep_grid_stage

    if args.cache_dir:
        # the jobs (child processes, Slurm jobs) and the book's run listings read it from here
        os.environ["BARTER_MINI_CACHE"] = str(Path(args.cache_dir).resolve())
    cache_dir = default_cache_dir().resolve()
    grid_flags = {"--methods": args.methods, "--densities": args.densities, "--seeds": args.seeds,
                  "--model": args.model, "--dataset": args.dataset, "--recipe": args.recipe,
                  "--epochs": args.epochs, "--train-subset": args.train_subset, "--data-root": args.data_root}
    if args.book:
        given = [flag for flag, value in grid_flags.items() if value is not None]
        if given:
            raise BarterError(f"--book trains the notebooks' own runs: leave out {', '.join(given)}")
        from ..book.plans import book_stages

        stages = book_stages(args.book, args.chapters, parameters=dict(args.parameter or []))
    else:
        if args.chapters is not None or args.parameter:
            raise BarterError("--chapters and --parameter choose notebooks of --book PROFILE and their values")
        if not args.methods:
            raise BarterError("give the grid's --methods (and --densities, --seeds), or --book PROFILE "
                              "for the runs the book's notebooks read")
        given = {name: getattr(args, name) for name in GRID_SETTINGS}      # unset: RunConfig's defaults
        stages = sweep_grid_stage(args.methods, args.densities or [0.3], args.seeds or [0],
                                  **{name: value for name, value in given.items() if value is not None})
    settings = ExecutorSettings(
        kind=args.executor, logs=Path(args.logs) if args.logs else default_logs(),
        jobs=args.jobs, partition=args.partition,
        gpus_per_job=default_gpus_per_job(args.executor, args.device, args.gpus_per_job),
        cpus_per_job=args.cpus_per_job, time_min=args.time, array_parallelism=args.array_parallelism,
        threads_per_job=args.threads_per_job)
    report = run_sweep(stages, settings, cache_dir, checkpoint_every=args.checkpoint_every, dry_run=args.dry_run,
                       log=lambda line: print(line, flush=True))
    print(report.summary(), flush=True)
    return 0 if args.dry_run or report.complete else 1
