"""``fixup study NAME`` and ``fixup reproduce``: argument parsing and the progress display only."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from .._signals import Interrupted

__all__ = ["register"]


def _add_common(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="the reduced grid on the embedded data (default): 93 cells, 3 min 02 s measured on an "
                           "idle 2-core machine (7 min 01 s on a slow day); prints its own duration estimate before "
                           "it starts")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the paper's scale (for a GPU): --data-dir D holds cifar-10-python.tar.gz (or "
                           "cifar-10-batches-py), and optionally iwslt14.de-en/, svhn/ and imagenet/; see "
                           "--dry-run and docs/studies.md")
    mode.add_argument("--deep", dest="mode", action="store_const", const="deep",
                      help="the paper's depths (10 to 10,000 layers, every method, 3 seeds), the ablations at 1,000 "
                           "and 10,000 layers, and translation at its plateau (dropout search, 5 seeds) on the "
                           "embedded data: many CPU hours, cheapest cells first; rerun the same command to resume "
                           "(docs/studies.md, 'The deep tier')")
    mode.add_argument("--tiny", dest="mode", action="store_const", const="tiny",
                      help="a minimal grid that checks the whole pipeline in about a minute (CI)")
    p.set_defaults(mode="quick")
    p.add_argument("--data", default="digits", choices=("digits", "cifar10", "cifar100", "svhn"),
                   help="image data (default: digits, embedded; the others read --data-dir)")
    p.add_argument("--data-dir", default=None, help="folder or archive of the local data set (default None: "
                                                    "digits needs none)")
    p.add_argument("--image-size", type=int, default=None, help="pixels per side (default: as stored)")
    p.add_argument("--translation-task", default="quick", choices=("quick", "hard", "hard_5k"),
                   help="the generated task the translation study trains on: quick (the default; every system ends "
                        "near 100 BLEU), hard (docs/translation.md, 'The hard task'), or hard_5k (its grammar and "
                        "vocabulary with 5,000 training pairs: the one whose systems plateau below the ceiling on a "
                        "CPU); with --deep each has its own plateau grid (4 methods, dropout searched on seed 0, 5 "
                        "seeds: many CPU hours)")
    p.add_argument("--out", default=None, help="output folder (default None: runs/<mode>, with -TASK for a "
                                               "--translation-task other than quick); rerun to resume")
    p.add_argument("--jobs", type=int, default=0,
                   help="cells run in parallel processes (default: one per CPU core up to 8; 1 on a GPU)")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per cell (quick: 2, deep and full: 3; at least 2 / 3)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures (no matplotlib needed)")
    p.add_argument("--keep-finished-checkpoints", action="store_true",
                   help="keep each finished cell's checkpoints (default: deleted once its result is written; a "
                        "10,000-layer cell's take 2.6 GB)")
    p.add_argument("--yes", action="store_true", help="start a full run without the confirmation pause")
    p.add_argument("--plan", action="store_true", help="list the cells and the expected duration, run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="write the report of the cells finished so far and run nothing (works while a run goes on)")
    p.add_argument("--dry-run", action="store_true",
                   help="list every cell, the data it reads and its GPU hours under a stated throughput model; "
                        "run nothing (for --full)")


def register(sub: argparse._SubParsersAction) -> None:
    from .registry import STUDIES

    p = sub.add_parser("reproduce", help="run every study of the paper and write report.md + results.json",
                       description="Run the paper's studies (depth, ablation, regularisation, ...) as resumable "
                                   "cells and write OUT/report.md, OUT/results.json and OUT/figures/*.png.")
    _add_common(p)
    p.add_argument("--only", default=None, help=f"comma-separated studies to run (of {', '.join(STUDIES)}; "
                                                f"default None: all)")
    p.set_defaults(func=_reproduce)
    p = sub.add_parser("study", help="run one study of the paper (resumable) and write its report")
    p.add_argument("name", choices=list(STUDIES), help=f"the study to run: one of {', '.join(STUDIES)}")
    _add_common(p)
    p.set_defaults(func=_study)


class _Display:
    """One tqdm bar over all cells: done/total, with running, left and ETA in its postfix."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit="cell", dynamic_ncols=True, file=sys.stderr,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} cells [{elapsed}] {postfix}")

    def __call__(self, p: Any, message: str) -> None:
        from .runner import format_seconds

        self.bar.total = p.total
        self.bar.n = p.done
        self.bar.set_postfix_str(f"{len(p.running)} running, {p.left} left, ETA {format_seconds(p.eta)}"
                                 + (f", {p.failed} failed" if p.failed else ""))
        if message.startswith(("finished", "FAILED", "PROBLEM")):
            self.bar.write(message)

    def close(self) -> None:
        self.bar.close()


