"""Data: images and parallel text, read from local files or generated.

Image classification: digits, CIFAR-10/100, SVHN, image folders (:mod:`.images`); parallel text
(:mod:`.text`) and the generated translation task (:mod:`.synthetic_translation`).

Nothing is downloaded: the default, scikit-learn's digits, ships with scikit-learn; the others are
read from their standard published files (see :mod:`fixup.data.image_formats`).
"""

from .augment import normalize, random_crop, random_flip, resize_images
from .images import DATASETS, STATS, ImageData, TensorImages, load_digits, load_images, split_validation

__all__ = [
    "DATASETS",
    "STATS",
    "ImageData",
    "TensorImages",
    "load_digits",
    "load_images",
    "normalize",
    "random_crop",
    "random_flip",
    "resize_images",
    "split_validation",
]
