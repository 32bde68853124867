"""Pictures of the mechanism (the paper's Figure 2), drawn from a real compact model so they
stay true to the code: a compact layer's tensors (:func:`plot_compact_layer`), one topology
update before and after (:func:`plot_update`) and the remap of Adam's moments
(:func:`plot_moment_remap`).

:func:`one_update` performs one FFN update on a briefly trained model, step by step with the
library's own functions, and records what the pictures need; :func:`write_mechanism_figures`
draws the three into a folder (the book build puts them beside the method page).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch, Rectangle

from ..core.barter import clone, prune_donors, receiver_room, select_donors, select_parents, select_receiver
from ..core.models import get_model_config
from ..errors import BarterError
from ..training.optimization import seed_everything
from .figures import BOOK_RC, MAX_WIDTH_IN, check_figure, stacked_panels
from .palette import BARTER_COLOR
from .walkthrough import briefly_trained

#: the figures :func:`write_mechanism_figures` writes, by file name
FIGURES = ("compact_layer.svg", "topology_update.svg", "moment_remap.svg")

HEAD_COLORS = plt.get_cmap("tab10").colors
DONOR_COLOR, PARENT_COLOR, CLONE_COLOR, KEPT_COLOR = (0.55, 0.55, 0.55), (0.0, 0.45, 0.70), BARTER_COLOR, (0.85, 0.85, 0.85)


def trained_compact_model(model_name: str = "cct-mini", density: float = 0.3, steps: int = 5, seed: int = 0):
    """A compact model trained ``steps`` AdamW steps on random 32 x 32 RGB images and labels,
    enough for its statistics hooks and its optimizer to hold real values (the mechanism does
    not depend on the data). Returns ``(model, optimizer, statistics)``."""
    seed_everything(seed)
    config = get_model_config(model_name).for_data(32, 3, 10)
    generator = torch.Generator().manual_seed(seed)
    batches = ((torch.randn(32, 3, 32, 32, generator=generator), torch.randint(0, 10, (32,), generator=generator))
               for _ in range(steps))
    model, optimizer, statistics = briefly_trained(config, density, batches)
    return model.eval(), optimizer, statistics


@dataclass
class UpdateRecord:
    """One FFN update, as :func:`one_update` performed it."""

    before: list[int]
    after: list[int]
    receiver: int
    donors: list[tuple[int, int]]
    parents: list[int]
    alpha: float
    #: per parameter role ("in": fc1's row, "out": fc2's column) and moment: the parent's norm
    #: before, the parent's and the first clone's after, each over the parent's before
    moment_ratios: dict[tuple[str, str], tuple[float, float]]


def one_update(model, optimizer, statistics, alpha: float = 0.5, most: int = 3) -> UpdateRecord:
    """One FFN topology update taken apart (receiver, donors, parents, clone with the exact
    split of the moments, prune), recording the allocation and the parent's and first
    clone's moments before and after."""
    stats = statistics.layers["ffn"]
    before = list(model.allocation().ffn)
    full_width = model.config.ffn_per_layer
    receiver = select_receiver(stats, before, full_width)
    if receiver is None:
        raise BarterError("no layer can receive a unit: every layer is at full width or has no statistics")
    donors = select_donors(stats, before, receiver, receiver_room(before, receiver, full_width, most), min_age=1)
    parents = select_parents(stats[receiver], len(donors))
    mlp = model.blocks[receiver].mlp
    tensors = {"in": (lambda: mlp.fc1.weight, 0), "out": (lambda: mlp.fc2.weight, 1)}
    parent, first_clone = parents[0], before[receiver]
    old = {role: {key: value.select(axis, parent).norm().item()
                  for key, value in optimizer.state[get()].items() if key in ("exp_avg", "exp_avg_sq")}
           for role, (get, axis) in tensors.items()}
    clone(model.blocks[receiver], "ffn", parents, stats[receiver], optimizer, alpha=alpha, symmetry_noise=0.0,
          clone_moments="split")
    ratios = {}
    for role, (get, axis) in tensors.items():
        state = optimizer.state[get()]
        for key in ("exp_avg", "exp_avg_sq"):
            ratios[role, key] = (state[key].select(axis, parent).norm().item() / old[role][key],
                                 state[key].select(axis, first_clone).norm().item() / old[role][key])
    prune_donors(model, "ffn", donors, stats, optimizer)
    return UpdateRecord(before, list(model.allocation().ffn), receiver, [tuple(d) for d in donors], list(parents),
                        alpha, ratios)


