"""Does Dynamic Tanh replace BatchNorm? Zhu et al. (CVPR 2025) report it does not (their Limitations: ResNet-50 and
VGG19 on ImageNet lose accuracy with DyT in place of BatchNorm). This measures it on the library's CIFAR ResNet-20
with BatchNorm, beside the same network with every BatchNorm2d replaced by :class:`fixup.nn.DyT` over the channel
dimension (alpha 0.5, weight 1, bias 0, as the method builds it), under the README's own-loop recipe:

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/dyt_batchnorm.py --steps 300 --seeds 0 1

digits (1,437 train / 360 test, the library's fixed split) upsampled to 32x32, three channels, standardised; SGD
over ``fixup.param_groups(model, lr=0.1, weight_decay=5e-4)`` with momentum 0.9, batch 64, a constant rate, the global
gradient norm clipped at 1 before each step; the seed fixes the initialisation and the batch order. Accuracy on the
360 test digits after the last step. Writes benchmarks/results/dyt_batchnorm.json (config and every run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import fixup
from adapt_zoo import digits_32, train_own_loop
from fixup.nn import DYT_ALPHA, DyT

OUT = Path(__file__).parent / "results" / "dyt_batchnorm.json"


def bn_to_dyt_(model: nn.Module) -> int:
    """Every BatchNorm2d of ``model`` replaced by DyT over its channels (dim 1); returns how many."""
    n = 0
    for mod in list(model.modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(mod, child_name, DyT(child.num_features, dim=1, alpha=DYT_ALPHA))
                n += 1
    return n


def run(form: str, seed: int, steps: int, data: tuple[torch.Tensor, ...]) -> dict[str, object]:
    start = time.time()
    torch.manual_seed(seed)
    model = fixup.create_model("resnet20", method="batchnorm", num_classes=10)
    replaced = bn_to_dyt_(model) if form == "dyt" else 0
    acc, loss_value, diverged_at = train_own_loop(
        model, data, steps=steps, seed=seed, lr=0.1, scalar_lr_mult=0.1,
        clip=lambda m: lambda: torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0))
    return {"form": form, "seed": seed, "replaced": replaced, "acc": acc, "final_loss": loss_value,
            "diverged_at": diverged_at, "seconds": round(time.time() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = digits_32()
    runs = [run(form, seed, args.steps, data) for seed in args.seeds for form in ("batchnorm", "dyt")]
    summary = {}
    for form in ("batchnorm", "dyt"):
        accs = [r["acc"] for r in runs if r["form"] == form]
        summary[form] = {"mean": statistics.mean(accs), "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                         "n": len(accs)}
    config = {"model": "resnet20", "data": "digits 32x32x3", "steps": args.steps, "seeds": args.seeds, "batch": 64,
              "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "clip": 1.0, "dyt_alpha": DYT_ALPHA}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "summary": summary, "runs": runs}, indent=1) + "\n")
    for form, s in summary.items():
        print(f"{form}: {100 * s['mean']:.1f} ± {100 * s['std']:.1f}% (n={s['n']})")


if __name__ == "__main__":
    main()
