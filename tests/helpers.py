"""Helpers shared by the tests: tiny models, batches, one training step, invariants, servers."""

import contextlib
import socket
import subprocess
import time
import urllib.error

import pytest
import torch

from barter_mini.core.budgets import Allocation
from barter_mini.core.configs import ModelConfig
from barter_mini.core.models import build_model
from barter_mini.masked import MaskedDST
from barter_mini.training.methods import METHODS
from barter_mini.training.step import training_step

#: a CPU-instant model: 3 layers, up to 4 heads of 16 and 12 FFN channels, 8x8 inputs
TINY_CCT = ModelConfig(name="tiny-cct", family="cct", img_size=8, in_chans=1, num_classes=5, depth=3,
                       embed_dim=24, heads_per_layer=4, ffn_per_layer=12, conv_layers=1)
TINY_VIT = ModelConfig(name="tiny-vit", family="vit", img_size=8, in_chans=1, num_classes=5, depth=3,
                       embed_dim=24, heads_per_layer=4, ffn_per_layer=12, patch_size=2)

#: the masked baselines by name, from the registry
MASKED = {name: m.controller for name, m in METHODS.items() if issubclass(m.controller, MaskedDST)}


def tiny_model(config: ModelConfig, heads=(2, 3, 1), ffn=(5, 8, 3), seed: int = 0):
    torch.manual_seed(seed)
    return build_model(config, allocation=Allocation(heads=tuple(heads), ffn=tuple(ffn)))


def batch(config: ModelConfig, n: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, config.in_chans, config.img_size, config.img_size, generator=g)
    y = torch.randint(0, config.num_classes, (n,), generator=g)
    return x, y


def train_step(model, optimizer, x, y):
    """One plain optimizer step (the package's own protocol, no method); its loss."""
    return training_step(model, optimizer, x, y).loss.item()


def assert_in_sync(model, optimizer):
    """Every model parameter is in exactly one param group, and its state has its shape."""
    params = list(model.parameters())
    grouped = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(grouped) == len(params)
    assert {id(p) for p in grouped} == {id(p) for p in params}
    assert {id(p) for p in optimizer.state} <= {id(p) for p in params}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                assert value.shape == p.shape, key


#: where the tests' servers listen
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(server: subprocess.Popen, answers, timeout: float, name: str, log=lambda: ""):
    """Wait until ``answers()`` is true (it may raise a connection error meanwhile), fail the
    test if ``server`` exits or ``timeout`` seconds pass first, and stop the server at the end
    (terminate, then kill)."""
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if answers():
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if server.poll() is not None:
                pytest.fail(f"{name} exited with {server.returncode}:\n{log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not answer within {timeout} s:\n{log()}")
            time.sleep(0.1)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def exit_status_and_stderr(main, argv, capsys) -> tuple[int, str]:
    """``main(ARGV)`` of a command line, in-process: its exit status (argparse's refusal
    included) and what it wrote to stderr."""
    capsys.readouterr()
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err
