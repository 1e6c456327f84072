"""Checkpoints that resume bit-exactly, are written atomically and are read safely.

A checkpoint holds the model, optimiser, scheduler and gradient-scaler states, every random number
generator state (torch CPU and CUDA, numpy, Python), the config, the position (epoch, batch within
the epoch, optimiser step), the partial epoch's running sums and the history so far. It is written
to a temporary file beside the target and renamed over it, so a crash mid-write never leaves a
half-written checkpoint, and it is loaded with ``torch.load(weights_only=True)``: plain tensors and
containers only, no pickled code.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import RESUMABLE_CHANGES

__all__ = ["FORMAT", "CheckpointError", "check_compatible", "get_rng_state", "load_checkpoint", "save_checkpoint",
           "set_rng_state"]

FORMAT = "fixup-train-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to the run that wants to resume from it."""


def get_rng_state() -> dict[str, Any]:
    """Every global generator's state, as tensors and plain values (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "state": list(py_state), "gauss": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` captured."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, flush to disk, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; anything else is a :class:`CheckpointError`."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # truncated files, foreign pickles, unsafe objects
        raise CheckpointError(f"cannot read checkpoint {path} ({type(err).__name__}: {err}); it is damaged or was "
                              "not written by fixup train. Move it away to start afresh, or point --out-dir "
                              "elsewhere") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path} is not a fixup train checkpoint (format {found!r}, expected {FORMAT!r})")
    missing = [k for k in ("model", "optimizer", "scheduler", "rng", "config", "position") if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; it is incomplete")
    return state


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str | Path) -> None:
    """Refuse to resume when the saved config differs from the current one in anything that matters."""
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    diff = sorted(k for k in keys if saved.get(k) != current.get(k))
    if diff:
        shown = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in diff)
        raise CheckpointError(f"checkpoint {path} belongs to a different run ({shown}). Use the same options to "
                              "resume, another --out-dir for a new run, or --no-resume to start afresh there")
