"""The output folder of a study run: one folder per cell, holding its config and, once finished, its result.

Layout::

    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_config.json   written when the cell starts
    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_result.json   written atomically when it finishes
    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_error.json    a cell that raised (retried next run)
    OUT/cells/<study>/<method>/<setting>/seed<N>/work/              the run's own logs and checkpoints

A cell is finished exactly when ``cell_result.json`` exists: it is written to a temporary file and
renamed, so a process killed mid-write never leaves a half result that looks finished. A restarted
study skips finished cells; an unfinished cell starts again (and the engine resumes it from its
checkpoint in ``work/`` when it has one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._io import write_json
from .cells import Cell

__all__ = ["ConfigMismatchError", "Store"]

RESULT, CONFIG, ERROR, WORK = "cell_result.json", "cell_config.json", "cell_error.json", "work"


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class ConfigMismatchError(ValueError):
    """A finished cell exists in the output folder with a different config."""


class Store:
    """Cells' configs and results under one output folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def cell_dir(self, cell: Cell) -> Path:
        return self.root / cell.relpath()

    def work_dir(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / WORK

    def is_done(self, cell: Cell) -> bool:
        """True when the cell has a result made with the same config; raises if its config differs."""
        folder = self.cell_dir(cell)
        if not (folder / RESULT).exists():
            return False
        self._check_config(cell)
        return True

    def _check_config(self, cell: Cell) -> None:
        path = self.cell_dir(cell) / CONFIG
        if not path.exists():
            return
        saved = json.loads(path.read_text()).get("config", {})
        if _canonical(saved) != _canonical(dict(cell.config)):
            diff = sorted(k for k in set(saved) | set(cell.config) if saved.get(k) != cell.config.get(k))
            raise ConfigMismatchError(
                f"cell {cell.key} in {self.root} was run with a different config (differs in: "
                f"{', '.join(diff)}); use another --out folder, or delete {self.cell_dir(cell)} to redo it")

    def start(self, cell: Cell) -> Path:
        """Record that the cell is starting (its identity and config); return its work folder."""
        folder = self.cell_dir(cell)
        if (folder / CONFIG).exists():
            self._check_config(cell)
        write_json(folder / CONFIG, {**cell.identity(), "config": dict(cell.config)})
        (folder / ERROR).unlink(missing_ok=True)
        work = folder / WORK
        work.mkdir(parents=True, exist_ok=True)
        return work

    def finish(self, cell: Cell, result: dict[str, Any], seconds: float) -> dict[str, Any]:
        """Write the cell's result atomically; from then on the cell counts as done."""
        record = {**cell.identity(), "config": dict(cell.config), "seconds": seconds, "result": result}
        write_json(self.cell_dir(cell) / RESULT, record)
        return record

    def fail(self, cell: Cell, error: str) -> None:
        """Record an error (a bug, not a divergence); the cell stays unfinished and is retried next time."""
        write_json(self.cell_dir(cell) / ERROR, {**cell.identity(), "error": error})

    def load(self, cell: Cell) -> dict[str, Any] | None:
        path = self.cell_dir(cell) / RESULT
        return json.loads(path.read_text()) if path.exists() else None

    def records(self, study: str | None = None) -> list[dict[str, Any]]:
        """Every finished cell's record (of one study, or all), in a stable order."""
        base = self.root / "cells"
        pattern = f"{study or '*'}/*/*/seed*/{RESULT}"  # never the engine's own files under work/
        return [json.loads(p.read_text()) for p in sorted(base.glob(pattern))]
