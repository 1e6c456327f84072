"""``fixup convert module:factory``: convert a trained model from the command line, print the report, save it."""

from __future__ import annotations

import argparse
import warnings

from torch import nn

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    """Build the model the factory returns (trained: the factory loads its weights), convert it, print the report,
    and write the converted model (``--out``, for :func:`fixup.load_converted`) and the report (``--json``)."""
    from .._io import check_output_file, write_json
    from ..external import example_inputs, load_factory
    from . import ConvertWarning, convert, save_converted

    if args.out:
        check_output_file(args.out, "--out")
    if args.json:
        check_output_file(args.json)
    made = load_factory(args.factory)()
    model, example = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ValueError(f"{args.factory}: the factory returned {type(model).__name__}, not an nn.Module (or a "
                         "(model, example_input) pair)")
    if args.input_shape:
        example = example_inputs(args.input_shape, args.token_inputs)
    if example is None:
        raise ValueError(f"{args.factory}: give the example input's shape with --input-shape (e.g. --input-shape "
                         "2,3,224,224), or let the factory return (model, example_input)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvertWarning)  # the report prints them
        converted, report = convert(model, example, method=args.method, per_example_norms=args.per_example_norms)
    print(report.format(max_norms=len(report.norms) if args.verbose else 12))
    if args.out:
        save_converted(args.out, converted, report)
        print(f"saved to {args.out}: load with fixup.load_converted({args.out!r}, <the factory>)")
    if args.json:
        write_json(args.json, {"factory": args.factory, "report": report.to_dict()})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from . import PER_EXAMPLE_OPTIONS
    from ._pipeline import BRANCH_METHODS

    p = sub.add_parser("convert", help="convert a trained model to run without normalisation, keeping its function "
                                       "(BatchNorm folded exactly; LayerNorm/GroupNorm by a measured option)")
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="the factory returning the trained model (or model, example input): mymodels:trained, "
                        "or path/to/file.py:build")
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="the example input's shape, e.g. 2,3,32,32 (repeat for several inputs) (default: the "
                        "factory's example input)")
    p.add_argument("--token-inputs", type=int, default=0, metavar="VOCAB",
                   help="example inputs are token ids below VOCAB instead of normal floats (default: 0, floats)")
    p.add_argument("--method", default="fixup", choices=BRANCH_METHODS,
                   help="the scalars to insert at identity: fixup (Scale 1, Bias 0) or a gate at 1 per branch")
    p.add_argument("--per-example-norms", default="refuse", choices=PER_EXAMPLE_OPTIONS,
                   help="what LayerNorm/GroupNorm become: refuse (an error naming them), affine (a per-channel "
                        "affine fitted on the example input) or dyt (Dynamic Tanh, alpha fitted)")
    p.add_argument("--out", metavar="PATH", help="write the converted model here (fixup.load_converted reads it) "
                                                 "(default: not written)")
    p.add_argument("--verbose", action="store_true", help="list every normalisation layer, not only the first 12 "
                                                          "(default: off)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to this file (default: not written)")
    p.set_defaults(func=run)
