"""The output folder of a study run: one folder per cell, holding its config and, once finished, its result.

Layout::

    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_config.json   written when the cell starts
    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_result.json   written atomically when it finishes
    OUT/cells/<study>/<method>/<setting>/seed<N>/cell_error.json    a cell that raised (retried next run)
    OUT/cells/<study>/<method>/<setting>/seed<N>/work/              the run's own logs and checkpoints (the
                                                                    checkpoints are deleted when the cell
                                                                    finishes, unless the run keeps them)

A cell is finished exactly when ``cell_result.json`` exists: it is written to a temporary file and
renamed, so a process killed mid-write never leaves a half result that looks finished. A restarted
study skips finished cells; an unfinished cell starts again (and the engine resumes it from its
checkpoint in ``work/`` when it has one).

Every file the store reads is validated: a truncated or malformed ``cell_result.json`` (``{}``, ``[]``,
a half-written file) or ``cell_config.json`` is moved aside as ``<name>.bad-<time>``, named in
:attr:`Store.problems`, and its cell counts as unfinished, so the next run redoes it. A run holds the
folder's lock (:meth:`Store.lock`) so that two runs never work on the same cells.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._io import write_json
from .cells import Cell

__all__ = ["BadCellFile", "ConfigMismatchError", "Store", "StoreLockedError"]

LOCK = ".lock"

RESULT, CONFIG, ERROR, WORK = "cell_result.json", "cell_config.json", "cell_error.json", "work"
SPENT = "seconds_spent.json"  # in work/: the time of the runs that stopped before the cell finished


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class ConfigMismatchError(ValueError):
    """A finished cell exists in the output folder with a different config."""


class StoreLockedError(RuntimeError):
    """Another run holds the study folder."""


class BadCellFile(ValueError):
    """A cell file that is not what the store wrote."""


_IDENTITY = {"study": str, "method": str, "setting": dict, "seed": int}


def _check_record(data: Any, path: Path, kind: str) -> dict[str, Any]:
    """``data`` read from a cell file, checked to have the shape the store writes (raises BadCellFile)."""
    if not isinstance(data, dict):
        raise BadCellFile(f"expected a JSON object, found {type(data).__name__}")
    needed = {**_IDENTITY, "config": dict, **({"result": dict} if kind == RESULT else {})}
    for key, typ in needed.items():
        if key not in data:
            raise BadCellFile(f"no {key!r} field")
        if not isinstance(data[key], typ) or (typ is int and isinstance(data[key], bool)):
            raise BadCellFile(f"field {key!r} is a {type(data[key]).__name__}, not a {typ.__name__}")
    return data


# Folders locked by this process (a run that holds the lock may call code that takes it again).
_HELD: dict[Path, tuple[Any, int]] = {}


class Store:
    """Cells' configs and results under one output folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.problems: list[str] = []  # bad files found, moved aside and redone (the CLI prints them)

    # -- reading, validated ------------------------------------------------------------------------
    def _read(self, path: Path, kind: str) -> dict[str, Any] | None:
        """The checked content of a cell file; ``None`` if it is absent or bad (a bad one is moved aside)."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return _check_record(json.loads(text), path, kind)
        except (ValueError, BadCellFile) as err:  # json.JSONDecodeError is a ValueError
            self._set_aside(path, str(err))
            return None

    def _set_aside(self, path: Path, why: str) -> None:
        aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            path.replace(aside)
        self.problems.append(f"{path}: unreadable ({why}); moved aside to {aside.name}, the cell will be redone")

    # -- the lock ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, command: str = "") -> Iterator[None]:
        """Hold the folder for this run; raise :class:`StoreLockedError` naming the holder if another has it.

        An advisory ``flock`` on ``OUT/.lock`` (released by the kernel when the holder dies, even by SIGKILL);
        the file says who holds it. Re-entrant within one process.
        """
        import fcntl

        key = self.root.resolve()
        if key in _HELD:
            fh, depth = _HELD[key]
            _HELD[key] = (fh, depth + 1)
            try:
                yield
            finally:
                _HELD[key] = (fh, _HELD[key][1] - 1)
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fh = open(self.root / LOCK, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StoreLockedError(f"{self.root} is in use by {holder}; wait for that run to finish (or stop it), "
                                   "or give another --out folder") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}, running `{command or ' '.join(sys.argv)}` since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        _HELD[key] = (fh, 1)
        try:
            yield
        finally:
            if _HELD[key][1] <= 1:
                del _HELD[key]
                fh.seek(0)
                fh.truncate()
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()
            else:
                _HELD[key] = (fh, _HELD[key][1] - 1)

    # -- cells ---------------------------------------------------------------------------------------
    def cell_dir(self, cell: Cell) -> Path:
        return self.root / cell.relpath()

    def work_dir(self, cell: Cell) -> Path:
        return self.cell_dir(cell) / WORK

    def is_done(self, cell: Cell) -> bool:
        """True when the cell has a valid result made with the same config; raises if its config differs.

        A bad result file is moved aside (see :attr:`problems`) and the cell counts as not done.
        """
        record = self._read(self.cell_dir(cell) / RESULT, RESULT)
        if record is None:
            return False
        self._check_config(cell, record["config"])
        return True

    def _check_config(self, cell: Cell, saved: dict[str, Any] | None = None) -> None:
        if saved is None:
            data = self._read(self.cell_dir(cell) / CONFIG, CONFIG)
            if data is None:
                return
            saved = data["config"]
        if _canonical(saved) != _canonical(dict(cell.config)):
            diff = sorted(k for k in set(saved) | set(cell.config) if saved.get(k) != cell.config.get(k))
            raise ConfigMismatchError(
                f"cell {cell.key} in {self.root} was run with a different config (differs in: "
                f"{', '.join(diff)}); use another --out folder, or delete {self.cell_dir(cell)} to redo it")

    def start(self, cell: Cell) -> Path:
        """Record that the cell is starting (its identity and config); return its work folder."""
        folder = self.cell_dir(cell)
        self._check_config(cell)  # a corrupt config file is moved aside here and rewritten below
        write_json(folder / CONFIG, {**cell.identity(), "config": dict(cell.config)})
        (folder / ERROR).unlink(missing_ok=True)
        work = folder / WORK
        work.mkdir(parents=True, exist_ok=True)
        return work

    def finish(self, cell: Cell, result: dict[str, Any], seconds: float | None) -> dict[str, Any]:
        """Write the cell's result atomically; from then on the cell counts as done. ``seconds`` is the
        workers' wall time for the cell (every run of it: :meth:`spent` holds the earlier ones'), None where it
        is unknown (a record rebuilt from a summary)."""
        record = {**cell.identity(), "config": dict(cell.config), "seconds": seconds, "result": result}
        write_json(self.cell_dir(cell) / RESULT, record)
        return record

    def drop_checkpoints(self, cell: Cell) -> int:
        """Delete a finished cell's checkpoints (``work/checkpoint*.pt*``): a finished cell is never resumed, and a
        10,000-layer cell's two checkpoints take 2.6 GB. Its logs and ``result.json`` stay. Returns the bytes freed."""
        if not (self.cell_dir(cell) / RESULT).is_file():
            raise ValueError(f"cell {cell.key} has not finished: its checkpoints are what it resumes from")
        freed = 0
        for path in (self.cell_dir(cell) / WORK).glob("checkpoint*.pt*"):
            with contextlib.suppress(FileNotFoundError):
                freed += path.stat().st_size
                path.unlink()
        return freed

    def spent(self, cell: Cell) -> float:
        """Seconds earlier runs spent on this unfinished cell before they stopped (0 if none, or unreadable)."""
        try:
            return float(json.loads((self.work_dir(cell) / SPENT).read_text())["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0

    def add_spent(self, cell: Cell, seconds: float) -> None:
        """Count ``seconds`` of a run that stopped before the cell finished, for the cell's recorded time."""
        write_json(self.work_dir(cell) / SPENT, {"seconds": self.spent(cell) + seconds})

    def fail(self, cell: Cell, error: str) -> None:
        """Record an error (a bug, not a divergence); the cell stays unfinished and is retried next time."""
        write_json(self.cell_dir(cell) / ERROR, {**cell.identity(), "error": error})

    def load(self, cell: Cell) -> dict[str, Any] | None:
        return self._read(self.cell_dir(cell) / RESULT, RESULT)

    def records(self, study: str | None = None) -> list[dict[str, Any]]:
        """Every valid finished cell's record (of one study, or all), in a stable order; bad ones are set aside."""
        base = self.root / "cells"
        pattern = f"{study or '*'}/*/*/seed*/{RESULT}"  # never the engine's own files under work/
        found = (self._read(p, RESULT) for p in sorted(base.glob(pattern)))
        return [r for r in found if r is not None]
