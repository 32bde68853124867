"""What ``barter-mini bench`` reports from its rows (:func:`barter_mini.measure.bench.bench`):
BARTER against RigL per density and execution (:func:`ratios`), BARTER's step against
Static's, RigL's and dense's (:func:`step_ratios`), each execution against eager
(:func:`execution_effects`), BARTER's fixed width-D work (:func:`fixed_work`), and the text
report of them all (:func:`format_report`). Rows may come from JSON written by an earlier
version (no ``execution``: eager).
"""

from __future__ import annotations

from .breakdown import ideal_without_fixed_work


def _execution(row: dict) -> str:
    return row.get("execution", "eager")       # rows written before executions were measured


def _by_case(rows: list[dict]) -> dict[tuple, dict]:
    """Bench rows by (method, density, execution)."""
    return {(r["method"], r["density"], _execution(r)): r for r in rows}


def ratios(rows: list[dict], method: str = "barter", against: str = "rigl") -> list[dict]:
    """Per execution and density: ``against``'s step time and peak memory over ``method``'s,
    beside the FLOPs-ideal ratio; ``efficiency`` is measured speedup / ideal speedup. Both
    run the same execution (eager, compiled, ...), so the comparison stays fair."""
    by_case = _by_case(rows)
    out = []
    for execution in dict.fromkeys(map(_execution, rows)):
        for density in sorted({d for m, d, e in by_case if m == method and e == execution}):
            ours, theirs = by_case.get((method, density, execution)), by_case.get((against, density, execution))
            if ours is None or theirs is None:
                continue
            speedup = theirs["step_ms"] / ours["step_ms"]
            ideal = theirs["train_gflops_per_image"] / ours["train_gflops_per_image"]
            out.append({"execution": execution, "density": density, "speedup": speedup, "ideal_speedup": ideal,
                        "efficiency": speedup / ideal,
                        "epoch_speedup": theirs["epoch_s"] / ours["epoch_s"],
                        "memory_fraction": ours["peak_mem_mb"] / theirs["peak_mem_mb"],
                        "update_percent_of_training": ours["update_percent_of_training"]})
    return out


def step_ratios(rows: list[dict], method: str = "barter", against=("static", "rigl", "dense")) -> list[dict]:
    """Per execution and density: ``method``'s step time over each of ``against``'s in the
    same execution (dense: its one row at density 1). Against Static it is the price of the
    method's own per-step work, its statistics (goal: at most 1.02, the paper's 33.27 / 32.69
    ms in Table 14); against RigL and dense, what compact tensors buy."""
    by_case = _by_case(rows)
    out = []
    for execution in dict.fromkeys(map(_execution, rows)):
        for density in sorted({d for m, d, e in by_case if m == method and e == execution}):
            ours = by_case[(method, density, execution)]
            record = {"execution": execution, "density": density, "step_ms": ours["step_ms"]}
            for other in against:
                theirs = by_case.get((other, density, execution)) or by_case.get((other, 1.0, execution))
                if theirs is not None:
                    record[other] = ours["step_ms"] / theirs["step_ms"]
            if len(record) > 3:
                out.append(record)
    return out


def execution_effects(rows: list[dict], baseline: str = "eager") -> list[dict]:
    """Per method, density and execution other than ``baseline``: its step time and peak
    memory against the ``baseline`` execution's of the same method and density, and what
    compiling cost (seconds at the first step, per update, over the paper's schedule) and what
    recording CUDA graphs cost (ms per recording, seconds over the schedule, the graph's
    memory)."""
    by_case = _by_case(rows)
    out = []
    for (method, density, execution), row in by_case.items():
        base = by_case.get((method, density, baseline))
        if execution == baseline or base is None:
            continue
        out.append({"method": method, "density": density, "execution": execution,
                    "step_speedup": base["step_ms"] / row["step_ms"],
                    "epoch_speedup": base["epoch_s"] / row["epoch_s"],
                    "memory_fraction": row["peak_mem_mb"] / base["peak_mem_mb"],
                    "compile_s": row.get("compile_s", 0.0),
                    "recompile_s_per_update": row.get("recompile_s_per_update", 0.0),
                    "compile_s_per_schedule": row.get("compile_s_per_schedule", 0.0),
                    "capture_ms": row.get("capture_ms", 0.0),
                    "capture_s_per_schedule": row.get("capture_s_per_schedule", 0.0),
                    "graph_memory_mb": row.get("graph_memory_mb", 0.0),
                    "updates_per_schedule": row["updates_per_schedule"]})
    return out