def _run(args: argparse.Namespace, studies: list[str]) -> int:
    from .grid import make_grid
    from .registry import get_study
    from .store import Store, StoreLockedError

    _check_inputs(args)
    for name in studies:  # an unknown study is refused before the output folder exists
        get_study(name)
    grid = make_grid(args.mode, data=args.data, data_dir=args.data_dir, seeds=args.seeds,
                     image_size=args.image_size, device=args.device, translation_task=args.translation_task)
    if args.jobs < 0:
        raise ValueError(f"--jobs must be 0 (automatic) or a positive number of processes, got {args.jobs}")
    args.jobs = args.jobs or _auto_jobs(args.device)
    task = "" if args.translation_task == "quick" else f"-{args.translation_task}"
    out = args.out or os.path.join("runs", (args.mode if len(studies) > 1 else f"{args.mode}-{studies[0]}") + task)
    store = Store(out)
    if args.dry_run:
        return _dry_run(grid, store, studies)
    if args.report_only:
        return _report_only(args, studies, grid, out)
    try:
        with store.lock("fixup " + shlex.join(sys.argv[1:])):
            return _run_locked(args, studies, grid, out, store)
    except StoreLockedError as err:
        print(f"fixup: {err}", file=sys.stderr)
        return 2


def _run_locked(args: argparse.Namespace, studies: list[str], grid: Any, out: str, store: Any) -> int:
    from .estimate import calibrate, estimate_seconds, measured_rate
    from .registry import get_study
    from .report import claim_rows
    from .reproduce import plan_all, reproduce
    from .runner import format_seconds

    tasks, waiting = plan_all(grid, store, [get_study(s) for s in studies])
    todo = [t for t in tasks if not store.is_done(t.cell)]
    spc, basis = measured_rate(store, [t for t in tasks if t not in todo]), "the cells finished here"
    if spc is None:
        side = grid.image_size or (8 if grid.data == "digits" else 32)
        spc, basis = calibrate(side, 1 if grid.data == "digits" else 3, device=grid.device,
                               threads=max(1, (os.cpu_count() or 1) // args.jobs)), "a few calibration steps"
    est = estimate_seconds(todo, spc, args.jobs, grid.order) * (1 + waiting / max(1, len(tasks)))
    print(f"fixup {args.mode}: {len(tasks) + waiting} cells ({len(tasks) - len(todo)} already finished in {out}), "
          f"{args.jobs} job(s); expected duration on this machine: about {format_seconds(est)} (timed on {basis})",
          file=sys.stderr)
    if args.plan:
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.cell.study] = counts.get(t.cell.study, 0) + 1
        for study, n in counts.items():
            print(f"  {study}: {n} cells")
        if waiting:
            print(f"  + {waiting} cells planned once the cells they depend on finish")
        return 0
    if args.mode in ("full", "deep") and not args.yes and sys.stdin.isatty():
        input("press Enter to start (Ctrl-C to stop; rerun the same command to resume) ")
    display = _Display()
    try:  # SIGINT and SIGTERM raise Interrupted (fixup._signals): workers are stopped, finished cells stay
        result = reproduce(grid, out, studies=studies, jobs=args.jobs, progress=display, plots=not args.no_plots,
                           keep_checkpoints=args.keep_finished_checkpoints,
                           seconds_per_cost=spc, command="fixup " + shlex.join(sys.argv[1:]))
    except Interrupted as err:
        display.close()
        done = len(list(Path(out).glob("cells/*/*/*/seed*/cell_result.json")))
        err.kept = (f"{done} finished cell(s) kept in {out}; unfinished cells resume from their checkpoints")
        raise
    finally:
        display.close()
    for problem in dict.fromkeys(store.problems + result.problems):
        print(f"fixup: {problem}", file=sys.stderr)
    print(f"{result.cells_run} cells run, {result.cells_resumed} resumed, in {format_seconds(result.seconds)}")
    print(f"report: {result.report}\nresults: {result.results}")
    for row in claim_rows(result.outputs, grid.skipped):
        if row.scale:  # claims this run tested
            print(f"  {row.verdict:38s} {row.claim}")
    if result.failed:
        print(f"{len(result.failed)} cell(s) failed (tracebacks in their cell_error.json); rerun to retry them:",
              file=sys.stderr)
        for key in result.failed:
            print(f"  {key}", file=sys.stderr)
        return 1
    return 0


def _report_only(args: argparse.Namespace, studies: list[str], grid: Any, out: str) -> int:
    from .report import claim_rows
    from .reproduce import reproduce

    if not Path(out, "cells").is_dir():
        raise FileNotFoundError(f"{out} holds no cells: give the --out of a run (and its mode) to --report-only")
    result = reproduce(grid, out, studies=studies, plots=not args.no_plots, run=False,
                       command="fixup " + shlex.join(sys.argv[1:]))
    print(f"report of the cells finished so far: {result.report}\nresults: {result.results}")
    for row in claim_rows(result.outputs, grid.skipped):
        if row.scale:
            print(f"  {row.verdict:38s} {row.claim}")
    return 0


def _dry_run(grid: Any, store: Any, studies: list[str]) -> int:
    from .fullplan import dry_run
    from .registry import get_study
    from .reproduce import plan_all

    tasks, waiting = plan_all(grid, store, [get_study(s) for s in studies])
    plan = dry_run(tasks, waiting, grid)
    for c in plan["cells"]:
        print(f"  {c['cell']:66s} {c['gpu_hours']:9.3f} GPU h   {c['data']}")
    if waiting:
        print(f"  + {waiting} cells planned once the cells they depend on finish (counted at the mean)")
    print(f"{len(plan['cells']) + waiting} cells, about {plan['gpu_hours']:.1f} GPU hours; throughput model: "
          f"{plan['throughput_model']}")
    return 0


def _check_inputs(args: argparse.Namespace) -> None:
    """What a study's cells would each fail on, refused once, before any cell starts."""
    from .._devices import resolve_device

    resolve_device(args.device)
    if args.data_dir is not None and not Path(args.data_dir).exists():
        raise FileNotFoundError(f"--data-dir {args.data_dir} does not exist; give the folder or archive of the "
                                f"{args.data} data set")
    if args.image_size is not None and args.image_size < 0:
        raise ValueError(f"--image-size must be >= 0 pixels (0 = as stored), got {args.image_size}")


def _auto_jobs(device: str) -> int:
    """One worker per CPU core (at most 8) on CPU; one on a GPU, whose cells would otherwise contend for it."""
    import torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _reproduce(args: argparse.Namespace) -> int:
    from .registry import STUDIES

    if args.only:
        return _run(args, [s.strip() for s in args.only.split(",")])
    from .grid import make_grid

    skipped = make_grid(args.mode, data=args.data, data_dir=args.data_dir, seeds=args.seeds).skipped
    return _run(args, [s for s in STUDIES if s not in skipped])


def _study(args: argparse.Namespace) -> int:
    return _run(args, [args.name])
