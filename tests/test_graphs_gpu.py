"""CUDA graphs on a real GPU (marked ``gpu``: skipped without CUDA; ``make test-gpu`` or
``pytest -m gpu`` runs them alone). Each case runs in a fresh process, as a training run
does, so that one recording's leftovers in the allocator cannot hide or cause another's
failure: record, release at an update, record again, for BARTER (surgery), RigL (new masks)
and Static (no update: one recording, replayed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu)")]

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", ["barter", "rigl", "static"])
def test_a_run_records_releases_and_records_again_in_a_fresh_process(method):
    """:func:`~barter_mini.measure.graph_check.record_release_record` in a process of its own."""
    result = subprocess.run([sys.executable, "-m", "barter_mini.measure.graph_check", method], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning:" not in result.stderr
    assert json.loads(result.stdout)["graph_replays"] > 0


def test_a_failed_recording_restores_the_stream_and_the_next_one_succeeds():
    from barter_mini.training.graphs import CudaBackend

    backend = CudaBackend()
    x = torch.ones(64, 64, device="cuda")
    backend.side_stream(lambda: x @ x)                 # the warm-up on the backend's stream
    before = torch.cuda.current_stream()
    failed = torch.cuda.CUDAGraph()

    def body():
        x @ x
        raise RuntimeError("failed inside the recording")

    with pytest.raises(RuntimeError):
        backend.capture(failed, body)
    assert torch.cuda.current_stream() == before
    backend.release(failed)
    graph = torch.cuda.CUDAGraph()
    out = backend.capture(graph, lambda: x @ x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full((64, 64), 64.0, device="cuda"))
    backend.release(graph)
