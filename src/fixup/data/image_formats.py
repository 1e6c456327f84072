"""Readers for image sets in their standard published on-disk formats; nothing is downloaded.

- CIFAR-10/100: the "python version" archive (``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz``)
  or its extracted folder: pickled dicts with ``data`` (N, 3072) uint8 rows (R, G, B planes of 32x32)
  and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100).
- SVHN: the cropped-digits ``train_32x32.mat`` and ``test_32x32.mat``: ``X`` (32, 32, 3, N) uint8 and
  ``y`` (N, 1) with the digit 0 stored as label 10.
- Image folders (ImageNet-style): ``root/train/<class>/<image>`` and ``root/val/<class>/<image>``
  (``test`` is accepted for ``val``), decoded with Pillow.

Every failure names the path and the layout that was expected.
"""

from __future__ import annotations

import functools
import io
import pickle
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .augment import adapt_channels

__all__ = ["LAYOUTS", "FolderImages", "read_cifar", "read_folder", "read_svhn"]

LAYOUTS = {
    "cifar10": "cifar-10-python.tar.gz or its extracted folder cifar-10-batches-py/ holding data_batch_1..5 and "
               "test_batch (https://www.cs.toronto.edu/~kriz/cifar.html, 'python version')",
    "cifar100": "cifar-100-python.tar.gz or its extracted folder cifar-100-python/ holding train and test "
                "(https://www.cs.toronto.edu/~kriz/cifar.html, 'python version')",
    "svhn": "a folder holding train_32x32.mat and test_32x32.mat (http://ufldl.stanford.edu/housenumbers/, "
            "format 2, cropped digits)",
    "folder": "a folder with train/<class>/<images> and val/<class>/<images> (or test/), one sub-folder per class",
}
_CIFAR = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", 100),
}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp"}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR batches: dicts of bytes, lists and numpy arrays; refuses any other object."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch file")
        return super().find_class(module, name)


def _unpickle(data: bytes, where: str) -> dict:
    try:
        batch = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as err:  # any decoding failure means the file is not a CIFAR batch
        raise ValueError(f"{where} is not a readable CIFAR batch ({type(err).__name__}: {err})") from err
    if not isinstance(batch, dict) or b"data" not in batch:
        raise ValueError(f"{where} is not a CIFAR batch: expected a pickled dict with a b'data' entry")
    return batch


def _cifar_files(path: Path, name: str) -> dict[str, bytes]:
    folder, train, test, _, _ = _CIFAR[name]
    wanted = train + test
    layout = f"expected {LAYOUTS[name]}"
    if not path.exists():
        raise FileNotFoundError(f"{name}: {path} does not exist; {layout}")
    if path.is_file():
        try:
            with tarfile.open(path, "r:*") as tar:
                members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
                missing = [w for w in wanted if w not in members]
                if missing:
                    raise FileNotFoundError(f"{name}: archive {path} lacks {', '.join(missing)}; {layout}")
                return {w: tar.extractfile(members[w]).read() for w in wanted}  # type: ignore[union-attr]
        except (tarfile.TarError, EOFError, OSError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise ValueError(f"{name}: {path} is not a readable tar archive ({err}); {layout}") from err
    base = path / folder if (path / folder).is_dir() else path
    missing = [w for w in wanted if not (base / w).is_file()]
    if missing:
        raise FileNotFoundError(f"{name}: {base} lacks {', '.join(missing)}; {layout}")
    return {w: (base / w).read_bytes() for w in wanted}


def read_cifar(path: Path, name: str) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], list[str]]:
    """``((train_images, train_labels), (test_images, test_labels), classes)``; images uint8 (N, 3, 32, 32).

    The last set read stays cached (studies train many times on one set); a changed file is read again.
    """
    return _read_cifar_cached(path.resolve(), name, _stamp(path))


def _stamp(path: Path) -> tuple:
    """Names, sizes and modification times of ``path`` or of the files up to two levels under it."""
    files = [path] if path.is_file() else [f for f in (*path.glob("*"), *path.glob("*/*")) if f.is_file()]
    return tuple(sorted((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=1)
def _read_cifar_cached(path: Path, name: str, _stamp: tuple) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor],
                                                                     list[str]]:
    _, train, test, key, num_classes = _CIFAR[name]
    raw = _cifar_files(path, name)

    def join(names: list[str]) -> tuple[Tensor, Tensor]:
        xs, ys = [], []
        for n in names:
            batch = _unpickle(raw[n], f"{path}:{n}")
            x, y = np.asarray(batch[b"data"]), np.asarray(batch.get(key, []))
            if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
                raise ValueError(f"{name}: {path}:{n} has data {x.dtype}{x.shape} and {len(y)} labels; expected "
                                 f"uint8 rows of 3072 values (3x32x32) and one {key.decode()} entry per row")
            if len(y) and (y.min() < 0 or y.max() >= num_classes):
                raise ValueError(f"{name}: {path}:{n} has labels outside 0..{num_classes - 1}")
            xs.append(x.reshape(-1, 3, 32, 32))
            ys.append(y.astype(np.int64))
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    return join(train), join(test), [str(c) for c in range(num_classes)]


