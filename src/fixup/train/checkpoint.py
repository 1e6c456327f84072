"""Checkpoints that resume bit-exactly, are written atomically, carry a digest and are read safely.

A checkpoint holds the model, optimiser, scheduler and gradient-scaler states, every random number
generator state (torch CPU and CUDA, numpy, Python), the config, the position (epoch, batch within
the epoch, optimiser step), the partial epoch's running sums and the history so far.

- **Atomic.** It is written to a temporary file beside the target, flushed and renamed over it
  (:func:`fixup._io.atomic_write`), so a crash mid-write never leaves a half-written checkpoint.
- **Safe to read.** It is loaded with ``torch.load(weights_only=True)``: plain tensors and
  containers only, no pickled code.
- **Verified.** It carries the SHA-256 digest of its contents (every tensor's dtype, shape and
  bytes, every plain value), checked on load: a single flipped bit is an error, not a silently
  different run.
- **The last good one is kept.** The run's checkpoint replaces ``checkpoint.pt`` only after the
  previous one was renamed to ``checkpoint.prev.pt``; :func:`resume_state` falls back to it when the
  newest is damaged, and moves the damaged file aside (``checkpoint.pt.bad``).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write
from .config import RESUMABLE_CHANGES, TrainConfig, flatten
from .recipe import apply_recipe

__all__ = ["FORMAT", "CheckpointError", "CheckpointWarning", "check_compatible", "get_rng_state", "load_checkpoint",
           "previous_path", "read_state", "resume_state", "save_checkpoint", "set_rng_state", "state_digest"]

FORMAT = "fixup-train-checkpoint/2"  # /2 added the digest; /1 checkpoints (no digest) still load
_OLD_FORMATS = ("fixup-train-checkpoint/1",)
DIGEST = "sha256"  # the key holding the hex digest of everything else in the checkpoint


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to the run that wants to resume from it."""


class CheckpointWarning(UserWarning):
    """A damaged newest checkpoint was set aside and the run resumed from the previous good one."""


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


def _feed(h: Any, obj: Any) -> None:
    """Add ``obj`` to the hash ``h`` in a canonical form: type tags, lengths, dtypes, shapes and raw bytes."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)};".encode())
        for key, value in obj.items():
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for value in obj:
            _feed(h, value)
    else:  # None, bool, int, float, str, bytes: repr is exact (floats round-trip)
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def state_digest(state: Mapping[str, Any]) -> str:
    """The SHA-256 hex digest of ``state`` without its own digest entry."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != DIGEST})
    return h.hexdigest()


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint before ``path`` is kept: ``checkpoint.pt`` -> ``checkpoint.prev.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_checkpoint(path: str | Path, state: dict[str, Any], *, keep_previous: bool = False) -> None:
    """Write ``state`` with its format tag and digest to ``path`` atomically (temporary file, flush, rename).

    With ``keep_previous`` the checkpoint being replaced is kept as :func:`previous_path`.
    """
    path = Path(path)
    full = {"format": FORMAT, **state}
    full[DIGEST] = state_digest(full)
    with atomic_write(path, "wb", previous=previous_path(path) if keep_previous else None) as fh:
        torch.save(full, fh)


def read_state(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A dict saved with ``torch.save``, read with ``weights_only=True`` and checked against its digest if it has one.

    Any file that cannot be read this way (damaged, foreign, carrying pickled code) or whose digest
    does not match is a :class:`CheckpointError` naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated files, foreign pickles, unsafe objects
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointError(f"cannot read checkpoint {path} ({type(err).__name__}: {first[:200]}); it is damaged or "
                              "was not written by fixup. Move it away to start afresh, or point --out-dir "
                              "elsewhere") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint (a dict of states)")
    if DIGEST in state and state[DIGEST] != state_digest(state):
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match their SHA-256 digest "
                              "(a changed bit on disk, or an edited file)")
    return state


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and verify a checkpoint written by :func:`save_checkpoint`; anything else is a :class:`CheckpointError`."""
    path = Path(path)
    state = read_state(path, map_location)
    found = state.get("format")
    if found != FORMAT and found not in _OLD_FORMATS:
        raise CheckpointError(f"{path} is not a fixup train checkpoint (format {found!r}, expected {FORMAT!r})")
    if found == FORMAT and DIGEST not in state:
        raise CheckpointError(f"checkpoint {path} has no {DIGEST} digest, which format {FORMAT} requires; it was "
                              "edited or damaged")
    missing = [k for k in ("model", "optimizer", "scheduler", "rng", "config", "position") if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; it is incomplete")
    return state


def resume_state(path: str | Path) -> tuple[dict[str, Any], Path, str] | None:
    """The newest good checkpoint among ``path`` and :func:`previous_path`: ``(state, file, note)``, or None.

    ``None`` when neither file exists. When ``path`` is damaged and the previous one is good, the
    damaged file is renamed to ``<path>.bad`` (so that the next save cannot rotate it over the good
    one) and ``note`` says so in one line; otherwise ``note`` is empty. When no file is good, the
    newest one's :class:`CheckpointError` is raised and every file is left as it was.
    """
    path = Path(path)
    prev = previous_path(path)
    if not path.exists():
        return None if not prev.exists() else (load_checkpoint(prev), prev, "")
    try:
        return load_checkpoint(path), path, ""
    except CheckpointError as newest:
        if not prev.exists():
            raise
        try:
            state = load_checkpoint(prev)
        except CheckpointError:
            raise newest from None
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        reason = str(newest).split(";")[0]
        return state, prev, (f"{reason}; moved it to {bad.name} and resumed from the previous good checkpoint "
                             f"{prev.name}")


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str | Path) -> None:
    """Refuse to resume when the saved config differs from the current one in anything that matters.

    Either config may be by section or flat (checkpoints written before the sections). An option the
    saved config lacks (added since) counts as its default, which keeps the behaviour it was added to.
    """
    try:
        saved, current = flatten(saved), flatten(current)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} holds a config this version cannot read ({err}); use another "
                              "--out-dir or --no-resume") from err
    # the defaults as the engine runs them (clip="auto" -> norm: what a run did before the option existed)
    defaults = flatten(apply_recipe(TrainConfig().validate())[0].to_dict())
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    diff = sorted(k for k in keys if saved.get(k) != current.get(k))
    if diff:
        shown = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in diff)
        raise CheckpointError(f"checkpoint {path} belongs to a different run ({shown}). Use the same options to "
                              "resume, another --out-dir for a new run, or --no-resume to start afresh there")
