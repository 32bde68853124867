"""The files on disk: finding Fashion-MNIST's (Debian's package or torchvision's folder),
unpacking them atomically and checking that each is a whole IDX file, and reading
Tiny-ImageNet's class list."""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np

from ...errors import BarterError

#: Where Debian's ``dataset-fashion-mnist`` package puts the four gzipped IDX files. The
#: environment variable ``BARTER_MINI_FASHION_MNIST_DEBIAN`` overrides it (read at call time),
#: and tests may also monkeypatch this constant.
FASHION_MNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

#: The official Tiny-ImageNet archive (Stanford CS231n) and its md5, as used by ``download=True``.
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"

FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def fashion_debian_dir() -> Path:
    env = os.environ.get("BARTER_MINI_FASHION_MNIST_DEBIAN")
    return Path(env).expanduser() if env else Path(FASHION_MNIST_DEBIAN_DIR)


def _check_idx(path: Path, name: str) -> None:
    """Check that ``path`` is a complete uint8 IDX file of the kind ``name`` promises."""
    ndim = 3 if "images" in name else 1
    with open(path, "rb") as f:
        header = f.read(4 + 4 * ndim)
    size = path.stat().st_size
    ok = len(header) == 4 + 4 * ndim and header[:4] == bytes((0, 0, 0x08, ndim))
    if ok:
        dims = [int.from_bytes(header[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
        ok = size == len(header) + int(np.prod(dims))
    if not ok:
        raise BarterError(f"{path} is not a complete uint8 IDX file ({name}); reinstall dataset-fashion-mnist")


def _atomic_gunzip(src: Path, dst: Path) -> None:
    """Decompress ``src`` (gzip, or plain if it does not end in .gz) to ``dst`` atomically.

    Writes a temp file in ``dst``'s folder, checks it is a whole IDX file, then ``os.replace``s
    it into place, so an interrupted run never leaves a half file that torchvision would read.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            opener = gzip.open if src.suffix == ".gz" else open
            try:
                with opener(src, "rb") as inp:
                    while chunk := inp.read(1 << 20):
                        out.write(chunk)
            except (OSError, EOFError, zlib.error) as exc:
                raise BarterError(f"cannot read {src} ({exc}); reinstall dataset-fashion-mnist") from None
            out.flush()
            os.fsync(out.fileno())
        _check_idx(Path(tmp), dst.name)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def prepare_fashion_from_debian(raw: Path) -> bool:
    """Fill ``raw`` (``root/FashionMNIST/raw``) from the Debian package's files, if present.

    torchvision's ``MNIST._check_exists`` wants the four *decompressed* files
    (``train-images-idx3-ubyte`` ...) in ``raw``; the Debian package ships them gzipped.
    Returns False when the Debian folder lacks any of the four files.
    """
    debian = fashion_debian_dir()
    sources = {}
    for name in FASHION_FILES:
        for cand in (debian / f"{name}.gz", debian / name):
            if cand.is_file():
                sources[name] = cand
                break
        else:
            return False
    raw.mkdir(parents=True, exist_ok=True)
    for name in FASHION_FILES:
        if not (raw / name).is_file():
            _atomic_gunzip(sources[name], raw / name)
    return True


def read_wnids(path: Path) -> list[str]:
    wnids = sorted({line.strip() for line in path.read_text().splitlines() if line.strip()})
    if not wnids:
        raise BarterError(f"{path} lists no class ids: it should hold one wnid per line")
    return wnids
