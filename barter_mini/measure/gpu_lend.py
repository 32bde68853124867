"""``barter-mini gpu-lend``: what a first, short GPU lend should measure, as one command.

On a GPU machine where nothing can be installed (only torch, timm with its dependencies,
numpy and scikit-learn), from the source tree::

    PYTHONPATH=. python3 -m barter_mini.cli gpu-lend --minutes 9 --out OUT

in this order, each stage's results written under ``OUT`` as soon as it has them:

1. the graph check (:mod:`~barter_mini.measure.graph_check`): record, release, record again
   for BARTER, RigL and Static, each in a fresh process -> ``graphs.json``;
2. the headline of the GPU check (:mod:`~barter_mini.measure.gpu_check`): the paper's CCT at
   rho 0.1, batch 128, dense, RigL, Static and BARTER in eager fp32, bf16 and bf16 + graphs,
   side by side -> ``gpu.json`` and its text report ``gpu.txt``;
3. the pair (:mod:`~barter_mini.measure.gpu_pair`) in the minutes left, less
   :data:`MARGIN_S` -> ``pair.csv``, one row per finished run.

A stage that fails is reported in one line and the next one runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..training.checkpoints import write_json
from . import gpu_pair
from .bench_report import format_report, step_ratios
from .gpu_check import GpuCase, one_line, run_gpu_check
from .graph_check import METHODS as GRAPH_METHODS
from .processes import child_environment, last_error_line

#: the GPU check's cases a lend measures: the paper's CCT at rho 0.1, the headline ratios
LEND_CHECK = (GpuCase("cct-paper", 128, ("dense", "rigl", "static", "barter"), (0.1,)),)
#: seconds kept back at the end of the lend (the rows' transfer, the machine's release)
MARGIN_S = 30.0


def graph_checks(out: Path, log=print) -> list[dict]:
    """:func:`~barter_mini.measure.graph_check.record_release_record` of every method, each
    in a process of its own; one result per method (its metrics, or its one-line error)."""
    results = []
    for method in GRAPH_METHODS:
        done = subprocess.run([sys.executable, "-m", "barter_mini.measure.graph_check", method],
                              capture_output=True, text=True, env=child_environment())
        if done.returncode == 0:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            log(f"graphs: {method} recorded {results[-1]['graph_captures']} times, replayed "
                f"{results[-1]['graph_replays']} steps, fell back {results[-1]['graph_fallbacks']} times")
        else:
            why = last_error_line(done.stderr.splitlines()) or "no error output"
            results.append({"method": method, "error": why})
            log(f"graphs: {method} failed: {why}")
        write_json(out / "graphs.json", results)
    return results


def headline(rows: list[dict]) -> list[str]:
    """BARTER's step against Static's, RigL's and dense's, per execution (bench_report)."""
    return [f"rho={r['density']:g} {r['execution']}: BARTER's step {r['step_ms']:.2f} ms, "
            + ", ".join(f"{r[other]:.3f}x {other}'s" for other in ("static", "rigl", "dense") if other in r)
            for r in step_ratios([row for row in rows if "error" not in row and "step_ms" in row])]


def run_lend(out: Path, minutes: float = 9.0, jobs: int = 5, log=print) -> dict:
    """The three stages of the module within ``minutes``; what each produced, and under
    ``failed`` the stages that did not finish (a graph check that failed for any method, a
    check or a pair that stopped with an error)."""
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    failed = []
    summary["graphs"] = graph_checks(out, log)
    if any("error" in result for result in summary["graphs"]):
        failed.append("graphs")
    try:
        rows = run_gpu_check(progress=False, cases=LEND_CHECK, out=out / "gpu.json")
        (out / "gpu.txt").write_text(format_report(rows) + "\n")
        summary["check"] = headline(rows)
        for line in summary["check"]:
            log(f"check: {line}")
    except Exception as error:  # noqa: BLE001 -- a failed stage is reported and the next one runs
        summary["check"] = [f"failed: {one_line(error)}"]
        failed.append("check")
        log(f"check: failed: {one_line(error)}")
    left_s = 60 * minutes - (time.perf_counter() - started) - MARGIN_S
    try:
        setting = gpu_pair.PairSetting()
        plan = gpu_pair.plan_pair(setting, gpu_pair.measure_step_seconds(setting), left_s, jobs)
        log(plan.describe())
        rows = gpu_pair.run_pair(plan, out / "pair.csv", out / "runs", log=log)
        summary["pair"] = {"epochs": plan.epochs, "runs": len(plan.runs), "finished": len(rows)}
    except Exception as error:  # noqa: BLE001
        summary["pair"] = {"error": one_line(error)}
        failed.append("pair")
        log(f"pair: failed: {one_line(error)}")
    summary["failed"] = failed
    write_json(out / "lend.json", summary)
    return summary
