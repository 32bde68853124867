"""Atomic writes and checkpoints: a crash never leaves a half-written result behind, and a
file read back never runs code.

A checkpoint is a dict saved with ``torch.save``: ``format``
(:data:`~barter_mini.training.checkpoint_parts.CHECKPOINT_FORMAT`), ``version`` and one entry
per part of :data:`~barter_mini.training.checkpoint_parts.PARTS`: the run and recipe settings,
the model configuration and per-layer ``allocation`` (so the compact model can be rebuilt with
the right tensor sizes), the model, optimizer and method controller's states, the epoch, step
and validation scores, and what continuing the run needs (its length, progress, LR schedule,
loss scaler and random generators).

It holds only tensors, numbers, strings, None and plain containers (dicts, lists, tuples):
settings as dicts, random generators' states as tensors, lists and ints. Every file is read
with ``torch.load(..., weights_only=True)``, PyTorch's restricted unpickler, which builds
nothing else; a pickle that names any other class or function (``os.system`` in a
downloaded file's ``__reduce__``) is refused before anything is called, in one line that
names the file. A file that loads but lacks what its use needs (:data:`MODEL_KEYS`,
:data:`RUN_KEYS`, :data:`RESUME_KEYS`) is one line too.

Every bad file is one line that names it, never a traceback or a hang: a damaged or foreign
file (whatever error its unpickling or decoding ends in, :data:`DAMAGED_FILE_ERRORS`); a
zip that would inflate far beyond its own size (:func:`check_inflation`), refused before
anything is inflated; a safetensors header whose length field exceeds the file
(:func:`check_safetensors_header`); weights of other names, shapes or dtypes than the model's
(:func:`~barter_mini.training.checkpoint_contents.check_weights`, the first tensor that differs); settings or a
resume state of other types or ranges than a run writes
(:func:`~barter_mini.training.checkpoint_contents.check_model_entries`, each part's own check:
:func:`~barter_mini.training.checkpoint_parts.check_resume_state`).
A model is built for real only once the file's tensors, whose bytes it holds, are known to
fill it exactly (:func:`~barter_mini.training.checkpoint_contents.model_shapes` builds it on the meta device first), so no setting in a
file makes a load allocate more than the file holds.

Results are written through a temporary file beside the target, renamed into place
(:func:`write_json`, :func:`save_checkpoint`), with the permissions the user's umask gives a
new file: a cache stays readable by the group where the umask says so (others may read it,
never write it: :mod:`~barter_mini.training.trusted_folders`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import pickle
import re
import struct
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.models import CompactTransformer, build_model
from ..errors import BarterError, shown_path
from .checkpoint_contents import building_from, check_model_entries, check_weights, model_shapes
from .checkpoint_parts import CHECKPOINT_FORMAT, MODEL_USE, PART_BY_NAME, RESUME_USE, RUN_USE, keys_for

#: what a checkpoint needs to rebuild its model (:func:`model_from_checkpoint`; ``--init``, exports)
MODEL_KEYS = keys_for(MODEL_USE)
#: ... and to be a training run's (``best.pt``, ``last.pt``: its settings, controller, scores)
RUN_KEYS = keys_for(RUN_USE)
#: ... and to continue it exactly (``last.pt`` with ``--resume``)
RESUME_KEYS = keys_for(RESUME_USE)
#: a temporary file of an atomic write of the result ``name``: ``.NAME.`` and mkstemp's suffix
TEMPORARY_PREFIX = ".{name}."

#: a zip (torch.save's format) may inflate to at most this many times its own size, plus
#: :data:`INFLATE_ALLOWANCE` (:func:`check_inflation`): torch.save stores every member
#: uncompressed (a ratio below 1); a checkpoint re-compressed by a zip tool inflates to a few
#: times its size (floats compress poorly; a masked model's zeros reach about 10), while
#: deflate reaches about 1000 on a run of zeros: a 1.35 MB file that claims 1.9 GB
MAX_INFLATE_RATIO = 32
#: ... plus this many bytes, which a small file's headers and short members may take
INFLATE_ALLOWANCE = 1 << 20
#: the first bytes of a zip, by which torch.load tells its zip format from a bare pickle
ZIP_MAGIC = b"PK\x03\x04"
#: a safetensors file: this 8-byte little-endian length of its JSON header, the header, the tensors
SAFETENSORS_LENGTH = struct.Struct("<Q")
#: what unpickling or decoding a damaged file ends in: torch's restricted unpickler is Python
#: code that meets a stream ending anywhere with a bare KeyError (a memo never stored),
#: IndexError (a pop from an empty stack), TypeError (a dict as a dict key), AttributeError or
#: AssertionError; decoding a size, a string or a zip can end in a ValueError (UnicodeDecodeError),
#: OverflowError, MemoryError, struct.error or an OSError. Caught only around a read of a file.
DAMAGED_FILE_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError,
                       struct.error, LookupError, TypeError, AttributeError, ArithmeticError, MemoryError,
                       AssertionError)


def ensure_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents); a one-line error where that is impossible."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise BarterError(f"cannot create the folder {shown_path(folder)}: a part of the path is a file; "
                          "choose a path whose parents are folders") from None
    except PermissionError:
        raise BarterError(f"cannot create the folder {shown_path(folder)}: permission denied") from None
    except OSError as error:            # a name too long, a loop of links, no space left
        raise BarterError(f"cannot create the folder {shown_path(folder)}: "
                          f"{error.strerror or type(error).__name__}") from None
    return folder


def check_can_create(folder: Path) -> Path:
    """Refuse, before any work is done, a folder that cannot be created: the nearest existing
    part of the path must be a folder we may write in. Creates nothing."""
    folder = Path(folder)
    existing = folder
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        is_folder = existing.is_dir()
    except OSError as error:            # a name too long (exists() ignores only a missing part or a loop)
        raise BarterError(f"cannot create the folder {shown_path(folder)}: "
                          f"{error.strerror or type(error).__name__}") from None
    if not is_folder:
        raise BarterError(f"cannot create the folder {shown_path(folder)}: {shown_path(existing)} is a file; "
                          "choose a path whose parents are folders")
    # a trial folder, removed at once: os.access says yes to root and on read-only or
    # virtual file systems (/proc, /sys), where only an actual mkdir tells
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".barter-mini-probe.", dir=existing))
    except OSError as error:
        raise BarterError(f"cannot create the folder {shown_path(folder)}: {shown_path(existing)} is not writable "
                          f"({error.strerror or type(error).__name__})") from None
    return folder


def _umask() -> int:
    mask = os.umask(0o022)      # reading the umask means setting it: set it straight back
    os.umask(mask)
    return mask


#: the errors of a write that found no room: the device is full, or the user's quota is
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: what torch's zip writer raises when a write of it fell short (it drops the errno): the
#: position it reached is not the one it wrote to, or the write failed
TORCH_WRITE_FAILED = re.compile(r"unexpected pos|file write failed|PytorchStreamWriter failed")
#: free bytes below which a failed write is taken for a full device (torch's writer says only
#: that it fell short)
LOW_SPACE = 64 << 20


def _mount_of(folder: Path) -> Path:
    """The mount point of the file system that holds ``folder`` (how a device is named)."""
    folder = Path(os.path.abspath(folder))
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def _free_bytes(folder: Path) -> int | None:
    try:
        found = os.statvfs(folder)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def failed_write(path: Path, error: BaseException) -> BarterError | None:
    """The one-line error of a write of ``path`` that ended in ``error``, or None if ``error``
    is no failed write: an OSError (no space left: :data:`NO_SPACE_ERRNOS`), or torch's zip
    writer falling short (:data:`TORCH_WRITE_FAILED`), taken for a full device when less than
    :data:`LOW_SPACE` is free there."""
    if isinstance(error, OSError):
        no_space = error.errno in NO_SPACE_ERRNOS
        reason = error.strerror or type(error).__name__
    elif isinstance(error, RuntimeError) and TORCH_WRITE_FAILED.search(str(error)):
        free = _free_bytes(path.parent)
        no_space = free is not None and free < LOW_SPACE
        reason = "the write fell short"
    else:
        return None
    intact = "the last checkpoint is intact" if path.suffix == ".pt" else f"an earlier {path.name} is intact"
    if no_space:
        quota = " (or your quota there)" if getattr(error, "errno", None) == errno.EDQUOT else ""
        return BarterError(f"no space left on {_mount_of(path.parent)}{quota} while writing {path}; {intact}: "
                           "free some space and run again (--resume continues a run)")
    return BarterError(f"cannot write {path} ({reason}); {intact}")


def write_atomically(path: Path, write: Callable[[str], None]) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then rename it into place: a reader
    sees the old file or the whole new one, never half of it; the file gets the umask's mode.
    A write that fails (a full device, :func:`failed_write`) leaves the old file as it was,
    removes the temporary one and is a one-line error."""
    path = Path(path)
    ensure_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX.format(name=path.name), dir=path.parent)
    except OSError as error:
        raise failed_write(path, error) from None
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes 0600 files; a result gets what open() would give it (0666 less the umask)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        refusal = failed_write(path, error)
        if refusal is not None:
            raise refusal from None
        raise
    return path


