"""Selective activation recomputation: LayerNorm and GELU outputs are rebuilt in backward, not kept.

Why. At low density BARTER's compute and weights shrink, but the width-``D`` activations
every layer keeps for backward do not, so they dominate the peak memory of a training step
(what the paper's "81.3 % less memory" than RigL measures, Tables 8 and 14). In a
pre-norm layer two of those tensors are redundant: a LayerNorm keeps its input ``x`` for its
own backward, and the Linear after it (``attn.qkv``, ``mlp.fc1``) keeps ``LN(x)``, which is
cheap to rebuild from the ``x`` that is kept anyway. Likewise GELU keeps its input ``h``
(``fc1``'s output) and ``fc2`` keeps ``GELU(h)``. This is the selective recomputation of
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(Megatron-LM), applied to the cheap elementwise/normalising ops instead of attention.

Per layer, backward keeps these tensors of the residual width ``D`` (``B x N x D`` each)
and of the FFN width ``C`` (``B x N x C``), for a layer ``y = x + attn(LN_a(x))``,
``z = LN_b(y)`` (CCT, whose MLP branch and residual start from ``z``) or ``z = y + mlp(LN_b(y))``
(ViT), with ``h = fc1(LN_b(y))``:

* without: ``x`` and ``LN_a(x)``, ``y`` and ``LN_b(y)``: four width-``D`` tensors; ``h`` and
  ``GELU(h)``: two width-``C`` ones;
* with: ``x`` and ``y``: two width-``D`` tensors; ``h``: one width-``C`` one

(``LN_a, LN_b`` are CCT's ``pre_norm, norm1`` and ViT's ``norm1, norm2``), and likewise the final
norm's output is no longer kept. The function, and every gradient, is unchanged: the rebuilt
tensor is the same kernel on the same input and weights, bit for bit. The price is one
LayerNorm or GELU forward per rebuilt tensor in backward.

How. :func:`enable_selective_recompute` attaches a :class:`SelectiveRecompute` to a model.
Around each forward of the model (its forward pre-hook and an ``always_call`` forward hook,
so an exception still closes it) it enters ``torch.autograd.graph.saved_tensors_hooks`` and
hooks every ``nn.LayerNorm`` and ``nn.GELU`` found in the model *at that forward* (so
modules or parameters that the surgery replaced between steps are simply the ones used), to
record each output's storage -> (module, input). When autograd saves a tensor that is (a view
of) a recorded output, the pack hook keeps a small token instead; the unpack hook reruns the
module on the kept input under ``torch.no_grad()`` and returns the same view (``as_strided``).
The record table is emptied when the forward ends; tokens live only as long as the graph.

Safety. A token is made only if the output, its input and the module's parameters are at the
versions they had when the output was made (an inplace change before saving: the tensor is
kept as is), and the unpack hook checks the input and parameters again (changed after saving:
a clear error instead of a wrong gradient; a change of the output itself after saving does no
harm, the rebuilt tensor is the one forward used). Autograd does not check the version of a
tensor that passes through saved-tensor hooks, so the kept tensors carry their version and
are checked as autograd would without hooks. One forward of a model at a time: the
recompute's state is not shared between threads (``nn.DataParallel`` replicas).

Saved-tensor hooks do not nest (only the innermost pair applies), so a measurement that
counts saved tensors with its own hooks (:func:`barter_mini.measure.memory.step_memory`)
installs its counting function as the recompute's ``observer``
(:meth:`SelectiveRecompute.observed_by`): it sees every tensor kept, and the input each
token keeps alive in place of its output.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

#: the modules whose outputs are rebuilt in backward: cheap, deterministic functions of one input
RECOMPUTED_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GELU)

_ATTRIBUTE = "_selective_recompute"


def _storage_key(tensor: torch.Tensor) -> tuple:
    # data_ptr less the offset is the storage's address, without building a storage object
    # for each of the hundreds of tensors a step saves
    return tensor.device, tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


def _extent(tensor: torch.Tensor) -> int:
    """Elements of storage a strided tensor spans, from its first to its last element."""
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))


def _modified_error(what: str, version: int, expected: int) -> RuntimeError:
    return RuntimeError(
        f"one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: {what} is at version {version}; expected version {expected} instead "
        f"(selective recompute checks what autograd would, since saved-tensor hooks hide it)")


class _Record:
    """One output of a recomputed module, as made in this forward."""

    __slots__ = ("module", "input", "input_version", "state", "output", "version", "dtype", "shape",
                 "stride", "offset", "size", "autocast")

    def __init__(self, module: nn.Module, input: torch.Tensor, output: torch.Tensor):
        self.module = module
        self.input = input
        self.input_version = input._version
        # the tensors forward read besides the input: recomputation must read the same ones
        self.state = tuple((name, t, t._version) for name, t in
                           [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)])
        # a weak reference: holding the output would keep exactly what this saves; while it
        # lives its storage cannot be reused by another tensor, so an address match is real
        self.output = weakref.ref(output)
        self.version = output._version
        self.dtype, self.shape, self.stride = output.dtype, output.shape, output.stride()
        self.offset, self.size = output.storage_offset(), output.numel()
        device = output.device.type
        # backward runs outside the forward's autocast region, so its state is replayed
        self.autocast = ((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                         if torch.amp.is_autocast_available(device) else None)

    def unchanged(self) -> bool:
        return (self.input._version == self.input_version
                and all(getattr(self.module, name) is t and t._version == v for name, t, v in self.state))

    def covers(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``, which lies in this output's storage, is (a view of) the output as made."""
        output = self.output()
        if output is None or output._version != self.version or tensor.dtype != self.dtype:
            return False
        if _storage_key(output) != _storage_key(tensor) or not self.unchanged():
            return False
        start = tensor.storage_offset()
        return self.offset <= start and start + _extent(tensor) <= self.offset + self.size

    def recompute(self) -> torch.Tensor:
        if self.input._version != self.input_version:
            raise _modified_error(f"the input of {type(self.module).__name__} (recomputed in backward)",
                                  self.input._version, self.input_version)
        for name, t, v in self.state:
            if getattr(self.module, name) is not t or t._version != v:
                raise _modified_error(f"{type(self.module).__name__}.{name} (recomputed in backward)",
                                      t._version, v)
        with torch.no_grad(), self._autocast():
            # forward, not __call__: hooks (ours included) are not part of the function
            output = self.module.forward(self.input)
        if output.dtype != self.dtype or output.shape != self.shape or output.stride() != self.stride:
            raise RuntimeError(f"selective recompute: {type(self.module).__name__} rebuilt a "
                               f"{output.dtype} {tuple(output.shape)} tensor with strides {output.stride()}, "
                               f"forward made {self.dtype} {tuple(self.shape)} with {self.stride}")
        return output

    def _autocast(self):
        if self.autocast is None:
            return nullcontext()
        device, enabled, dtype = self.autocast
        if torch.is_autocast_enabled(device) == enabled and (not enabled or torch.get_autocast_dtype(device) == dtype):
            return nullcontext()
        return torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=False)


