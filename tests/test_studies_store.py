"""The study store validates every file it reads, a study folder is locked while a run holds it, and worker
processes die with their parent, even when the parent is SIGKILLed (issue 15)."""

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
from fixup.studies.runner import STOP_SECONDS

HERE = Path(__file__).parent
SRC = HERE.parent / "src"


def value_cell(cell: Cell, work: Path) -> dict:
    log = work.parents[len(cell.relpath().parts)] / "calls.log"
    with open(log, "a") as fh:
        fh.write(cell.key + "\n")
    return {"value": cell.seed}


def pid_cell(cell: Cell, work: Path) -> dict:
    """Writes its worker's pid beside the store, then sleeps (a long cell)."""
    (work.parents[len(cell.relpath().parts)] / f"pid-{os.getpid()}").write_text(str(os.getpid()))
    time.sleep(cell.config.get("sleep", 60))
    return {}


def _one(tmp_path: Path) -> tuple[Store, Cell, Path]:
    cell = Cell("s", "m", {"x": 1}, 0, config={"epochs": 1})
    summary = run_tasks([Task(cell, value_cell)], tmp_path)
    assert summary.ran == [cell.key]
    store = Store(tmp_path)
    return store, cell, store.cell_dir(cell)


@pytest.mark.parametrize("content", ['{"study": "s", "method": "m", "setting": {"x": 1}, "seed": 0, "con', "{}", "[]",
                                     '{"study": "s", "method": "m", "setting": {}, "seed": "0", "config": {}, '
                                     '"result": {}}'])
