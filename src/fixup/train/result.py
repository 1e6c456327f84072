"""What a training run returns: its per-epoch history and how it ended.

A run that diverges or collapses (its units all dead) is a result, not an error: the depth study counts
such runs. ``fixup train``
turns the outcome into its exit code (:data:`EXIT_CODES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["EXIT_CODES", "SIGNAL_EXIT_CODES", "Outcome", "TrainResult"]

# Exit codes of `fixup train` per outcome (2 is kept for usage and input errors); an interruption by
# a signal exits as shells report a process killed by it, 128 + the signal's number.
EXIT_CODES = {"completed": 0, "diverged": 3, "interrupted": 4, "collapsed": 5}
SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


class Outcome(str):
    """How a run ended: ``completed``, ``diverged`` or ``collapsed`` (where and why), or ``interrupted`` (resumable).

    It is the status string itself (``result.outcome == "diverged"``; JSON writes it as that string)
    carrying ``epoch`` (0-based epoch in which the run ended), ``step`` (optimiser steps taken in total)
    and ``reason`` (e.g. "training loss is nan at step 12 (epoch 0, batch 12)").
    """

    epoch: int
    step: int
    reason: str

    def __new__(cls, status: str, epoch: int = 0, step: int = 0, reason: str = "") -> Outcome:
        if status not in EXIT_CODES:
            raise ValueError(f"outcome status must be one of {', '.join(EXIT_CODES)}, got {status!r}")
        obj = super().__new__(cls, status)
        obj.epoch, obj.step, obj.reason = int(epoch), int(step), str(reason)
        return obj

    def __getnewargs__(self) -> tuple[str, int, int, str]:  # copy and pickle keep the fields
        return (str(self), self.epoch, self.step, self.reason)

    @property
    def status(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Outcome({self.status!r}, epoch={self.epoch}, step={self.step}, reason={self.reason!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "epoch": self.epoch, "step": self.step, "reason": self.reason}


@dataclass
class TrainResult:
    """The history (one dict per finished epoch), the outcome, the run's setup and its scalars over training."""

    history: list[dict[str, Any]]
    outcome: Outcome
    config: dict[str, Any]
    param_groups: list[dict[str, Any]] = field(default_factory=list)  # name, lr, weight_decay, params
    task: dict[str, Any] = field(default_factory=dict)  # the task's describe()
    out_dir: str | None = None
    model: nn.Module | None = field(default=None, repr=False, compare=False)  # the trained model (unwrapped)
    already_ended: bool = False  # the run folder's run had already ended: returned as found, nothing trained
    stopped_by: str = ""  # the signal that interrupted the run ("SIGINT", "SIGTERM"), "" otherwise
    # Per finished epoch, and at initialisation (epoch 0), the distribution of the method's scalars per kind and
    # stage: {"epoch", "step", "scalars": [{"kind", "stage", "count", "mean", ...}]} (fixup.train.scalars).
    scalars: list[dict[str, Any]] = field(default_factory=list)
    # What the engine applied of the method's own recipe and why (fixup.train.recipe.Recipe.to_dict()).
    recipe: dict[str, Any] = field(default_factory=dict)
    # Private training (dp): the mechanism's settings and the epsilon spent at delta (PrivateTraining.summary()).
    privacy: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's metrics ({} when no epoch finished)."""
        return self.history[-1] if self.history else {}

    @property
    def reason(self) -> str:
        """Why the run stopped early ("" when it completed)."""
        return self.outcome.reason

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_CODES` of the outcome; a run stopped by a signal exits as 128 + its number (130, 143)."""
        if self.outcome.status == "interrupted" and self.stopped_by in SIGNAL_EXIT_CODES:
            return SIGNAL_EXIT_CODES[self.stopped_by]
        return EXIT_CODES[self.outcome.status]

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.to_dict(), "final": self.final, "history": self.history,
                "config": self.config, "param_groups": self.param_groups, "task": self.task, "out_dir": self.out_dir,
                "scalars": self.scalars, "recipe": self.recipe,
                **({"privacy": self.privacy} if self.privacy else {})}
