"""The ``fixup`` command line: argument parsing only; every command calls an importable function.

Each subcommand lives beside the code it runs, in a module with ``register(subparsers)`` that adds
its parser and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ._checks import check_numbers
from ._signals import Interrupted, signals_raise
from .external import add_adapt_arguments, check_adapt_arguments

__all__ = ["main"]

# Subcommand modules, in the order `fixup --help` lists them.
_COMMANDS: tuple[str, ...] = ("fixup.cli", "fixup.train.cli", "fixup.translation.cli", "fixup.studies.cli",
                              "fixup.studies.compare_cli", "fixup.bench.speed", "fixup.lab.cli",
                              "fixup.bench.deep", "fixup._convert._cli")


def _model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {} if args.norm is None else {"norm": args.norm}
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
    from ._io import write_json
    from .models import create_model

    check_adapt_arguments(args)
    if args.adapt:
        from .external import run_adapt

        return run_adapt(args)
    if args.model is None:
        raise ValueError("give a registered model name (see `fixup list`) or --adapt module:factory")
    check_numbers(args, positive=("depth", "width", "num_classes"))

    model = create_model(args.model, **_model_kwargs(args))
    report = model.init_report
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.model} (norm={model.method.norm}, init={args.init or 'default'}): {params:,} parameters")
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
    p.add_argument("--norm", default=None, help="normalisation: fixup, batchnorm, groupnorm, layernorm or none "
                                                "(default None: fixup, or the norm of the method --init names)")
    p.add_argument("--init", default=None, help="initialisation or ablation (depends on --norm; default None: the "
                                                "norm's own); alone, any method of fixup.METHODS, e.g. rezero")
    p.add_argument("--depth", type=int, default=None, help="depth, for models that take one (default None: the "
                                                           "model's own)")
    p.add_argument("--width", type=int, default=None, help="width, for models that take one (default None: the "
                                                           "model's own)")
    p.add_argument("--num-classes", type=int, default=None, help="classifier outputs (default None: the model's own)")
    p.add_argument("--verbose", action="store_true", help="list every branch, not only the first 12")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to this file")
    add_adapt_arguments(p)
    p.set_defaults(func=_inspect)
    p = sub.add_parser("list", help="list registered models")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style pattern of the names to list, e.g. 'resnet*'")
    p.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    from .models import list_models

    print("\n".join(list_models(args.pattern)))
    return 0


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; every option's help ends with its default, once (an option whose help says its
    default in words keeps those words)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "(default:" in action.help:
            return action.help
        return super()._get_help_string(action)


class _Subcommands(argparse._SubParsersAction):
    """Subcommands whose one-line help is also their description, unless they give a longer one."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if kwargs.get("description") is None and kwargs.get("help"):
            kwargs["description"] = kwargs["help"][0].upper() + kwargs["help"][1:] + "."
        return super().add_parser(name, **kwargs)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (with where to find help), exit code 2, and whose
    help shows every option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = _Formatter
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        # argparse checks required arguments before unknown ones: ``fixup --nosuch`` would say "COMMAND is
        # required" instead of naming the option it did not know
        if self.prog == "fixup" and args:
            first = next(iter(args))
            if first.startswith("-") and first.split("=")[0] not in self._option_string_actions:
                self.error(f"unknown option {first}: options go after the command (fixup COMMAND --option)")
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="fixup", description="Fixup initialisation: library, laboratory, studies")
    parser.add_argument("--version", action="version", version=f"fixup-lab {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
              line: str | None = None) -> None:
    """Warnings shown by the command line: ``fixup: warning: ...`` on one line."""
    print(f"fixup: {category.__name__}: {' '.join(str(message).split())}", file=sys.stderr)


def _command_name(args: argparse.Namespace | None, argv: Sequence[str]) -> str:
    if args is None:
        return "fixup"
    sub = getattr(args, "lab_command", None)
    return f"fixup {args.command}" + (f" {sub}" if sub else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``fixup`` command; returns its exit code.

    Exit codes: 0 success; 2 bad options or input, or an output that cannot be written (a full disk too: one
    line on stderr naming the value and the fix);
    130 / 143 stopped by SIGINT / SIGTERM (one line: what was kept and the command that resumes);
    141 the reader of the output went away (``fixup list | head``); commands document others
    (``fixup train``: 3 diverged, 5 collapsed).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    with signals_raise(), warnings.catch_warnings():
        warnings.showwarning = _one_line
        try:
            args = build_parser().parse_args(argv)
            _check_outputs(args)
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at interpreter exit
            return code
        except Interrupted as err:
            return _interrupted(err, _command_name(args, argv), argv)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
            return 141  # 128 + SIGPIPE, as a shell reports a writer whose reader went away
        except (ValueError, OSError) as err:
            return _error(err, _command_name(args, argv))
        except Exception as err:  # a full disk that a library wrapped (torch.save: RuntimeError "unexpected pos")
            from ._io import full_disk_error

            full = full_disk_error(err)
            if full is None:
                raise
            return _error(full, _command_name(args, argv))


def _error(err: BaseException, command: str) -> int:
    """Print ``err`` as one line on stderr; return the exit code of bad options or input (2)."""
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    print(f"{command}: error: {text}", file=sys.stderr)
    return 2


def _check_outputs(args: argparse.Namespace) -> None:
    """Output paths every command shares, checked before any work starts."""
    from ._io import check_output_dir, check_output_file

    for name, option in (("out_dir", "--out-dir"), ("out", "--out")):
        if getattr(args, name, None) is not None:
            check_output_dir(getattr(args, name), option)
    for name, option in (("json", "--json"), ("plot", "--plot")):
        if getattr(args, name, None) is not None:
            check_output_file(getattr(args, name), option)


def _interrupted(err: Interrupted, command: str, argv: Sequence[str]) -> int:
    kept = err.kept or "nothing was kept"
    print(f"{command}: interrupted by {err.name}; {kept}; to resume run: fixup {shlex.join(argv)}", file=sys.stderr)
    return err.exit_code