def _tensor_box(ax, x, width, height, full_width, full_height, bands, along_rows: bool, label: str):
    """One weight matrix with its top-left corner at (x, 0), drawn downwards: its full-width
    size dashed, its compact size filled with one band per unit (colours ``bands``) along its
    rows (``along_rows``) or its columns, and its label above it."""
    ax.add_patch(Rectangle((x, -full_height), full_width, full_height, fill=False, linestyle="--",
                           edgecolor="0.6"))
    start = 0.0
    for size, color in bands:
        if along_rows:
            ax.add_patch(Rectangle((x, -start - size), width, size, facecolor=color, edgecolor="none"))
        else:
            ax.add_patch(Rectangle((x + start, -height), size, height, facecolor=color, edgecolor="none"))
        start += size
    ax.text(x + full_width / 2, 6, label, ha="center", va="bottom", fontsize=8.5)


def plot_compact_layer(model, layer: int = 0):
    """A compact layer's weight matrices to scale, rows downwards: ``qkv`` (shown as its q, k
    and v row groups: the rows of each kept head in each), ``proj`` (its columns per head),
    ``fc1`` (one row per FFN channel) and ``fc2`` (one column per channel); dashed, the
    full-width layer's size. A head or a channel is a block of rows of its input matrix and
    the same block of columns of its output matrix: removing a unit removes both."""
    block, config = model.blocks[layer], model.config
    heads, channels = block.attn.num_heads, block.mlp.fc1.out_features
    d, head_dim = config.embed_dim, config.head_dim
    full_heads, full_channels = config.heads_per_layer, config.ffn_per_layer
    head_bands = [(head_dim, HEAD_COLORS[h % 10]) for h in range(heads)]
    channel_cmap = plt.get_cmap("Greens")
    channel_bands = [(1, channel_cmap(0.35 + 0.6 * c / max(channels - 1, 1))) for c in range(channels)]
    gap = 0.35 * d
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 3.4), constrained_layout=True)
    x = 0.0
    for group in ("q", "k", "v"):
        _tensor_box(ax, x, d, heads * head_dim, d, full_heads * head_dim, head_bands, True, f"{group} rows")
        x += d + 0.15 * d
    ax.text((x - 0.15 * d) / 2, 22, f"qkv.weight: {3 * heads * head_dim} x {d}", ha="center", va="bottom",
            fontsize=8.5)
    x += gap - 0.15 * d
    _tensor_box(ax, x, heads * head_dim, d, full_heads * head_dim, d, head_bands, False,
                f"proj.weight\n{d} x {heads * head_dim}")
    x += full_heads * head_dim + gap
    _tensor_box(ax, x, d, channels, d, full_channels, channel_bands, True, f"mlp.fc1.weight\n{channels} x {d}")
    x += d + gap
    _tensor_box(ax, x, channels, d, full_channels, d, channel_bands, False, f"mlp.fc2.weight\n{d} x {channels}")
    x += full_channels
    tallest = max(full_heads * head_dim, full_channels, d)
    ax.set_xlim(-5, x + 5)
    ax.set_ylim(-tallest - 5, 45)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Layer {layer} of a compact {config.name}: {heads} of {full_heads} heads, "
                 f"{channels} of {full_channels} FFN channels", fontsize=10)
    ax.legend(handles=[Patch(facecolor=HEAD_COLORS[0], label="one colour per attention head"),
                       Patch(facecolor=channel_cmap(0.7), label="one shade per FFN channel"),
                       Patch(facecolor="white", edgecolor="0.6", linestyle="--", label="the full-width layer")],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, frameon=False, fontsize=8.5)
    return fig


def _units_row(ax, y, count, colors, hatch_units=(), width=1.0):
    for unit in range(count):
        ax.add_patch(Rectangle((unit * width, y), width * 0.9, 0.7, facecolor=colors.get(unit, KEPT_COLOR),
                               edgecolor="0.3" if unit in hatch_units else "none", linewidth=0.8,
                               hatch="xxx" if unit in hatch_units else None))