def write_csv_atomically(path: Path, columns, rows) -> Path:
    """``rows`` (mappings holding at least ``columns``) as a CSV file with a header, written
    through :func:`write_atomically`."""
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows({key: row[key] for key in columns} for row in rows)
    return write_atomically(path, write)


def remove_temporary_files(folder: Path, names) -> list[Path]:
    """Delete what a write of one of ``names`` (``last.pt``, ``metrics.json``) killed midway
    left in ``folder`` (``.last.pt.XXXXXXXX``, up to a checkpoint's size); return them.
    Call it only while no other process writes there (under the run folder's lock)."""
    removed = []
    for name in names:
        for leftover in Path(folder).glob(TEMPORARY_PREFIX.format(name=name) + "*"):
            if leftover.is_file():
                leftover.unlink(missing_ok=True)
                removed.append(leftover)
    return removed


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float inside it (dicts, lists, tuples) replaced by
    None: JSON has no such numbers, and ``null`` reads as "no finite value"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def write_json(path: Path, data: Any) -> Path:
    """``data`` as strict JSON (RFC 8259: no bare NaN or Infinity, :func:`finite_or_none`),
    atomically."""
    data = finite_or_none(data)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
    return write_atomically(path, write)


#: what parsing a damaged JSON file ends in: a syntax error or bad UTF-8 (ValueError), an
#: integer of more digits than Python converts (ValueError), nesting deeper than the parser's
#: recursion limit (``"[" * 100000``: RecursionError) or than memory holds
JSON_ERRORS = (ValueError, RecursionError, MemoryError)


