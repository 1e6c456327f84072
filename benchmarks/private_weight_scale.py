"""Why Fixup needs a lower rate than GroupNorm under DP-SGD: the scale DP-SGD's noise gives the weights.

    PYTHONPATH=src python benchmarks/private_weight_scale.py --json benchmarks/results/private_weight_scale.json

DP-SGD adds Gaussian noise to every coordinate of every step's gradient, so each weight takes a random walk whose
size grows with the rate and the number of steps, whatever the data says. A normalised layer does not see its
weights' scale (GroupNorm divides it out), so the walk only lowers its effective rate; without normalisation the
walk is part of the function. Fixup starts each branch's last layer at zero and relies on it staying small while
the branches grow from there; under DP-SGD the walk alone can carry those layers past the scale of a He
initialisation, and then the residual stream grows with depth as it does without Fixup.

Each run is one private training run of the private-training benchmark (``private_training.py``'s settings: ResNet-20
on 8x8 digits, batch 256 expected, 20 epochs, SGD momentum 0.9, cosine, per-example clipping at 1, epsilon 8,
delta 1e-5, seed 0) at the given rates; after training it reports, for each branch's last convolution
(``conv2``), the root mean square of its weights over the std of He's fan-in draw for that layer (sqrt(2 / fan-in)),
and the classifier's weight RMS, beside the test accuracy. One seed: a probe of the mechanism, not a table.

``NORM:LR:K`` trains the zero-started layers (each branch's last convolution and the classifier) at K times the
rate and everything else at the rate, to test whether those layers are what limits Fixup's rate:

    PYTHONPATH=src python benchmarks/private_weight_scale.py --runs fixup:0.5:0.2 fixup:1:0.1 fixup:0.5:0.4 \\
        fixup:0.2:0.5 --json benchmarks/results/private_weight_scale_ends.json

``NORM:LR:K:B`` also bounds the zero-started convolutions: after every step each branch's last convolution whose RMS
exceeds B times He's std is scaled back to it (a projection of the released weights: post-processing, which costs
no privacy), so that the noise's walk cannot carry them past B while the rate stays high:

    PYTHONPATH=src python benchmarks/private_weight_scale.py --runs fixup:0.5:1:0.5 fixup:0.5:1:1 fixup:0.3:1:0.5 \\
        fixup:0.2:1:0.5 --json benchmarks/results/private_weight_scale_bound.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "src" / "fixup").is_dir():
    sys.path.insert(0, str(_ROOT / "src"))

BASE = {"dataset": "digits", "model": "resnet_cifar", "depth": 20, "batch_size": 256, "epochs": 20, "momentum": 0.9,
        "weight_decay": 0.0, "schedule": "cosine", "eval_every": 20, "checkpoint": False, "seed": 0, "device": "cpu",
        "dp": True, "target_epsilon": 8.0, "delta": 1e-5, "max_grad_norm": 1.0}


def weight_scale(model: nn.Module) -> dict[str, Any]:
    """RMS over He's std of every branch's last convolution (min, median, max), and the classifier's RMS."""
    ratios = [float(m.weight.detach().pow(2).mean().sqrt()) / math.sqrt(2.0 / m.weight[0].numel())
              for name, m in model.named_modules() if isinstance(m, nn.Conv2d) and name.endswith("conv2")]
    classifier = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    return {"last_conv_rms_over_he": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
                                      "n": len(ratios)},
            "classifier_rms": float(classifier.weight.detach().pow(2).mean().sqrt())}


def _is_end(name: str) -> bool:
    """A zero-started layer of fixup-lab's CIFAR ResNet under Fixup: each branch's last convolution, the classifier."""
    return name.endswith("conv2.weight") or name.startswith("fc.")


@contextlib.contextmanager
def ends_at(mult: float) -> Iterator[None]:
    """While open, the engine's parameter groups put the zero-started layers (:func:`_is_end`) in groups of their own
    at ``mult`` times their group's rate (a probe: the engine has no such option)."""
    import fixup.train.optim as optim

    plain = optim.config_groups

    def groups(model: nn.Module, config: Any) -> list[dict[str, Any]]:
        out = []
        for g in plain(model, config):
            for is_end in (False, True):
                pairs = [(p, n) for p, n in zip(g["params"], g["param_names"], strict=True) if _is_end(n) == is_end]
                if pairs:
                    out.append({**g, "name": g["name"] + ("_ends" if is_end else ""),
                                "lr": g["lr"] * (mult if is_end else 1.0), "params": [p for p, _ in pairs],
                                "param_names": [n for _, n in pairs]})
        return out

    optim.config_groups = groups
    try:
        yield
    finally:
        optim.config_groups = plain


@contextlib.contextmanager
def ends_bounded(bound: float | None) -> Iterator[None]:
    """While open, every optimiser step is followed by scaling each branch's last convolution (in the ``_ends``
    groups of :func:`ends_at`) back to an RMS of ``bound`` x He's std where it exceeds that; ``None``: no bound."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    @torch.no_grad()
    def project(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            if not str(group.get("name", "")).endswith("_ends"):
                continue
            for p in group["params"]:
                if p.dim() == 4:  # the groups hold no names here: the only convolutions in them are the conv2s
                    cap = bound * math.sqrt(2.0 / p[0].numel())
                    rms = float(p.pow(2).mean().sqrt())
                    if rms > cap:
                        p.mul_(cap / rms)

    handle = register_optimizer_step_post_hook(project) if bound is not None else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def probe(norm: str, lr: float, ends_mult: float = 1.0, bound: float | None = None) -> dict[str, Any]:
    from fixup.train import TrainConfig, fit

    with warnings.catch_warnings(), ends_at(ends_mult), ends_bounded(bound):
        warnings.simplefilter("ignore")  # Opacus's hook warnings
        result = fit(TrainConfig.from_dict({**BASE, "norm": norm, "lr": lr}), progress=False)
    return {"norm": norm, "lr": lr, "ends_lr_mult": ends_mult, "ends_rms_bound": bound, "outcome": str(result.outcome),
            "test_acc": result.final.get("test_acc"), **weight_scale(result.model)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=["fixup:0.2", "fixup:0.5", "groupnorm:0.5"],
                   metavar="NORM:LR[:K[:B]]",
                   help="the (norm, rate) pairs to train (default fixup:0.2 fixup:0.5 groupnorm:0.5); a third field K "
                        "trains the zero-started layers (each branch's last convolution, the classifier) at K x lr; a "
                        "fourth B bounds each branch's last convolution's RMS to B x He's std after every step")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in args.runs:
        norm, lr, *rest = spec.split(":")
        mult = float(rest[0]) if rest else 1.0
        bound = float(rest[1]) if len(rest) > 1 else None
        row = probe(norm, float(lr), mult, bound)
        rows.append(row)
        s = row["last_conv_rms_over_he"]
        ends = f" (zero-started layers at {mult:g} x lr)" if rest else ""
        ends += f" (their RMS bounded to {bound:g} x He)" if bound is not None else ""
        print(f"{norm} lr {lr}{ends}: test accuracy {100 * row['test_acc']:.1f}%; branches' last convolution RMS / "
              f"He std {s['min']:.2f} to {s['max']:.2f} (median {s['median']:.2f}, n={s['n']}); classifier RMS "
              f"{row['classifier_rms']:.3f}", flush=True)
    if args.json:
        command = "python benchmarks/private_weight_scale.py " + " ".join(sys.argv[1:])
        Path(args.json).write_text(json.dumps({"command": command, "settings": BASE, "torch": torch.__version__,
                                               "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
