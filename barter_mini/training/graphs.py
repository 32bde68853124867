"""The whole training step as one CUDA graph (``--cuda-graphs``), captured anew whenever the
model's tensors change.

At the paper's sizes a step of a compact model is hundreds of small kernels, and the GPU
waits on their launches more than it computes. A CUDA graph records the step's
kernels once and replays all of them with one launch. A graph holds the addresses of the
tensors it read and wrote, so it must be recorded again whenever they change: after every
topology update (BARTER's surgery makes new parameters, optimizer states and statistics)
and after every mask update (the masked methods' new masks). Between updates nothing moves,
and every step replays.

Inside the graph, recorded from :func:`~barter_mini.training.step.training_step` itself (the
step is written once): ``zero_grad``, the forward pass and the loss (in the run's precision),
the backward pass (with the statistics' hook kernels), the controller's ``before_step`` and the
optimizer step (AdamW built ``capturable``, its learning rate a tensor). Outside: copying the
batch into the graph's input buffers, the learning rate of the schedule into its tensor, the
loss check after the step and the controller's ``after_step``.

A step runs eagerly instead (:func:`~barter_mini.training.step.training_step`) when

* the controller decides after it (:meth:`~barter_mini.core.method.MethodController.graph_safe`
  is False: its checks read values on the host, its gradients feed an update; the graph is let
  go first, since the update replaces what it addressed),
* its batch has another shape than the graph's (an epoch's last, smaller batch),
* the tensors changed since the capture (the controller's ``tensors_version`` moved, by
  any caller of its ``after_step``): that step runs eagerly on a side stream (which also
  warms up what a capture must not allocate lazily), then the graph is recorded.

The capture itself executes nothing. The loss is checked after the replay, so under graphs
a non-finite loss stops the run one optimizer step later than an eager run would.

Re-recording. Each :class:`GraphedStep` has one stream of its own: its warm-up steps run on
it and its recordings capture on it (``torch.cuda.graph(..., stream=...)``), so what CUDA's
libraries allocate lazily per stream (cuBLAS's workspace on a stream's first matrix product)
is made by the eager warm-up, outside any graph's memory. Before every recording the old
graph is released with its outputs, and the new one records into a pool of its own: no
recording depends on memory an earlier, released one made. A recording that fails releases
what it made, puts the thread's stream back, prints one warning line, and the step runs
eagerly until the tensors change (the next update), when recording is tried again; the run's
metrics count recordings, replays, eager steps and such fallbacks.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..core.execution import Execution
from ..core.method import MethodController
from ..errors import BarterError
from .methods import METHODS, get_method
from .step import StepOutcome, after_step, training_step


def check_graphs_possible(device: torch.device, method: str, distributed: bool = False) -> None:
    """One-line errors where a run of ``method`` asks for CUDA graphs that cannot be had (the
    execution itself refuses them with compile or recompute)."""
    if device.type != "cuda":
        raise BarterError(f"--cuda-graphs needs a CUDA device; this run is on {device.type}: leave it off")
    if distributed:
        raise BarterError("--cuda-graphs runs on one process: DDP's gradient buckets are not captured here")
    if not get_method(method).replayable:
        offered = ", ".join(name for name, spec in METHODS.items() if spec.replayable)
        raise BarterError(f"--cuda-graphs: {method} does work on the host before every step, which a graph "
                          f"cannot replay; it is offered for {offered}")


@dataclass
class CudaBackend:
    """What records and replays a graph: CUDA's own. A test may put a host-only stand-in here.

    One side stream per backend (each :class:`GraphedStep` builds its own): the warm-up steps
    run on it and the recordings capture on it. Every recording gets a new private memory
    pool; the old graph is released first (:meth:`release`), so its pool's memory returns to
    the allocator rather than being added to."""

    pool: Any = None
    stream: Any = None

    def graph(self):
        return torch.cuda.CUDAGraph()

    def _stream(self):
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        return self.stream

    def capture(self, graph, body: Callable[[], Any]) -> Any:
        """``body`` recorded into ``graph`` on this backend's stream, in a new pool. The
        thread's current stream is restored whether or not the recording succeeds
        (``torch.cuda.graph`` leaves its capture stream current when ending the capture fails)."""
        previous = torch.cuda.current_stream()
        self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self._stream()):
                return body()
        finally:
            torch.cuda.set_stream(previous)

    def release(self, graph) -> None:
        """Free ``graph`` and its pool's claim now, not whenever Python collects it."""
        graph.reset()

    def replay(self, graph) -> None:
        graph.replay()

    def side_stream(self, body: Callable[[], Any]) -> Any:
        stream = self._stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            result = body()
        torch.cuda.current_stream().wait_stream(stream)
        return result

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def pool_bytes(self) -> int:
        """What the graph's pool holds: the allocator's segments of that pool (the recorded
        step's activations, gradients and temporaries at fixed addresses). Reading the pool
        itself, not the allocator's reservation before and after a recording, which the
        recording's own emptying of the cache would hide."""
        return self.pool_usage()[0]

    def pool_usage(self) -> tuple[int, int]:
        """The graph pool's bytes reserved and, of them, allocated to live tensors now (the
        recording's outputs and gradients; the rest is what a replay writes and frees)."""
        pool = tuple(self.pool or ())
        segments = [segment for segment in torch.cuda.memory_snapshot()
                    if tuple(segment.get("segment_pool_id", ())) == pool]
        return (sum(segment["total_size"] for segment in segments),
                sum(segment["allocated_size"] for segment in segments))


