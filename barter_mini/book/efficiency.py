"""How much the efficiency chapter measures per notebook profile (:data:`BENCH_PROFILES`) and
which of the paper's tables its compute counts are set beside (:data:`PAPER_COMPUTE_TABLES`);
the chapter's tables, checks and figures are written in its cells."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ..errors import BarterError
from ..measure.bench import bench
from ..training.methods import bench_methods
from ..training.checkpoints import write_csv_atomically
from .recorded_grid import recorded_data_dir
from .tables import settings_markdown


@dataclass(frozen=True)
class BenchProfile:
    """How much the efficiency notebook measures under a notebook profile.

    ``paper_models`` (model, batch) are benchmarked for the paper's efficiency tables; the
    profile's own training model is benchmarked at its recipe's batch for Figure 1.
    ``profile_steps`` steps of every case run under the profiler (where the time goes);
    ``executions`` are measured side by side for RigL and BARTER on every paper model at the
    lowest of the notebook's densities (all of them where ``all_densities_executed``).
    """

    paper_models: tuple[tuple[str, int], ...]
    steps: int
    warmup: int
    segment_steps: int
    update_samples: int
    profile_steps: int = 2
    executions: tuple[str, ...] = ("eager", "compiled", "recompute")
    all_densities_executed: bool = False

    def _repr_markdown_(self) -> str:
        return settings_markdown(self, "What this chapter measures")


#: what the chapter measures under each notebook profile
BENCH_PROFILES = {
    # the smoke profile skips the compiled execution: a first compile takes half a minute per case here
    "smoke": BenchProfile((("cct-mini", 16),), steps=2, warmup=1, segment_steps=1, update_samples=1,
                          profile_steps=1, executions=("eager", "recompute")),
    # the quick book's budget is 45 minutes on two cores: batch 16, one sample of each extra
    # measurement, and no compiled execution (a first compile takes half a minute per case)
    "quick": BenchProfile((("cct-paper", 16), ("vit-paper", 16)), steps=3, warmup=1, segment_steps=1,
                          update_samples=1, profile_steps=1, executions=("eager", "recompute")),
    "long": BenchProfile((("cct-paper", 32), ("vit-paper", 32)), steps=5, warmup=2, segment_steps=3,
                         update_samples=3, profile_steps=3, all_densities_executed=True),
    "paper": BenchProfile((("cct-paper", 128), ("vit-paper", 256)), steps=20, warmup=5, segment_steps=50,
                          update_samples=5, profile_steps=5, all_densities_executed=True),
}


#: per model, the paper's table of training GFLOPs per image and exported parameters (M) in
#: ``data/paper`` and its name. Only the model a table reports is compared with it: Table 15
#: is CCT on CIFAR-100. ViT's compute table (Table 9, ViT on Tiny-ImageNet) is not among our
#: transcriptions, so ViT's paper cells stay blank, as do those of models the paper does not
#: train (cct-mini).
PAPER_COMPUTE_TABLES = {"cct-paper": ("table15_compute_and_size_cct", "Table 15")}


@dataclass(frozen=True)
class BenchGrid:
    """The timing grid chapter 04's timing conclusions rest on, recorded in
    ``data/bench_grid.csv``: every default method of ``barter-mini bench`` at every density on
    both paper models (``barter-mini bench``'s default methods), measured ``repeats`` times
    one after another on one quiet machine.

    One bench run is one sample of the machine's noise (its step times are medians of
    interleaved steps, Tables 6, 8, 14); the repeats give each ratio a mean ± SE over
    ``repeats`` runs, paired by repeat (BARTER's speedup over RigL is computed inside one
    run, where both felt the same machine). Each row is a bench row plus ``repeat``, the
    machine (``cpu``, ``threads``, ``torch``), ``commit`` and ``command``. To re-record::

        python -m barter_mini.book.efficiency
    """

    models: tuple[tuple[str, int], ...] = (("cct-paper", 16), ("vit-paper", 16))
    methods: tuple[str, ...] = field(default_factory=bench_methods)
    densities: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7)
    steps: int = 5
    warmup: int = 2
    segment_steps: int = 2
    update_samples: int = 1
    repeats: int = 3

    command = "python -m barter_mini.book.efficiency"

    @property
    def csv(self) -> Path:
        return recorded_data_dir() / "bench_grid.csv"

    def measure(self, commit: str, device: str = "cpu") -> list[dict]:
        """Every row of the grid, ``repeats`` bench runs per model (repeat r uses seed r)."""
        machine = {"cpu": _cpu_name() or platform.machine(), "threads": torch.get_num_threads(),
                   "torch": torch.__version__.split("+")[0]}
        rows = []
        for repeat in range(self.repeats):
            for model, batch in self.models:
                for row in bench(model, self.methods, self.densities, batch, steps=self.steps,
                                 warmup=self.warmup, segment_steps=self.segment_steps,
                                 update_samples=self.update_samples, device=device, seed=repeat, progress=False):
                    rows.append({"repeat": repeat, **row, **machine, "commit": commit, "command": self.command})
        return rows

    def record(self, commit: str, device: str = "cpu", path: Path | None = None) -> Path:
        """:meth:`measure` written to ``path`` (default :attr:`csv`), atomically."""
        frame = pd.DataFrame(self.measure(commit, device)).round(4)
        return write_csv_atomically(path or self.csv, tuple(frame.columns), frame.to_dict("records"))

    def read(self, path: Path | None = None) -> pd.DataFrame:
        """The recorded rows (:meth:`record`'s layout); a missing file is a one-line error with
        the command that records it."""
        path = path or self.csv
        if not path.is_file():
            raise BarterError(f"{path} is missing: record the bench grid with `{self.command}` on a quiet machine")
        return pd.read_csv(path, dtype={"commit": "string"})


def _cpu_name() -> str | None:
    """The CPU's model name (Linux), for the recorded grid's ``cpu`` column."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


#: the recorded timing grid of chapter 04
BENCH_GRID = BenchGrid()


if __name__ == "__main__":
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    print(BENCH_GRID.record(head.stdout.strip()))
