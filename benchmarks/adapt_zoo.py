"""``fixup.adapt`` on third-party models: the accounting of every model in tests/adapt_zoo.py, and digits
accuracy of some of them, adapted (no normalisation) beside the same model with its normalisation.

    PYTHONPATH=src python benchmarks/adapt_zoo.py                     # both tables (minutes on 2 cores)
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only accounting   # the first table (about a minute)
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only training --models "resnet18 (fixup-lab)" \
        "resnet18 (torchvision ResNet)" --forms fixup --seeds 5 --lr 0.05   # the ResNet-18 rate sweep
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only training --models "resnet18 (fixup-lab)" \
        "resnet18 (torchvision ResNet)" --seeds 5 --grad-clip 1   # the same loop, clipping the gradient norm

Training: digits (1,437 train / 360 test, the library's fixed split) upsampled to 32x32, three channels,
standardised; SGD over ``fixup.param_groups(model, lr=0.1, weight_decay=5e-4)`` with momentum 0.9, batch 64,
``--steps`` steps at a constant rate; the seed fixes the initialisation and the batch order. Accuracy on the
360 test digits after the last step; ``--grad-clip`` clips the global gradient norm before each step. The
normalised form trains with the same loop (its groups hold only weights). Figures: mean +- std over n seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fixup
from fixup.data.images import load_images

TRAINED = ["resnet18 (torchvision ResNet)", "regnetx (timm RegNet, BatchNormAct2d)",
           "efficientnet (timm MBConv, BatchNormAct2d + SE)", "resnet (ResNetForImageClassification)"]
# The library's own ResNet-18 (same layout, built by fixup.create_model under Fixup or BatchNorm): the yardstick
# for the adapted torchvision one. Train it with --models "resnet18 (fixup-lab)".
OURS = "resnet18 (fixup-lab)"


def _build(name: str, resnet18_width: int) -> torch.nn.Module:
    from adapt_zoo import ZOO, BasicBlock, ResNet
    if name.startswith("resnet18"):  # torchvision's ResNet-18 layout (7x7 stem, max pool), at this width
        return ResNet(BasicBlock, [2, 2, 2, 2], width=resnet18_width)
    return ZOO[name].build()


def accounting() -> list[dict[str, object]]:
    from adapt_zoo import ZOO
    rows = []
    for name, entry in ZOO.items():
        torch.manual_seed(0)
        example = entry.example()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, report = fixup.adapt(entry.build(), example)
        except ImportError as err:
            rows.append({"model": name, "source": entry.source, "result": f"skipped: {err}"})
            continue
        kinds = {}
        for b in report.branches:
            kinds.setdefault(b.kind, (b.m, b.factor))
        rows.append({
            "model": name, "source": entry.source, "family": entry.family, "class": type(model).__name__,
            "result": "adapted" + (f" ({len(report.warnings)} warnings)" if report.warnings else ""),
            "L": report.num_branches, "m": {k: v[0] for k, v in kinds.items()},
            "factor": {k: round(v[1], 4) for k, v in kinds.items()},
            "nonlinearities": [report.nonlinearities_before, report.nonlinearities_after],
            "norms": f"{sum(n.action == 'bias' for n in report.norms_replaced)} bias / "
                     f"{sum(n.action == 'removed' for n in report.norms_replaced)} removed",
            "layer_scales": len(report.layer_scales), "fused_qkv": len(report.fused_qkv), "untied": len(report.untied),
            "warnings": report.warnings,
        })
    return rows


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = load_images("digits", image_size=32, channels=3)
    out = []
    for split in (data.train, data.test):
        x, y = split.batch(torch.arange(len(split)))
        out += [x.float(), y]
    xtr, ytr, xte, yte = out
    mean, std = xtr.mean((0, 2, 3), keepdim=True), xtr.std((0, 2, 3), keepdim=True)
    return (xtr - mean) / std, ytr, (xte - mean) / std, yte


def _logits(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out["logits"]  # type: ignore[index]


def train_one(name: str, form: str, seed: int, steps: int, data: tuple[torch.Tensor, ...],
              resnet18_width: int, lr: float = 0.1, scalar_lr_mult: float = 0.1,
              grad_clip: float = 0.0) -> dict[str, float]:
    xtr, ytr, xte, yte = data
    torch.manual_seed(seed)
    if name == OURS:
        model = fixup.create_model("resnet18", width=resnet18_width, num_classes=10,
                                   norm="fixup" if form == "fixup" else "batchnorm")
    else:
        model = _build(name, resnet18_width)
    if form == "fixup" and name != OURS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, _ = fixup.adapt(model, xtr[:2])
    groups = fixup.param_groups(model, lr, weight_decay=5e-4, scalar_lr_mult=scalar_lr_mult)
    opt = torch.optim.SGD(groups, lr=lr, momentum=0.9)
    order = torch.Generator().manual_seed(seed)
    model.train()
    perm, pos, losses = torch.randperm(len(xtr), generator=order), 0, []
    for _ in range(steps):
        if pos + 64 > len(perm):
            perm, pos = torch.randperm(len(xtr), generator=order), 0
        idx = perm[pos:pos + 64]
        pos += 64
        loss = F.cross_entropy(_logits(model(xtr[idx])), ytr[idx])
        opt.zero_grad()
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        acc = (_logits(model(xte)).argmax(1) == yte).float().mean().item()
    return {"acc": acc, "final_loss": losses[-1], "finite": all(x == x and abs(x) != float("inf") for x in losses)}


def training(seeds: int, steps: int, names: list[str], resnet18_width: int, lr: float,
             forms: tuple[str, ...], scalar_lr_mult: float, grad_clip: float = 0.0) -> list[dict[str, object]]:
    data = _digits()
    rows = []
    for name in names:
        for form in forms:
            start = time.time()
            runs = [train_one(name, form, s, steps, data, resnet18_width, lr, scalar_lr_mult, grad_clip)
                    for s in range(seeds)]
            accs = [r["acc"] for r in runs]
            rows.append({"model": name, "form": form, "accs": accs, "mean": statistics.mean(accs),
                         "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "n": len(accs),
                         "finite": all(r["finite"] for r in runs), "seconds": round(time.time() - start, 1)})
            print(f"{name:<52} {form:<10} " + " ".join(f"{a:.3f}" for a in accs)
                  + f"  {rows[-1]['mean']:.3f} +- {rows[-1]['std']:.3f} (n={len(accs)}, {rows[-1]['seconds']} s)",
                  flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("accounting", "training"), default=None)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--models", nargs="*", default=TRAINED,
                   help=f"models of tests/adapt_zoo.py to train, or {OURS!r} (the library's own ResNet-18)")
    p.add_argument("--resnet18-width", type=int, default=16,
                   help="ResNet-18's base width (torchvision's is 64: about 5 s a step on 2 shared cores)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD rate of the weights (scalars: fixup.param_groups)")
    p.add_argument("--scalar-lr-mult", type=float, default=0.1, help="the scalars' rate over lr (0: held fixed)")
    p.add_argument("--grad-clip", type=float, default=0.0,
                   help="clip the global gradient norm to this before each step (0, the default: no clipping)")
    p.add_argument("--forms", nargs="*", default=["fixup", "normalised"], choices=["fixup", "normalised"])
    p.add_argument("--json", default=None, help="write both tables as JSON")
    args = p.parse_args()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out: dict[str, object] = {"settings": {"seeds": args.seeds, "steps": args.steps, "batch": 64, "lr": args.lr,
                                           "scalar_lr_mult": args.scalar_lr_mult, "grad_clip": args.grad_clip,
                                           "momentum": 0.9, "weight_decay": 5e-4, "image_size": 32,
                                           "resnet18_width": args.resnet18_width}}
    if args.only in (None, "accounting"):
        out["accounting"] = rows = accounting()
        for r in rows:
            print(f"| {r['model']} | {r['source']} | {r['result']} | {r.get('L', '')} | {r.get('m', '')} | "
                  f"{r.get('factor', '')} | {r.get('nonlinearities', '')} | {r.get('norms', '')} |", flush=True)
    if args.only in (None, "training"):
        out["training"] = training(args.seeds, args.steps, args.models, args.resnet18_width, args.lr,
                                   tuple(args.forms), args.scalar_lr_mult, args.grad_clip)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