def read_svhn(path: Path) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], list[str]]:
    """SVHN cropped digits; images uint8 (N, 3, 32, 32), labels 0..9 (the file's 10 becomes 0)."""
    from scipy.io import loadmat

    def read(split: str) -> tuple[Tensor, Tensor]:
        file = path / f"{split}_32x32.mat"
        if not file.is_file():
            raise FileNotFoundError(f"svhn: {file} does not exist; expected {LAYOUTS['svhn']}")
        try:
            mat = loadmat(file)
        except Exception as err:  # scipy raises several types for a damaged file
            raise ValueError(f"svhn: {file} is not a readable MATLAB file ({err}); expected {LAYOUTS['svhn']}") from err
        x, y = mat.get("X"), mat.get("y")
        if x is None or y is None or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or y.size != x.shape[3]:
            raise ValueError(f"svhn: {file} must hold X (32, 32, 3, N) and y (N, 1); found "
                             f"X {None if x is None else x.shape}, y {None if y is None else y.shape}")
        labels = y.reshape(-1).astype(np.int64) % 10  # label 10 is the digit 0
        images = np.ascontiguousarray(x.transpose(3, 2, 0, 1)).astype(np.uint8)  # (N, 3, 32, 32)
        return torch.from_numpy(images), torch.from_numpy(labels)

    return read("train"), read("test"), [str(c) for c in range(10)]


class FolderImages(Dataset):
    """Images decoded from files on access, resized to ``size x size``: item ``(image (C, H, W) in [0, 1], label)``."""

    def __init__(self, files: list[Path], labels: list[int], size: int, channels: int = 0) -> None:
        self.files, self.size, self.channels = files, size, channels
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        from PIL import Image, UnidentifiedImageError

        file = self.files[i]
        try:
            with Image.open(file) as img:
                rgb = img.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"folder: cannot decode image {file} ({err}); remove it or replace it") from err
        x = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255.0)
        return adapt_channels(x[None], self.channels)[0], self.labels[i]


def _images_in(folder: Path) -> list[Path]:
    return sorted(f for f in folder.glob("*") if f.suffix.lower() in _IMAGE_SUFFIXES) if folder.is_dir() else []


def _stored_size(file: Path) -> int:
    """The larger side, in pixels, of one image file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as img:
            return max(img.size)
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"folder: cannot decode image {file} ({err}); remove it or replace it") from err


def read_folder(root: Path, size: int = 0, channels: int = 0) -> tuple[FolderImages, FolderImages, list[str]]:
    """Index ``root/train/<class>/*`` and ``root/val/<class>/*``; classes are the sorted train sub-folders.

    Every image is resized to ``size x size``; ``size=0`` takes the larger side of the first training
    image (a folder of 32x32 images stays 32x32). A class folder in train/ without images is an error
    naming it: it would otherwise count as a class that no example has.
    """
    layout = f"expected {LAYOUTS['folder']}"
    train_dir = root / "train"
    test_dir = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
    if not train_dir.is_dir() or test_dir is None:
        raise FileNotFoundError(f"folder: {root} lacks a train/ and a val/ (or test/) sub-folder; {layout}")
    classes = sorted(d.name for d in train_dir.iterdir() if d.is_dir())
    if not classes:
        raise FileNotFoundError(f"folder: {train_dir} has no class sub-folders; {layout}")
    empty = [c for c in classes if not _images_in(train_dir / c)]
    if empty:
        raise ValueError(f"folder: class folder(s) {', '.join(str(train_dir / c) for c in empty)} hold no image files "
                         f"({', '.join(sorted(_IMAGE_SUFFIXES))}); add images or remove the folder(s)")
    if size <= 0:
        size = _stored_size(_images_in(train_dir / classes[0])[0])

    def index(split: Path) -> FolderImages:
        extra = sorted(d.name for d in split.iterdir() if d.is_dir() and d.name not in classes)
        if extra:
            raise ValueError(f"folder: {split} has classes {extra} that train/ does not have")
        files, labels = [], []
        for k, c in enumerate(classes):
            found = _images_in(split / c)
            files += found
            labels += [k] * len(found)
        if not files:
            raise FileNotFoundError(f"folder: no image files ({', '.join(sorted(_IMAGE_SUFFIXES))}) under {split}; "
                                    f"{layout}")
        return FolderImages(files, labels, size, channels)

    return index(train_dir), index(test_dir), classes