class _Token:
    """What autograd holds instead of a recomputed tensor: the record and the saved view's geometry."""

    __slots__ = ("record", "size", "stride", "offset")

    def __init__(self, record: _Record, tensor: torch.Tensor):
        self.record = record
        self.size, self.stride, self.offset = tensor.shape, tensor.stride(), tensor.storage_offset()


class _Kept:
    """A tensor kept as is, with the version autograd would have checked."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.version = tensor, tensor._version


def _unpack(packed):
    if isinstance(packed, _Kept):
        if packed.tensor._version != packed.version:
            raise _modified_error(f"a tensor of shape {tuple(packed.tensor.shape)} saved for backward",
                                  packed.tensor._version, packed.version)
        return packed.tensor
    record = packed.record
    output = record.recompute()
    return output.as_strided(packed.size, packed.stride,
                             packed.offset - record.offset + output.storage_offset())


class SelectiveRecompute:
    """Selective recomputation attached to ``model`` (see the module): use
    :func:`enable_selective_recompute`, not this constructor, and :meth:`disable` to detach.

    ``observer``, when set, is called with every tensor the forward keeps for backward, and
    with the input each recomputed tensor keeps alive instead (already kept by its module,
    so a counter of distinct storages counts nothing more for it).
    ``recomputed`` and ``kept`` count the saved tensors of the last forward.
    """

    def __init__(self, model: nn.Module, types: tuple[type[nn.Module], ...] = RECOMPUTED_TYPES):
        self.model = model
        self.types = tuple(types)
        self.observer: Callable[[torch.Tensor], object] | None = None
        self.recomputed = 0
        self.kept = 0
        self._records: dict[tuple, _Record] = {}
        self._stack: list = []              # one entry per running forward: its hooks context or None
        self._module_hooks: list = []
        # prepend: other pre-hooks of the model run inside the context too
        self._hooks = [model.register_forward_pre_hook(self._enter, prepend=True),
                       model.register_forward_hook(self._exit, always_call=True)]

    @property
    def records(self) -> int:
        """Outputs recorded by the forward now running (0 between forwards)."""
        return len(self._records)

    @property
    def active(self) -> bool:
        return bool(self._hooks)

    def disable(self) -> None:
        """Detach from the model: later forwards keep every tensor as autograd does."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.model.__dict__.get(_ATTRIBUTE) is self:
            del self.model.__dict__[_ATTRIBUTE]

    @contextmanager
    def observed_by(self, observer: Callable[[torch.Tensor], object]) -> Iterator[SelectiveRecompute]:
        """Within the block, ``observer`` sees what the model's forwards keep (see the class)."""
        previous, self.observer = self.observer, observer
        try:
            yield self
        finally:
            self.observer = previous

    # ------------------------------------------------------------------ hooks

    def _enter(self, module: nn.Module, args) -> None:
        # a nested call of the model runs inside the outer one's context; without grad
        # nothing is saved, so nothing is recorded (eval and no_grad forwards cost nothing)
        if self._stack or not torch.is_grad_enabled():
            self._stack.append(None)
            return
        self.recomputed = self.kept = 0
        # walked at every forward: the surgery may have replaced modules since the last one
        self._module_hooks = [m.register_forward_hook(self._record) for m in self.model.modules()
                              if isinstance(m, self.types)]
        context = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        context.__enter__()
        self._stack.append(context)

    def _exit(self, module: nn.Module, args, output) -> None:
        if not self._stack:                 # an earlier pre-hook failed before ours ran
            return
        context = self._stack.pop()
        if context is None:
            return
        try:
            context.__exit__(None, None, None)
        finally:
            for handle in self._module_hooks:
                handle.remove()
            self._module_hooks = []
            self._records.clear()

    def _record(self, module: nn.Module, args, output) -> None:
        if (len(args) != 1 or not torch.is_tensor(args[0]) or not torch.is_tensor(output)
                or output.layout != torch.strided or output.numel() == 0 or not torch.is_grad_enabled()):
            return
        # the saved view is rebuilt inside the recomputed output's own extent, so the
        # output must fill it (no gaps another tensor's data could sit in)
        if _extent(output) != output.numel():
            return
        self._records[_storage_key(output)] = _Record(module, args[0], output)

    def _pack(self, tensor: torch.Tensor):
        if self._records and tensor.layout == torch.strided:
            try:
                record = self._records.get(_storage_key(tensor))
            except RuntimeError:            # no storage (e.g. a tensor subclass): keep it
                record = None
            if record is not None and record.covers(tensor):
                self.recomputed += 1
                if self.observer is not None:
                    self.observer(record.input)
                return _Token(record, tensor)
        self.kept += 1
        if self.observer is not None:
            self.observer(tensor)
        return _Kept(tensor)


