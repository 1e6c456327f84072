"""Peak memory of one training step, measured the same way for every variant.

CPU: PyTorch's profiler with ``profile_memory=True`` records every allocation and free of the CPU
allocator with its size; summing them in time order gives the exact peak of tensor memory during
the step, above what was live before it. (``tracemalloc`` does not see tensor storage, and the
process RSS includes the allocator's caching and the interpreter; RSS is reported separately by the
deep-network benchmark, which runs each case in a fresh process.)

CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, the same quantity.

Both report ``peak_bytes = parameter and buffer bytes + peak increase during the step`` (activations
kept for backward, gradients, temporaries). Gradients are released before the step so that they count.
The input batch and the optimiser's state are left out: they are the same for every variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["MEMORY_METHOD", "model_bytes", "peak_step_memory"]

MEMORY_METHOD = {
    "cpu": "parameters + buffers + peak increase of CPU tensor memory during one training step, from the "
           "allocator's event timeline (torch.profiler, profile_memory=True)",
    "cuda": "parameters + buffers + torch.cuda.max_memory_allocated increase during one training step",
}


def model_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _cpu_peak_increase(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    from .profiling import quiet_profiler

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    kineto = getattr(prof.profiler, "kineto_results", None)
    if kineto is None:
        raise RuntimeError(f"torch {torch.__version__}'s profiler exposes no allocation events; "
                           "measure memory on CUDA or upgrade PyTorch (2.1+)")
    events = sorted((e.start_ns(), e.nbytes()) for e in kineto.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def peak_step_memory(step: Callable[[], Any], model: nn.Module, device: torch.device | str) -> dict[str, Any]:
    """Run ``step`` once; return ``{"peak_bytes", "model_bytes", "step_increase_bytes"}`` (see above)."""
    device = torch.device(device)
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        increase = torch.cuda.max_memory_allocated(device) - before
    elif device.type == "cpu":
        increase = _cpu_peak_increase(step)
    else:
        raise ValueError(f"memory measurement supports cpu and cuda devices, got {device}")
    static = model_bytes(model)
    return {"peak_bytes": static + increase, "model_bytes": static, "step_increase_bytes": increase}
