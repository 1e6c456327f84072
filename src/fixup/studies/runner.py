"""Run a list of cells: skip the finished ones, run the rest in-process or in ``jobs`` worker processes.

The runner owns no training logic: each cell's function does the work (through the training
engine). The runner reports one overall progress (cells done, running, left, ETA) to a callback, so
that the command line can draw it; library code never prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .._io import full_disk_error
from .cells import Cell, CellFn, Task
from .store import Store

__all__ = ["Progress", "ProgressFn", "RunSummary", "format_seconds", "in_order", "longest_first", "run_tasks"]


def format_seconds(seconds: float | None) -> str:
    """``1h02m``, ``4m10s``, ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@dataclass
class Progress:
    """A snapshot of a run: every number counts cells."""

    total: int
    done: int = 0  # finished, including those found finished from an earlier run
    resumed: int = 0  # of ``done``: found finished from an earlier run, not redone
    failed: int = 0
    running: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    eta: float | None = None

    @property
    def left(self) -> int:
        return self.total - self.done - self.failed - len(self.running)

    def format(self) -> str:
        extra = f" ({self.resumed} from an earlier run)" if self.resumed else ""
        failed = f", {self.failed} failed" if self.failed else ""
        return (f"{self.done}/{self.total} cells done{extra}, {len(self.running)} running, {self.left} left"
                f"{failed}; elapsed {format_seconds(self.elapsed)}, ETA {format_seconds(self.eta)}")


ProgressFn = Callable[[Progress, str], None]


def longest_first(tasks: Sequence[Task]) -> list[Task]:
    """The order parallel workers take cells in: costliest first (plan order among equals), so that the
    last cells to start are short and no worker waits long on the last one."""
    return sorted(tasks, key=lambda t: -t.cell.cost)


def in_order(tasks: Sequence[Task], order: str = "longest") -> list[Task]:
    """The cells in the order a run takes them: ``"longest"`` first (:func:`longest_first`), or ``"cheapest"``
    first (plan order among equals), for a run that may stop long before its end (the deep tier)."""
    if order == "longest":
        return longest_first(tasks)
    if order == "cheapest":
        return sorted(tasks, key=lambda t: t.cell.cost)
    raise ValueError(f"order must be 'longest' or 'cheapest', got {order!r}")


@dataclass
class RunSummary:
    ran: list[str]  # keys of the cells run in this call
    resumed: list[str]  # keys of the cells already finished, not redone
    failed: dict[str, str]  # key -> error text
    seconds: float
    seconds_per_cost: float | None  # measured on the cells run here (None if none ran)
    problems: list[str] = field(default_factory=list)  # bad cell files found, moved aside and redone


def _execute(fn: CellFn, cell: Cell, root: str,
             keep_checkpoints: bool = False) -> tuple[str, float, str | None, list[str]]:
    """Run one cell and store its result (then delete its checkpoints, unless ``keep_checkpoints``); returns
    (key, seconds, error or None, problems). Runs in a worker."""
    store = Store(root)
    start = time.perf_counter()
    try:
        work = store.start(cell)
        earlier = store.spent(cell)  # runs that stopped before the cell finished (it resumes where they stopped)
        result = fn(cell, work)
    except BaseException as err:
        with contextlib.suppress(OSError):  # a full disk must not hide the error itself
            store.add_spent(cell, time.perf_counter() - start)
        if not isinstance(err, Exception):  # stopped (SIGINT/SIGTERM): the run resumes the cell later
            raise
        full = full_disk_error(err)
        if full is not None:  # not the cell's bug: every cell would meet it, so the run stops (and resumes later)
            raise full from (None if full is err else err)
        error = traceback.format_exc()  # a bug in a cell is recorded and the other cells go on
        store.fail(cell, error)
        return cell.key, time.perf_counter() - start, error, store.problems
    seconds = earlier + time.perf_counter() - start
    store.finish(cell, result, seconds)
    if not keep_checkpoints:
        store.drop_checkpoints(cell)
    return cell.key, seconds, None, store.problems


