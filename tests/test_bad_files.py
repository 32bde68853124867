"""Every bad file is one line, never a traceback or a hang (issue 31, section 6).

Real files, written by a tiny run (``best.pt``, ``last.pt``) or by ``safetensors``, are
damaged the ways a disk, a download or a hostile hand damages them (bytes flipped or
replaced, the file cut short, odd leading bytes, the ``data.pkl`` inside the zip mutated,
a header that lies about a size) and given to every command-line site that reads them:
``export``, ``train --init`` and ``train --resume``. A file that is refused is status 2 and
one ``error: ...`` line naming it, and nothing is written; a damage that leaves a valid
file (a flipped bit inside a weight) may load, but never ends in a traceback.
"""

import io
import shutil
import struct
import tempfile
import time
import zipfile
from dataclasses import fields
from pathlib import Path

import pytest
import timm
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as safetensors_load, save_file

import barter_mini.training.checkpoints as checkpoints
from barter_mini.cli import main
from barter_mini.core.configs import ModelConfig
from barter_mini.training.checkpoint_contents import CONFIG_COUNTS, CONFIG_NAMES
from barter_mini.training.checkpoint_parts import PART_BY_NAME
from barter_mini.training.progress import PROGRESS_CHECKS
from barter_mini.training.checkpoints import MAX_INFLATE_RATIO, load_checkpoint, save_checkpoint

#: a second of training on digits
SMOKE = ["--dataset", "digits", "--recipe", "smoke", "--epochs", "1", "--seed", "0", "--no-progress"]
#: a stock timm ViT made small (tests/test_dense_start.py)
TIMM_SPEC = "timm:vit_tiny_patch16_224:patch_size=2,embed_dim=96,num_heads=6,depth=3"


def run_cli(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    status = main([str(arg) for arg in argv])
    return status, capsys.readouterr().err


def refused(status: int, err: str, path: Path) -> str:
    """The one ``error:`` line that refused ``path``."""
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, err)
    assert "Traceback" not in err and str(path) in lines[0], err
    return lines[0]


def contents(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """A compact run (``best.pt`` for export, its folder without ``metrics.json`` to resume:
    killed after its last ``last.pt``), a dense run's ``best.pt`` (``--init``) and a timm
    state dict as safetensors (``--init`` of a timm model)."""
    root = tmp_path_factory.mktemp("sources")
    assert main(["train", "--method", "barter", "--density", "0.5", *SMOKE, "--out", str(root / "run")]) == 0
    assert main(["train", "--method", "dense", *SMOKE, "--out", str(root / "dense")]) == 0
    resumable = root / "resumable"
    shutil.copytree(root / "run", resumable)
    (resumable / "metrics.json").unlink()
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, patch_size=2, embed_dim=96, num_heads=6,
                            depth=3, img_size=8, in_chans=1, num_classes=10)
    save_file(vit.state_dict(), root / "vit.safetensors")
    return {"best": (root / "run" / "best.pt").read_bytes(), "dense": (root / "dense" / "best.pt").read_bytes(),
            "resumable": resumable, "safetensors": (root / "vit.safetensors").read_bytes(), "root": root}


# ----------------------------------------------------------------------------- the load sites

def export_site(tmp: Path, data: bytes, capsys, must_refuse: bool = False) -> None:
    """``export`` of a run folder whose ``best.pt`` is ``data``."""
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "best.pt").write_bytes(data)
    status, err = run_cli(["export", run_dir, "--out", tmp / "exported.pt"], capsys)
    if status == 2 or must_refuse:
        refused(status, err, run_dir / "best.pt")
        assert not (tmp / "exported.pt").exists()
    else:
        assert status == 0 and load_checkpoint(tmp / "exported.pt")["method"] == "barter", err


def init_site(tmp: Path, data: bytes, capsys, must_refuse: bool = False) -> None:
    """``train --init`` from the dense checkpoint ``data``."""
    init = tmp / "dense.pt"
    init.write_bytes(data)
    status, err = run_cli(["train", "--method", "dense", *SMOKE, "--init", init, "--out", tmp / "tuned"], capsys)
    if status == 2 or must_refuse:
        refused(status, err, init)
        assert not (tmp / "tuned").exists()
    else:
        assert status == 0 and (tmp / "tuned" / "metrics.json").is_file(), err


