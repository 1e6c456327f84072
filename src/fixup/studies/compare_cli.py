"""``fixup compare MODEL``: argument parsing and printing only; the work is :func:`fixup.studies.compare.compare`."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .._signals import Interrupted

__all__ = ["register"]


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _seeds(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 0,1,2, got {text!r}") from err


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="train one model under several methods, side by side over seeds (resumable); "
                                       "write a table and a plot",
                       description="Train one registered model under several methods (fixup.METHODS) and seeds with "
                                   "the training engine, as resumable cells, and write OUT/compare.md (each seed's "
                                   "test accuracy, mean ± std (n), failed runs named), OUT/compare.json and "
                                   "OUT/compare.png. Each run uses one torch thread.")
    p.add_argument("model", help="a registered model name (`fixup list`), e.g. resnet_cifar or wide_resnet")
    p.add_argument("--methods", type=_names, default=["fixup", "skipinit", "rezero", "batchnorm"],
                   help="comma-separated methods of fixup.METHODS")
    p.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="comma-separated seeds, one run per method each")
    p.add_argument("--depth", type=int, default=0, help="layers, for models that take a depth (0: the model's own)")
    p.add_argument("--width", type=int, default=0, help="base width, for models that take one (0: the model's own)")
    p.add_argument("--epochs", type=int, default=3, help="passes over the training set")
    p.add_argument("--data", default="digits", help="digits (embedded), cifar10, cifar100, svhn or folder "
                                                    "(these read --data-dir)")
    p.add_argument("--data-dir", default="", help="folder or archive of the local data set (digits needs none)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--set", dest="train", action="append", default=[], metavar="KEY=VALUE",
                   help="a further `fixup train` option for every run, as its field name (lr=0.05, clip=none, "
                        "batch_size=64); repeat for several")
    p.add_argument("--jobs", type=int, default=0,
                   help="runs in parallel processes, one torch thread each (0: one per CPU core, at most the "
                        "number of runs; 1 on a GPU)")
    p.add_argument("--out", default=None, help="output folder (default None: runs/compare-MODEL); rerun to resume")
    p.add_argument("--json", metavar="PATH", help="also write the figures (compare.json's content) to this file")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figure (no matplotlib needed)")
    p.add_argument("--keep-finished-checkpoints", action="store_true",
                   help="keep each finished run's checkpoints (default: deleted once its result is written)")
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from .cli import _auto_jobs, _Display
    from .compare import CompareConfig, compare, parse_train_options
    from .runner import format_seconds

    config = CompareConfig(args.model, tuple(args.methods), tuple(args.seeds), depth=args.depth, width=args.width,
                           epochs=args.epochs, dataset=args.data, data_dir=args.data_dir, device=args.device,
                           train=parse_train_options(args.train)).validate()
    if args.jobs < 0:
        raise ValueError(f"--jobs must be 0 (automatic) or a positive number of processes, got {args.jobs}")
    runs = len(config.methods) * len(config.seeds)
    jobs = args.jobs or min(_auto_jobs(args.device), runs)
    out = args.out or os.path.join("runs", f"compare-{args.model}")
    command = "fixup " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["compare"] else ""
    display = _Display()
    try:  # SIGINT/SIGTERM raise Interrupted: running cells write their checkpoints, finished ones stay
        result = compare(config, out, jobs=jobs, progress=display, plots=not args.no_plots, command=command,
                         keep_checkpoints=args.keep_finished_checkpoints)
    except Interrupted as err:
        err.kept = f"finished runs kept in {out}; unfinished ones resume from their checkpoints"
        raise
    finally:
        display.close()
    print(result.table)
    print(f"{len(result.ran)} runs trained, {len(result.resumed)} found finished, in {format_seconds(result.seconds)}")
    print(f"report: {result.report}\nresults: {result.results}" + (f"\nplot: {result.plot}" if result.plot else ""))
    if args.json:
        from .._io import write_json

        write_json(args.json, result.summary)
        print(f"wrote {args.json}")
    if result.failed:
        print(f"{len(result.failed)} run(s) failed (tracebacks in their cell_error.json); rerun to retry them:",
              file=sys.stderr)
        for key, error in result.failed.items():
            print(f"  {key}: {error.strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    return 0
