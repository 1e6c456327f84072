"""Train a grid of (depth, method, seed) runs with the engine's defaults and print test accuracy side by side.

Every run is ``fixup.train.fit`` with only the options given here changed; a run that diverged or
collapsed is counted and shown, never dropped from the table silently. Examples (the commands behind
the tables of docs/training.md):

    # Defaults that train: CIFAR ResNets 8-110 on digits, 6 epochs, 5 seeds, Fixup against BatchNorm
    python benchmarks/train_grid.py --depths 8 14 20 32 56 110 --methods fixup batchnorm --seeds 0 1 2 3 4 \\
        --epochs 6 --batch-size 32 --json defaults.json

    # The stream budget at 1,000 layers: one epoch (45 steps) of WRN-1000-1 at lr 0.1, batch 32
    python benchmarks/train_grid.py --model wide_resnet --depths 1000 --width 1 --channels 3 --epochs 1 \\
        --batch-size 32 --schedule constant --methods fixup fixup_paper fixup_no_stream_bias batchnorm \\
        --seeds 0 1 2 --json wrn1000.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "fixup").is_dir():
    sys.path.insert(0, str(_SRC))


def _run(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from fixup.method import as_method
    from fixup.train import TrainConfig, fit

    torch.set_num_threads(args.pop("threads"))
    method = as_method(args.pop("method"))
    started = time.perf_counter()
    config = TrainConfig(norm=method.norm, init=method.init, **args)
    result = fit(config, progress=False)
    final = result.final
    return {"depth": config.depth, "method": method.name, "seed": config.seed, "outcome": result.outcome.status,
            "reason": result.reason, "steps": result.outcome.step, "test_acc": final.get("test_acc"),
            "seconds": round(time.perf_counter() - started, 1)}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (depth, method): mean and std of test accuracy over completed runs, n, and the failed runs."""
    table = []
    for key in dict.fromkeys((r["depth"], r["method"]) for r in rows):
        runs = [r for r in rows if (r["depth"], r["method"]) == key]
        accs = [r["test_acc"] for r in runs if r["outcome"] == "completed" and r["test_acc"] is not None]
        failed = {o: sum(r["outcome"] == o for r in runs) for o in ("diverged", "collapsed") if
                  any(r["outcome"] == o for r in runs)}
        table.append({"depth": key[0], "method": key[1], "n": len(runs), "completed": len(accs),
                      "mean": statistics.fmean(accs) if accs else math.nan,
                      "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "min": min(accs, default=math.nan),
                      "failed": failed, "accs": accs})
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| depth | method | test accuracy % (mean ± std) | n | min | failed runs |", "|---|---|---|---|---|---|"]
    for t in table:
        acc = f"{100 * t['mean']:.1f} ± {100 * t['std']:.1f}" if t["completed"] else "-"
        failed = ", ".join(f"{k} {v} of {t['n']}" for k, v in t["failed"].items()) or "none"
        lines.append(f"| {t['depth']} | {t['method']} | {acc} | {t['completed']} of {t['n']} | "
                     f"{100 * t['min']:.1f} | {failed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet_cifar", help="registered model (default: resnet_cifar)")
    p.add_argument("--depths", type=int, nargs="+", default=[8, 14, 20], help="depths to train (default: 8 14 20)")
    p.add_argument("--width", type=int, default=0, help="model width (0: the builder's default)")
    p.add_argument("--methods", nargs="+", default=["fixup", "batchnorm"], help="methods of fixup.METHODS")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    p.add_argument("--epochs", type=int, default=6, help="epochs per run (default: 6)")
    p.add_argument("--batch-size", type=int, default=128, help="batch size (default: the engine's, 128)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the engine's, 0.1)")
    p.add_argument("--schedule", default=None, help="lr schedule (default: the engine's, step)")
    p.add_argument("--channels", type=int, default=0, help="input channels (0: as stored)")
    p.add_argument("--scalar-lr-mult", type=float, default=None, help="scalars' rate (default: the engine's, 0.1)")
    p.add_argument("--grad-clip", type=float, default=None,
                   help="clip the global gradient norm to this (default: the engine's; 0 turns it off)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (default: one per core)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per run (default 1: on a shared machine more threads spin and slow it down)")
    p.add_argument("--json", default=None, help="write every run and the summary here")
    a = p.parse_args(argv)
    fixed: dict[str, Any] = {"model": a.model, "epochs": a.epochs, "batch_size": a.batch_size, "channels": a.channels,
                             "width": a.width, "checkpoint": False}
    for name in ("lr", "schedule", "scalar_lr_mult", "grad_clip"):
        if getattr(a, name) is not None:
            fixed[name] = getattr(a, name)
    jobs = [{**fixed, "depth": d, "method": m, "seed": s, "threads": a.threads}
            for d in a.depths for m in a.methods for s in a.seeds]
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(a.jobs) as pool:
        for row in pool.map(_run, jobs):  # each run as it ends, so that a long grid shows its progress
            print(json.dumps(row), flush=True)
            rows.append(row)
    table = summarise(rows)
    print(markdown(table))
    wall = time.perf_counter() - started
    print(f"\n{len(rows)} runs in {wall:.0f} s ({a.jobs} at a time); command: {' '.join(sys.argv)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"settings": fixed, "runs": rows, "summary": table, "seconds": wall},
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
