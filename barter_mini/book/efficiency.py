"""How much the efficiency chapter measures per notebook profile (:data:`BENCH_PROFILES`) and
which of the paper's tables its compute counts are set beside (:data:`PAPER_COMPUTE_TABLES`);
the chapter's tables, checks and figures are written in its cells."""

from __future__ import annotations

from dataclasses import dataclass

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
