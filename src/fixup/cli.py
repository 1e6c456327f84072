"""The ``fixup`` command line: argument parsing only; every command calls an importable function.

Each subcommand lives beside the code it runs, in a module with ``register(subparsers)`` that adds
its parser and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._adapt._cli import add_arguments as adapt_arguments

__all__ = ["main", "write_json"]

# Subcommand modules, in the order `fixup --help` lists them.
_COMMANDS: tuple[str, ...] = ("fixup.cli", "fixup.train.cli", "fixup.translation.cli", "fixup.studies.cli",
                              "fixup.bench", "fixup.lab.cli", "fixup.bench_deep")


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (atomically: a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def _model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"norm": args.norm}
    if args.init is not None:
        kwargs["init"] = args.init
    if args.depth is not None:
        kwargs["depth"] = args.depth
    if args.width is not None:
        kwargs["width"] = args.width
    if args.num_classes is not None:
        kwargs["num_classes"] = args.num_classes
    return kwargs


def _inspect(args: argparse.Namespace) -> int:
    from .models import create_model

    if args.adapt:
        from ._adapt._cli import run

        return run(args)
    if args.model is None:
        raise ValueError("give a registered model name (see `fixup list`) or --adapt module:factory")

    model = create_model(args.model, **_model_kwargs(args))
    report = model.init_report
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.model} (norm={args.norm}, init={args.init or 'default'}): {params:,} parameters")
    if report is None:
        print("no initialisation accounting is available for this method")
    else:
        print(report.format(max_branches=len(report.branches) if args.verbose else 12))
    if args.json:
        write_json(args.json, {"model": args.model, "options": _model_kwargs(args), "parameters": params,
                               "report": None if report is None else report.to_dict()})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="build a model and print its initialisation accounting report")
    p.add_argument("model", nargs="?", help="a registered model name (see `fixup list`)")
    p.add_argument("--norm", default="fixup", help="fixup (default), batchnorm, groupnorm, layernorm or none")
    p.add_argument("--init", default=None, help="initialisation or ablation (depends on --norm)")
    p.add_argument("--depth", type=int, default=None, help="depth, for models that take one")
    p.add_argument("--width", type=int, default=None, help="width, for models that take one")
    p.add_argument("--num-classes", type=int, default=None)
    p.add_argument("--verbose", action="store_true", help="list every branch")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    adapt_arguments(p)
    p.set_defaults(func=_inspect)
    p = sub.add_parser("list", help="list registered models")
    p.add_argument("pattern", nargs="?", default="*")
    p.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    from .models import list_models

    print("\n".join(list_models(args.pattern)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fixup", description="Fixup initialisation: library, laboratory, studies")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"fixup {args.command}: error: {err}", file=sys.stderr)
        return 2