def test_a_bad_result_file_is_named_moved_aside_and_redone(tmp_path, content):
    _store, cell, folder = _one(tmp_path)
    (folder / "cell_result.json").write_text(content)
    messages = []
    summary = run_tasks([Task(cell, value_cell)], tmp_path, progress=lambda p, m: messages.append(m))
    assert summary.ran == [cell.key], "the cell with a bad result must be redone"
    assert len(summary.problems) == 1 and str(folder / "cell_result.json") in summary.problems[0]
    assert any(m.startswith("PROBLEM") and "cell_result.json" in m for m in messages)
    aside = list(folder.glob("cell_result.json.bad-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert json.loads((folder / "cell_result.json").read_text())["result"] == {"value": 0}
    assert (tmp_path / "calls.log").read_text().split() == [cell.key, cell.key]


def test_bad_records_are_left_out_of_the_summary_and_named(tmp_path):
    store, _cell, folder = _one(tmp_path)
    (folder / "cell_result.json").write_text("[]")
    assert store.records() == [] and "cell_result.json" in store.problems[0]


def test_a_corrupt_config_file_is_moved_aside_and_the_cell_runs(tmp_path):
    cell = Cell("s", "m", {"x": 1}, 0, config={"epochs": 1})
    folder = Store(tmp_path).cell_dir(cell)
    folder.mkdir(parents=True)
    (folder / "cell_config.json").write_text('{"study": "s", "conf')  # a run killed while writing it (by hand)
    summary = run_tasks([Task(cell, value_cell)], tmp_path)
    assert summary.ran == [cell.key] and not summary.failed
    assert "cell_config.json" in summary.problems[0] and list(folder.glob("cell_config.json.bad-*"))
    assert json.loads((folder / "cell_config.json").read_text())["config"] == {"epochs": 1}


def test_a_locked_folder_refuses_a_second_run_naming_the_holder(tmp_path):
    store = Store(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from fixup.studies import Store\n"
            "with Store(sys.argv[2]).lock(): print('got it')\n")
    with store.lock("fixup reproduce --quick"):
        with store.lock():  # re-entrant in the process that holds it
            pass
        proc = subprocess.run([sys.executable, "-c", code, str(SRC), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "StoreLockedError" in proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr and "fixup reproduce --quick" in proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, str(SRC), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "got it" in proc.stdout  # released


def test_a_second_reproduce_on_a_held_folder_exits_2(tmp_path):
    with Store(tmp_path).lock("fixup reproduce --tiny"):
        proc = subprocess.run([sys.executable, "-m", "fixup", "reproduce", "--tiny", "--out", str(tmp_path)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr and "fixup reproduce --tiny" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "cells").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def test_workers_die_when_their_parent_is_killed(tmp_path):
    script = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(SRC)!r}]\n"
              "from test_studies_store import pid_cell\nfrom fixup.studies import Cell, Task, run_tasks\n"
              "tasks = [Task(Cell('w', 'm', {'x': i}, 0, config={'sleep': 120}), pid_cell) for i in range(2)]\n"
              f"run_tasks(tasks, {str(tmp_path)!r}, jobs=2)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.time() + 90
        while len(pids := [int(p.read_text()) for p in tmp_path.glob("pid-*") if p.read_text()]) < 2:
            assert proc.poll() is None and time.time() < deadline, "the workers did not start"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # the parent only, not its process group
        proc.wait()
        deadline = time.time() + 15
        while any(_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a worker outlived its SIGKILLed parent"
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def slow_to_stop_cell(cell: Cell, work: Path) -> dict:
    """Like :func:`pid_cell`, but on SIGTERM takes a second to stop (a cell writing its checkpoint)."""

    def stop(*_: object) -> None:
        time.sleep(1.0)
        (work.parents[len(cell.relpath().parts)] / f"stopped-{os.getpid()}").write_text("")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    return pid_cell(cell, work)


def engine_like_cell(cell: Cell, work: Path) -> dict:
    """Like :func:`pid_cell`, but stops as the training engine does: SIGTERM is a request; the cell then takes a
    second (its checkpoint), and raises :class:`fixup._signals.Interrupted`, which its worker reports back."""
    from fixup._signals import Interrupted

    asked: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: asked.append(signum))
    (work.parents[len(cell.relpath().parts)] / f"pid-{os.getpid()}").write_text(str(os.getpid()))
    for _ in range(int(cell.config.get("sleep", 60) * 10)):
        if asked:
            time.sleep(1.0)
            (work.parents[len(cell.relpath().parts)] / f"stopped-{os.getpid()}").write_text("")
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            raise Interrupted(asked[0])
        time.sleep(0.1)
    return {}


def _start_two_cells_then_interrupt(tmp_path: Path, cell_fn: str) -> subprocess.Popen:
    """A run of two cells of ``cell_fn`` (a function of this module) in two workers, in its own process,
    SIGINTed once both workers have started. When ``run_tasks`` raises, the process writes the number of
    cells that had written their ``stopped-*`` file to ``raised``."""
    # SIGINT as Ctrl-C raises it, even where this test's process inherited it ignored (a background job)
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"sys.path[:0] = [{str(HERE)!r}, {str(SRC)!r}]\n"
              f"from test_studies_store import {cell_fn}\nfrom fixup.studies import Cell, Task, run_tasks\n"
              f"tasks = [Task(Cell('w', 'm', {{'x': i}}, 0, config={{'sleep': 300}}), {cell_fn})\n"
              "         for i in range(2)]\n"
              "try:\n"
              f"    run_tasks(tasks, {str(tmp_path)!r}, jobs=2)\n"
              "except KeyboardInterrupt:\n"
              f"    open({str(tmp_path / 'raised')!r}, 'w').write(str(len(list(__import__('pathlib').Path("
              f"{str(tmp_path)!r}).glob('stopped-*')))))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.time() + 90
    while len([p for p in tmp_path.glob("pid-*") if p.read_text()]) < 2:
        if proc.poll() is not None or time.time() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the workers did not start")
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    return proc


def test_a_stopped_run_returns_once_its_cells_have_checkpointed(tmp_path):
    """A cell stopped as the engine stops reports back and its worker idles: the run must not wait the whole
    STOP_SECONDS for workers that would never exit by themselves."""
    proc = _start_two_cells_then_interrupt(tmp_path, "engine_like_cell")
    stopped = time.time()
    try:
        proc.wait(timeout=STOP_SECONDS - 30)  # before: the full STOP_SECONDS
        assert (tmp_path / "raised").read_text() == "2", "the run returned before its cells had checkpointed"
        assert time.time() - stopped < STOP_SECONDS / 2
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_stopped_run_releases_its_folder_only_after_its_workers_have_stopped(tmp_path):
    proc = _start_two_cells_then_interrupt(tmp_path, "slow_to_stop_cell")
    try:
        raised = tmp_path / "raised"
        deadline = time.time() + 60
        while not (raised.exists() and raised.read_text()):  # the process itself may take longer to exit
            assert time.time() < deadline, "the stopped run did not return"
            time.sleep(0.1)
        assert raised.read_text() == "2", "the run returned while its workers were still stopping"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def engine_cell(cell: Cell, work: Path) -> dict:
    """A real training run (two epochs, keeping the last epoch's weights too), as the studies' cells train."""
    from fixup.train import TrainConfig, fit

    fit(TrainConfig(depth=8, batch_size=256, epochs=2, keep_checkpoints=1), out_dir=work, progress=False)
    return {"files": sorted(p.name for p in work.iterdir())}


@pytest.mark.parametrize("keep", [False, True])
def test_a_finished_cells_checkpoints_are_deleted_unless_kept(tmp_path, keep):
    cell = Cell("s", "m", {"x": 1}, 0)
    run_tasks([Task(cell, engine_cell)], tmp_path, keep_checkpoints=keep)
    store = Store(tmp_path)
    written = json.loads((store.cell_dir(cell) / "cell_result.json").read_text())["result"]["files"]
    checkpoints = [f for f in written if f.startswith("checkpoint")]
    assert "checkpoint.pt" in checkpoints and any(f.startswith("checkpoint_step") for f in checkpoints)
    left = sorted(p.name for p in store.work_dir(cell).iterdir())
    assert left == written if keep else left == [f for f in written if f not in checkpoints]
    assert store.is_done(cell)


def test_checkpoints_of_an_unfinished_cell_are_never_dropped(tmp_path):
    cell = Cell("s", "m", {"x": 1}, 0)
    work = Store(tmp_path).start(cell)
    (work / "checkpoint.pt").write_bytes(b"state")
    with pytest.raises(ValueError, match="has not finished"):
        Store(tmp_path).drop_checkpoints(cell)
    assert (work / "checkpoint.pt").read_bytes() == b"state"


def stopping_cell(cell: Cell, work: Path) -> dict:
    """Stopped (SIGINT's exception) 0.3 s into its first run, interrupted by its engine 0.2 s into its second;
    finishes 0.1 s into its third, as a cell that resumes from its checkpoints does."""
    runs = work / "runs"
    n = int(runs.read_text()) if runs.exists() else 0
    runs.write_text(str(n + 1))
    time.sleep((0.3, 0.2, 0.1)[n])
    if n == 0:
        raise KeyboardInterrupt
    if n == 1:
        raise RuntimeError(f"cell {cell.key} was interrupted; rerun to resume it")
    return {"value": 1}


def test_a_resumed_cell_records_the_time_of_every_run(tmp_path):
    from fixup.studies.runner import _execute

    cell = Cell("s", "m", {"x": 1}, 0, config={})
    with pytest.raises(KeyboardInterrupt):
        _execute(stopping_cell, cell, str(tmp_path))
    _execute(stopping_cell, cell, str(tmp_path))  # recorded as a failure; the next run retries it
    _, seconds, error, _ = _execute(stopping_cell, cell, str(tmp_path))
    assert error is None
    record = Store(tmp_path).load(cell)
    assert record["seconds"] == seconds and 0.6 <= seconds < 3.0  # 0.3 + 0.2 + 0.1 s of sleeping, not 0.1
