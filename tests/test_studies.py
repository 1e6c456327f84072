"""The studies' machinery: cells stored atomically, a killed study resumes without redoing finished cells,
parallel jobs, failures recorded and retried, statistics, and a report with a row for every claim."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixup.studies import Cell, Store, Task, run_tasks
from fixup.studies.stats import stat
from fixup.studies.store import ConfigMismatchError

HERE = Path(__file__).parent


def counting_cell(cell: Cell, work: Path) -> dict:
    """A fake cell: logs each call (one line per start) next to the store, sleeps, returns a value."""
    log = work.parents[len(cell.relpath().parts)] / "calls.log"
    with open(log, "a") as fh:
        fh.write(cell.key + "\n")
    time.sleep(cell.config.get("sleep", 0.0))
    if cell.config.get("fail"):
        raise RuntimeError(f"deliberate failure in {cell.key}")
    return {"value": cell.seed * 10 + cell.setting.get("x", 0)}


def _tasks(n: int, sleep: float = 0.0, **config) -> list[Task]:
    return [Task(Cell("fake", "m", {"x": i}, 0, config={"sleep": sleep, **config}), counting_cell) for i in range(n)]


def _calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().split() if log.exists() else []


def test_cell_identity_and_folder():
    cell = Cell("depth", "fixup", {"depth": 1000, "lr": 0.1}, 2, config={"epochs": 1})
    assert cell.key == "depth/fixup/depth=1000,lr=0.1/seed2"
    assert cell.relpath() == Path("cells/depth/fixup/depth=1000,lr=0.1/seed2")
    assert cell == Cell("depth", "fixup", {"lr": 0.1, "depth": 1000}, 2, config={"epochs": 5})  # config not identity
    with pytest.raises(ValueError, match="seed"):
        Cell("depth", "fixup", {}, -1)


def test_store_result_is_atomic_and_config_checked(tmp_path):
    store = Store(tmp_path)
    cell = Cell("s", "m", {"x": 1}, 0, config={"epochs": 1})
    assert not store.is_done(cell)
    store.start(cell)
    assert not store.is_done(cell)  # started is not finished
    store.finish(cell, {"acc": 0.5}, 1.0)
    assert store.is_done(cell) and store.load(cell)["result"] == {"acc": 0.5}
    assert not list(tmp_path.rglob("*.tmp"))
    other = Cell("s", "m", {"x": 1}, 0, config={"epochs": 2})
    with pytest.raises(ConfigMismatchError, match="epochs"):
        store.is_done(other)


def test_runner_skips_finished_cells_and_reports_progress(tmp_path):
    seen = []
    summary = run_tasks(_tasks(3), tmp_path, progress=lambda p, m: seen.append((p.done, p.left, m)))
    assert sorted(summary.ran) == sorted(t.cell.key for t in _tasks(3)) and not summary.resumed
    assert seen[-1][:2] == (3, 0)
    again = run_tasks(_tasks(4), tmp_path)
    assert len(again.resumed) == 3 and again.ran == ["fake/m/x=3/seed0"]
    assert sorted(_calls(tmp_path)) == sorted(t.cell.key for t in _tasks(4))  # each cell ran exactly once


def test_killed_study_restarts_without_redoing_finished_cells(tmp_path):
    """SIGKILL a study mid-run; the restart runs only the cells that had not finished."""
    script = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent / 'src')!r}]\n"
              "from test_studies import _tasks\nfrom fixup.studies import run_tasks\n"
              f"run_tasks(_tasks(6, sleep=0.4), {str(tmp_path)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.time() + 60
        while len(list(tmp_path.rglob("cell_result.json"))) < 2:
            assert proc.poll() is None and time.time() < deadline, "the study process ended early"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = {json.loads(p.read_text())["setting"]["x"] for p in tmp_path.rglob("cell_result.json")}
    assert 2 <= len(finished) < 6
    summary = run_tasks(_tasks(6, sleep=0.4), tmp_path)
    assert {f"fake/m/x={x}/seed0" for x in finished} == set(summary.resumed)
    calls = _calls(tmp_path)
    for x in finished:
        assert calls.count(f"fake/m/x={x}/seed0") == 1, f"finished cell x={x} was redone"
    assert len(list(tmp_path.rglob("cell_result.json"))) == 6


def test_failed_cell_is_recorded_and_retried(tmp_path):
    tasks = [*_tasks(2), Task(Cell("fake", "m", {"x": 9}, 0, config={"fail": True}), counting_cell)]
    summary = run_tasks(tasks, tmp_path)
    assert list(summary.failed) == ["fake/m/x=9/seed0"] and "deliberate failure" in summary.failed["fake/m/x=9/seed0"]
    assert (Store(tmp_path).cell_dir(tasks[2].cell) / "cell_error.json").exists()
    again = run_tasks(tasks, tmp_path)
    assert len(again.resumed) == 2 and list(again.failed) == ["fake/m/x=9/seed0"]


def test_parallel_jobs_run_every_cell_once(tmp_path):
    summary = run_tasks(_tasks(4, sleep=0.2), tmp_path, jobs=2)
    assert len(summary.ran) == 4 and not summary.failed
    assert sorted(_calls(tmp_path)) == sorted(t.cell.key for t in _tasks(4))


def test_duplicate_cells_are_refused(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        run_tasks(_tasks(2) + _tasks(1), tmp_path)


def test_stat_mean_std_n():
    s = stat([1.0, 2.0, 3.0, None, float("nan")])
    assert (s.mean, s.std, s.n, s.n_total) == (2.0, 1.0, 3, 5)
    assert s.format(1) == "2.0 ± 1.0 (n=3 of 5)"
    assert stat([None]).format() == "— (n=0 of 1)"
    assert stat([0.5]).std == 0.0


def _costed(costs: list[float]) -> list[Task]:
    return [Task(Cell("fake", "m", {"x": i}, 0, cost=c), counting_cell) for i, c in enumerate(costs)]


def test_parallel_workers_take_the_costliest_cells_first(tmp_path):
    tasks = _costed([1, 5, 2, 4, 3])
    handed_out: list[str] = []  # the runner says "running KEY" as it hands a cell to a worker

    def progress(state, message: str) -> None:
        if message.startswith("running "):
            handed_out.append(message.split()[1])

    run_tasks(tasks, tmp_path, jobs=2, progress=progress)
    by_cost = sorted(tasks, key=lambda t: -t.cell.cost)
    assert handed_out == [t.cell.key for t in by_cost]
    assert sorted(_calls(tmp_path)) == sorted(t.cell.key for t in tasks)


def test_estimate_lays_cells_out_on_the_workers():
    from fixup.studies.estimate import CELL_OVERHEAD_S, COST_FACTOR, estimate_seconds

    costs = [8.0, 7.0, 6.0, 5.0, 4.0]
    tasks = _costed(costs)
    unit = 1.0 / COST_FACTOR  # one second of work per unit of cost

    def secs(c: float) -> float:
        return CELL_OVERHEAD_S + c

    assert estimate_seconds(tasks, unit, jobs=1) == pytest.approx(sum(secs(c) for c in costs))
    # longest first on 2 workers: {8, 5, 4} and {7, 6}
    assert estimate_seconds(tasks, unit, jobs=2) == pytest.approx(max(secs(8) + secs(5) + secs(4),
                                                                       secs(7) + secs(6)))
    # more workers than cells: the longest cell alone
    assert estimate_seconds(tasks, unit, jobs=8) == pytest.approx(secs(8))
