"""``--compile``: every encoder layer through ``torch.compile``, with shapes that may change.

A topology update changes the shapes of a layer's tensors (BARTER's surgery swaps its
``qkv``/``proj``/``fc1``/``fc2`` parameters for resized ones and sets ``attn.num_heads``),
so a layer compiled for the shapes it had would be recompiled after every update (147
updates in a paper schedule at rho = 0.7) and, past Dynamo's recompile limit, silently run
uncompiled. :func:`compile_layers` avoids that:

* each layer is compiled on its own, with symbolic shapes (``dynamic=True``): the layers of
  a model share one forward function, so they share its graphs, and a graph traced with a
  symbolic head count ``h`` and channel count ``c`` serves every layer and every update;
* Dynamo is told (:data:`DYNAMIC_SETTINGS`) to treat parameter shapes, ``nn.Module``
  attributes such as ``num_heads``, and equal sizes as symbolic rather than as constants.
  What remains specialised is a size of 1 (a layer with one head takes another path through
  ``scaled_dot_product_attention``), train against eval mode, and grad against no-grad: a
  handful of graphs per model family, whatever the schedule (``tests/test_compilation.py``
  counts them over a schedule of updates);
* only the layers are compiled. The stem (the CCT tokenizer's max-pool backward lowers to a
  scatter that is slower than ATen's kernel on a CPU, so a whole-model compile is slower
  than eager) and the head run as they are.

The masked methods compile the same layers (their shapes never change), so the comparison
stays fair. Compiling changes the floating-point order of fused kernels, not the function:
outputs and gradients agree with the eager model to float32 rounding (``tests``).
"""

from __future__ import annotations

import contextlib

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from ..errors import BarterError

#: Dynamo settings under which a layer's graph survives a topology update (see the module);
#: process-wide, applied by :func:`compile_layers`. They only stop Dynamo from specialising.
DYNAMIC_SETTINGS = {
    "force_parameter_static_shapes": False,         # a resized parameter keeps the graph
    "force_nn_module_property_static_shapes": False,
    "allow_unspec_int_on_nn_module": True,          # attn.num_heads is a symbol, not a constant
    # the graphs a model needs stay few (above), but train/eval and one-head variants of
    # several model families in one process must not reach Dynamo's default of 8
    "recompile_limit": 64,
}


def _apply_dynamic_settings() -> None:
    for name, value in DYNAMIC_SETTINGS.items():
        setattr(torch._dynamo.config, name, value)
    # Without duck sizing a head count that happens to equal a channel count gets its own
    # symbol, so the two may part at the next update without a recompile.
    import torch.fx.experimental._config as fx_config
    fx_config.use_duck_shape = False


#: the torch.compile backend (tests swap in "aot_eager": the same graphs, no C++ compile)
BACKEND = "inductor"


def compile_layers(model: nn.Module) -> nn.Module:
    """Compile each of ``model.blocks`` in place (``nn.Module.compile``, :data:`BACKEND`,
    dynamic shapes); parameters, state dicts and checkpoints are unchanged. Returns ``model``."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise BarterError(f"{type(model).__name__} has no .blocks of encoder layers to compile")
    _apply_dynamic_settings()
    for block in blocks:
        block.compile(dynamic=True, backend=BACKEND)
    return model


def is_compiled(model: nn.Module) -> bool:
    """Whether :func:`compile_layers` compiled ``model``'s layers."""
    return any(getattr(block, "_compiled_call_impl", None) is not None for block in getattr(model, "blocks", ()))


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (first compiles and recompiles):
    the difference across a stretch of training counts its recompilations."""
    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def cold_compile():
    """Compile as a fresh process on a fresh machine would: Dynamo's graphs forgotten (every
    compiled module recompiles at its next call) and inductor's caches, in memory and on
    disk, replaced by empty ones for the duration (``torch._inductor.utils.fresh_cache``).
    What ``barter-mini bench`` times a first compile under."""
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache():
        yield
