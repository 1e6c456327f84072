"""How long a plan will take: a few timed training steps on this machine, scaled by each cell's cost.

Image cells cost ``depth x epochs x training examples x (side/8)^2`` (see
:func:`fixup.studies._common.image_cost`); :func:`calibrate` measures the seconds one such unit takes
here, with a CIFAR ResNet-20 forward and backward pass. A cell's time is then
``CELL_OVERHEAD_S + COST_FACTOR x cost x seconds-per-unit``, and :func:`estimate_seconds` lays the cells
out on the workers in the order the runner takes them (:func:`fixup.studies.runner.longest_first`).
The two constants were fitted to a measured quick run (docs/studies.md, "Measured on this machine"): a
training step of a deep, narrow net costs less per layer-example than the calibration's ResNet-20, and
every cell pays for building its model, evaluating and writing its files.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .cells import Task

if TYPE_CHECKING:
    from .store import Store

__all__ = ["CELL_OVERHEAD_S", "COST_FACTOR", "calibrate", "estimate_seconds", "measured_rate"]

CELL_OVERHEAD_S = 2.0  # building the model, evaluating, writing the cell's files (fitted; see module doc)
COST_FACTOR = 0.67  # measured seconds per unit over the calibrated ones (fitted; see module doc)


def calibrate(side: int = 8, channels: int = 1, *, device: str = "auto", threads: int | None = None,
              batch: int = 32, steps: int = 3) -> float:
    """Seconds per cost unit (one residual layer on one 8x8-equivalent example, forward and backward)."""
    import torch

    from ..models import create_model

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                           "cpu" if device == "auto" else device)
        gen = torch.Generator().manual_seed(0)
        model = create_model("resnet_cifar", depth=20, norm="fixup", in_channels=channels).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(batch, channels, side, side, generator=gen).to(dev)
        y = torch.randint(0, 10, (batch,), generator=gen).to(dev)
        times = []
        for i in range(steps + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t0)
        return min(times) / (20 * batch * (side / 8) ** 2)
    finally:
        torch.set_num_threads(old)


def estimate_seconds(tasks: Sequence[Task], seconds_per_cost: float, jobs: int = 1, order: str | None = None) -> float:
    """Wall-clock estimate for ``tasks`` run ``jobs`` at a time, in the runner's order (see its ``order``)."""
    from .runner import in_order, longest_first

    workers = [0.0] * max(1, jobs)
    for task in in_order(tasks, order) if order else longest_first(tasks) if jobs > 1 else tasks:
        i = workers.index(min(workers))  # the next free worker takes the next cell
        workers[i] += CELL_OVERHEAD_S + COST_FACTOR * task.cell.cost * seconds_per_cost
    return max(workers)


# A resumed run times itself on its own finished cells once they hold this much of the work (cost units): the
# calibration's ResNet-20 misjudges deep, narrow nets and a loaded machine; cells that did the work do not.
MEASURED_MIN_COST = 1e6


def measured_rate(store: Store, finished: Sequence[Task]) -> float | None:
    """Seconds per cost unit as :func:`estimate_seconds` takes them, from the recorded time of ``finished``
    cells of ``store``; None if they hold too little work to time on (:data:`MEASURED_MIN_COST`)."""
    seconds = cost = 0.0
    for task in finished:
        record = store.load(task.cell)
        if record is not None and isinstance(record.get("seconds"), (int, float)):
            seconds += max(0.0, float(record["seconds"]) - CELL_OVERHEAD_S)
            cost += task.cell.cost
    if cost < MEASURED_MIN_COST or seconds <= 0:
        return None
    return seconds / cost / COST_FACTOR