def resume_site(tmp: Path, data: bytes, capsys, resumable: Path, must_refuse: bool = False) -> None:
    """``train --resume`` of a run killed after its last ``last.pt``, now ``data``."""
    out = tmp / "resumed"
    shutil.copytree(resumable, out)
    (out / "last.pt").write_bytes(data)
    before = contents(out)
    status, err = run_cli(["train", "--method", "barter", "--density", "0.5", *SMOKE, "--resume", "--out", out],
                          capsys)
    if status == 2 or must_refuse:
        refused(status, err, out / "last.pt")
        assert contents(out) == before
    else:
        assert status == 0 and (out / "metrics.json").is_file(), err


def at_site(site: str, files: dict, tmp: Path, data: bytes, capsys, must_refuse: bool = False) -> None:
    if site == "export":
        export_site(tmp, data, capsys, must_refuse)
    elif site == "init":
        init_site(tmp, data, capsys, must_refuse)
    else:
        resume_site(tmp, data, capsys, files["resumable"], must_refuse)


def source(files: dict, site: str) -> bytes:
    """The real file each site reads."""
    return {"export": files["best"], "init": files["dense"],
            "resume": (files["resumable"] / "last.pt").read_bytes()}[site]


# ----------------------------------------------------------------------------- damage

def rezipped(data: bytes, change) -> bytes:
    """``data`` (a torch.save zip) with its ``data.pkl`` member replaced by ``change(pickle)``,
    every other member as it was, the zip written anew (its sizes and CRCs consistent)."""
    original, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in original.infolist():
            member = original.read(info)
            target.writestr(info, change(member) if info.filename.endswith("/data.pkl") else member)
    return out.getvalue()


@st.composite
def damage(draw, data: bytes) -> bytes:
    """``data`` damaged one way: bytes flipped, leading bytes replaced or prepended, the end
    cut off, or bytes of the pickle inside the zip replaced."""
    how = draw(st.sampled_from(["flip", "lead", "prepend", "truncate", "pickle"]))
    if how == "flip":
        damaged = bytearray(data)
        # the zip's first member, data.pkl, and its headers are in the first 64 kB; the rest is weights
        end = draw(st.sampled_from([min(len(data), 65536), len(data)]))
        for position in draw(st.lists(st.integers(0, end - 1), min_size=1, max_size=8)):
            damaged[position] ^= draw(st.integers(1, 255))
        return bytes(damaged)
    if how == "lead":
        lead = draw(st.binary(min_size=1, max_size=16))
        return lead + data[len(lead):]
    if how == "prepend":
        return draw(st.binary(min_size=1, max_size=16)) + data
    if how == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    pickle_size = len(zipfile.ZipFile(io.BytesIO(data)).read(
        next(n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n.endswith("/data.pkl"))))
    changes = draw(st.lists(st.tuples(st.integers(0, pickle_size - 1), st.integers(0, 255)), min_size=1, max_size=4))

    def change(member: bytes) -> bytes:
        member = bytearray(member)
        for position, value in changes:
            member[position] = value
        return bytes(member)
    return rezipped(data, change)


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_file_at_every_load_site_is_one_line_or_loads(files, capsys, data):
    site = data.draw(st.sampled_from(["export", "init", "resume"]), label="site")
    damaged = data.draw(damage(source(files, site)), label="damaged")
    tmp = Path(tempfile.mkdtemp(dir=files["root"].parent))
    try:
        at_site(site, files, tmp, damaged, capsys)
    finally:
        shutil.rmtree(tmp)


#: pickle streams whose restricted unpickling ends in a bare error: a memo never stored
#: (KeyError), a dict as a dict key (TypeError), an append to an empty stack or a reduce with
#: no callable (IndexError), a persistent id that is no tuple (AssertionError)
BARE_ERRORS = [b"\x80\x02h\x07.", b"\x80\x02j\x01\x00\x00\x00.", b"\x80\x02}}}s.", b"\x80\x02a.",
               b"\x80\x02K\x01\x85R.", b"\x80\x02K\x01Q."]


def test_odd_leading_bytes_are_one_line_at_every_site(files, capsys, tmp_path):
    """The first bytes replaced: no longer a zip, the file is read as a pickle that ends
    anywhere (:data:`BARE_ERRORS` without their STOP, then the zip's own bytes)."""
    for number, lead in enumerate([stream[:-1] for stream in BARE_ERRORS] + [b"\x00" * 8, b"PK\x05\x06"]):
        for site in ("export", "init", "resume"):
            case = tmp_path / f"{site}-{number}"
            case.mkdir()
            real = source(files, site)
            at_site(site, files, case, lead + real[len(lead):], capsys, must_refuse=True)