def enable_selective_recompute(model: nn.Module,
                               types: tuple[type[nn.Module], ...] = RECOMPUTED_TYPES) -> SelectiveRecompute:
    """Rebuild the outputs of ``model``'s LayerNorms and GELUs (``types``) in backward instead of
    keeping them; the function and gradients are unchanged. Enabling twice returns the first."""
    existing = model.__dict__.get(_ATTRIBUTE)
    if isinstance(existing, SelectiveRecompute) and existing.active:
        return existing
    recompute = SelectiveRecompute(model, types)
    model.__dict__[_ATTRIBUTE] = recompute
    return recompute


def disable_selective_recompute(model: nn.Module) -> bool:
    """Detach ``model``'s selective recompute; whether it had one."""
    recompute = selective_recompute_of(model)
    if recompute is None:
        return False
    recompute.disable()
    return True


def selective_recompute_of(model: nn.Module) -> SelectiveRecompute | None:
    """The selective recompute attached to ``model`` (or to the module a DDP or
    DataParallel wrapper holds), or None."""
    for candidate in (model, getattr(model, "module", None)):
        found = getattr(candidate, "__dict__", {}).get(_ATTRIBUTE)
        if isinstance(found, SelectiveRecompute) and found.active:
            return found
        if not isinstance(model, (DataParallel, DistributedDataParallel)):
            break
    return None
