"""The scalars of a method over training: Fixup's multipliers and biases, SkipInit's and ReZero's gates.

Once per epoch (and once at initialisation, epoch 0) the engine records :func:`scalar_stats`: for each kind of
scalar and each stage, the count, mean, standard deviation, minimum, maximum and mean absolute value of the
values. The kinds are found by module type and by the blocks' own declarations, never by parameter name:

- ``scale``: Fixup's multipliers (:class:`fixup.nn.Scale`, rule 3; start at 1);
- ``bias``: Fixup's scalar biases (:class:`fixup.nn.Bias`) other than the stream biases (start at 0);
- ``stream_bias``: the bias that ends each branch and shifts the residual stream (``Branch.stream_bias``);
- ``gate``: SkipInit's and ReZero's branch gates (:class:`fixup.nn.Gate`; start at 0).

A stage is a block's parent module (``layer2.3`` -> ``layer2``, as :func:`fixup.train.collapse.stage_of`);
scalars outside every declared branch (the stem's and the classifier's biases) are the stage ``trunk``, and
each kind also has the stage ``all`` over the whole model. Reading the values needs no forward pass.

:func:`read_scalars` reads the records back from a run folder (``scalars.jsonl``) or from a ``result.json``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..branch import find_branches
from ..nn import Bias, Gate, Scale
from .collapse import stage_of

__all__ = ["ALL", "KINDS", "STATS", "TRUNK", "read_scalars", "scalar_stats"]

KINDS = ("scale", "bias", "stream_bias", "gate")
STATS = ("count", "mean", "std", "min", "max", "mean_abs")
ALL, TRUNK = "all", "trunk"  # the stage of a kind over the whole model; of scalars outside every branch


def _kind(module: nn.Module, stream: set[int]) -> str | None:
    if isinstance(module, Gate):
        return "gate"
    if isinstance(module, Scale):
        return "scale"
    if isinstance(module, Bias):
        return "stream_bias" if id(module) in stream else "bias"
    return None


def _stats(values: Tensor) -> dict[str, float | int]:
    """The statistics of a 1-d float64 tensor (std over the values themselves: no Bessel correction)."""
    return {"count": values.numel(), "mean": float(values.mean()), "std": float(values.std(correction=0)),
            "min": float(values.min()), "max": float(values.max()), "mean_abs": float(values.abs().mean())}


@torch.no_grad()
def scalar_stats(model: nn.Module) -> list[dict[str, Any]]:
    """Per kind (:data:`KINDS`) and stage, the distribution of ``model``'s scalars, one dict each.

    Each dict holds ``kind``, ``stage`` and :data:`STATS` (computed in float64); a kind's stages come in module
    order, then ``trunk``, then ``all``. Kinds the model lacks are left out (a BatchNorm network gives ``[]``).
    """
    stage: dict[int, str] = {}
    stream: set[int] = set()
    for block, branch in find_branches(model):
        where = stage_of(block)
        for module in (*branch.all_biases, *([branch.scale] if branch.scale is not None else [])):
            stage.setdefault(id(module), where)
        if branch.stream_bias is not None:
            stream.add(id(branch.stream_bias))
    values: dict[str, dict[str, list[Tensor]]] = defaultdict(lambda: defaultdict(list))
    seen: set[int] = set()
    for module in model.modules():
        kind = _kind(module, stream)
        if kind is None or id(module) in seen:
            continue
        seen.add(id(module))
        flat = [p.detach().reshape(-1).double().cpu() for p in module.parameters(recurse=False)]
        if flat:
            values[kind][stage.get(id(module), TRUNK)].extend(flat)
    records = []
    for kind in KINDS:
        if kind not in values:
            continue
        stages = sorted(values[kind], key=lambda s: s == TRUNK)  # module order, the trunk last (a stable sort)
        for where in stages:
            records.append({"kind": kind, "stage": where, **_stats(torch.cat(values[kind][where]))})
        records.append({"kind": kind, "stage": ALL, **_stats(torch.cat([v for s in stages for v in values[kind][s]]))})
    return records


def read_scalars(path: str | Path) -> list[dict[str, Any]]:
    """The per-epoch scalar records of a run: ``[{"epoch": 0, "step": 0, "scalars": [...]}, ...]``.

    ``path`` is a run folder (its ``scalars.jsonl``, else its ``result.json``), a study cell's folder (its
    ``work/scalars.jsonl``), a ``scalars.jsonl``, or a JSON file holding them under ``"scalars"`` (``result.json``,
    or the ``--json`` output of ``fixup lab scalars``).
    """
    path = Path(path)
    if path.is_dir():
        found = [p for p in (path / "scalars.jsonl", path / "result.json", path / "work" / "scalars.jsonl")
                 if p.is_file()]
        if not found:
            raise FileNotFoundError(f"{path} holds neither scalars.jsonl nor result.json; give the run folder of "
                                    "`fixup train --out-dir` (or a study cell's work/ folder)")
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give a run folder, its scalars.jsonl or a result.json")
    text = path.read_text()
    try:
        if path.suffix == ".jsonl":
            epochs = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            epochs = data.get("scalars") if isinstance(data, dict) else None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); give a run's scalars.jsonl or result.json") from err
    if not isinstance(epochs, list) or not all(isinstance(e, dict) and isinstance(e.get("scalars"), list)
                                               for e in epochs):
        raise ValueError(f"{path} holds no per-epoch scalar records (a list under 'scalars'); runs record them "
                         "since the engine's scalars.jsonl: train again, or give that run's folder")
    return epochs
