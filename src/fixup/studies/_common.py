"""Helpers the image studies share: the training config of a cell, and running it through the engine.

No training loop lives here: a cell's run is one call of :func:`fixup.train.fit`, with the cell's
``work`` folder as the engine's output folder (so a killed cell resumes from its checkpoint).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..method import as_method
from .cells import Cell
from .grid import Grid

__all__ = ["chance", "chance_level", "image_cost", "image_train", "layer_cost", "method_model_args", "train_cell"]

# "folder" is an ImageNet-style class-folder set; its figures are ImageNet-1k's.
NUM_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "svhn": 10, "folder": 1000}
# Training-set sizes and native image sides, for cost estimates only.
TRAIN_SIZE = {"digits": 1437, "cifar10": 50_000, "cifar100": 50_000, "svhn": 73_257, "folder": 1_281_167}
NATIVE_SIDE = {"digits": 8, "cifar10": 32, "cifar100": 32, "svhn": 32, "folder": 224}
# Multiply-adds per residual layer and input pixel of an ImageNet ResNet, relative to a CIFAR ResNet's:
# ResNet-50 does 4.1e9 at 224x224 (50 layers x 28^2 units: 1.05e5 a unit), ResNet-110 2.5e8 at 32x32
# (110 x 4^2 units: 1.44e5 a unit); ResNet-101, 7.8e9, gives 0.68. The stem's stride 4 offsets the width.
IMAGENET_RESNET_LAYER_COST = 0.7


def layer_cost(model: str, width: int = 0) -> float:
    """A residual layer's compute per input pixel relative to a CIFAR ResNet's (``width``: 0 = the default)."""
    if model == "wide_resnet":
        return float(max(width, 1) ** 2)  # k times the channels of a width-1 network: k^2 the multiply-adds
    if model == "resnet_imagenet":
        return IMAGENET_RESNET_LAYER_COST * ((width or 64) / 64) ** 2
    return 1.0


def image_cost(grid: Grid, depth: int, epochs: float, *, data: str | None = None, image_size: int | None = None,
               model: str = "", width: int = 0) -> float:
    """A cell's cost in layer-examples at 8x8 pixels (the unit :mod:`fixup.studies.estimate` calibrates).

    ``data``/``image_size`` describe a cell with its own data set (default: the grid's); ``model`` and
    ``width`` scale by the model's compute per layer (:func:`layer_cost`; default: a CIFAR ResNet's).
    """
    own = data is not None
    data = data if own else grid.data
    side = image_size or (None if own else grid.image_size) or NATIVE_SIDE.get(data, 32)
    return depth * epochs * TRAIN_SIZE.get(data, 50_000) * (side / 8) ** 2 * layer_cost(model, width)


def chance_level(grid: Grid) -> float:
    return 1.0 / NUM_CLASSES.get(grid.data, 10)


def chance(dataset: str) -> float:
    """The accuracy of a constant guess on ``dataset`` (1 / classes), where known; NaN otherwise."""
    return 1.0 / NUM_CLASSES[dataset] if dataset in NUM_CLASSES else math.nan


def method_model_args(method: str) -> dict[str, str]:
    """The training config's ``norm`` and ``init`` for a method of :data:`fixup.METHODS`."""
    m = as_method(method)
    return {"norm": m.norm, "init": m.init}


def image_train(grid: Grid, method: str, seed: int, *, data: str | None = None, data_dir: str | None = None,
                **fields: Any) -> dict[str, Any]:
    """The :class:`fixup.train.TrainConfig` fields of an image cell (only those that differ from defaults).

    The cell trains on the grid's data, or on its own where ``data`` (a data set of
    :data:`fixup.data.DATASETS`) and ``data_dir`` are given; the grid's image size then does not apply.
    """
    own = data is not None
    # No gradient clipping: the paper's protocol, under which methods without normalisation may diverge.
    train: dict[str, Any] = {"task": "images", "dataset": data if own else grid.data, "seed": seed,
                             "device": grid.device, "grad_clip": 0.0, **method_model_args(method), **fields}
    folder = data_dir if own else grid.data_dir
    if folder:
        train["data_dir"] = folder
    if grid.image_size and not own:
        train["image_size"] = grid.image_size
    return train


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


# A long cell stops itself after this many seconds of training, writes the engine's checkpoint and goes on
# from it, so that a cell killed at any time (SIGKILL, power loss) resumes from its last segment rather
# than from step 0 (the engine's own checkpoint is written once per epoch, and a depth-study cell is one
# epoch). The engine's resume is exact, so segments never change a result.
SEGMENT_SECONDS = 60.0
# ... or longer where a checkpoint is large: a segment lasts at least this many times the last checkpoint's
# write and reload, so that checkpoints cost about 5% at most (a 10,000-layer Wide-ResNet's is 1.3 GB).
SEGMENT_OVERHEAD = 20.0


def train_cell(cell: Cell, work: Path) -> dict[str, Any]:
    """Run the cell's ``config["train"]`` with the engine; return its outcome and per-epoch history.

    Any outcome other than ``completed`` (``diverged``, ``collapsed``, ...) is a result, not an error; the
    figures of a failed cell are left out (``None``) and the report counts the cell by its outcome.
    """
    import time

    from .._signals import Interrupted
    from ..train import TrainConfig, fit

    config = TrainConfig.from_dict(dict(cell.config["train"]))
    length = SEGMENT_SECONDS
    losses: dict[int, float] = {}  # step -> training loss, for the steps this process ran (not before a restart)
    while True:
        started, asked = time.monotonic(), []

        def segment(info: Any, _started: float = started, _asked: list[float] = asked,
                    _length: float = length) -> bool:
            losses[int(info.step)] = float(info.loss)
            if config.checkpoint and time.monotonic() - _started >= _length:
                _asked.append(time.monotonic())
                return True
            return False

        result = fit(config, out_dir=work, progress=False, on_step=segment)
        if asked:  # from the request to the return: the checkpoint's write; its reload costs about as much
            length = max(SEGMENT_SECONDS, SEGMENT_OVERHEAD * 2 * (time.monotonic() - asked[0]))
        if result.stopped_by:  # SIGINT/SIGTERM: the whole run stops (the cell's checkpoint is kept)
            raise Interrupted.from_name(result.stopped_by)
        if result.outcome == "interrupted" and asked and "request" in str(getattr(result, "reason", "")):
            continue  # our own segment boundary: the checkpoint is written, go on from it
        break
    if result.outcome == "interrupted":  # not a result: the cell stays unfinished and resumes next time
        raise RuntimeError(f"cell {cell.key} was interrupted ({result.reason}); rerun to resume it")
    history = [{k: v for k, v in row.items() if isinstance(v, (int, float, str)) or v is None}
               for row in result.history]
    last = history[-1] if history else {}
    ok = result.outcome == "completed"
    return {
        "outcome": result.outcome,
        "diverged": result.outcome == "diverged",
        "reason": getattr(result, "reason", ""),
        "history": history,
        "test_acc": _finite(last.get("test_acc")) if ok else None,
        "train_loss": _finite(last.get("train_loss")) if ok else None,
        "train_acc": _finite(last.get("train_acc")) if ok else None,
        # every step's training loss from the first step this process ran (a cell resumed after its process
        # died starts later): the data a rule that stops a cell stuck at chance early would be checked against
        "step_loss": {"first_step": min(losses, default=0),
                      "loss": [losses[k] if math.isfinite(losses[k]) else None for k in sorted(losses)]},
    }
