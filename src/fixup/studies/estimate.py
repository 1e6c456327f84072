"""How long a plan will take: a few timed training steps on this machine, scaled by each cell's cost.

Image cells cost ``depth x epochs x training examples x (side/8)^2`` (see
:func:`fixup.studies._common.image_cost`); :func:`calibrate` measures the seconds one such unit takes
here, with a CIFAR ResNet-20 forward and backward pass. It is an estimate: real runs add evaluation,
data handling and (for LSUV) initialisation passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .cells import Task

__all__ = ["calibrate", "estimate_seconds"]


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


def estimate_seconds(tasks: Sequence[Task], seconds_per_cost: float, jobs: int = 1) -> float:
    """Wall-clock estimate for ``tasks`` run ``jobs`` at a time."""
    return sum(t.cell.cost for t in tasks) * seconds_per_cost / max(1, jobs)
