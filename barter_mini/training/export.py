"""Export a trained run in its smallest dense form (paper Tables 7, 9 and 15: exported size).

Each method says how (:meth:`~barter_mini.core.method.MethodController.smallest_dense_form`):

* BARTER, its ablations and static: the compact timm model exactly as trained.
* S2ViTE: its masked heads and FFN neurons are removed physically, which leaves a compact
  model of the same family; at equal density it has BARTER's parameter count.
* The unstructured masked methods (SET, SNFS, RigL, SRigL) and dense: the full-size model,
  zeros included; dense kernels cannot use unstructured zeros.

The exported file is a checkpoint of :data:`~barter_mini.training.checkpoint_parts.CHECKPOINT_FORMAT`
with the model alone, its method and density: the entries a model needs, written by the rows
of :data:`~barter_mini.training.checkpoint_parts.PARTS` that a run's checkpoint is written by
(:func:`~barter_mini.training.checkpoint_parts.entries_for`), so
:func:`~barter_mini.training.checkpoints.model_from_checkpoint` rebuilds it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from types import SimpleNamespace

import torch

from ..core.configs import ModelConfig
from ..core.counting import count_parameters
from .checkpoint_contents import building_from
from .checkpoint_parts import CHECKPOINT_FORMAT, MODEL_USE, entries_for
from .checkpoints import RUN_KEYS, failed_write, load_checkpoint, model_from_checkpoint
from ..errors import BarterError
from .methods import get_method
from .run_folder import RUN_FILES, RUN_LOCK
from .trusted_folders import open_trusted_folder

#: what a run folder holds besides :data:`~barter_mini.training.run_folder.RUN_FILES`: its lock and, in the run cache, the
#: completion record (training.cache.COMPLETION_RECORD) that vouches for the others
RUN_FOLDER_EXTRAS = (RUN_LOCK, "complete.json")


def _identity(found: os.stat_result) -> tuple[int, int]:
    return found.st_dev, found.st_ino


def check_not_run_file(run_dir: Path, out: Path, folder_fd: int) -> None:
    """A one-line error if ``out``, to be written into the folder held open as ``folder_fd``,
    is one of ``run_dir``'s own files (by name, or the same file under another name: a link):
    writing the export there would replace a run file with one that lacks the run's keys, and
    the next export or resume of the run would fail. The folder is compared as held, so
    turning its path into a link to the run folder after this check changes nothing."""
    names = RUN_FILES + RUN_FOLDER_EXTRAS
    own = set()
    for name in names:
        with contextlib.suppress(OSError):
            own.add(_identity(os.stat(run_dir / name)))
    same_folder = False
    with contextlib.suppress(OSError):
        same_folder = _identity(os.fstat(folder_fd)) == _identity(os.stat(run_dir))
    try:
        target = _identity(os.stat(out.name, dir_fd=folder_fd))
    except OSError:
        target = None
    if (same_folder and out.name in names) or target in own:
        raise BarterError(f"--out {out} is one of the run's own files ({', '.join(names)}): "
                          "export to a path outside them")


def save_in_folder(folder_fd: int, out: Path, checkpoint: dict) -> None:
    """``checkpoint`` written as ``out``'s name inside the folder held open as ``folder_fd``,
    through a temporary file renamed into place (a reader sees the old file or the whole new
    one); a failed write (a full device) removes the temporary file and is one line
    (:func:`~barter_mini.training.checkpoints.failed_write`)."""
    tmp = f".{out.name}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder_fd)
    except OSError as error:
        raise failed_write(out, error) from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
        os.replace(tmp, out.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        refusal = failed_write(out, error)
        if refusal is not None:
            raise refusal from None
        raise


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str = "best.pt") -> dict:
    """Write ``run_dir``'s model in its smallest dense form to ``out``; return a summary."""
    path, out = Path(run_dir) / checkpoint, Path(out)
    if not out.name or out.name in (".", ".."):
        raise BarterError(f"--out {out} names a folder: give a file path such as model.pt")
    folder_fd = open_trusted_folder(out.parent, f"the folder of --out {out}", create=True, trust=False)
    try:
        return _export(path, out, folder_fd)
    finally:
        os.close(folder_fd)


def _export(path: Path, out: Path, folder_fd: int) -> dict:
    check_not_run_file(path.parent, out, folder_fd)
    state = load_checkpoint(path, keys=RUN_KEYS, use="exporting it")
    if not isinstance(state["run"], dict) or not {"method", "density"} <= set(state["run"]):
        raise BarterError(f"{path} records no run settings with a method and a density: "
                          "pass a run folder written by barter-mini train with this version")
    method = state["run"]["method"]
    model = model_from_checkpoint(state, path=path).eval()
    with building_from(path):           # the method and its state are the file's: a refusal names it
        model = get_method(method).controller.smallest_dense_form(model, state["controller"])
    exported = {"format": CHECKPOINT_FORMAT, "method": method, "density": state["run"]["density"],
                **entries_for(MODEL_USE, SimpleNamespace(config=ModelConfig.from_dict(state["model_config"]),
                                                         model=model))}
    save_in_folder(folder_fd, out, exported)
    return {"method": method, "density": state["run"]["density"], "params": count_parameters(model),
            "allocation": exported["allocation"], "out": str(out)}