def read_json(path: Path) -> Any:
    """The JSON document at ``path``; a one-line error naming the file if it is not one
    (whatever parsing it ends in, :data:`JSON_ERRORS`)."""
    try:
        with open(path) as f:
            return json.load(f)
    except JSON_ERRORS as error:
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise BarterError(f"{path} is not a readable JSON file ({type(error).__name__}"
                          f"{': ' + detail if detail else ''}): it may be truncated or damaged; "
                          "delete it and train the run again") from None


def save_checkpoint(path: Path, checkpoint: dict) -> Path:
    return write_atomically(path, lambda tmp: torch.save(checkpoint, tmp))


#: what the restricted unpickler says when a file names a class or function it does not build
#: (as against a damaged stream: "Unsupported operand", a short read)
UNSAFE_PICKLE = re.compile(r"GLOBAL|Unsupported class|call reduce|Can only (build|create)")


class RefusedFileError(BarterError):
    """A file refused for what reading it would do, not for being damaged: no other reader
    (timm's, for ``--init``) may try it either."""


class UnsafeFileError(RefusedFileError):
    """A file that names a class or function the restricted unpickler does not build: loading
    it the ordinary way could run code (:func:`load_plain`)."""


class InflatingFileError(RefusedFileError):
    """A zip whose members would inflate far beyond the file's size (:func:`check_inflation`)."""