def test_pickles_in_the_zip_that_end_in_bare_errors_are_one_line(files, capsys, tmp_path):
    """A zip whose data.pkl is one of :data:`BARE_ERRORS`: one line at every site."""
    for number, stream in enumerate(BARE_ERRORS):
        for site in ("export", "init", "resume"):
            case = tmp_path / f"{site}-{number}"
            case.mkdir()
            at_site(site, files, case, rezipped(source(files, site), lambda member: stream), capsys,
                    must_refuse=True)


# ----------------------------------------------------------------------------- sizes that lie

def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path, capsys, monkeypatch):
    """64 MiB of zeros deflated into 65 kB: refused from the zip's central directory, before
    torch.load (here made to fail the test) inflates anything."""
    torch.save({"format": 3, "model": {"w": torch.zeros(16 * 2**20)}}, tmp_path / "plain.pt")
    plain = zipfile.ZipFile(tmp_path / "plain.pt")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    bomb = run_dir / "best.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
        for info in plain.infolist():
            target.writestr(info.filename, plain.read(info))
    inflated = sum(info.file_size for info in zipfile.ZipFile(bomb).infolist())
    assert inflated > 4 * MAX_INFLATE_RATIO * bomb.stat().st_size

    def inflate(*args, **kwargs):
        raise AssertionError("torch.load was called on the zip bomb")
    monkeypatch.setattr(torch, "load", inflate)
    started = time.perf_counter()
    status, err = run_cli(["export", run_dir, "--out", tmp_path / "exported.pt"], capsys)
    line = refused(status, err, bomb)
    assert f"{inflated:,} bytes" in line and f"{bomb.stat().st_size:,}" in line
    assert time.perf_counter() - started < 5 and not (tmp_path / "exported.pt").exists()

    timm_bomb = tmp_path / "vit.pth"                  # the --init of a timm model reads it with timm's loader
    shutil.copy(bomb, timm_bomb)
    status, err = run_cli(["train", "--method", "dense", "--model", TIMM_SPEC, *SMOKE, "--init", timm_bomb,
                           "--out", tmp_path / "tuned"], capsys)
    assert f"{inflated:,} bytes" in refused(status, err, timm_bomb) and not (tmp_path / "tuned").exists()


def timm_init(tmp: Path, data: bytes, capsys, name: str = "vit.safetensors") -> str:
    """``train --init`` of a timm model from the file ``data``; the refusal's line."""
    tmp.mkdir(exist_ok=True)
    path = tmp / name
    path.write_bytes(data)
    status, err = run_cli(["train", "--method", "dense", "--model", TIMM_SPEC, *SMOKE, "--init", path,
                           "--out", tmp / "tuned"], capsys)
    assert not (tmp / "tuned").exists()
    return refused(status, err, path)


def test_a_crafted_safetensors_header_is_one_line(files, tmp_path, capsys):
    real = files["safetensors"]
    (header_size,) = struct.unpack("<Q", real[:8])
    huge = struct.pack("<Q", 2**62) + real[8:]               # a header larger than the file
    assert "a header of 4,611,686,018,427,387,904 bytes" in timm_init(tmp_path, huge, capsys)
    garbled = bytearray(real)                                # the JSON header itself broken
    garbled[8:8 + 12] = b"\x00\xff" * 6
    assert "not a readable safetensors file" in timm_init(tmp_path, bytes(garbled), capsys)
    header = real[8:8 + header_size]                         # a tensor's bytes past the end of the file
    assert b'"data_offsets":[0,' in header
    moved = header.replace(b'"data_offsets":[0,', b'"data_offsets":[9,', 1)
    assert "not a readable safetensors file" in timm_init(tmp_path, real[:8] + moved + real[8 + header_size:],
                                                          capsys)
    assert "5 bytes" in timm_init(tmp_path, real[:5], capsys)          # shorter than its length field


def test_a_pickle_renamed_safetensors_is_one_line(files, tmp_path, capsys):
    assert "is not a safetensors file" in timm_init(tmp_path, files["dense"], capsys)
    vit = load_safetensors(files["safetensors"])
    buffer = io.BytesIO()
    torch.save(vit, buffer)                                  # a timm state dict, the name says otherwise
    assert "is not a safetensors file" in timm_init(tmp_path / "b", buffer.getvalue(), capsys)


# ----------------------------------------------------------------------------- --init: shapes and dtypes

