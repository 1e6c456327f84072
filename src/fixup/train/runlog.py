"""The run folder: config, parameter groups, per-epoch metrics (JSON Lines and CSV), TensorBoard, result.

Only the main process writes. Files in ``out_dir``:

- ``config.json``: the :class:`~fixup.train.TrainConfig` (``TrainConfig.from_dict`` reads it back);
- ``run.json``: the task's description and the optimiser's parameter groups (which parameters, with
  which learning rate and weight decay);
- ``metrics.jsonl`` / ``metrics.csv``: one record per epoch (train/test loss and accuracy, learning
  rate, optimiser steps, seconds), rewritten from the history so a resumed run never repeats a line;
- ``scalars.jsonl``: per epoch, and at initialisation (epoch 0), the distribution of the method's scalars per kind
  and stage (:mod:`fixup.train.scalars`), rewritten like the metrics;
- ``result.json``: the outcome, the history and the scalars when the run ends; ``checkpoint.pt``: see checkpoint.py;
- ``tensorboard/``: event files when ``tensorboard=True``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .._io import write_text

__all__ = ["RunLog"]


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str, allow_nan=True)


class RunLog:
    """Writes the run folder (a no-op without ``out_dir`` or on processes other than the main one)."""

    def __init__(self, out_dir: str | Path | None, *, enabled: bool = True, tensorboard: bool = False) -> None:
        self.dir = Path(out_dir) if out_dir is not None and enabled else None
        self.tb = None
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("tensorboard=True needs the tensorboard package (pip install tensorboard); "
                                 "or leave --tensorboard off") from err
            self.tb = SummaryWriter(str(self.dir / "tensorboard"))

    def write_setup(self, config: dict[str, Any], run: dict[str, Any]) -> None:
        if self.dir is None:
            return
        write_text(self.dir / "config.json", _json(config) + "\n")
        write_text(self.dir / "run.json", _json(run) + "\n")

    def write_history(self, history: list[dict[str, Any]]) -> None:
        """Rewrite metrics.jsonl and metrics.csv from the whole history; log the newest epoch to TensorBoard."""
        if self.dir is None:
            return
        write_text(self.dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in history))
        columns: list[str] = []
        for record in history:
            columns += [k for k in record if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(history)
        write_text(self.dir / "metrics.csv", buf.getvalue())
        if self.tb is not None and history:
            last = history[-1]
            for key, value in last.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.tb.add_scalar(key, value, last["epoch"])
            self.tb.flush()

    def write_scalars(self, epochs: list[dict[str, Any]]) -> None:
        """Rewrite scalars.jsonl (one line per epoch); log the newest epoch's means per kind to TensorBoard."""
        if self.dir is None:
            return
        write_text(self.dir / "scalars.jsonl", "".join(json.dumps(e) + "\n" for e in epochs))
        if self.tb is not None and epochs:
            last = epochs[-1]
            for rec in last["scalars"]:
                self.tb.add_scalar(f"scalars/{rec['kind']}/{rec['stage']}/mean", rec["mean"], last["epoch"])
            self.tb.flush()

    def write_result(self, result: dict[str, Any]) -> None:
        if self.dir is None:
            return
        write_text(self.dir / "result.json", _json(result) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
