"""CUDA graphs of whole training steps (training.graphs): when a step is recorded, replayed or
run eagerly. The recording itself needs a GPU; here a host stand-in "replays" a recorded step
by running its body again on the recorded input buffers and learning-rate tensors, so a run
through GraphedStep must equal the eager run across BARTER's topology updates, up to the
rounding of a float32 learning-rate tensor where an eager step reads a Python float (the
test gives both runs float32 tensors, so they must agree bit for bit)."""

from dataclasses import replace

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from barter_mini.core.execution import Execution
from barter_mini.errors import BarterError
from barter_mini.measure.bench import build_training_step
from barter_mini.core.method import MethodController
from barter_mini.training.graphs import GraphedStep, check_graphs_possible
from barter_mini.training.methods import METHODS, Look, Method
from barter_mini.training.run_config import RunConfig
from barter_mini.training.step import training_step
from barter_mini.training.trainer import build_training


class ReadTensors(TorchDispatchMode):
    """The tensors a step reads that it did not make itself (weights, optimizer state,
    masks, statistics, input buffers): what a recorded graph holds the addresses of. Each
    is kept alive while the mode is, so no other tensor can take its identity."""

    def __init__(self):
        super().__init__()
        self.made, self.read = {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and id(t) not in self.made:
                self.read[id(t)] = t
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.made[id(t)] = t
        return out


class HostBackend:
    """A host stand-in for CUDA's graphs: a capture runs the body once and then undoes its
    effects (a real capture executes nothing), remembering the learning-rate tensors the
    recorded optimizer step read and every tensor it read from outside itself; a replay
    runs the body again with those learning rates and fails, as a real replay would read
    freed memory, when the step now reads a tensor the recording did not (one that an
    update replaced since)."""

    def __init__(self, t):
        self.t = t
        self.captures = 0
        self.releases = 0

    def graph(self):
        return {}

    def _live(self):
        """What a step writes: weights, optimizer state, BARTER's statistics, SNFS's momentum."""
        t, controller = self.t, self.t.controller
        return ([p for p in t.model.parameters()]
                + [v for s in t.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
                + (controller.statistics.tensors() if hasattr(controller, "statistics") else [])
                + [v for s in getattr(controller, "_moments", {}).values() for v in s.values()])

    def capture(self, graph, body):
        saved = [v.detach().clone() for v in self._live()]
        graph["body"] = body
        graph["lr"] = [group["lr"] for group in self.t.optimizer.param_groups]
        with ReadTensors() as read:
            body()
        graph["read"] = read.read
        with torch.no_grad():
            for live, value in zip(self._live(), saved):
                live.copy_(value)
        self.captures += 1

    def replay(self, graph):
        floats = [group["lr"] for group in self.t.optimizer.param_groups]
        for group, lr in zip(self.t.optimizer.param_groups, graph["lr"]):
            group["lr"] = lr                  # what the recorded kernels read
        with ReadTensors() as read:
            graph["body"]()
        replaced = set(read.read) - set(graph["read"])
        assert not replaced, (f"a replay read {len(replaced)} tensors the recording did not "
                              f"(shapes {[tuple(read.read[i].shape) for i in list(replaced)[:3]]}): the graph is stale")
        for group, value in zip(self.t.optimizer.param_groups, floats):
            group["lr"] = value

    def release(self, graph):
        self.releases += 1
        graph.clear()                         # a replay of a released graph fails

    def side_stream(self, body):
        return body()

    def synchronize(self):
        pass

    def pool_bytes(self):
        return 0


def train_side_by_side(run: RunConfig, backend_type=HostBackend):
    """``run`` trained twice over its epochs, eagerly and through GraphedStep on the host
    stand-in, with the real LR schedule (as float32 tensors, as a recorded step reads it) and
    each epoch's last smaller batch; every step's loss and whether it changed the model must
    agree. Returns both trainings, the graphed step, its backend, the steps and the eager
    outcomes that changed the model."""
    eager, graphed_run = build_training(run), build_training(run)
    backend = backend_type(graphed_run)
    graphed = GraphedStep(graphed_run.model, graphed_run.optimizer, graphed_run.parts.criterion, graphed_run.controller,
                          Execution(), backend)
    step, changes = 0, []
    for _ in range(run.epochs):
        for x, y in eager.loaders[0]:
            step += 1
            outcome = training_step(eager.model, eager.optimizer, x, y, criterion=eager.parts.criterion,
                                    controller=eager.controller, step=step)
            mirrored = graphed(x, y, step)
            assert (outcome.changed is None) == (mirrored.changed is None)
            assert torch.equal(mirrored.loss, outcome.loss)
            if outcome.changed is not None:
                changes.append(outcome.changed)
            for t in (eager, graphed_run):
                t.scheduler.step_update(step)
                for group in t.optimizer.param_groups:
                    group["lr"] = torch.tensor(float(group["lr"]))
    for a, b in zip(eager.model.parameters(), graphed_run.model.parameters()):
        assert a.shape == b.shape and torch.equal(a, b)
    return eager, graphed_run, graphed, backend, step, changes


def test_graphed_steps_equal_eager_steps_across_topology_updates():
    """BARTER eager and through GraphedStep: the same allocations, weights and statistics,
    bit for bit, after updates that moved units."""
    run = RunConfig(method="barter", dataset="digits", recipe="smoke", epochs=3, density=0.5, seed=3, delta_t=4,
                    progress=False)
    eager, graphed_run, graphed, backend, step, changes = train_side_by_side(run)
    assert sum(r.executed for changed in changes for r in changed.values()) > 0
    for a, b in zip(eager.controller.statistics.tensors(), graphed_run.controller.statistics.tensors()):
        assert torch.equal(a, b)
    changing = [s for s in eager.controller.changing_steps() if s <= step]
    assert graphed.captures == backend.captures >= len(changing) and graphed.replays > step // 2
    assert graphed.replays + graphed.eager_steps == step
    # no graph outlives an update: each is followed by an eager warm-up step before recording
    assert graphed.eager_steps >= len(changing) + graphed.captures


class OneGraphAtATime(HostBackend):
    """Refuses a recording while an earlier graph is still alive (not released), and fails
    the recordings numbered in ``failing`` (counting from 1) as a CUDA capture can."""

    failing = (2,)

    def __init__(self, t):
        super().__init__(t)
        self.alive, self.tries = 0, 0

    def graph(self):
        assert self.alive == 0, "a new recording began while an older graph was alive"
        self.alive += 1
        return {}

    def capture(self, graph, body):
        self.tries += 1
        super().capture(graph, body)          # the step's Python side ran, its kernels were undone
        if self.tries in self.failing:
            self.captures -= 1
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel "
                               "errors might be asynchronously reported")

    def release(self, graph):
        self.alive -= 1
        super().release(graph)


def test_a_failed_recording_runs_those_steps_eagerly_and_records_again_after_the_next_update(capsys):
    """The second recording fails: its graph is released, one warning line is printed, the
    steps until the next update run eagerly (still bit for bit the eager run's), and the
    recording after that update succeeds; every recording began with no older graph alive,
    and the metrics count the fallback."""
    run = RunConfig(method="barter", dataset="digits", recipe="smoke", epochs=3, density=0.5, seed=3, delta_t=4,
                    progress=False)
    eager, _, graphed, backend, step, changes = train_side_by_side(run, OneGraphAtATime)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: recording the CUDA graph failed (RuntimeError: CUDA error: operation not "
                        "permitted when stream is capturing); these steps run eagerly until the next update"]
    assert backend.tries == graphed.captures + 1 and graphed.captures >= 2 and graphed.replays > 0
    assert graphed.metrics()["graph_fallbacks"] == 1
    assert graphed.replays + graphed.eager_steps == step
    assert backend.alive <= 1 and backend.releases >= backend.tries - 1


def test_a_step_that_cannot_replay_runs_with_no_graph_alive(monkeypatch):
    """An update step runs eagerly; the graph it could not replay is let go first, so its
    pool's activations are never held beside the eager step's (the update replaces what the
    graph addressed anyway)."""
    alive_during_update_steps = []
    original = GraphedStep._eager

    def eager(self, x, y, step, check_loss, warm_up=False):
        if not warm_up and not self.controller.graph_safe(step):
            alive_during_update_steps.append(self._graph is not None)
        return original(self, x, y, step, check_loss, warm_up)

    monkeypatch.setattr(GraphedStep, "_eager", eager)
    run = RunConfig(method="barter", dataset="digits", recipe="smoke", epochs=2, density=0.5, seed=3, delta_t=4,
                    progress=False)
    _, _, graphed, _, _, changes = train_side_by_side(run)
    assert changes and graphed.captures > 1
    assert alive_during_update_steps and not any(alive_during_update_steps)


class ProbeController(MethodController):
    """A method with host work before every step and no say on which steps may replay."""

    def before_step(self) -> None:
        pass


@pytest.mark.parametrize("method", ["rigl", "snfs", "s2vite"])
def test_a_masked_methods_graphed_steps_equal_its_eager_steps_across_mask_updates(method):
    """RigL, SNFS (its momentum updated before every step) and S2ViTE (its head hooks armed
    before an update) eager and through GraphedStep: the same masks and weights, bit for
    bit, after mask updates that regrew weights; every update step ran eagerly."""
    run = RunConfig(method=method, dataset="digits", recipe="smoke", epochs=1, density=0.5, seed=3, delta_t=4,
                    progress=False)
    eager, graphed_run, graphed, _, _, changes = train_side_by_side(run)
    assert changes and graphed.replays > 0 and graphed.captures >= len(changes)
    assert any(record["grown"] for record in eager.controller.history)
    for name, mask in eager.controller.state_dict()["masks"].items():
        assert torch.equal(mask, graphed_run.controller.state_dict()["masks"][name]), name


def test_graphs_are_refused_where_they_cannot_work(monkeypatch):
    with pytest.raises(BarterError, match="needs a CUDA device; this run is on cpu"):
        check_graphs_possible(torch.device("cpu"), "static")
    with pytest.raises(BarterError, match="runs on one process"):
        check_graphs_possible(torch.device("cuda"), "static", distributed=True)
    probe = Method("probe", "probe", ProbeController, full_width=False, build=lambda setup: ProbeController(),
                   look=Look("D", hue_slot=10))
    monkeypatch.setitem(METHODS, "probe", probe)
    with pytest.raises(BarterError, match="probe does work on the host before every step.*offered for dense, "
                                          "set, snfs, rigl, srigl, s2vite, static, oneshot, random-receiver, "
                                          "random-donor, random-pair, barter$"):
        check_graphs_possible(torch.device("cuda"), "probe")
    check_graphs_possible(torch.device("cuda"), "static")        # nothing to refuse
    with pytest.raises(BarterError, match="needs a CUDA device; this run asks for the cpu"):
        RunConfig(cuda_graphs=True, device="cpu").validate()
    with pytest.raises(BarterError, match="cannot be combined"):
        RunConfig(cuda_graphs=True, recompute=True).validate()


def test_which_methods_may_replay():
    barter = build_training_step("cct-mini", "barter", 0.5, 4, 200, torch.device("cpu")).controller
    update = barter.schedule.update_steps[0]
    assert barter.graph_safe(update + 1) and not barter.graph_safe(update)
    assert build_training_step("cct-mini", "static", 0.5, 4, 200, torch.device("cpu")).controller.graph_safe(1)
    rigl = build_training_step("cct-mini", "rigl", 0.5, 4, 200, torch.device("cpu")).controller
    update = rigl.schedule.update_steps[0]
    assert rigl.graph_safe(1) and rigl.graph_safe(update + 1) and not rigl.graph_safe(update)
    assert all(spec.replayable for spec in METHODS.values())


@pytest.mark.parametrize("method", ["rigl", "s2vite", "barter"])
def test_an_update_made_outside_the_graphed_step_is_never_replayed_stale(method):
    """The bench times an update by calling the controller's ``after_step`` itself, around
    the graphed step; the next step must not replay a graph that reads the masks or
    parameters the update replaced (the stand-in fails such a replay), but run eagerly and
    record anew."""
    from barter_mini.measure.bench import update_cost

    setup = build_training_step("cct-mini", method, 0.5, 4, 400, torch.device("cpu"))
    backend = HostBackend(setup)
    setup.parts = replace(setup.parts, graphed=GraphedStep(setup.model, setup.optimizer, setup.parts.criterion,
                                                           setup.controller, Execution(), backend))
    for _ in range(3):
        setup()
    recorded = setup.graphed.captures
    versions = setup.controller.tensors_version
    cost = update_cost(setup, samples=2, device=torch.device("cpu"))
    assert cost["update_units_moved"] > 0 or method != "barter"
    assert setup.controller.tensors_version >= versions + 2
    assert setup.graphed.captures >= recorded + 2         # recorded anew after each sampled update
    setup()                                               # and replays again: nothing stale
    assert setup.graphed.replays > 0


def test_a_barter_update_step_that_moves_nothing_replays():
    barter = build_training_step("cct-mini", "barter", 0.5, 4, 20_000, torch.device("cpu")).controller
    quiet = [s for s in barter.schedule.update_steps if not any(barter.schedule.transfers_at(s).values())]
    moving = barter.changing_steps()
    assert quiet and moving
    assert barter.graph_safe(quiet[0]) and not barter.graph_safe(moving[0])
