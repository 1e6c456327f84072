"""Where full mode finds the paper's data sets under one ``--data-dir`` (the layout :mod:`fixup.studies.fullplan`
describes); :func:`fixup.studies.grid.make_grid` reads it, and the cost of the cells it plans is fullplan's.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CIFAR_NAMES", "IWSLT_NAME", "LAYOUT", "missing_reason", "resolve_full_data"]

CIFAR_NAMES = ("cifar-10-python.tar.gz", "cifar-10-batches-py")
IWSLT_NAME = "iwslt14.de-en"
# The optional image sets: the folder under --data-dir and what it must hold.
LAYOUT = {"svhn": "svhn/ holding train_32x32.mat and test_32x32.mat",
          "imagenet": "imagenet/ holding train/<class>/* and val/<class>/* (class folders of images)"}


def resolve_full_data(data_dir: str | Path) -> dict[str, str | None]:
    """The data sets found under ``data_dir`` (``None`` where one is absent)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--data-dir {root} is not a folder; full mode expects a folder holding "
                                f"{' or '.join(CIFAR_NAMES)} and {IWSLT_NAME}/ (see docs/studies.md)")
    cifar = next((root / n for n in CIFAR_NAMES if (root / n).exists()), None)
    iwslt = root / IWSLT_NAME
    svhn, imagenet = root / "svhn", root / "imagenet"
    has_svhn = all((svhn / f"{split}_32x32.mat").is_file() for split in ("train", "test"))
    has_imagenet = (imagenet / "train").is_dir() and any((imagenet / d).is_dir() for d in ("val", "test"))
    return {"cifar10": None if cifar is None else str(cifar if cifar.suffix == ".gz" else root),
            "iwslt": str(iwslt) if (iwslt / "train.de").exists() else None,
            "svhn": str(svhn) if has_svhn else None,
            "imagenet": str(imagenet) if has_imagenet else None}


def missing_reason(data_dir: str | Path, name: str) -> str:
    """Why the cells of ``name`` (``svhn`` or ``imagenet``) are not planned: the folder that was not found."""
    return f"--data-dir {data_dir} has no {LAYOUT[name]}; add it to run these cells (docs/studies.md)"
