"""Full mode on a GPU: what a run will cost (where its data lie: :mod:`fixup.studies.layout`).

``fixup reproduce --full --data-dir D`` reads the data in their standard published formats from::

    D/cifar-10-python.tar.gz or D/cifar-10-batches-py/     CIFAR-10, the python archive (image studies)
    D/iwslt14.de-en/{train,valid,test}.{de,en}            IWSLT'14 De-En, one sentence a line (translation)
    D/svhn/train_32x32.mat and D/svhn/test_32x32.mat      SVHN cropped digits, format 2 (Appendix C's row)
    D/imagenet/train/<class>/*.JPEG, D/imagenet/val/<class>/*.JPEG
                                                          ImageNet as class folders (Table 2's rows); the
                                                          validation images sorted into class folders too

CIFAR-10 is required; each of the others is optional: where it is missing its cells are not planned
and its claim rows say "not run", naming the folder that was not found.

``--dry-run`` lists every cell, the data it needs and an estimate of GPU hours from the throughput
model below; nothing runs.

Throughput model (an assumption, stated in the output, not a measurement): one cost unit (one
residual layer of a CIFAR ResNet on one 8x8-equivalent example, forward and backward;
:func:`fixup.studies._common.image_cost`, which scales other models by their compute per layer) takes
:data:`GPU_SECONDS_PER_UNIT` on one current data-centre GPU in fp32. It is derived from ResNet-110
on CIFAR-10 at 3,000 training images a second: 110 layers x 50,000 images x (32/8)^2 = 8.8e7 units
in 16.7 s. Under it an ImageNet ResNet-50 trains at about 190 images a second at 224x224.
Translation cells carry their own cost in the same unit (:attr:`fixup.studies.grid.TranslationGrid.cost_per_cell`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .cells import Task
from .grid import Grid

__all__ = ["GPU_SECONDS_PER_UNIT", "THROUGHPUT_MODEL", "data_needed", "dry_run"]

GPU_SECONDS_PER_UNIT = 16.7 / (110 * 50_000 * 16)
THROUGHPUT_MODEL = ("assumed: ResNet-110 trains on CIFAR-10 at 3,000 images/s on one GPU (fp32); every cell is "
                    "scaled from it by depth x examples x pixels x compute per layer")

def data_needed(task: Task, grid: Grid) -> str:
    """The files a cell reads."""
    train = task.cell.config.get("train", {})
    if task.cell.study == "theory":
        return "none (random batches)"
    if task.cell.study == "translation":
        return train.get("data_dir") or "the generated task (made on the fly)"
    name = train.get("dataset", grid.data)
    return f"{'imagenet (folder)' if name == 'folder' else name}: {train.get('data_dir') or 'embedded'}"


def dry_run(tasks: Sequence[Task], waiting: int, grid: Grid) -> dict[str, Any]:
    """Every cell with the data it needs and its GPU hours under the throughput model, and the totals."""
    cells = [{"cell": t.cell.key, "data": data_needed(t, grid), "cost": t.cell.cost,
              "gpu_hours": t.cell.cost * GPU_SECONDS_PER_UNIT / 3600} for t in tasks]
    mean = sum(c["gpu_hours"] for c in cells) / max(1, len(cells))
    total = sum(c["gpu_hours"] for c in cells) + waiting * mean
    return {"cells": cells, "waiting": waiting, "gpu_hours": total, "throughput_model": THROUGHPUT_MODEL,
            "gpu_seconds_per_unit": GPU_SECONDS_PER_UNIT}
