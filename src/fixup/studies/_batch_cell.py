"""One cell of the batch-size study (:mod:`fixup.studies.batch`): train one (method, batch, rate, seed) on the
training part, then measure its validation accuracy (which chooses the rate) and its test accuracy, for BatchNorm
both with the running statistics and with each test batch's own.

A BatchNorm cell that torch could not train (one value per channel at this batch) is found before training by a
forward pass that records every BatchNorm layer's input shape, and returned as the outcome ``failed``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from .._signals import Interrupted
from .cells import Cell
from .evidence import COMPLETED

__all__ = ["batch_cell"]


def _batch_statistics_problem(model: Any, example: Any, smallest_batch: int) -> str:
    """Why training would fail in a BatchNorm layer (one value per channel), or ""."""
    import torch
    from torch import nn

    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            shapes[name] = tuple(args[0].shape)
        return hook

    hooks = [m.register_forward_pre_hook(record(name)) for name, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    try:
        was = model.training
        model.eval()
        with torch.no_grad():
            model(example)
        model.train(was)
    finally:
        for h in hooks:
            h.remove()
    for name, shape in shapes.items():
        if smallest_batch * math.prod(shape[2:]) <= 1:
            spatial = "x".join(map(str, shape[2:])) or "no spatial"
            return (f"BatchNorm needs more than 1 value per channel in training: layer {name} sees {spatial} maps "
                    f"at batch {smallest_batch}")
    return ""


def _accuracy(model: Any, dataset: Any, data: Any, batch: int, *, batch_statistics: bool) -> float:
    """Accuracy on ``dataset`` in eval mode, or with every BatchNorm using each batch's own statistics (batches of
    ``batch`` in a fixed shuffled order, as in training; the last batch is filled up with examples before it, which
    are not counted twice), on a copy so that the model's running statistics stay as trained."""
    import torch

    from ..data import normalize

    device = next(model.parameters()).device
    net = copy.deepcopy(model) if batch_statistics else model
    net.train(batch_statistics)
    n = len(dataset)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)) if batch_statistics else torch.arange(n)
    size = batch if batch_statistics else 500
    correct = 0
    with torch.no_grad():
        for start in range(0, n, size):
            lo = min(start, max(0, n - size))  # a short last batch takes earlier examples along
            x, y = dataset.batch(order[lo:lo + size])
            pred = net(normalize(x, data.mean, data.std).to(device)).argmax(1).cpu()
            correct += int((pred[start - lo:] == y[start - lo:]).sum())
    model.eval()
    return correct / n


def batch_cell(cell: Cell, work: Path) -> dict[str, Any]:
    """Train one (method, batch, rate, seed) on the training part; measure validation and test accuracy.

    Outcomes other than ``completed`` are results: ``diverged`` and ``collapsed`` from the engine, and ``failed``
    where a BatchNorm layer would see one value per channel at this batch (nothing is trained then).
    """
    from ..data import load_images, split_validation
    from ..train import TrainConfig, fit
    from ..train.image_task import ImageClassification

    config = TrainConfig.from_dict(dict(cell.config["train"]))
    data = load_images(config.dataset, data_dir=config.data_dir or None, image_size=config.image_size,
                       resize=config.resize, channels=config.channels, split_seed=config.split_seed,
                       test_fraction=config.test_fraction)
    parts = split_validation(data, float(cell.config["val_fraction"]), seed=config.split_seed,
                             limit=int(cell.config.get("train_limit", 0)))
    train, val = parts.train, parts.test
    task = ImageClassification(config, data=parts)  # the engine evaluates on the validation part
    batch = config.batch_size
    steps = config.epochs * math.ceil(len(train) / batch)
    base = {"batch": batch, "steps": steps, "examples": config.epochs * len(train), "val_examples": len(val)}
    if config.norm == "batchnorm":
        smallest = len(train) % batch or batch  # the epoch's last batch may be shorter
        problem = _batch_statistics_problem(task.build_model(config), task.first_batch()[:1], min(batch, smallest))
        if problem:
            return {**base, "outcome": "failed", "diverged": False, "reason": problem, "history": [],
                    "val_acc": None, "test_acc": None, "test_acc_batch_stats": None, "train_acc": None}
    result = fit(config, out_dir=work, task=task, progress=False)
    if result.stopped_by:  # SIGINT/SIGTERM: the whole run stops (the cell's checkpoint is kept), not just this cell
        raise Interrupted.from_name(result.stopped_by)
    if result.outcome == "interrupted":
        raise RuntimeError(f"cell {cell.key} was interrupted ({result.reason}); rerun to resume it")
    history = [{k: v for k, v in row.items() if isinstance(v, (int, float, str)) or v is None}
               for row in result.history]
    ok = result.outcome == COMPLETED
    last = history[-1] if history else {}
    test = batch_stats = None
    if ok and result.model is not None:
        test = _accuracy(result.model, data.test, data, batch, batch_statistics=False)
        if config.norm == "batchnorm":
            batch_stats = _accuracy(result.model, data.test, data, batch, batch_statistics=True)
    return {**base, "outcome": str(result.outcome), "diverged": result.outcome == "diverged",
            "reason": result.reason, "history": history,
            "val_acc": _finite(last.get("test_acc")) if ok else None,  # the engine's "test" is the validation part
            "test_acc": test, "test_acc_batch_stats": batch_stats,
            "train_acc": _finite(last.get("train_acc")) if ok else None}


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
