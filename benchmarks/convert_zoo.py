"""``fixup.convert`` measured: the function change of every model of tests/adapt_zoo.py, and trained models on digits.

    PYTHONPATH=src python benchmarks/convert_zoo.py --only function --json benchmarks/results/convert_function.json
    PYTHONPATH=src python benchmarks/convert_zoo.py --only trained --seeds 0 1 \
        --json benchmarks/results/convert_trained.json

function: each zoo model as built, its BatchNorms given statistics and affines as training would (means N(0, 0.3),
variances U(0.5, 2), gammas U(0.5, 1.5), betas N(0, 0.3)), converted on two inputs; the change is the largest and
the RMS |converted - original| over the RMS of the original output, in eval mode, on 8 fresh inputs. Models with
LayerNorm are refused by default; they are converted under each per-example option, fitted on 8 calibration inputs.
Their weights are a random initialisation: the change of a trained model is in the second table.

trained: digits (1,437 train / 360 test, 32x32, three channels, standardised); each model trained with its
normalisation by AdamW (lr 2e-3, weight decay 0.05, batch 64, --steps steps), then converted (calibration: 256
training images); test accuracy before, right after conversion (no fine-tuning) and after --finetune-steps steps
of fine-tuning at batch 4 (SGD, momentum 0.9, ``fixup.param_groups(model, lr, scalar_lr_mult=m)``, global gradient
norm clipped at 1), for each lr and m of --lrs and --scalar-lr-mults. The normalised model fine-tuned alike (its
BatchNorm in train mode at batch 4) is the baseline. One torch thread.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fixup
from adapt_zoo import ZOO, as_inputs, import_timm, timm_model, trained_statistics_
from fixup.data.images import load_images

OPTIONS = ("affine", "dyt")
TRAINED = ("resnet18 (torchvision ResNet)", "vit_tiny_patch16_224", "convnext_atto")


def _like(example: tuple[torch.Tensor, ...], n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, *t.shape[1:], generator=g) if t.is_floating_point()
                 else torch.randint(1, 100, (n, *t.shape[1:]), generator=g) for t in example)


def function_rows(sequential: bool = True) -> list[dict[str, object]]:
    rows = []
    for name, entry in ZOO.items():
        if entry.needs == "timm":
            try:
                import_timm()
            except ImportError as err:
                rows.append({"model": name, "skipped": str(err)})
                continue
        torch.manual_seed(0)
        model = trained_statistics_(entry.build()).eval()
        example = as_inputs(entry.example())
        held_out, calibration = _like(example, 8, 1), [_like(example, 8, 2)]
        row: dict[str, object] = {"model": name}
        for option in ("refuse", *OPTIONS):
            start = time.time()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", fixup.FixupWarning)
                    _, report = fixup.convert(model, example, per_example_norms=option, calibration=calibration,
                                              held_out=held_out, sequential=sequential)
            except fixup.ConvertError as err:
                row[option] = {"refused": str(err).splitlines()[1].strip("- ")[:100]}
                continue
            kinds: dict[str, int] = {}
            for f in report.norms:
                kinds[f"{f.type} -> {f.fate}"] = kinds.get(f"{f.type} -> {f.fate}", 0) + 1
            row[option] = {"norms": kinds, "max_change": report.max_change, "rms_change": report.rms_change,
                           "exact": report.exact, "seconds": round(time.time() - start, 2),
                           "layer_change_max": max((f.change for f in report.norms), default=0.0)}
            if option == "refuse":
                break  # converted without an option: nothing per-example to choose
        rows.append(row)
    return rows


def function_table(rows: list[dict[str, object]]) -> str:
    lines = ["| model | normalisation -> fate | change (max / RMS, x output RMS) |", "|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | skipped: {r['skipped']} | |")
            continue
        if "norms" in r["refuse"]:  # type: ignore[operator]
            c = r["refuse"]
            lines.append(f"| {r['model']} | {', '.join(f'{n} {k}' for k, n in c['norms'].items())} | "  # type: ignore[index]
                         f"{c['max_change']:.2g} / {c['rms_change']:.2g} (exact) |")  # type: ignore[index]
            continue
        for option in OPTIONS:
            c = r[option]
            if "refused" in c:  # type: ignore[operator]
                lines.append(f"| {r['model']} | {option}: refused ({c['refused']}) | |")  # type: ignore[index]
            else:
                lines.append(f"| {r['model']} | {', '.join(f'{n} {k}' for k, n in c['norms'].items())} | "  # type: ignore[index]
                             f"{c['max_change']:.3g} / {c['rms_change']:.3g} |")  # type: ignore[index]
    return "\n".join(lines)


# --- trained models on digits ---

def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = load_images("digits", image_size=32, channels=3)
    (xtr, ytr), (xte, yte) = (s.batch(torch.arange(len(s))) for s in (data.train, data.test))
    xtr, xte = xtr.float(), xte.float()
    mean, std = xtr.mean((0, 2, 3), keepdim=True), xtr.std((0, 2, 3), keepdim=True)
    return (xtr - mean) / std, ytr, (xte - mean) / std, yte


def build(name: str) -> nn.Module:
    return ZOO[name].build() if name in ZOO else timm_model(name)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, batch: int, opt: torch.optim.Optimizer,
          seed: int, clip: float | None = None) -> float:
    """``steps`` steps; returns the last loss (nan where it turned non-finite, and training stops)."""
    order = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=order)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if not math.isfinite(loss.item()):
            return float("nan")
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return loss.item()


def trained_rows(models: list[str], seeds: list[int], steps: int, ft_steps: int, lrs: list[float],
                 mults: list[float], sequential: bool = True) -> list[dict[str, object]]:
    xtr, ytr, xte, yte = digits()
    rows = []
    for name in models:
        for seed in seeds:
            torch.manual_seed(seed)
            model = build(name)
            train(model, xtr, ytr, steps, 64, torch.optim.AdamW(model.parameters(), 2e-3, weight_decay=0.05), seed)
            base = accuracy(model, xte, yte)
            has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
            calibration = [xtr[i:i + 64] for i in range(0, 256, 64)]
            for option in ("refuse",) if has_bn else OPTIONS:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", fixup.FixupWarning)
                    converted, report = fixup.convert(model, xtr[:2], per_example_norms=option,
                                                      calibration=calibration, held_out=xte, sequential=sequential)
                row = {"model": name, "seed": seed, "option": option, "acc_trained": base,
                       "acc_converted": accuracy(converted, xte, yte), "max_change": report.max_change,
                       "rms_change": report.rms_change, "finetune": []}
                state = {k: v.clone() for k, v in converted.state_dict().items()}
                for lr in lrs:
                    for mult in mults:
                        converted.load_state_dict(state)
                        opt = torch.optim.SGD(fixup.param_groups(converted, lr, scalar_lr_mult=mult), lr=lr,
                                              momentum=0.9)
                        last = train(converted, xtr, ytr, ft_steps, 4, opt, seed + 100, clip=1.0)
                        row["finetune"].append({"lr": lr, "scalar_lr_mult": mult, "final_loss": last,
                                                "acc": accuracy(converted, xte, yte)})
                rows.append(row)
            if has_bn:  # the baseline: the normalised model fine-tuned alike, BatchNorm at batch 4
                state = {k: v.clone() for k, v in model.state_dict().items()}
                row = {"model": name, "seed": seed, "option": "normalised (baseline)", "acc_trained": base,
                       "acc_converted": base, "max_change": 0.0, "rms_change": 0.0, "finetune": []}
                for lr in lrs:
                    model.load_state_dict(state)
                    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
                    last = train(model, xtr, ytr, ft_steps, 4, opt, seed + 100, clip=1.0)
                    row["finetune"].append({"lr": lr, "scalar_lr_mult": None, "final_loss": last,
                                            "acc": accuracy(model, xte, yte)})
                rows.append(row)
            print(f"  {name} seed {seed} done", file=sys.stderr, flush=True)
    return rows


def trained_table(rows: list[dict[str, object]]) -> str:
    groups: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault((str(r["model"]), str(r["option"])), []).append(r)

    def ms(values: list[float]) -> str:
        return f"{100 * statistics.mean(values):.1f}" + (f" ± {100 * statistics.stdev(values):.1f}"
                                                         if len(values) > 1 else "")

    cells = sorted({(f["lr"], f["scalar_lr_mult"]) for r in rows for f in r["finetune"]},  # type: ignore[attr-defined]
                   key=lambda c: (c[0], -1 if c[1] is None else c[1]))
    head = "| model | option | trained | converted (change RMS) | " + " | ".join(
        f"ft lr {lr:g}" + ("" if m is None else f" m {m:g}") for lr, m in cells) + " |"
    lines = [head, "|" + "---|" * (4 + len(cells))]
    for (model, option), rs in groups.items():
        fts = []
        for lr, m in cells:
            vals = [f["acc"] for r in rs for f in r["finetune"] if f["lr"] == lr and f["scalar_lr_mult"] == m]  # type: ignore[attr-defined]
            fts.append(ms(vals) if vals else "")
        change = statistics.mean(float(r["rms_change"]) for r in rs)  # type: ignore[arg-type]
        lines.append(f"| {model} | {option} | {ms([float(r['acc_trained']) for r in rs])} | "  # type: ignore[arg-type]
                     f"{ms([float(r['acc_converted']) for r in rs])} ({change:.2g}) | " + " | ".join(fts) + " |")  # type: ignore[arg-type]
    return f"n = {len(next(iter(groups.values())))} seeds per row\n" + "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("function", "trained"), default=None)
    p.add_argument("--models", nargs="+", default=list(TRAINED), help="trained: zoo names or TIMM_TINY names")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="trained: seeds (n = how many)")
    p.add_argument("--steps", type=int, default=300, help="trained: training steps with normalisation")
    p.add_argument("--finetune-steps", type=int, default=150, help="trained: fine-tuning steps at batch 4")
    p.add_argument("--lrs", nargs="+", type=float, default=[0.001, 0.01], help="trained: fine-tuning rates")
    p.add_argument("--scalar-lr-mults", nargs="+", type=float, default=[0.1, 1.0], help="trained: scalar rate mults")
    p.add_argument("--layerwise", action="store_true",
                   help="fit each LayerNorm replacement on the original model's inputs (fixup.convert(sequential="
                        "False)) instead of on the model converted so far")
    p.add_argument("--json", default=None, help="write the settings, the rows and the tables as JSON")
    args = p.parse_args()
    torch.set_num_threads(1)
    out: dict[str, object] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    if args.only in (None, "function"):
        rows = function_rows(not args.layerwise)
        out["function"], out["function_table"] = rows, function_table(rows)
        print(out["function_table"])
    if args.only in (None, "trained"):
        rows = trained_rows(args.models, args.seeds, args.steps, args.finetune_steps, args.lrs, args.scalar_lr_mults,
                            not args.layerwise)
        out["trained"], out["trained_table"] = rows, trained_table(rows)
        print(out["trained_table"])
    if args.json:
        from fixup._io import write_json
        write_json(args.json, out)


if __name__ == "__main__":
    main()