@dataclass
class GraphedStep:
    """Replays one recorded training step (see the module); call it as
    :func:`~barter_mini.training.step.training_step` is called, with the step's number."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    criterion: Callable
    controller: MethodController | None = None
    execution: Execution = field(default_factory=Execution)
    backend: Any = field(default_factory=CudaBackend)
    #: how often a graph was recorded, and the wall seconds the recordings took
    captures: int = 0
    capture_seconds: float = 0.0
    #: the most memory the graphs' private pool held after a recording: the step's
    #: activations, gradients and temporaries at fixed addresses beside the eager allocator's cache
    memory_bytes: int = 0
    #: steps replayed from a graph and steps run eagerly
    replays: int = 0
    eager_steps: int = 0
    #: recordings that failed (each followed by eager steps until the tensors change)
    fallbacks: int = 0
    _graph: Any = field(default=None, init=False, repr=False)
    #: the controller's tensors_version the graph was recorded at
    _version: int | None = field(default=None, init=False, repr=False)
    #: the tensors_version a recording failed at: no new try until the tensors change
    _failed_version: int | None = field(default=None, init=False, repr=False)
    _largest: torch.Size | None = field(default=None, init=False, repr=False)
    _static: dict = field(default_factory=dict, init=False, repr=False)
    _lr: list = field(default_factory=list, init=False, repr=False)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, step: int,
                 check_loss: Callable[[torch.Tensor, torch.Tensor], Any] | None = None) -> StepOutcome:
        if self._largest is None or x.numel() > math.prod(self._largest):
            self._largest = x.shape      # an epoch's smaller last batch is never the one recorded
        if not (self.controller is None or self.controller.graph_safe(step)):
            # the update after this step replaces what the graph addressed anyway: let its pool
            # go now rather than hold two steps' activations while this one runs eagerly
            self._release()
            return self._eager(x, y, step, check_loss)
        if self._graph is not None and x.shape != self._static["x"].shape:
            return self._eager(x, y, step, check_loss)      # an epoch's smaller last batch
        if self._graph is None or self._tensors_version() != self._version:
            self._release()                      # recorded at other tensors: nothing to replay
            if self._failed_version == self._tensors_version():
                return self._eager(x, y, step, check_loss)
            outcome = self._eager(x, y, step, check_loss, warm_up=True)
            # record only where the recorded before_step is the next step's: not before an
            # update (it would read values on the host), not after one (the tensors changed)
            if (outcome.changed is None and x.shape == self._largest
                    and (self.controller is None or self.controller.graph_safe(step + 1))):
                self._record(x, y)
            return outcome
        self._static["x"].copy_(x)
        self._static["y"].copy_(y)
        for group, lr in zip(self.optimizer.param_groups, self._lr):
            lr.fill_(float(group["lr"]) if not torch.is_tensor(group["lr"]) else group["lr"])
        self.backend.replay(self._graph)
        self.replays += 1
        loss, logits = self._static["loss"], self._static["logits"]
        if check_loss is not None:
            check_loss(loss, logits)
        return self._after(StepOutcome(loss, logits), step, x)

    def _eager(self, x, y, step, check_loss, warm_up: bool = False) -> StepOutcome:
        self.eager_steps += 1

        def body() -> StepOutcome:
            return training_step(self.model, self.optimizer, x, y, criterion=self.criterion,
                                 controller=self.controller, step=None, check_loss=check_loss,
                                 execution=self.execution)
        outcome = self.backend.side_stream(body) if warm_up else body()
        return self._after(outcome, step, x)

    def _after(self, outcome: StepOutcome, step: int, x: torch.Tensor) -> StepOutcome:
        """The controller's ``after_step``, outside any graph (it may change the tensors)."""
        if self.controller is not None and after_step(self.controller, step, outcome, x.device).changed is not None:
            self._release()                      # the tensors the graph addressed are gone
        return outcome

    def _release(self) -> None:
        """Let the graph and its outputs go (the outputs live in its pool)."""
        if self._graph is not None:
            self.backend.release(self._graph)
            self._graph = None
        self._static = {}

    def _record(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Record one step on static input buffers, the learning rates as tensors (the old
        graph was released before the warm-up step that precedes every recording)."""
        started = time.perf_counter()
        self.backend.synchronize()
        self._static = {"x": x.clone(), "y": y.clone()}
        self._lr = []
        for group in self.optimizer.param_groups:
            value = group["lr"]
            lr = value if torch.is_tensor(value) else torch.tensor(float(value), device=x.device)
            group["lr"] = lr
            self._lr.append(lr)
        graph = self.backend.graph()
        controller = self.controller

        def body() -> None:
            outcome = training_step(self.model, self.optimizer, self._static["x"], self._static["y"],
                                    criterion=self.criterion, controller=controller, step=None,
                                    execution=self.execution, recording=True)
            self._static["logits"], self._static["loss"] = outcome.logits, outcome.loss

        try:
            self.backend.capture(graph, body)
            self.backend.synchronize()
        except Exception as error:  # noqa: BLE001 -- any failed recording leaves the step eager, not the run stopped
            self._static = {}
            try:
                self.backend.release(graph)
            except Exception:  # noqa: BLE001 -- a graph whose capture never began has nothing to free
                pass
            self._failed_version = self._tensors_version()
            self.fallbacks += 1
            reason = (str(error).strip().splitlines() or [""])[0]
            print(f"warning: recording the CUDA graph failed ({type(error).__name__}: {reason}); "
                  "these steps run eagerly until the next update", file=sys.stderr, flush=True)
            return
        self.memory_bytes = max(self.memory_bytes, self.backend.pool_bytes())
        self._graph = graph
        self._version = self._tensors_version()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - started

    def _tensors_version(self) -> int:
        """Which tensors the step addresses now: the controller counts every change it makes
        (:attr:`~barter_mini.core.method.MethodController.tensors_version`), whoever asked
        for it, so this is one read per step rather than a walk over the parameters."""
        return self.controller.tensors_version if self.controller is not None else 0

    def metrics(self) -> dict:
        """What metrics.json reports of the graphs."""
        return {"graph_captures": self.captures, "graph_capture_s": self.capture_seconds,
                "graph_memory_mb": self.memory_bytes / 2**20,
                "graph_replays": self.replays, "graph_eager_steps": self.eager_steps,
                "graph_fallbacks": self.fallbacks}
