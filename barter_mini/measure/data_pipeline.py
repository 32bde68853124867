"""How fast the data pipeline feeds training, for two source trees side by side.

``python -m barter_mini.measure.data_pipeline --tree before=PATH --tree after=PATH`` measures,
for each tree in turn and in alternating order over ``--repeats`` rounds (these machines are
noisy, so the two are always measured under the same load):

* ``loader``: images per second of the training loader alone, iterating augmented batches
  of ``--batch`` images after a warm-up, nothing else running;
* ``run``: the wall time of a whole ``barter-mini train`` run (BARTER, ``cct-mini``, the
  ``quick`` recipe for ``--epochs`` epochs): data, steps, updates, evaluation.

Each measurement runs in a fresh process with the tree first on ``PYTHONPATH`` and only the
public API (:func:`~barter_mini.training.data.datasets.load_dataset`,
:func:`~barter_mini.training.data.loaders.make_loaders`, :func:`~barter_mini.training.trainer.train`),
so a tree from before a change measures the same way as one after it. The report gives each
tree's median and the ratio of every tree to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOADER = """
import json, sys, time, torch
from barter_mini.training.data import load_dataset, make_loaders
dataset, root, batch, warmup, batches = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
splits = load_dataset(dataset, root, seed=0)
train = make_loaders(splits, batch, seed=0)[0]
iterator = iter(train)
for _ in range(warmup):
    next(iterator)
start = time.perf_counter()
for _ in range(batches):
    x, y = next(iterator)
    float(x[0, 0, 0, 0])
print(json.dumps({"images_per_s": batches * batch / (time.perf_counter() - start)}))
"""

RUN = """
import json, sys, tempfile, time
from pathlib import Path
from barter_mini.training.run_config import RunConfig
from barter_mini.training.trainer import train
dataset, root, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
with tempfile.TemporaryDirectory() as out:
    start = time.perf_counter()
    metrics = train(RunConfig(method="barter", model="cct-mini", dataset=dataset, recipe="quick", epochs=epochs,
                              data_root=root, progress=False), Path(out) / "run")
    print(json.dumps({"run_s": time.perf_counter() - start, "steps": metrics["steps"],
                      "val_acc": metrics["val_acc"]}))
"""


def measure_once(tree: Path, what: str, dataset: str, root: Path, batch: int, epochs: int) -> dict:
    """One measurement of ``what`` (loader or run) with ``tree``'s package, in a new process."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = [dataset, str(root), str(batch), "5", "40"] if what == "loader" else [dataset, str(root), str(epochs)]
    with tempfile.TemporaryDirectory() as cwd:           # not the tree's folder: PYTHONPATH decides
        result = subprocess.run([sys.executable, "-c", LOADER if what == "loader" else RUN, *args],
                                capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"{tree} {what}: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(trees: dict[str, Path], dataset: str, root: Path, repeats: int = 3, batch: int = 128,
            epochs: int = 1, what=("loader", "run")) -> list[dict]:
    """Every tree's measurements over ``repeats`` rounds, alternating the trees' order."""
    rows = []
    for repeat in range(repeats):
        order = list(trees.items()) if repeat % 2 == 0 else list(reversed(trees.items()))
        for kind in what:
            for name, tree in order:
                rows.append({"tree": name, "what": kind, "repeat": repeat,
                             **measure_once(tree, kind, dataset, root, batch, epochs)})
    return rows


def report(rows: list[dict], trees: list[str]) -> str:
    lines = []
    for kind, key in (("loader", "images_per_s"), ("run", "run_s")):
        medians = {name: statistics.median(r[key] for r in rows if r["tree"] == name and r["what"] == kind)
                   for name in trees if any(r["tree"] == name and r["what"] == kind for r in rows)}
        if medians:
            first = medians[trees[0]]
            lines.append(f"{kind} ({key}, median): " + ", ".join(
                f"{name} {value:.4g} ({value / first:.2f}x of {trees[0]})" for name, value in medians.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree to measure (give two or more)")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--what", default="loader,run")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    trees = {name: Path(path).resolve() for name, path in (spec.split("=", 1) for spec in args.tree)}
    rows = compare(trees, args.dataset, args.data_root.resolve(), args.repeats, args.batch, args.epochs,
                   tuple(args.what.split(",")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(report(rows, list(trees)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
