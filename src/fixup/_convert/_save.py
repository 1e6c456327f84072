"""Saving a converted model, and loading it with ``torch.load(weights_only=True)``: no code is ever unpickled.

A converted model is its original class with some modules swapped (norms for identities, affines or Dynamic Tanh)
and Fixup's scalars attached by forward hooks, so its pickle would hold code. The file holds data only: the
conversion's *spec* (method, per-example option, the example input's shapes and dtypes), its report (JSON) and the
``state_dict``. :func:`load_converted` builds a fresh model of the original architecture, replays the conversion
on it (the structure depends on the architecture alone, not on the weights), and loads the state_dict strictly:
a key that does not match means another architecture, and is an error that says so.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import atomic_write
from ..report import FixupWarning
from ._pipeline import convert
from ._report import ConvertReport

__all__ = ["FORMAT", "load_converted", "save_converted"]

FORMAT = "fixup-converted/1"


def save_converted(path: str | Path, model: nn.Module, report: ConvertReport) -> None:
    """Write ``model`` (as :func:`fixup.convert` returned it, fine-tuned or not) and its ``report`` to ``path``,
    atomically, as data that ``torch.load(path, weights_only=True)`` reads."""
    if not isinstance(report, ConvertReport) or not report.spec:
        raise TypeError(f"report must be the ConvertReport fixup.convert returned with the model, got "
                        f"{type(report).__name__}")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {"format": FORMAT, "spec": report.spec, "report": report.to_json(), "state_dict": state}
    with atomic_write(path, "wb") as fh:
        torch.save(payload, fh)


def load_converted(path: str | Path, build: Callable[[], nn.Module] | nn.Module, *,
                   leaf_modules: tuple[type[nn.Module], ...] = (),
                   map_location: str | torch.device = "cpu") -> tuple[nn.Module, ConvertReport]:
    """The converted model saved at ``path`` and its report.

    Args:
        build: the original, unconverted architecture: a model, or a callable returning one (e.g.
            ``lambda: timm.create_model("resnet18", num_classes=10)``); its weights do not matter.
        leaf_modules: as passed to :func:`fixup.convert` (the file names them; their types are not unpickled).
        map_location: where the weights go.
    """
    data: Any = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} is not a converted model saved by fixup.save_converted (format {found!r}, "
                         f"expected {FORMAT!r})")
    spec = data["spec"]
    names = [t.__qualname__ for t in leaf_modules]
    if names != spec.get("leaf_modules", []):
        raise ValueError(f"{path} was converted with leaf_modules {spec.get('leaf_modules')}, got {names}: pass the "
                         "same module types")
    model = build if isinstance(build, nn.Module) else build()
    if not isinstance(model, nn.Module):
        raise TypeError(f"build must be a model or return one, got {type(model).__name__}")
    inputs = tuple(torch.zeros(i["shape"], dtype=getattr(torch, i["dtype"])) for i in spec["inputs"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        converted, _ = convert(model, inputs, method=spec["method"], per_example_norms=spec["per_example_norms"],
                               leaf_modules=leaf_modules, _replay=True)
    try:
        converted.load_state_dict(data["state_dict"], strict=True)
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit the model build returned ({type(model).__name__}): {err}. Build the "
                         "same architecture and configuration that was converted") from err
    return converted, ConvertReport.from_dict(json.loads(data["report"]))
