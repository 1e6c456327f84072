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

__all__ = ["chance_level", "image_cost", "image_train", "method_model_args", "train_cell"]

NUM_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "svhn": 10}
# Training-set sizes and native image sides, for cost estimates only.
TRAIN_SIZE = {"digits": 1437, "cifar10": 50_000, "cifar100": 50_000, "svhn": 73_257}
NATIVE_SIDE = {"digits": 8, "cifar10": 32, "cifar100": 32, "svhn": 32}


def image_cost(grid: Grid, depth: int, epochs: float) -> float:
    """A cell's cost in layer-examples at 8x8 pixels (the unit :mod:`fixup.studies.estimate` calibrates)."""
    side = grid.image_size or NATIVE_SIDE.get(grid.data, 32)
    return depth * epochs * TRAIN_SIZE.get(grid.data, 50_000) * (side / 8) ** 2


def chance_level(grid: Grid) -> float:
    return 1.0 / NUM_CLASSES.get(grid.data, 10)


def method_model_args(method: str) -> dict[str, str]:
    """The training config's ``norm`` and ``init`` for a method of :data:`fixup.METHODS`."""
    m = as_method(method)
    return {"norm": m.norm, "init": m.init}


def image_train(grid: Grid, method: str, seed: int, **fields: Any) -> dict[str, Any]:
    """The :class:`fixup.train.TrainConfig` fields of an image cell (only those that differ from defaults)."""
    train: dict[str, Any] = {"task": "images", "dataset": grid.data, "seed": seed, "device": grid.device,
                             **method_model_args(method), **fields}
    if grid.data_dir:
        train["data_dir"] = grid.data_dir
    if grid.image_size:
        train["image_size"] = grid.image_size
    return train


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


# A long cell stops itself after this many seconds of training, writes the engine's checkpoint and goes on
# from it, so that a cell killed at any time (SIGKILL, power loss) resumes from its last segment rather
# than from step 0 (the engine's own checkpoint is written once per epoch, and a depth-study cell is one
# epoch). The engine's resume is exact, so segments never change a result.
SEGMENT_SECONDS = 60.0


def train_cell(cell: Cell, work: Path) -> dict[str, Any]:
    """Run the cell's ``config["train"]`` with the engine; return its outcome and per-epoch history.

    Any outcome other than ``completed`` (``diverged``, ``collapsed``, ...) is a result, not an error; the
    figures of a failed cell are left out (``None``) and the report counts the cell by its outcome.
    """
    import time

    from .._signals import Interrupted
    from ..train import TrainConfig, fit

    config = TrainConfig.from_dict(dict(cell.config["train"]))
    while True:
        started, asked = time.monotonic(), []

        def segment(_info: Any, _started: float = started, _asked: list[bool] = asked) -> bool:
            if config.checkpoint and time.monotonic() - _started >= SEGMENT_SECONDS:
                _asked.append(True)
                return True
            return False

        result = fit(config, out_dir=work, progress=False, on_step=segment)
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
    }
