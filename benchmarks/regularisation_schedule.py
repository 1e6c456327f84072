"""When does the training loss flatten? The measurement behind the deep tier's regularisation schedule (issue 39).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/regularisation_schedule.py \\
        --json benchmarks/results/regularisation_schedule.json

The regularisation claims (Table 1-2, Appendix C) concern networks at the end of their schedule, where the training
set is fitted. On digits that end is reachable: this trains each method of the study without a regulariser at the
study's constant peak rate (no decay, so the flattening is the rate's, not the schedule's) for ``--epochs`` epochs
and reports, per method, the first epoch at which the running training loss comes within ``--within`` times its
lowest value plus ``--floor``: where more epochs at this rate stop paying (a constant rate of 0.1 also throws
the loss back up now and then, which is why the rule looks for the first arrival, not for the last departure). The
deep tier's schedule then trains about twice the later method's epoch, the rate divided by 10 at half and three
quarters (the paper's step schedule), so that the decayed half starts from networks that have stopped improving at
the peak rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "src" / "fixup").is_dir():
    sys.path.insert(0, str(_ROOT / "src"))


def flattening_epoch(losses: list[float], within: float, floor: float) -> int:
    """The first epoch (1-based) whose loss is at most ``within x (the lowest loss) + floor``."""
    bar = within * min(losses) + floor
    return next(i + 1 for i, loss in enumerate(losses) if loss <= bar)


def run(method: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from fixup.studies._common import method_model_args
    from fixup.train import TrainConfig, fit

    config = TrainConfig.from_dict({"task": "images", "dataset": "digits", "model": "resnet_cifar", "depth": args.depth,
                                    **method_model_args(method), "batch_size": args.batch_size, "epochs": args.epochs,
                                    "lr": args.lr, "schedule": "constant", "weight_decay": 5e-4, "grad_clip": 0.0,
                                    "checkpoint": False, "device": "cpu", "seed": seed})
    started = time.monotonic()
    result = fit(config, progress=False)
    losses = [float(row["train_loss"]) for row in result.history]
    errors = [1 - float(row["train_acc"]) for row in result.history]
    return {"method": method, "seed": seed, "outcome": str(result.outcome), "train_loss": losses,
            "train_error": errors, "test_acc": [row.get("test_acc") for row in result.history],
            "flattens_at": flattening_epoch(losses, args.within, args.floor) if losses else None,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["fixup", "batchnorm"], help="methods of fixup.METHODS")
    p.add_argument("--depth", type=int, default=14)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--within", type=float, default=1.5, help="the loss band's factor over the final loss")
    p.add_argument("--floor", type=float, default=0.01, help="the loss band's additive floor")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for method in args.methods:
        for seed in args.seeds:
            row = run(method, args, seed)
            rows.append(row)
            print(f"{method} seed {seed}: {row['outcome']}; training loss {row['train_loss'][0]:.3f} -> "
                  f"{row['train_loss'][-1]:.4f}, training error {100 * row['train_error'][-1]:.2f}%; flattens at "
                  f"epoch {row['flattens_at']} of {args.epochs} ({row['seconds']} s)", flush=True)
    if args.json:
        command = "python benchmarks/regularisation_schedule.py " + " ".join(sys.argv[1:])
        Path(args.json).write_text(json.dumps({"command": command, "settings": vars(args), "torch": torch.__version__,
                                               "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
