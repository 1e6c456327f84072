"""``fixup inspect --adapt module:factory``: adapt a user's model from the command line and print the report."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._io import json_object
from ..method import ADAPT_METHODS, METHODS
from ._options import check_options
from ._trunk import TRUNK_RULES

__all__ = ["add_arguments", "check_arguments", "example_inputs", "load_factory", "run"]


def load_factory(spec: str) -> Any:
    """The callable named by ``module:factory`` (a dotted module importable from the current directory)
    or ``path/to/file.py:factory``."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--adapt expects module:factory (e.g. mymodels:resnet50 or models.py:build), got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"--adapt {spec}: no file {path}")
        module = _exec_file(path)
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ValueError(f"--adapt {spec}: cannot import {module_name!r} ({err}); run from the directory "
                             "that holds it or give a file path, path/to/file.py:factory") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--adapt {spec}: {module_name} has no callable {attr!r}")
    return factory


def _exec_file(path: Path) -> Any:
    """The module in the file at ``path``, run as an import would run it: registered in ``sys.modules`` (which
    ``dataclasses`` and pickling look a class's module up in) and with its folder on ``sys.path`` (so that it
    imports the files beside it)."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.stem not in sys.modules else f"{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return module


def example_inputs(shapes: list[str], tokens: int) -> tuple[Tensor, ...]:
    """Random inputs of the given comma-separated shapes: normal floats, or token ids in [1, tokens)."""
    inputs = []
    for text in shapes:
        try:
            shape = [int(s) for s in text.split(",")]
        except ValueError as err:
            raise ValueError(f"--input-shape expects comma-separated sizes such as 2,3,32,32, got {text!r}") from err
        inputs.append(torch.randint(1, tokens, shape) if tokens else torch.randn(shape))
    return tuple(inputs)


def run(args: argparse.Namespace) -> int:
    """Build the model the factory returns, adapt it and print (and optionally save) the report.

    The factory returns a model, or ``(model, example_input)``; without an example input from the
    factory, ``--input-shape`` gives one.
    """
    from .._io import write_json
    from . import adapt

    method, trunk = args.method or "fixup", args.trunk or "lsuv"
    made = load_factory(args.adapt)()
    model, example = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ValueError(f"--adapt {args.adapt}: the factory returned {type(model).__name__}, not an nn.Module "
                         "(or a (model, example_input) pair)")
    if args.input_shape:
        example = example_inputs(args.input_shape, args.token_inputs)
    if example is None:
        raise ValueError(f"--adapt {args.adapt}: give the example input's shape with --input-shape (e.g. "
                         "--input-shape 2,3,224,224), or let the factory return (model, example_input)")
    adapted, report = adapt(model, example, strict=not args.lenient, method=method, trunk=trunk,
                            **(args.adapt_options or {}))
    params = sum(p.numel() for p in adapted.parameters())
    how = "" if METHODS[method].adapt in ("dyt", "nf", "t_fixup") else f" (trunk {trunk})"  # these set no trunk
    print(f"{args.adapt} adapted to {'Fixup' if method == 'fixup' else method}{how}: {params:,} parameters")
    branches = getattr(report, "branches", None)  # a DyT report has none: every LayerNorm replaced, listed whole
    print(str(report) if branches is None else report.format(max_branches=len(branches) if args.verbose else 12))
    if args.json:
        write_json(args.json, {"adapt": args.adapt, "method": method, "trunk": trunk, "parameters": params,
                               "report": report.to_dict()})
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """The options of this mode, before any model is built: ``--method`` and ``--trunk`` must name what adapt
    applies, and need ``--adapt`` (a ValueError, not an option ignored)."""
    given = {f"--{name.replace('_', '-')}": value for name in ("method", "trunk", "adapt_options")
             if (value := getattr(args, name, None)) is not None}
    if given and not args.adapt:
        raise ValueError(f"{' and '.join(f'{k} {v!r}' for k, v in given.items())} "
                         f"{'applies' if len(given) == 1 else 'apply'} only to a model adapted with --adapt "
                         "module:factory; a registered model takes its method from --norm/--init (e.g. fixup inspect "
                         "resnet_cifar --init rezero)")
    options = dict(args.adapt_options or {})
    named = sorted(set(options) & {"method", "trunk", "strict"})
    if named:
        raise ValueError(f"--adapt-options {', '.join(named)}: give --method, --trunk or --lenient instead")
    try:
        check_options(args.method or "fixup", args.trunk or "lsuv", options.pop("gate_biases", False),
                      options.pop("mode", None), options)
    except ValueError as err:
        flag = "--trunk" if str(err).startswith("trunk") else "--adapt-options" if options else "--method"
        raise ValueError(f"{flag}: {err}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``inspect`` options of this mode."""
    p.add_argument("--adapt", metavar="MODULE:FACTORY", default=None,
                   help="adapt a model written elsewhere: the factory returns a model (or model, example input)")
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="with --adapt: the example input's shape, e.g. 2,3,32,32 (repeat for several inputs)")
    p.add_argument("--token-inputs", type=int, default=0, metavar="VOCAB",
                   help="with --adapt: example inputs are token ids below VOCAB instead of normal floats")
    p.add_argument("--method", default=None, metavar="METHOD",
                   help="with --adapt: the method adapt applies, one of fixup.ADAPT_METHODS "
                        f"({', '.join(ADAPT_METHODS)}; default None: fixup)")
    p.add_argument("--trunk", default=None, metavar="RULE",
                   help="with --adapt: the rule for the weight layers outside the branches, one of "
                        f"{', '.join(TRUNK_RULES)} (default None: lsuv; docs/adapt.md, The trunk)")
    p.add_argument("--adapt-options", type=json_object, default=None, metavar="JSON",
                   help="with --adapt: more options of fixup.adapt as a JSON object, e.g. '{\"rescale\": 2}' "
                        "(docs/adapt.md)")
    p.add_argument("--lenient", action="store_true",
                   help="with --adapt: leave out residual sums it cannot attribute (warnings) instead of failing")
