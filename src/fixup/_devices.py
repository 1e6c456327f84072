"""Device names as the command line and configs accept them, checked before any work starts."""

from __future__ import annotations

import re

__all__ = ["check_device_name", "resolve_device"]

_FORM = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")


def check_device_name(choice: str) -> str:
    """Refuse a device name that is none of auto, cpu, cuda, cuda:N, mps (without asking the hardware)."""
    if not isinstance(choice, str) or not _FORM.match(choice):
        raise ValueError(f"device {choice!r} is not a device name; use auto (CUDA when available), cpu, cuda, "
                         "cuda:N or mps")
    return choice


def resolve_device(choice: str, local_rank: int = 0):
    """The ``torch.device`` for ``choice`` on this machine; one that is absent here is an error saying so.

    ``auto`` is CUDA when available, else the CPU; plain ``cuda`` is device ``local_rank`` (torchrun).
    """
    import torch

    check_device_name(choice)
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError("device 'mps' was asked for but this PyTorch build or machine has no MPS; use cpu or auto")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise ValueError(f"device {choice!r} was asked for but CUDA is not available (this PyTorch build or machine "
                         "has no GPU); use cpu or auto")
    index = local_rank if choice == "cuda" else int(choice.split(":")[1])
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {choice!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered 0..{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)