def test_wrong_shapes_or_dtypes_given_to_init_name_the_first_tensor(files, tmp_path, capsys):
    state = torch.load(io.BytesIO(files["dense"]), weights_only=True)
    name = "blocks.1.mlp.fc1.weight"
    rows, columns = state["model"][name].shape
    state["model"][name] = torch.zeros(rows - 3, columns)
    save_checkpoint(tmp_path / "shapes.pt", state)
    status, err = run_cli(["train", "--method", "dense", *SMOKE, "--init", tmp_path / "shapes.pt",
                           "--out", tmp_path / "tuned"], capsys)
    line = refused(status, err, tmp_path / "shapes.pt")
    assert f"{name} of shape [{rows}, {columns}] in the model, [{rows - 3}, {columns}] in the file" in line
    assert not (tmp_path / "tuned").exists()

    state["model"][name] = torch.zeros(rows, columns, dtype=torch.int64)
    save_checkpoint(tmp_path / "dtypes.pt", state)
    status, err = run_cli(["train", "--method", "dense", *SMOKE, "--init", tmp_path / "dtypes.pt",
                           "--out", tmp_path / "tuned"], capsys)
    assert f"{name} is torch.int64 in the file" in refused(status, err, tmp_path / "dtypes.pt")
    assert not (tmp_path / "tuned").exists()

    vit = load_safetensors(files["safetensors"])             # a timm file
    vit["blocks.2.attn.qkv.weight"] = vit["blocks.2.attn.qkv.weight"][:7].clone()
    buffer = tmp_path / "vit.safetensors"
    save_file(vit, buffer)
    line = timm_init(tmp_path / "timm", buffer.read_bytes(), capsys)
    assert "blocks.2.attn.qkv.weight of shape [288, 96] in the model, [7, 96] in the file" in line


def load_safetensors(data: bytes) -> dict:
    return {name: tensor.clone() for name, tensor in safetensors_load(data).items()}


# ----------------------------------------------------------------------------- --resume: the resume state

def resumed_with(files, tmp_path, capsys, change) -> str:
    """Resume the run from its last.pt changed by ``change(checkpoint)``; the refusal's line."""
    out = tmp_path / "resumed"
    shutil.copytree(files["resumable"], out)
    checkpoint = torch.load(out / "last.pt", weights_only=True)
    change(checkpoint)
    save_checkpoint(out / "last.pt", checkpoint)
    before = contents(out)
    status, err = run_cli(["train", "--method", "barter", "--density", "0.5", *SMOKE, "--resume", "--out", out],
                          capsys)
    assert contents(out) == before
    return refused(status, err, out / "last.pt")


@pytest.mark.parametrize("where, key, value, message", [
    ("progress", "epoch", "2", "epoch must be an integer"),
    ("top", "epoch", "1", "epoch must be an integer"),
    ("length", "total_steps", -5, "total_steps must be"),
    ("progress", "step", 11, "step must be"),
    ("progress", "elapsed_s", float("nan"), "elapsed_s must be"),
    ("progress", "history", {"epoch": 1}, "history must be a list"),
    ("progress", "window", [(1.0,)], "window must be a list of (loss, accuracy) pairs"),
    ("progress", "epoch_loader_state", [1, 2], "epoch_loader_state must be"),
    ("top", "rng", None, "rng must be a list"),
])
def test_a_last_pt_with_a_bad_resume_state_is_one_line(files, tmp_path, capsys, where, key, value, message):
    def change(checkpoint):
        (checkpoint if where == "top" else checkpoint[where])[key] = value
    assert message in resumed_with(files, tmp_path, capsys, change)


def test_a_last_pt_whose_scheduler_or_optimizer_does_not_fit_is_one_line(files, tmp_path, capsys):
    def scheduler(checkpoint):
        checkpoint["scheduler"]["t_initial"] = 0          # timm divides by it
    assert "scheduler" in resumed_with(files, tmp_path / "a", capsys, scheduler)

    def noise(checkpoint):
        checkpoint["scheduler"]["noise_range_t"] = 5      # timm then loops while |noise| >= noise_pct
        checkpoint["scheduler"]["noise_pct"] = 0.0
    assert "scheduler" in resumed_with(files, tmp_path / "b", capsys, noise)

    def moments(checkpoint):
        state = checkpoint["optimizer"]["state"]
        first = next(iter(state))
        state[first]["exp_avg"] = state[first]["exp_avg"][:1]
    assert "optimizer" in resumed_with(files, tmp_path / "c", capsys, moments)

    def weights(checkpoint):
        checkpoint["model"]["blocks.0.attn.qkv.weight"] = checkpoint["model"]["blocks.0.attn.qkv.weight"][:5]
    assert "blocks.0.attn.qkv.weight of shape" in resumed_with(files, tmp_path / "d", capsys, weights)