def fixed_work(rows: list[dict], method: str = "barter", against: str = "rigl") -> list[dict]:
    """Per execution and density where both were profiled (``profile_steps``): BARTER's
    fixed work (ms, share of its step) and the efficiency it would reach without it
    (:func:`~barter_mini.measure.breakdown.ideal_without_fixed_work`)."""
    out = []
    by_case = _by_case(rows)
    for ratio in ratios(rows, method, against):
        key = (ratio["density"], ratio["execution"])
        ours, theirs = by_case[(method, *key)], by_case[(against, *key)]
        if "profile_total_ms" not in ours or "profile_total_ms" not in theirs:
            continue
        profiles = [{k[len("profile_"):-len("_ms")]: v for k, v in r.items() if k.startswith("profile_")}
                    for r in (ours, theirs)]
        out.append({"execution": ratio["execution"], "density": ratio["density"],
                    "ideal_speedup": ratio["ideal_speedup"], "efficiency": ratio["efficiency"],
                    **ideal_without_fixed_work(*profiles, ratio["ideal_speedup"])})
    return out


def format_report(rows: list[dict]) -> str:
    """Each execution's and density's figures per method, then BARTER against RigL beside
    the FLOPs ideal, and each execution against eager. Rows of cases that could not be
    measured (an ``error``) are listed at the end, not read; a graphs row that never
    replayed (``replayed`` false: its recordings failed) is marked where its figures stand."""
    failed = [r for r in rows if "error" in r or "step_ms" not in r]
    rows = [r for r in rows if not ("error" in r or "step_ms" not in r)]
    lines = []
    header = (f"{'method':<16}{'density':>8}{'ms/step':>10}{'s/epoch':>10}{'peak MB':>10}"
              f"{'GFLOPs':>9}{'params':>11}{'update %':>10}")
    executions = list(dict.fromkeys(map(_execution, rows)))
    for execution in executions:
        chosen = [r for r in rows if _execution(r) == execution]
        for density in sorted({r["density"] for r in chosen}):
            lines += [f"density {density:g}" + (f", {execution}" if len(executions) > 1 else ""), header]
            for r in (r for r in chosen if r["density"] == density):
                lines.append(f"{r['method']:<16}{r['density']:>8g}{r['step_ms']:>10.1f}{r['epoch_s']:>10.1f}"
                             f"{r['peak_mem_mb']:>10.1f}{r['train_gflops_per_image']:>9.3f}{r['params']:>11,}"
                             f"{r['update_percent_of_training']:>10.4f}"
                             + ("  (never replayed: eager steps)" if r.get("replayed") is False
                                and "graphs" in _execution(r) else ""))
            lines.append("")
    def case(record: dict) -> str:
        return f"rho={record['density']:g}" + (f" ({record['execution']})" if len(executions) > 1 else "")

    for ratio in step_ratios(rows):
        others = ", ".join(f"{ratio[other]:.3f}x {other}'s" for other in ("static", "rigl", "dense") if other in ratio)
        lines.append(f"{case(ratio)}: BARTER's step is {others}")
    for ratio in ratios(rows):
        lines.append(f"{case(ratio)}: BARTER is {ratio['speedup']:.2f}x faster per step than RigL "
                     f"(FLOPs-ideal {ratio['ideal_speedup']:.2f}x, {ratio['efficiency']:.2f} of ideal), "
                     f"peak memory {100 * ratio['memory_fraction']:.1f} % of RigL's, "
                     f"topology updates {ratio['update_percent_of_training']:.4f} % of training time")
    for fixed in fixed_work(rows):
        lines.append(f"{case(fixed)}: fixed width-D work (LayerNorm, stem, elementwise) is "
                     f"{fixed['fixed_ms']:.0f} ms, {100 * fixed['fixed_share']:.0f} % of BARTER's profiled step "
                     f"(RigL's: {fixed['rigl_fixed_ms']:.0f} ms); without it in both, BARTER would be "
                     f"{fixed['speedup_without_fixed']:.2f}x faster, {fixed['efficiency_without_fixed']:.2f} of ideal")
    for effect in execution_effects(rows):
        compiled = (f"; compiling {effect['compile_s']:.1f} s, {effect['recompile_s_per_update']:.2f} s per update, "
                    f"{effect['compile_s_per_schedule']:.0f} s over {effect['updates_per_schedule']} updates"
                    if "compiled" in effect["execution"] else "")
        recorded = (f"; recording the graph {effect['capture_ms']:.0f} ms, {effect['capture_s_per_schedule']:.1f} s "
                    f"over {effect['updates_per_schedule']} updates and the start, graph memory "
                    f"{effect['graph_memory_mb']:.0f} MB" if "graphs" in effect["execution"] else "")
        lines.append(f"{effect['method']} rho={effect['density']:g} {effect['execution']}: "
                     f"{effect['step_speedup']:.2f}x the eager step speed, peak memory "
                     f"{100 * effect['memory_fraction']:.1f} % of eager's{compiled}{recorded}")
    for r in failed:
        lines.append(f"not measured: {r.get('method')} rho={r.get('density')} {_execution(r)}: "
                     f"{r.get('error', 'no step time')}")
    return "\n".join(lines)