# A worker whose parent has died stops: at once on Linux (the kernel sends SIGTERM, which the engine turns
# into a checkpoint at the end of the current step), and within WATCH_SECONDS elsewhere; one that has not
# exited GRACE_SECONDS after its parent died exits there and then.
WATCH_SECONDS = 0.5
GRACE_SECONDS = 30.0
# A run that is stopped waits this long for its workers to finish their step and write their checkpoints (a
# 10,000-layer cell's step and checkpoint take tens of seconds on a loaded core), then kills them.
STOP_SECONDS = 180.0


def _die_with_parent(parent: int) -> None:
    """Make this process end when ``parent`` does, including when the parent is SIGKILLed."""
    import threading

    on_linux = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            on_linux = libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
        except (OSError, AttributeError):
            on_linux = False
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        if not on_linux:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="fixup-parent-watch", daemon=True).start()


def _init_worker(threads: int, parent: int) -> None:
    """Give each worker its share of the cores (torch reads OMP_NUM_THREADS when first imported), and make it
    end with its parent.

    Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent alone decides; it
    stops the workers with SIGTERM, on which the engine writes a checkpoint (fixup._signals).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


class _Clock:
    """Cost-weighted ETA: seconds per unit of cost, measured on the cells finished in this run."""

    def __init__(self, jobs: int, seconds_per_cost: float | None) -> None:
        self.jobs, self.prior = jobs, seconds_per_cost
        self.seconds = self.cost = 0.0

    def add(self, seconds: float, cost: float) -> None:
        self.seconds += seconds
        self.cost += cost

    def eta(self, remaining_cost: float) -> float | None:
        rate = self.seconds / self.cost if self.cost > 0 else self.prior
        return None if rate is None else rate * remaining_cost / self.jobs


def run_tasks(tasks: Sequence[Task], root: str | Path, *, jobs: int = 1, progress: ProgressFn | None = None,
              seconds_per_cost: float | None = None, order: str | None = None,
              keep_checkpoints: bool = False) -> RunSummary:
    """Run every unfinished task's cell, store results under ``root``, and return what happened.

    ``jobs`` > 1 runs cells in that many worker processes (spawned, each with
    ``cpu_count // jobs`` torch threads). A cell whose function raises is recorded as failed (its
    traceback in ``cell_error.json``) and retried by the next run; the other cells go on. A full disk
    (:func:`fixup._io.full_disk_error`) stops the run instead: its :class:`OSError` is raised here.
    ``seconds_per_cost`` is the ETA's prior until the first cell finishes. ``order`` (see :func:`in_order`):
    None runs one job in plan order and several longest first. A finished cell's checkpoints are deleted
    (:meth:`Store.drop_checkpoints`) unless ``keep_checkpoints``.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    keys = [t.cell.key for t in tasks]
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"a plan lists the same cell twice: {', '.join(dupes[:5])}")
    if order is not None:
        tasks = in_order(tasks, order)
    elif jobs > 1:
        tasks = longest_first(tasks)
    store = Store(root)
    with store.lock():
        return _run_locked(tasks, store, jobs, progress, seconds_per_cost, keep_checkpoints)


