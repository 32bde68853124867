"""Export a trained run in its smallest dense form (paper Tables 7, 9 and 15: exported size).

Each method says how (:meth:`~barter_mini.core.method.MethodController.smallest_dense_form`):

* BARTER, its ablations and static: the compact timm model exactly as trained.
* S2ViTE: its masked heads and FFN neurons are removed physically, which leaves a compact
  model of the same family; at equal density it has BARTER's parameter count.
* The unstructured masked methods (SET, SNFS, RigL, SRigL) and dense: the full-size model,
  zeros included; dense kernels cannot use unstructured zeros.

The exported file is a checkpoint of :data:`~barter_mini.training.checkpoints.CHECKPOINT_FORMAT`
with the model alone, so :func:`~barter_mini.training.checkpoints.model_from_checkpoint`
rebuilds it.
"""

from __future__ import annotations

from pathlib import Path

from ..core.counting import count_parameters
from ..core.surgery import allocation_of
from .checkpoint_contents import building_from
from .checkpoints import CHECKPOINT_FORMAT, RUN_KEYS, load_checkpoint, model_from_checkpoint, save_checkpoint
from ..errors import BarterError
from .methods import get_method
from .run_folder import RUN_FILES, RUN_LOCK

#: what a run folder holds besides :data:`~barter_mini.training.run_folder.RUN_FILES`: its lock and, in the run cache, the
#: completion record (training.cache.COMPLETION_RECORD) that vouches for the others
RUN_FOLDER_EXTRAS = (RUN_LOCK, "complete.json")


def check_not_run_file(run_dir: Path, out: Path) -> None:
    """A one-line error if ``out`` is one of ``run_dir``'s own files (by name, or the same
    file under another name: a link): writing the export there would replace a run file with
    one that lacks the run's keys, and the next export or resume of the run would fail."""
    names = RUN_FILES + RUN_FOLDER_EXTRAS
    own = [run_dir / name for name in names]
    same = out.resolve().parent == run_dir.resolve() and out.name in names
    if same or (out.exists() and any(path.exists() and out.samefile(path) for path in own)):
        raise BarterError(f"--out {out} is one of the run's own files ({', '.join(names)}): "
                          "export to a path outside them")


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str = "best.pt") -> dict:
    """Write ``run_dir``'s model in its smallest dense form to ``out``; return a summary."""
    path = Path(run_dir) / checkpoint
    check_not_run_file(Path(run_dir), Path(out))
    state = load_checkpoint(path, keys=RUN_KEYS, use="exporting it")
    if not isinstance(state["run"], dict) or not {"method", "density"} <= set(state["run"]):
        raise BarterError(f"{path} records no run settings with a method and a density: "
                          "pass a run folder written by barter-mini train with this version")
    method = state["run"]["method"]
    model = model_from_checkpoint(state, path=path).eval()
    with building_from(path):           # the method and its state are the file's: a refusal names it
        model = get_method(method).controller.smallest_dense_form(model, state["controller"])
    exported = {"format": CHECKPOINT_FORMAT, "method": method, "density": state["run"]["density"],
                "model_config": state["model_config"], "allocation": allocation_of(model).as_dict(),
                "model": model.state_dict()}
    save_checkpoint(Path(out), exported)
    return {"method": method, "density": state["run"]["density"], "params": count_parameters(model),
            "allocation": exported["allocation"], "out": str(out)}
