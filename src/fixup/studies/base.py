"""What a study is: a plan of cells, a function that runs one, and the summary, claims, tables and figures.

A study is a :class:`Study` record of plain functions (the cell function must be a module-level
function so worker processes can import it). :func:`fixup.studies.reproduce.reproduce` and
``fixup study NAME`` drive them all the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cells import CellFn, Task
from .claims import ClaimRow
from .grid import Grid
from .store import Store

__all__ = ["Plan", "Study", "StudyOutput"]


@dataclass
class Plan:
    """The cells a study can run now, and how many more it will plan once those finish.

    ``waiting`` counts cells whose config depends on finished cells (e.g. runs at a learning rate
    chosen by a search); the driver plans again after each round until nothing is waiting.
    """

    tasks: list[Task] = field(default_factory=list)
    waiting: int = 0


@dataclass
class StudyOutput:
    """A study's part of the report."""

    summary: dict[str, Any]
    claims: list[ClaimRow]
    markdown: str
    figures: list[Path]


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    run_cell: CellFn
    plan: Callable[[Grid, Store], Plan]
    # (finished cell records, grid) -> JSON-able summary with mean ± std and n
    summarise: Callable[[list[dict[str, Any]], Grid], dict[str, Any]]
    claims: Callable[[dict[str, Any], Grid], list[ClaimRow]]
    markdown: Callable[[dict[str, Any], Grid], str]
    # (summary, folder) -> the PNG files written (matplotlib is imported only here)
    figures: Callable[[dict[str, Any], Path], list[Path]]

    def output(self, store: Store, grid: Grid, figure_dir: Path, *, plots: bool = True) -> StudyOutput:
        """Summarise the finished cells of this study into its part of the report."""
        summary = self.summarise(store.records(self.name), grid)
        figures = self.figures(summary, figure_dir) if plots else []
        return StudyOutput(summary, self.claims(summary, grid), self.markdown(summary, grid), figures)