def check_inflation(path: Path) -> None:
    """Refuse a zip (what torch.load reads as one: a file that starts with :data:`ZIP_MAGIC`)
    whose members would inflate to more than ``MAX_INFLATE_RATIO * size + INFLATE_ALLOWANCE``
    bytes, read off its central directory before anything is inflated: torch.load allocates
    every member it reads at the size the directory gives, so a few kilobytes of deflated
    zeros would take gigabytes of memory before any key could be checked. Any other file is a
    bare pickle or torch's legacy format, whose tensors' bytes are the file's own."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
                return
        with zipfile.ZipFile(path) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except DAMAGED_FILE_ERRORS as error:
        raise BarterError(f"{path} is not a readable checkpoint ({type(error).__name__} reading it as a zip): "
                          "it may be truncated; retrain or pass another file") from None
    size = path.stat().st_size
    if inflated > MAX_INFLATE_RATIO * size + INFLATE_ALLOWANCE:
        raise InflatingFileError(f"{path} would inflate to {inflated:,} bytes from its {size:,}: a checkpoint may "
                                 f"hold at most {MAX_INFLATE_RATIO} times its size (torch.save stores it "
                                 "uncompressed), so it was not read; pass a file torch.save or timm wrote")


def check_safetensors_header(path: Path) -> None:
    """Refuse a file named ``.safetensors`` whose first 8 bytes (:data:`SAFETENSORS_LENGTH`)
    give a JSON header longer than the rest of the file, before safetensors reads the header
    into memory whole: a length field that lies (a pickle renamed ``.safetensors`` reads as
    about 2**60) would be an allocation of that size, or safetensors' own error."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(SAFETENSORS_LENGTH.size)
    except OSError as error:
        raise BarterError(f"{path} cannot be read ({error.strerror or type(error).__name__})") from None
    if len(head) < SAFETENSORS_LENGTH.size:
        raise BarterError(f"{path} is not a safetensors file: it has {size:,} bytes, fewer than the "
                          f"{SAFETENSORS_LENGTH.size} of its header's length; pass a file safetensors wrote")
    (length,) = SAFETENSORS_LENGTH.unpack(head)
    if length > size - SAFETENSORS_LENGTH.size:
        raise BarterError(f"{path} is not a safetensors file: its first {SAFETENSORS_LENGTH.size} bytes give a header "
                          f"of {length:,} bytes, and the file has {size:,}; pass a file safetensors wrote "
                          "(a torch.save file is named .pt or .pth)")


