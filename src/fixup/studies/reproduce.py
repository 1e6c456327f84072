"""``fixup reproduce``: plan every study's cells, run them with one overall progress, write the report.

Some cells depend on others (a rate chosen by a search): the driver plans, runs what it can, and
plans again until nothing is left waiting. Everything is stored as it finishes, so an interrupted
run picks up where it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._io import write_json
from .base import Study, StudyOutput
from .cells import Task
from .grid import Grid
from .registry import STUDIES, get_study
from .report import write_report
from .runner import Progress, ProgressFn, run_tasks
from .store import Store

__all__ = ["ReproduceResult", "plan_all", "reproduce"]


@dataclass
class ReproduceResult:
    report: Path
    results: Path
    outputs: dict[str, StudyOutput]
    failed: dict[str, str]  # cell key -> error
    seconds: float
    cells_run: int
    cells_resumed: int
    problems: list[str] = field(default_factory=list)  # bad cell files found, moved aside and redone


def plan_all(grid: Grid, store: Store, studies: Sequence[Study]) -> tuple[list[Task], int]:
    """All tasks the studies can plan now, and how many cells wait on them."""
    tasks: list[Task] = []
    waiting = 0
    for study in studies:
        p = study.plan(grid, store)
        tasks += p.tasks
        waiting += p.waiting
    return tasks, waiting


def reproduce(grid: Grid, out: str | Path, *, studies: Sequence[str] | None = None, jobs: int = 1,
              progress: ProgressFn | None = None, plots: bool = True, seconds_per_cost: float | None = None,
              command: str = "", run: bool = True, keep_checkpoints: bool = False) -> ReproduceResult:
    """Run ``studies`` (default: every study the grid's mode includes) on ``grid`` into ``out``.

    The run holds ``out``'s lock throughout (:meth:`fixup.studies.store.Store.lock`): a second run on the
    same folder raises :class:`fixup.studies.store.StoreLockedError`, naming the holder. ``run=False`` runs
    no cell and writes the report of the cells finished so far, without the lock (it only reads finished
    cells, which are written atomically): a run of many hours can be read while it goes on. A finished
    cell's checkpoints are deleted unless ``keep_checkpoints``.
    """
    store = Store(out)
    if not run:
        return _reproduce(grid, Path(out), store, studies=studies, jobs=jobs, progress=progress, plots=plots,
                          seconds_per_cost=seconds_per_cost, command=command, run=False)
    with store.lock(command):
        return _reproduce(grid, Path(out), store, studies=studies, jobs=jobs, progress=progress, plots=plots,
                          seconds_per_cost=seconds_per_cost, command=command, keep_checkpoints=keep_checkpoints)


def _reproduce(grid: Grid, out: Path, store: Store, *, studies: Sequence[str] | None, jobs: int,
               progress: ProgressFn | None, plots: bool, seconds_per_cost: float | None,
               command: str, run: bool = True, keep_checkpoints: bool = False) -> ReproduceResult:
    chosen = [get_study(n) for n in (studies or [s for s in STUDIES if s not in grid.skipped])]
    problems: list[str] = []
    write_json(out / "grid.json", grid.to_dict())
    start = time.perf_counter()
    done_before = ran = resumed = 0
    failed: dict[str, str] = {}
    seen: set[str] = set()
    while run:
        tasks, waiting = plan_all(grid, store, chosen)
        new = [t for t in tasks if t.cell.key not in seen]
        if not new:
            break
        seen.update(t.cell.key for t in new)

        def overall(p: Progress, message: str, _offset: int = done_before, _waiting: int = waiting,
                    _resumed: int = resumed) -> None:
            if progress is not None:
                progress(Progress(total=_offset + p.total + _waiting, done=_offset + p.done,
                                  resumed=p.resumed + _resumed, failed=p.failed + len(failed), running=p.running,
                                  elapsed=time.perf_counter() - start, eta=p.eta), message)

        summary = run_tasks(new, out, jobs=jobs, progress=overall, seconds_per_cost=seconds_per_cost,
                            order=grid.order, keep_checkpoints=keep_checkpoints)
        seconds_per_cost = summary.seconds_per_cost or seconds_per_cost  # the next round's ETA prior
        ran += len(summary.ran)
        resumed += len(summary.resumed)
        failed.update(summary.failed)
        problems += summary.problems
        done_before += len(new) - len(summary.failed)
        if summary.failed:
            break  # cells waiting on a failed cell cannot be planned; report what finished
    figure_dir = out / "figures"
    outputs = {s.name: s.output(store, grid, figure_dir, plots=plots) for s in chosen}
    seconds = time.perf_counter() - start
    finished = [r for s in chosen for r in store.records(s.name)]
    timing = {"report_only": not run, "seconds": seconds, "cells_run": ran, "cells_resumed": resumed,
              "cells_failed": len(failed)}
    last = None if run else _last_run(out)
    if last is not None:  # a rewritten report keeps the command and time of the run that last ran cells here
        command, timing = last["command"], {**last["timing"], "report_only": False, "rewritten": True}
    timing.update({"cells_finished": len(finished),
                   "cell_seconds": sum(float(r.get("seconds") or 0) for r in finished),
                   # cells whose record holds no time (rebuilt from a summary): their time is not in cell_seconds
                   "cells_untimed": sum(not isinstance(r.get("seconds"), (int, float)) for r in finished)})
    report, results = write_report(out, grid, outputs, {s.name: s.title for s in chosen}, timing=timing,
                                   command=command, skipped=grid.skipped)
    problems += store.problems  # files found bad while summarising
    return ReproduceResult(report, results, outputs, failed, seconds, ran, resumed, problems)


def _last_run(out: Path) -> dict | None:
    """The command and timing of the last run that ran cells into ``out`` (from its results.json), or None."""
    try:
        last = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return None
    timing = last.get("timing") if isinstance(last, dict) else None
    if not isinstance(timing, dict) or timing.get("report_only") or not last.get("command"):
        return None
    return {"command": last["command"], "timing": timing}
