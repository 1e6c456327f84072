"""How large each example's gradient is under private training, per route: does the clipping bound clip at all?

    PYTHONPATH=src python benchmarks/private_grad_norms.py --json benchmarks/results/private_grad_norms_resnet20.json

DP-SGD clips each example's gradient to the bound C (``max_grad_norm``) and adds noise of std ``sigma * C`` to their
sum, so the signal of a step is the sum of ``min(|g_i|, C)`` along each gradient's direction and the noise grows with
C. Where every |g_i| is far above C every example is cut to C and a smaller C only lowers the step (which a higher
rate undoes); where most lie below C the bound adds noise for nothing. So the useful bounds follow the norms, and
they may differ between a network that sees its weights' scale (Fixup) and one that does not (GroupNorm).

Each route trains as ``private_training.py`` trains it (ResNet-20 on 8x8 digits, batch 256 expected, 20 epochs =
120 steps, SGD momentum 0.9, cosine, epsilon 8, clipping at 1, seed 0) at its own rate (``--runs ROUTE:LR``; by
default each route's rate chosen on the validation split at C=1), and is stopped after each of ``--steps`` optimiser
steps; at each of those the per-example gradient norms of the first Poisson batch of the run (about 239 training
examples, normalised as training sees them) are computed one example at a time, without Opacus (train mode, the
same loss, each example's loss alone). Reported: quantiles of the norms and the fraction of examples above each bound
of ``--bounds``. One seed: a probe, not a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "src" / "fixup").is_dir():
    sys.path.insert(0, str(_ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


def example_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The L2 norm over all parameters of each example's gradient of its own cross-entropy loss (train mode)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(len(y)):
        loss = nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        grads = torch.autograd.grad(loss, params)
        norms.append(float(torch.sqrt(sum(g.pow(2).sum() for g in grads))))
    return norms


def describe(norms: list[float], bounds: list[float]) -> dict[str, Any]:
    t = torch.tensor(norms)
    return {"n": len(norms), "mean": statistics.fmean(norms),
            "quantiles": {f"{q:g}": float(t.quantile(q)) for q in QUANTILES},
            "fraction_above": {f"{c:g}": float((t > c).float().mean()) for c in bounds}}


def probe(route: str, lr: float, steps: list[int], bounds: list[float], opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-example gradient norms of one route after each of ``steps`` optimiser steps of its private run."""
    from private_training import config_for

    from fixup.train import TrainConfig, fit
    from fixup.train.image_task import ImageClassification
    from fixup.train.task import Shard

    config = TrainConfig.from_dict(config_for("resnet20", route, 8.0, 0, lr, opts))
    task = ImageClassification(config)
    x, y, _ = next(iter(task.train_batches(0, Shard())))
    rows = []
    for k in steps:
        torch.manual_seed(config.seed)  # as fit seeds before building: step 0 is the run's initialisation
        model = task.build_model(config)  # a fresh copy, without Opacus's hooks
        if k:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Opacus's hook warnings
                trained = fit(config, progress=False, task=task, on_step=lambda s, k=k: s.step >= k).model
            model.load_state_dict(trained.state_dict())
        rows.append({"route": route, "lr": lr, "step": k, **describe(example_norms(model, x, y), bounds)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=["fixup:0.2", "groupnorm:1"], metavar="ROUTE:LR",
                   help="routes of private_training.py and their rates (default fixup:0.2 groupnorm:1, the rates "
                        "chosen on the validation split at clipping bound 1)")
    p.add_argument("--steps", nargs="+", type=int, default=[0, 5, 20, 60],
                   help="optimiser steps after which to measure (0: at initialisation; the run has 120)")
    p.add_argument("--bounds", nargs="+", type=float, default=[0.1, 0.3, 1.0, 3.0],
                   help="clipping bounds to report the fraction of examples above")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args()
    torch.set_num_threads(1)
    opts = {"image_size": 0, "channels": 0, "batch_size": 256, "epochs": 20, "momentum": 0.9, "delta": 1e-5,
            "max_grad_norm": 1.0, "device": "cpu"}
    rows = []
    for spec in args.runs:
        route, lr = spec.split(":")
        for row in probe(route, float(lr), args.steps, args.bounds, opts):
            rows.append(row)
            q, above = row["quantiles"], row["fraction_above"]
            print(f"{route} lr {lr} step {row['step']}: per-example gradient norm min {q['0']:.3g}, "
                  f"10% {q['0.1']:.3g}, median {q['0.5']:.3g}, 90% {q['0.9']:.3g}, max {q['1']:.3g} "
                  f"(n={row['n']}); above "
                  + ", ".join(f"{c}: {100 * v:.0f}%" for c, v in above.items()), flush=True)
    if args.json:
        command = "python benchmarks/private_grad_norms.py " + " ".join(sys.argv[1:])
        Path(args.json).write_text(json.dumps({"command": command, "settings": {**opts, "epsilon": 8.0, "seed": 0},
                                               "torch": torch.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