def plot_update(record: UpdateRecord):
    """One FFN topology update before (left) and after (right): one row of squares per layer,
    one square per channel. Before: the donors (lowest pruning scores outside the receiver,
    crossed) and the receiver's parents (highest growth scores). After: the donors are gone,
    each parent has a clone appended to the receiver, and the parent keeps ``alpha`` of its
    output weights while the clone takes ``1 - alpha``; the budget is unchanged."""
    layers = len(record.before)
    fig, axes = stacked_panels(2, 0.55 * layers + 0.6, legend_in=0.9)
    widest = max(max(record.before), max(record.after))
    donors_by_layer: dict[int, set[int]] = {}
    for layer, unit in record.donors:
        donors_by_layer.setdefault(layer, set()).add(unit)
    for layer in range(layers):
        y = layers - 1 - layer
        before_colors = {u: DONOR_COLOR for u in donors_by_layer.get(layer, ())}
        after_colors = {}
        if layer == record.receiver:  # clones are appended, so the parents keep their places
            before_colors.update({p: PARENT_COLOR for p in record.parents})
            after_colors.update({p: PARENT_COLOR for p in record.parents})
            after_colors.update({record.before[layer] + i: CLONE_COLOR for i in range(len(record.parents))})
        _units_row(axes[0], y, record.before[layer], before_colors, donors_by_layer.get(layer, ()))
        _units_row(axes[1], y, record.after[layer], after_colors)
        for ax, counts in ((axes[0], record.before), (axes[1], record.after)):
            ax.text(-1, y + 0.35, f"layer {layer}" + (" (receiver)" if layer == record.receiver else ""),
                    ha="right", va="center", fontsize=9)
            ax.text(widest + 1, y + 0.35, str(counts[layer]), ha="left", va="center", fontsize=9)
    titles = (f"Before: {sum(record.before)} channels", f"After: {sum(record.after)} channels, the same budget")
    for ax, title in zip(axes, titles):
        ax.set_xlim(-12, widest + 4)
        ax.set_ylim(-0.5, layers + 0.2)
        ax.axis("off")
        ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=DONOR_COLOR, hatch="xxx", edgecolor="0.3", label="donor (pruned)"),
               Patch(facecolor=PARENT_COLOR, label=f"parent (keeps alpha = {record.alpha:g} of its output weights)"),
               Patch(facecolor=CLONE_COLOR, label=f"clone (copies the input weights, takes 1 - alpha = "
                                                  f"{1 - record.alpha:g} of the output weights)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=1, frameon=False, fontsize=8.5)
    return fig


def plot_moment_remap(record: UpdateRecord):
    """Adam's moments of a parent and its clone right after a split clone, as multiples of
    the parent's before: the input row (``fc1``) of each copy sees ``alpha`` (parent) or
    ``1 - alpha`` (clone) of the old gradient, so its first moment scales by that factor and
    its second moment by its square; the output column (``fc2``) sees the old gradient
    unchanged, so its moments are copied."""
    alpha = record.alpha
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 3.4), sharey=True, constrained_layout=True)
    for ax, (role, title) in zip(axes, (("in", "input row of fc1 (copied weights)"),
                                        ("out", "output column of fc2 (split weights)"))):
        labels, measured, expected = [], [], []
        for key, power in (("exp_avg", 1), ("exp_avg_sq", 2)):
            parent, clone_ratio = record.moment_ratios[role, key]
            scale = (alpha ** power, (1 - alpha) ** power) if role == "in" else (1.0, 1.0)
            labels += [f"{key}\n{copy}" for copy in ("parent", "clone")]
            measured += [parent, clone_ratio]
            expected += list(scale)
        positions = range(len(labels))
        ax.bar(positions, measured, color=[PARENT_COLOR, CLONE_COLOR] * 2, width=0.6, label="measured")
        ax.scatter(positions, expected, marker="_", s=600, color="black", zorder=3, label="derived factor")
        ax.axhline(1.0, color="0.6", linestyle=":", linewidth=1)
        ax.set_xticks(list(positions), labels, fontsize=7.5)
        ax.set_title(title, fontsize=9.5)
    axes[0].set_ylabel("norm after / parent's norm before")
    axes[0].legend(loc="upper center", bbox_to_anchor=(1.0, -0.22), ncol=2, frameon=False, fontsize=8.5)
    return fig


def write_mechanism_figures(folder: Path, density: float = 0.3, seed: int = 0) -> list[Path]:
    """Draw the three figures of :data:`FIGURES` from one real model and update into
    ``folder``, as the notebooks' figures are drawn (:data:`~barter_mini.book.figures.BOOK_RC`:
    SVG with its text as text, checked by :func:`~barter_mini.book.figures.check_figure`)."""
    folder.mkdir(parents=True, exist_ok=True)
    model, optimizer, statistics = trained_compact_model(density=density, seed=seed)
    paths = []
    with plt.rc_context(BOOK_RC):
        layer_figure = plot_compact_layer(model)
        record = one_update(model, optimizer, statistics)
        for name, figure in zip(FIGURES, (layer_figure, plot_update(record), plot_moment_remap(record))):
            check_figure(figure, name)
            path = folder / name
            figure.savefig(path, metadata={"Date": None})  # the same model draws the same file
            plt.close(figure)
            paths.append(path)
    return paths
