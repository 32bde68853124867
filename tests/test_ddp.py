"""One run on two processes (torchrun, gloo on the CPU) against one process with the same
global batch.

What must be equal, and what may not be: the two processes see exactly the images of each
global batch a single process sees, and DDP averages their gradients, so the decisions
(BARTER's receivers, donors and parents; RigL's masks) are the same: the allocation and
mask histories are compared for equality. The weights are not bitwise equal: the gradient
of a global batch is summed in another order (two half-batch means, then their mean), which
changes the last bits, and Adam divides by ``sqrt(v)``, so where a gradient is near zero
those bits can change an element's update by up to about the learning rate. The bound
tested, ``5e-3`` absolute per element (2.5 x the smoke recipe's peak learning rate after 20
steps, while the weights are of order 1), allows such a handful of elements; the norm of all
differences must stay under ``1e-3`` of the weights' norm. Measured: at most ``2e-4`` (BARTER)
and ``7e-4`` (RigL) per element.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from barter_mini.core.distributed import RankDivergence, check_same_on_every_rank
from barter_mini.training.checkpoints import load_checkpoint
from barter_mini.training.data import load_dataset, make_loaders

REPO = Path(__file__).resolve().parents[1]
RUN = ["train", "--dataset", "digits", "--recipe", "smoke", "--epochs", "2", "--density", "0.3", "--seed", "1",
       "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(n: int, method: str, out: Path) -> dict:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                 "--master-addr", "127.0.0.1", "--master-port", str(free_port())] if n > 1 else [sys.executable])
    result = subprocess.run([*launcher, "-m", "barter_mini.cli", *RUN, "--method", method, "--out", str(out)],
                            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("test acc") == 1          # rank 0 alone reports
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["barter", "rigl"])
def test_two_processes_decide_as_one_process_does(tmp_path, method):
    one = run_processes(1, method, tmp_path / "one")
    two = run_processes(2, method, tmp_path / "two")
    assert two["processes"] == 2 and one["processes"] == 1
    if method == "barter":
        updates = len(one["allocation_history"]) - 1
        assert updates >= 5 and sum(one["transfers_executed"].values()) > 0
        assert two["allocation_history"] == one["allocation_history"]
    else:
        history = lambda m: [(h["step"], h["dropped"], h["grown"]) for h in m["mask"]["history"]]
        updates = len(history(one))
        assert updates >= 5 and history(two) == history(one)
        masks_one = load_checkpoint(tmp_path / "one" / "last.pt")["controller"]["masks"]
        masks_two = load_checkpoint(tmp_path / "two" / "last.pt")["controller"]["masks"]
        assert all(torch.equal(masks_one[name], masks_two[name]) for name in masks_one)
    # the rank-divergence check ran after every update, on both processes
    assert two["rank_checks"] == updates and one["rank_checks"] == 0
    assert two["train_pflops"] == pytest.approx(one["train_pflops"])     # the global batch, not a share
    weights_one = load_checkpoint(tmp_path / "one" / "last.pt")["model"]
    weights_two = load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    difference = torch.cat([(w - weights_two[name]).float().flatten() for name, w in weights_one.items()])
    weights = torch.cat([w.float().flatten() for w in weights_one.values()])
    assert difference.abs().max() < 5e-3
    assert difference.norm() < 1e-3 * weights.norm()


def _disagree(rank: int, port: int, outcome) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        check_same_on_every_rank("masks", {"fc1": torch.tensor([True, rank == 0])}, step=7)
        outcome.put((rank, "agreed"))
    except RankDivergence as error:
        outcome.put((rank, str(error)))
    finally:
        dist.destroy_process_group()


def test_a_rank_divergence_fails_loudly_on_every_process():
    context = mp.get_context("spawn")
    outcome = context.Queue()
    port = free_port()
    processes = [context.Process(target=_disagree, args=(rank, port, outcome)) for rank in range(2)]
    for p in processes:
        p.start()
    messages = dict(outcome.get(timeout=120) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    assert set(messages) == {0, 1}
    for message in messages.values():
        assert "disagree on the masks after the update at step 7" in message and "rank 1" in message


def test_shares_of_global_batches_and_evaluation_sets_cover_each_image_once():
    splits = load_dataset("digits", seed=0)
    single_train, single_val, single_test = make_loaders(splits, 64, seed=5)
    shares = [make_loaders(splits, 64, seed=5, rank=r, world_size=2) for r in range(2)]
    single = list(single_train.batch_sampler)
    per_rank = [list(share[0].batch_sampler) for share in shares]
    assert len(single) == len(per_rank[0]) == len(per_rank[1])
    for whole, half0, half1 in zip(single, *per_rank):
        assert len(half0) == len(half1) == 32 and sorted(half0 + half1) == sorted(whole)
    for position in (1, 2):                  # validation, test
        indices = [list(share[position].dataset.indices) for share in shares]
        assert not set(indices[0]) & set(indices[1])
        assert sorted(indices[0] + indices[1]) == list(range(len(single_val.dataset if position == 1
                                                                    else single_test.dataset)))
