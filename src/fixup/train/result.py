"""What a training run returns: its per-epoch history and how it ended.

A run that diverges is a result, not an error: the depth study counts such runs. ``fixup train``
turns the outcome into its exit code (:data:`EXIT_CODES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

__all__ = ["EXIT_CODES", "Outcome", "TrainResult"]

# Exit codes of `fixup train` per outcome (2 is kept for usage and input errors).
EXIT_CODES = {"completed": 0, "diverged": 3, "interrupted": 4}


@dataclass
class Outcome:
    """How a run ended: ``completed``, ``diverged`` (where and why) or ``interrupted`` (resumable)."""

    status: str  # completed | diverged | interrupted
    epoch: int  # 0-based epoch in which the run ended (the last epoch when completed)
    step: int  # optimiser steps taken in total when it ended
    reason: str = ""  # e.g. "training loss is nan at step 12 (epoch 0, batch 12)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    """The history (one dict per finished epoch), the outcome, and the run's setup."""

    history: list[dict[str, Any]]
    outcome: Outcome
    config: dict[str, Any]
    param_groups: list[dict[str, Any]] = field(default_factory=list)  # name, lr, weight_decay, params
    task: dict[str, Any] = field(default_factory=dict)  # the task's describe()
    out_dir: str | None = None
    model: nn.Module | None = field(default=None, repr=False, compare=False)  # the trained model (unwrapped)

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's metrics ({} when no epoch finished)."""
        return self.history[-1] if self.history else {}

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome.status]

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.to_dict(), "final": self.final, "history": self.history,
                "config": self.config, "param_groups": self.param_groups, "task": self.task, "out_dir": self.out_dir}