class _Run:
    """One locked run's bookkeeping: its progress and ETA, and which cells ran, failed or found problems."""

    def __init__(self, tasks: Sequence[Task], store: Store, jobs: int, progress: ProgressFn | None,
                 seconds_per_cost: float | None) -> None:
        self.start = time.perf_counter()
        self.todo = [t for t in tasks if not store.is_done(t.cell)]  # in the order they run
        self.resumed = [t.cell.key for t in tasks if t not in self.todo]
        self.state = Progress(total=len(tasks), done=len(self.resumed), resumed=len(self.resumed))
        self.clock = _Clock(min(jobs, max(1, len(self.todo))), seconds_per_cost)
        self.remaining = sum(t.cell.cost for t in self.todo)
        self.ran: list[str] = []
        self.failed: dict[str, str] = {}
        self.problems = list(store.problems)
        self.progress = progress

    def report(self, message: str) -> None:
        self.state.elapsed = time.perf_counter() - self.start
        self.state.eta = self.clock.eta(self.remaining) if self.todo else 0.0
        if self.progress is not None:
            self.progress(self.state, message)

    def announce_problems(self) -> None:
        """The store's problems, found when it was opened."""
        for problem in list(self.problems):
            if self.progress is not None:
                self.progress(self.state, f"PROBLEM {problem}")

    def started(self, task: Task) -> None:
        self.state.running.append(task.cell.key)
        self.report(f"running {task.cell.key}")

    def finished(self, task: Task, key: str, seconds: float, error: str | None, found: list[str]) -> None:
        """Record what :func:`_execute` returned for ``task``."""
        for problem in found:
            self.problems.append(problem)
            self.report(f"PROBLEM {problem}")
        self.state.running.remove(key)
        self.remaining -= task.cell.cost
        if error is None:
            self.state.done += 1
            self.ran.append(key)
            self.clock.add(seconds, task.cell.cost)
            self.report(f"finished {key} in {format_seconds(seconds)}")
        else:
            self.state.failed += 1
            self.failed[key] = error
            self.report(f"FAILED {key}: {error.strip().splitlines()[-1]}")

    def summary(self) -> RunSummary:
        rate = self.clock.seconds / self.clock.cost if self.clock.cost > 0 else None
        return RunSummary(ran=self.ran, resumed=self.resumed, failed=self.failed,
                          seconds=time.perf_counter() - self.start, seconds_per_cost=rate, problems=self.problems)


def _run_locked(tasks: Sequence[Task], store: Store, jobs: int, progress: ProgressFn | None,
                seconds_per_cost: float | None, keep_checkpoints: bool) -> RunSummary:
    run = _Run(tasks, store, jobs, progress, seconds_per_cost)
    run.announce_problems()
    run.report("start")
    root_s = str(store.root)
    if jobs == 1 or len(run.todo) <= 1:
        for task in run.todo:
            run.started(task)
            run.finished(task, *_execute(task.fn, task.cell, root_s, keep_checkpoints))
    else:
        _run_in_pool(run, jobs, root_s, keep_checkpoints)
    run.report("end")
    return run.summary()


def _run_in_pool(run: _Run, jobs: int, root_s: str, keep_checkpoints: bool) -> None:
    """Run ``run.todo`` in ``jobs`` spawned workers, at most ``jobs`` cells at a time, in order."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                             initializer=_init_worker, initargs=(threads, os.getpid())) as pool:
        queue = list(run.todo)
        pending: dict[Future[Any], Task] = {}
        try:
            while queue or pending:
                while queue and len(pending) < jobs:
                    task = queue.pop(0)
                    pending[pool.submit(_execute, task.fn, task.cell, root_s, keep_checkpoints)] = task
                    run.started(task)
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    run.finished(pending.pop(fut), *fut.result())
        except BaseException:  # Ctrl-C, SIGTERM (the CLI turns it into KeyboardInterrupt), a bug here
            _stop_workers(pool, pending)
            raise


def _stop_workers(pool: ProcessPoolExecutor, pending: dict[Future[Any], Task]) -> None:
    """Stop the running cells too: SIGTERM makes the engine checkpoint, so they resume next run. The store's lock is
    held until they have exited: a run started at once must not find a cell's worker still writing its checkpoint.
    """
    workers = list((pool._processes or {}).values())  # no public API lists the workers
    for proc in workers:
        proc.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    # A stopped cell writes its checkpoint and reports back (the engine's SIGTERM); its worker then
    # waits for work and would never exit by itself, so once every running cell has reported, the
    # workers are idle and are killed at once. A worker that died instead breaks the pool, and
    # which of the others are still writing is unknown: each gets until the deadline.
    wait(pending, timeout=STOP_SECONDS)
    idle = all(f.done() and (f.cancelled() or not isinstance(f.exception(), BrokenProcessPool))
               for f in pending)
    for proc in workers:
        if not idle:
            proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()  # idle, or past the deadline: its cell resumes from its last checkpoint
        proc.join()
    pool.shutdown(wait=False, cancel_futures=True)
