"""Image classification data: the embedded digits set, CIFAR-10/100, SVHN and image folders.

:func:`load_images` returns an :class:`ImageData`: a train and a test set plus what a model and the
input pipeline need to know (classes, channels, size, the normalisation mean/std). Small sets live
in memory as tensors (:class:`TensorImages`); image folders are decoded from disk on demand
(:class:`~fixup.data.image_formats.FolderImages`), optionally in ``DataLoader`` workers.

Nothing is ever downloaded. Every set is a ``torch.utils.data.Dataset`` whose items are
``(image, label)`` with the image a float tensor ``(C, H, W)`` in [0, 1], before normalisation;
in-memory sets also offer :meth:`TensorImages.batch` to gather a whole batch with one indexing op.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .augment import adapt_channels, resize_images

__all__ = ["DATASETS", "STATS", "ImageData", "TensorImages", "load_digits", "load_images", "split_validation"]

DATASETS = ("digits", "cifar10", "cifar100", "svhn", "folder")

# Per-channel mean and standard deviation of the training images in [0, 1], as published for each set
# (the values every CIFAR/SVHN/ImageNet training script normalises with). Digits has no published
# figures; its statistics are computed from its training split at load time.
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "folder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet
}


class TensorImages(Dataset):
    """An image set held in memory: ``images`` (N, C, H, W) as uint8 (0..255) or float in [0, 1]."""

    def __init__(self, images: Tensor, labels: Tensor, *, size: int = 0, resize: str = "interpolate",
                 channels: int = 0) -> None:
        if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ValueError(f"expected images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and "
                             f"{tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()
        self.size, self.resize, self.channels = size, resize, channels

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x, y = self.batch(torch.tensor([i]))
        return x[0], y[0]

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Images (B, C, H, W) as float32 in [0, 1] and labels (B,) for the indices ``idx``."""
        x = self.images[idx]
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        x = adapt_channels(x, self.channels)
        if self.size:
            x = resize_images(x, self.size, self.resize)
        return x, self.labels[idx]


@dataclass
class ImageData:
    """A train/test pair with what a model and the input pipeline need to know about it."""

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    in_channels: int  # channels of the images the model receives
    image_size: int  # height = width of the images the model receives (pixels)
    mean: tuple[float, ...]  # per-channel normalisation, for images in [0, 1]
    std: tuple[float, ...]
    classes: list[str] = field(default_factory=list)
    source: str = ""  # where it was read from


def split_validation(data: ImageData, fraction: float, *, seed: int = 0, limit: int = 0) -> ImageData:
    """``data`` with its training set split in two: ``train`` the training part, ``test`` the validation part.

    A stratified ``fraction`` of the training set, fixed by ``seed``, is held out to choose hyperparameters on; the
    test set is not touched. ``limit`` > 0 keeps at most that many training examples. Only in-memory sets
    (:class:`TensorImages`: digits, CIFAR, SVHN) can be split; a ValueError names the set otherwise.
    """
    from sklearn.model_selection import train_test_split

    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    t = data.train
    if not isinstance(t, TensorImages):
        raise ValueError(f"split_validation splits an in-memory training set; data set {data.name!r} is read from "
                         "files: use digits, cifar10, cifar100 or svhn")
    labels = t.labels.numpy()
    train, val = train_test_split(np.arange(len(labels)), test_size=fraction, random_state=seed, stratify=labels)
    if limit:
        train = train[:limit]

    def part(idx: np.ndarray) -> TensorImages:
        i = torch.from_numpy(np.sort(idx))
        return TensorImages(t.images[i], t.labels[i], size=t.size, resize=t.resize, channels=t.channels)

    return dataclasses.replace(data, train=part(train), test=part(val))


def _channel_stats(mean: tuple[float, ...], std: tuple[float, ...], channels: int) -> tuple[tuple, tuple]:
    if channels in (0, len(mean)):
        return mean, std
    if len(mean) == 1:
        return mean * channels, std * channels
    return (float(np.mean(mean)),), (float(np.mean(std)),)


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images (N, 8, 8) float32 in [0, 1], labels), read once per process."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    images = bunch.images.astype(np.float32) / 16.0
    images.flags.writeable = False
    return images, bunch.target.astype(np.int64)


