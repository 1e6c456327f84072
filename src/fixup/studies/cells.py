"""The unit of work of a study: a cell = (study, method, setting, seed), with the config that runs it.

A cell's identity is its study, method, setting and seed; its ``config`` is everything the run needs
(data, model, learning rate, epochs, ...). The identity names the cell's folder in the output
directory; the config is saved beside the result so that a finished cell is never silently reused
for a different protocol (see :class:`fixup.studies.store.Store`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Cell", "CellFn", "Task"]

_SAFE = re.compile(r"[^A-Za-z0-9._=+,-]")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Cell:
    """One run of a study.

    ``setting`` holds the varying grid coordinates (e.g. ``{"depth": 1000}``) and is part of the
    identity; ``config`` is the full run description (JSON-serialisable) and is not. ``cost`` is a
    relative cost estimate (any unit, consistent within a plan) used for the ETA.
    """

    study: str
    method: str
    setting: Mapping[str, Any]
    seed: int
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    cost: float = field(default=1.0, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.study or not self.method:
            raise ValueError(f"a cell needs a study and a method name, got study={self.study!r}, "
                             f"method={self.method!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"a cell's seed must be an integer >= 0, got {self.seed!r}")
        if self.cost <= 0:
            raise ValueError(f"a cell's cost estimate must be positive, got {self.cost!r}")

    @property
    def setting_label(self) -> str:
        """``depth=1000,lr=0.1`` (sorted keys), or ``default`` for an empty setting."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in sorted(self.setting.items())) or "default"

    @property
    def key(self) -> str:
        """``study/method/setting/seedN``: the cell's identity as a string."""
        return f"{self.study}/{self.method}/{self.setting_label}/seed{self.seed}"

    def relpath(self) -> Path:
        """The cell's folder inside the output directory (names made filesystem-safe)."""
        parts = (self.study, self.method, self.setting_label, f"seed{self.seed}")
        return Path("cells", *(_SAFE.sub("_", p) for p in parts))

    def identity(self) -> dict[str, Any]:
        return {"study": self.study, "method": self.method, "setting": dict(self.setting), "seed": self.seed}


# A cell function runs one cell: it receives the cell and a private working folder (for the
# engine's logs and checkpoints, so that a killed cell resumes), and returns a JSON-able result.
# It must be a module-level function, so that worker processes can import it.
CellFn = Callable[[Cell, Path], dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """A cell and the function that runs it."""

    cell: Cell
    fn: CellFn