def test_the_resume_checks_cover_every_entry_of_the_resume_state(files):
    last = torch.load(files["resumable"] / "last.pt", weights_only=True)
    assert set(PART_BY_NAME) | {"format", "version"} == set(last)
    assert set(PROGRESS_CHECKS) == set(last["progress"])


def test_a_last_pt_whose_generator_states_are_out_of_range_is_one_line(files, tmp_path, capsys):
    """Integers out of a generator's range end in an OverflowError where the trainer restores
    them: refused when the file is read, naming the generator."""
    def numpy_key(checkpoint):
        checkpoint["rng"][0]["numpy"]["state"]["key"][3] = 2**40
    assert "last.pt: rng[0].numpy is not a state" in resumed_with(files, tmp_path / "a", capsys, numpy_key)

    def python_state(checkpoint):
        version, internal, gauss = checkpoint["rng"][0]["python"]
        checkpoint["rng"][0]["python"] = (version, (-1,) + internal[1:], gauss)
    assert "last.pt: rng[0].python is not a state" in resumed_with(files, tmp_path / "b", capsys, python_state)

    def method_generator(checkpoint):                       # BARTER's own numpy generator
        checkpoint["controller"]["rng"]["state"]["state"] = -1
    assert "controller.rng is not a state of a NumPy bit generator" in resumed_with(
        files, tmp_path / "c", capsys, method_generator)


def test_settings_that_do_not_fit_the_weights_are_refused_before_a_model_is_built(files, tmp_path, capsys,
                                                                                  monkeypatch):
    """A best.pt whose model_config says embed_dim 2**20 (terabytes of weights) is refused by
    comparing its tensors with the model built on the meta device; the model is never built
    for real. Counts of layers beyond the file's tensors (a build or a loop over 2**31 of them)
    and settings that would make timm load another file are refused before that."""
    built = checkpoints.build_model

    def build_on_meta_only(*args, **kwargs):
        assert torch.empty(0).device.type == "meta", "a model was built for real from settings its weights do not fill"
        return built(*args, **kwargs)
    monkeypatch.setattr(checkpoints, "build_model", build_on_meta_only)
    state = torch.load(io.BytesIO(files["best"]), weights_only=True)
    for number, (key, value, message) in enumerate([
            ("embed_dim", 2**20, "pos_embed of shape [1, 4, 1048576] in the model, [1, 4, 64] in the file"),
            ("depth", 2**20, "model_config.depth must be at most the 53 tensors the file holds, got 1048576"),
            ("conv_layers", 2**31, "model_config.conv_layers must be at most the 53 tensors"),   # a loop over them
            ("depth", 5, "model_config has 5 layers, and the weights name layers 0..3"),
            ("timm_kwargs", [("checkpoint_path", "/etc/passwd")], "timm_kwargs must be (name, value) pairs")]):
        run_dir = tmp_path / f"run{number}"
        allocation = {kind: widths + widths[:1] for kind, widths in state["allocation"].items()} \
            if (key, value) == ("depth", 5) else state["allocation"]
        save_checkpoint(run_dir / "best.pt", {**state, "model_config": {**state["model_config"], key: value},
                                              "allocation": allocation})
        status, err = run_cli(["export", run_dir, "--out", tmp_path / "exported.pt"], capsys)
        assert message in refused(status, err, run_dir / "best.pt")
        assert not (tmp_path / "exported.pt").exists()


def test_every_model_setting_is_checked():
    assert set(CONFIG_COUNTS) | set(CONFIG_NAMES) | {"timm_kwargs"} == {f.name for f in fields(ModelConfig)}


@pytest.mark.parametrize("key, value", [("method", "\x00arter"), ("method", ["barter"]), ("density", "0.5"),
                                        ("density", float("nan")), ("density", 7.0)])
def test_a_run_setting_read_from_best_pt_is_refused_naming_the_file(files, tmp_path, capsys, key, value):
    """A best.pt whose stored run names a method this version lacks, or a density no run
    has: export's refusal names the file, as every refusal of a setting read from a file does."""
    state = torch.load(io.BytesIO(files["best"]), weights_only=True)
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir / "best.pt", {**state, "run": {**state["run"], key: value}})
    status, err = run_cli(["export", run_dir, "--out", tmp_path / "exported.pt"], capsys)
    assert key in refused(status, err, run_dir / "best.pt")
    assert not (tmp_path / "exported.pt").exists()