@contextlib.contextmanager
def quiet_loading():
    """No warnings while a file is read: a bare pickle's protocol, and the deprecations of
    torch internals a damaged stream reaches (TypedStorage, a plain ``__torch_function__``),
    would be lines of their own around the one line that says whether the file loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_plain(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """What ``torch.load`` reads from ``path`` with the restricted unpickler
    (``weights_only=True``): tensors, numbers, strings and plain containers only. A file that
    names anything else (code that would run), that would inflate far beyond its size
    (:func:`check_inflation`), or that is truncated, damaged or no checkpoint at all, is a
    one-line :class:`~barter_mini.errors.BarterError` naming it (:class:`UnsafeFileError` and
    :class:`InflatingFileError` for the first two). ``mmap``: map the tensors' storage instead
    of reading it (a probe of a large file)."""
    path = Path(path)
    if not path.is_file():
        raise BarterError(f"no checkpoint at {path}: pass a best.pt or last.pt written by barter-mini train")
    check_inflation(path)
    try:
        with quiet_loading():
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if not UNSAFE_PICKLE.search(str(error)):       # a damaged pickle stream, not a refusal
            reason = re.search(r"(Unsupported operand \S+)", str(error))
            raise BarterError(f"{path} is not a readable checkpoint (UnpicklingError"
                              f"{': ' + reason.group(1) if reason else ''}): it may be truncated or not written "
                              "by torch.save, and nothing in it was run; retrain or pass another file") from None
        named = re.search(r"GLOBAL (\S+)", str(error))
        raise UnsafeFileError(f"{path} holds more than tensors, numbers, strings and plain containers"
                          f"{f' (it names {named.group(1)})' if named else ''}: it was not loaded, because "
                          "unpickling such a file can run any code; use a file barter-mini or timm wrote, "
                          "from a source you trust (a barter-mini checkpoint of format 2 or older: retrain it)") from None
    except DAMAGED_FILE_ERRORS as error:
        raise BarterError(f"{path} is not a readable checkpoint ({type(error).__name__}): it may be truncated or "
                          "damaged, and nothing in it was run; retrain or pass another file") from None


def check_keys(checkpoint: dict, path: Path, keys: tuple[str, ...], use: str) -> dict:
    """``checkpoint`` if it holds every one of ``keys``, else a one-line error naming the file
    and what it lacks for ``use`` (what it was read for)."""
    missing = [key for key in keys if key not in checkpoint]
    if missing:
        raise BarterError(f"{path} lacks {', '.join(missing)}, which {use} needs: "
                          "pass a best.pt or last.pt written by barter-mini train with this version")
    return checkpoint


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu", keys: tuple[str, ...] = MODEL_KEYS,
                    use: str = "rebuilding its model") -> dict:
    """A checkpoint written by this version that holds ``keys`` (by default :data:`MODEL_KEYS`,
    what :func:`model_from_checkpoint` needs: a run's ``best.pt`` or ``last.pt``, or an exported
    model); a one-line error for a missing, truncated, foreign or unsafe file
    (:func:`load_plain`) or one that lacks a key ``use`` needs."""
    return check_checkpoint(load_plain(Path(path), map_location), Path(path), keys, use)


def check_checkpoint(checkpoint: Any, path: Path, keys: tuple[str, ...] = MODEL_KEYS,
                     use: str = "rebuilding its model") -> dict:
    """``checkpoint`` (what :func:`load_plain` read from ``path``) if it is a checkpoint of
    :data:`~barter_mini.training.checkpoint_parts.CHECKPOINT_FORMAT` that holds ``keys``, each
    of them what its part's ``entry`` check allows, else a one-line error (an earlier format
    is one too: its layout is not this version's)."""
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise BarterError(f"{path} is not a barter-mini checkpoint of format {CHECKPOINT_FORMAT} "
                          f"(found {found!r}): retrain the run with this version")
    check_keys(checkpoint, path, keys, use)
    for key in keys:
        entry = PART_BY_NAME[key].entry if key in PART_BY_NAME else None
        if entry is not None:
            entry(path, key, checkpoint[key])
    return checkpoint


def model_from_checkpoint(checkpoint: dict, device: torch.device | str = "cpu",
                          path: Path | str = "the checkpoint") -> CompactTransformer:
    """Rebuild the compact model a checkpoint was saved from (its per-layer allocation); a
    one-line error naming ``path`` if its configuration, allocation and weights do not fit
    (:func:`~barter_mini.training.checkpoint_contents.check_model_entries`, then :func:`~barter_mini.training.checkpoint_contents.check_weights` against the model built on the
    meta device: the real one is built only for weights that fill it exactly)."""
    config, allocation = check_model_entries(checkpoint, path)
    shapes = model_shapes(config, allocation, path, len(checkpoint["model"])).state_dict()
    check_weights(shapes, checkpoint["model"], path)
    with building_from(path):
        model = build_model(config, allocation=allocation)
        model.load_state_dict(checkpoint["model"])
    return model.to(device)