def load_digits(*, split_seed: int = 0, test_fraction: float = 0.2, size: int = 0, resize: str = "interpolate",
                channels: int = 0) -> ImageData:
    """scikit-learn's 1,797 real 8x8 handwritten digits with a stratified split fixed by ``split_seed``.

    Pixels (0..16 in the source) are scaled to [0, 1]; ``size`` upsamples or pads the images (0 keeps
    8x8); ``channels=3`` repeats the grey channel for models that expect colour.
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    raw_images, raw_labels = _digits_arrays()
    images = torch.tensor(raw_images)[:, None]  # (N, 1, 8, 8), a copy
    labels = torch.tensor(raw_labels)
    tr, te = train_test_split(np.arange(len(labels)), test_size=test_fraction, random_state=split_seed,
                              stratify=raw_labels)
    tr, te = torch.from_numpy(np.sort(tr)), torch.from_numpy(np.sort(te))
    # Resize once at load: the whole set is tiny, and every batch is then a single indexing op.
    train_x, test_x = (adapt_channels(images[i], channels) for i in (tr, te))
    if size:
        train_x, test_x = resize_images(train_x, size, resize), resize_images(test_x, size, resize)
    dims = (0, 2, 3)
    mean = tuple(float(v) for v in train_x.mean(dims))
    std = tuple(float(v) for v in train_x.std(dims))
    return ImageData("digits", TensorImages(train_x, labels[tr]), TensorImages(test_x, labels[te]),
                     num_classes=10, in_channels=train_x.shape[1], image_size=train_x.shape[-1], mean=mean, std=std,
                     classes=[str(d) for d in range(10)], source="sklearn.datasets.load_digits")


def load_images(name: str = "digits", *, data_dir: str | Path | None = None, image_size: int = 0,
                resize: str = "interpolate", channels: int = 0, split_seed: int = 0,
                test_fraction: float = 0.2) -> ImageData:
    """Load an image classification set by name (one of :data:`DATASETS`).

    ``data_dir`` is required for every set but ``digits``: the CIFAR python archive (``.tar.gz``) or
    its extracted folder, the folder holding SVHN's ``train_32x32.mat``/``test_32x32.mat``, or an
    image-folder root with ``train/<class>/*`` and ``val/<class>/*`` (``test/`` also accepted).
    ``image_size`` (pixels, 0 = as stored; image folders: the first training image's larger side), ``resize`` and
    ``channels``
    adapt the images to a model. ``split_seed``/``test_fraction`` concern digits only.
    """
    from . import image_formats

    if name == "digits":
        return load_digits(split_seed=split_seed, test_fraction=test_fraction, size=image_size, resize=resize,
                           channels=channels)
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    if data_dir is None:
        raise ValueError(f"data set {name!r} is read from local files: pass data_dir (--data-dir) pointing at "
                         f"{image_formats.LAYOUTS[name]}; nothing is downloaded")
    if name == "folder":
        train, test, classes = image_formats.read_folder(Path(data_dir), size=image_size, channels=channels)
        mean, std = _channel_stats(*STATS[name], channels)
        return ImageData(name, train, test, len(classes), in_channels=len(mean), image_size=train.size, mean=mean,
                         std=std,
                         classes=classes, source=str(data_dir))
    if name in ("cifar10", "cifar100"):
        (tx, ty), (vx, vy), classes = image_formats.read_cifar(Path(data_dir), name)
    else:
        (tx, ty), (vx, vy), classes = image_formats.read_svhn(Path(data_dir))
    kw = {"size": image_size, "resize": resize, "channels": channels}
    mean, std = _channel_stats(*STATS[name], channels)
    return ImageData(name, TensorImages(tx, ty, **kw), TensorImages(vx, vy, **kw), len(classes),
                     in_channels=len(mean), image_size=image_size or tx.shape[-1], mean=mean, std=std,
                     classes=classes, source=str(data_dir))
