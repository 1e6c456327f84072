"""``fixup.adapt`` on third-party models: the accounting of every model in tests/adapt_zoo.py, and digits
accuracy of real timm classes, adapted (no normalisation) beside the same model with its normalisation.

    PYTHONPATH=src python benchmarks/adapt_zoo.py --only accounting   # the first table (about a minute)
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only training --jobs 2   # the training table (see below)
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only signal   # the stream at initialisation, per trunk rule
    PYTHONPATH=src python benchmarks/adapt_zoo.py --only training --models regnetx_002 efficientnet_b0 \
        --adapt-option trunk=none --seeds 0 1     # the same loop under another option of fixup.adapt

Training (the README's own-loop recipe): digits (1,437 train / 360 test, the library's fixed split)
upsampled to 32x32, three channels, standardised; SGD over ``fixup.param_groups(model, lr=0.1,
weight_decay=5e-4)`` with momentum 0.9, batch 64, ``--steps`` steps (150) at a constant rate, the global
gradient norm clipped at 1 before each step (``--clip``); the seed fixes the initialisation and the batch
order. "adapted" is ``fixup.adapt(model, x[:2], **adapt_options)`` on two training images; "normalised" is
the same model untouched, trained by the same loop (its groups hold only weights). Accuracy on the 360 test
digits after the last step; a run whose loss turns non-finite stops there and is marked diverged (its
accuracy, at chance, still counts in the mean). Each cell runs on ``--threads`` torch threads (1).
``--recipe vit`` trains both forms as Vision Transformers are trained instead: AdamW at 1e-3 with decoupled
weight decay 0.05 (weights only, as fixup.param_groups groups them), a linear warm-up over the first tenth of
the steps and a cosine decay to zero, the same clipping:

    PYTHONPATH=src python benchmarks/adapt_zoo.py --only training --recipe vit --models vit_tiny_patch16_224

Models: timm's resnet18, regnetx_002, efficientnet_b0, mobilenetv3_small_050 and convnext_atto as
registered, and vit_tiny_patch16_224 at img_size 32, patch 4 (65 tokens) with ``--vit-depth`` of its 12
blocks (6 by default, for CPU time). timm imports through tests/_torchvision_shim.py. Also accepted: any
name of tests/adapt_zoo.py's ZOO and "resnet18 (fixup-lab)" (the library's own, ``--resnet18-width``).

With --json PATH (or --runs STORE) every training run is appended to PATH.runs.jsonl as it ends and read back by a
rerun instead of trained again: a stopped table resumes by running the same command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _torchvision_shim import install as _install_torchvision_shim

_install_torchvision_shim()  # before anything imports torchvision

import fixup  # noqa: E402
from fixup._io import RecordLog  # noqa: E402
from fixup.data.images import load_images  # noqa: E402

TIMM = ("resnet18", "regnetx_002", "efficientnet_b0", "mobilenetv3_small_050", "convnext_atto",
        "vit_tiny_patch16_224")
# More timm classes that --models takes (not in the default table): a pre-activation ResNet (normalisation before
# each branch's first layer, on the stream side) and a hybrid whose attention blocks sit inside convolutional stages
# (issue 38, item 1), each at its registered size.
TIMM_MORE = ("resnetv2_18", "mobilevit_xxs")
VIT_BLOCKS = 6  # of vit_tiny's 12: a 12-block cell costs about twice a 6-block one
# The library's own ResNet-18 (torchvision's layout, built by fixup.create_model under Fixup or BatchNorm).
OURS = "resnet18 (fixup-lab)"
FORMS = ("adapted", "normalised")
CLIPS = ("norm", "agc", "none")
# The own loop's recipes (``--recipe``), the same for both forms of a model. "sgd": the README's (SGD at a
# constant rate, momentum 0.9). "vit": as Vision Transformers are trained (AdamW, decoupled weight decay 0.05,
# a linear warm-up over the first tenth of the steps, then a cosine decay to zero), so that a ViT row measures
# the method rather than an optimiser that suits neither form (issue 38, item 4).
RECIPES: dict[str, dict[str, object]] = {
    "sgd": {"optimizer": "sgd", "lr": 0.1, "weight_decay": 5e-4, "warmup_fraction": 0.0, "schedule": "constant"},
    "vit": {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.05, "warmup_fraction": 0.1, "schedule": "cosine"},
}


@dataclass(frozen=True)
class Cell:
    """One training run: a model in one form on one seed, under the recipe's settings."""

    model: str
    form: str                     # "adapted" or "normalised"
    seed: int
    steps: int = 150
    lr: float = 0.1               # the weights' peak rate; the scalars' follows from fixup.param_groups
    scalar_lr_mult: float = 0.1
    clip: str = "norm"            # "norm": global gradient norm; "agc": fixup.adaptive_clip_grad_; "none"
    clip_value: float | None = None  # norm: the max norm (1); agc: lambda (the library's default)
    adapt_options: tuple[tuple[str, object], ...] = field(default_factory=tuple)
    vit_depth: int = VIT_BLOCKS
    resnet18_width: int = 16      # "resnet18 (fixup-lab)" and the zoo's torchvision-layout ResNet-18
    threads: int = 1
    recipe: str = "sgd"           # of RECIPES: the optimiser, its weight decay and the rate's schedule
    val_fraction: float = 0.0     # > 0: train on the rest of the training set, score on this held-out part (--lrs)


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as an int, a float, a bool (true/false) or else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--adapt-option {text!r}: expected KEY=VALUE, e.g. trunk=none")
    if raw.lower() in ("true", "false"):
        return key, raw.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def build(cell: Cell) -> torch.nn.Module:
    if cell.model in TIMM + TIMM_MORE:
        from adapt_zoo import import_timm
        extra = {"img_size": 32, "patch_size": 4, "depth": cell.vit_depth} if cell.model.startswith("vit") else {}
        return import_timm().create_model(cell.model, pretrained=False, num_classes=10, **extra)
    if cell.model == OURS:
        return fixup.create_model("resnet18", width=cell.resnet18_width, num_classes=10,
                                  norm="fixup" if cell.form == "adapted" else "batchnorm")
    from adapt_zoo import ZOO, BasicBlock, ResNet
    if cell.model == "resnet18 (torchvision ResNet)":  # torchvision's ResNet-18 layout, at this width
        return ResNet(BasicBlock, [2, 2, 2, 2], width=cell.resnet18_width)
    return ZOO[cell.model].build()


def method_options(spec: str) -> dict[str, object]:
    """``"dyt:alpha0=fitted"`` -> ``{"method": "dyt", "alpha0": "fitted"}`` (values as ``--adapt-option`` parses)."""
    method, _, rest = spec.partition(":")
    return {"method": method, **dict(parse_option(o) for o in rest.split(",") if o)}


def _zoo_names() -> set[str]:
    from adapt_zoo import ZOO
    return set(ZOO)


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


@lru_cache(maxsize=1)
def digits_32() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits at 32x32x3, train and test, normalised by the training images' channel statistics."""
    data = load_images("digits", image_size=32, channels=3)
    out = []
    for split in (data.train, data.test):
        x, y = split.batch(torch.arange(len(split)))
        out += [x.float(), y]
    xtr, ytr, xte, yte = out
    mean, std = xtr.mean((0, 2, 3), keepdim=True), xtr.std((0, 2, 3), keepdim=True)
    return (xtr - mean) / std, ytr, (xte - mean) / std, yte


def held_out(data: tuple[torch.Tensor, ...], fraction: float) -> tuple[torch.Tensor, ...]:
    """The training set split for the rate search: ``fraction`` of each class held out (the first of a permutation
    fixed by seed 0), as (train part, its labels, held-out part, its labels); the test set is not touched."""
    xtr, ytr = data[0], data[1]
    order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(0))
    held = torch.zeros(len(ytr), dtype=torch.bool)
    for c in ytr.unique():
        members = order[ytr[order] == c]
        held[members[:round(fraction * len(members))]] = True
    return xtr[~held], ytr[~held], xtr[held], ytr[held]


def _logits(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out["logits"]  # type: ignore[index]


def _clipper(cell: Cell, model: torch.nn.Module):
    if cell.clip == "none":
        return lambda: None
    if cell.clip == "norm":
        max_norm = 1.0 if cell.clip_value is None else cell.clip_value
        return lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    agc = getattr(fixup, "adaptive_clip_grad_", None)
    if agc is None:
        raise SystemExit("--clip agc needs fixup.adaptive_clip_grad_, which this checkout of fixup does not have "
                         "yet (issue 24, item 4); use --clip norm or --clip none")
    # Given the model, AGC leaves the tensors Fixup starts at zero to a global-norm clip (fixup.clip).
    options = {} if cell.clip_value is None else {"clipping": cell.clip_value}
    return lambda: agc(model, **options)


def _optimizer(model: torch.nn.Module, lr: float, scalar_lr_mult: float, recipe: dict[str, object]
               ) -> torch.optim.Optimizer:
    groups = fixup.param_groups(model, lr, weight_decay=float(recipe["weight_decay"]), scalar_lr_mult=scalar_lr_mult)
    if recipe["optimizer"] == "adamw":  # the groups carry the decay; AdamW applies it decoupled
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999))
    return torch.optim.SGD(groups, lr=lr, momentum=0.9)


def _rate_factor(step: int, steps: int, recipe: dict[str, object]) -> float:
    """The rate's factor at ``step`` (0-based): linear warm-up over the first ``warmup_fraction`` of the steps,
    then constant or a cosine to zero at the last step."""
    warmup = round(float(recipe["warmup_fraction"]) * steps)
    if step < warmup:
        return (step + 1) / warmup
    if recipe["schedule"] == "constant":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train_own_loop(model: torch.nn.Module, data: tuple[torch.Tensor, ...], *, steps: int, seed: int, lr: float,
                   scalar_lr_mult: float, clip: Callable[[torch.nn.Module], Callable[[], object]],
                   recipe: str = "sgd") -> tuple[float, float, int | None]:
    """The own loop: ``recipe``'s optimiser (:data:`RECIPES`; "sgd", the README's: SGD with momentum 0.9 and
    weight decay 5e-4 at a constant rate) over ``fixup.param_groups``, batches of 64 in a seeded order,
    ``clip(model)``'s clipping before each step, stopped at a non-finite loss. Returns the test accuracy, the
    last loss and the step it diverged at (None)."""
    xtr, ytr, xte, yte = data
    settings = RECIPES[recipe]
    opt = _optimizer(model, lr, scalar_lr_mult, settings)
    peaks = [g["lr"] for g in opt.param_groups]
    clip_now = clip(model)
    order = torch.Generator().manual_seed(seed)
    model.train()
    perm, pos, loss_value, diverged_at = torch.randperm(len(xtr), generator=order), 0, float("nan"), None
    for step in range(steps):
        if pos + 64 > len(perm):
            perm, pos = torch.randperm(len(xtr), generator=order), 0
        idx = perm[pos:pos + 64]
        pos += 64
        loss = F.cross_entropy(_logits(model(xtr[idx])), ytr[idx])
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            diverged_at = step
            break
        opt.zero_grad()
        loss.backward()
        clip_now()
        for group, peak in zip(opt.param_groups, peaks):
            group["lr"] = peak * _rate_factor(step, steps, settings)
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (_logits(model(xte)).argmax(1) == yte).float().mean().item()
    return acc, loss_value, diverged_at


def run_cell(cell: Cell) -> dict[str, object]:
    """Train one cell; return its accuracy, whether it diverged, its final loss, its wall and CPU time."""
    start, cpu_start = time.time(), time.process_time()
    torch.set_num_threads(cell.threads)
    data = digits_32() if not cell.val_fraction else held_out(digits_32(), cell.val_fraction)
    xtr, ytr, xte, yte = data
    torch.manual_seed(cell.seed)
    model = build(cell)
    if cell.form == "adapted" and cell.model != OURS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, _ = fixup.adapt(model, xtr[:2], **dict(cell.adapt_options))
    acc, loss_value, diverged_at = train_own_loop(model, (xtr, ytr, xte, yte), steps=cell.steps, seed=cell.seed,
                                                  lr=cell.lr, scalar_lr_mult=cell.scalar_lr_mult,
                                                  clip=lambda m: _clipper(cell, m), recipe=cell.recipe)
    return {**asdict(cell), "adapt_options": dict(cell.adapt_options), "acc": acc, "final_loss": loss_value,
            "diverged_at": diverged_at, "seconds": round(time.time() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1)}


def chosen_rates(search: list[dict[str, object]]) -> dict[tuple[str, str], float]:
    """Per (model, form), the rate of the search with the best mean held-out accuracy over the search's seeds (a
    diverged run counts at its accuracy, chance; ties go to the smaller rate)."""
    scores: dict[tuple[str, str], dict[float, list[float]]] = {}
    for r in search:
        scores.setdefault((r["model"], r["form"]), {}).setdefault(r["lr"], []).append(r["acc"])
    return {key: max(sorted(by_rate), key=lambda lr: statistics.fmean(by_rate[lr]))
            for key, by_rate in scores.items()}


def edge_rates(search: list[dict[str, object]], grid: list[float], extend: int) -> dict[tuple[str, str], float]:
    """Per (model, form) whose chosen rate is the largest (smallest) it has tried, the next rate of the grid's
    geometric progression beyond it (the ratio of the grid's two largest (smallest) rates), while fewer than
    ``extend`` rates beyond the grid were tried that way."""
    if len(grid) < 2:
        return {}
    tried: dict[tuple[str, str], set[float]] = {}
    for r in search:
        tried.setdefault((r["model"], r["form"]), set()).add(r["lr"])
    top, bottom = sorted(grid)[-2:], sorted(grid)[:2]
    more = {}
    for key, lr in chosen_rates(search).items():
        rates = sorted(tried[key])
        if lr == rates[-1] and sum(x > top[1] for x in rates) < extend:
            more[key] = lr * top[1] / top[0]
        elif lr == rates[0] and sum(x < bottom[0] for x in rates) < extend:
            more[key] = lr * bottom[0] / bottom[1]
    return more


def _one_thread_worker() -> None:
    torch.set_num_threads(1)


def cell_key(cell: Cell) -> str:
    """A cell's key in the run store: every field but its thread count, which does not change the run."""
    return json.dumps({k: v for k, v in asdict(cell).items() if k != "threads"}, sort_keys=True, default=str)


def run_cells(cells: list[Cell], jobs: int, log: RecordLog | None = None) -> list[dict[str, object]]:
    """Run every cell, in this process (``jobs`` 1) or in ``jobs`` processes of one thread each; a cell already in
    ``log`` (the run store) is read from it, and each new one is added to it as it ends."""
    log = log if log is not None else RecordLog(None, ("cell",))
    found = {cell_key(c): log.get(cell=cell_key(c)) for c in cells}
    results = [{k: v for k, v in r.items() if k != "cell"} for r in found.values() if r is not None]
    cells = [c for c in cells if found[cell_key(c)] is None]
    if results:
        print(f"  {len(results)} runs read from {log.path}", file=sys.stderr, flush=True)

    def done(cell: Cell, r: dict[str, object]) -> None:
        log.add({"cell": cell_key(cell), **r})
        results.append(r)
        diverged = r["diverged_at"] is not None
        state = f"diverged at step {r['diverged_at']}" if diverged else f"loss {r['final_loss']:.3f}"
        print(f"  {r['model']} {r['form']} seed {r['seed']}: {100 * r['acc']:.1f}% ({state}, {r['seconds']} s, "
              f"{r['cpu_seconds']} CPU s)",
              file=sys.stderr, flush=True)

    if jobs <= 1:
        for cell in cells:
            done(cell, run_cell(cell))
        return results
    os.environ["OMP_NUM_THREADS"] = "1"  # read by each child's OpenMP at start
    cells = [replace(c, threads=1) for c in cells]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_one_thread_worker) as pool:
        futures = {pool.submit(run_cell, c): c for c in cells}
        for future in as_completed(futures):
            done(futures[future], future.result())
    return results


def _cost(model: str) -> int:  # costliest first, so that the pool ends together
    return {"vit_tiny_patch16_224": 0, "efficientnet_b0": 1, "convnext_atto": 2, "resnet18": 3}.get(model, 4)


def training_table(results: list[dict[str, object]], models: list[str], forms: list[str],
                   seeds: list[int]) -> tuple[list[dict[str, object]], str]:
    """Rows per model and form (accuracy per seed, mean +- std, n, seconds) and their markdown table."""
    rows, lines = [], []
    lines.append("| model | form | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std (n) | s per run (CPU) |")
    lines.append("|---|---|" + "---|" * len(seeds) + "---|---|")
    for model in models:
        for form in forms:
            runs = {r["seed"]: r for r in results if r["model"] == model and r["form"] == form}
            accs = [100 * runs[s]["acc"] for s in seeds if s in runs]
            if not accs:
                continue
            mean = statistics.mean(accs)
            std = statistics.stdev(accs) if len(accs) > 1 else float("nan")
            seconds = statistics.mean(runs[s]["seconds"] for s in seeds if s in runs)
            cpu = statistics.mean(runs[s]["cpu_seconds"] for s in seeds if s in runs)
            rows.append({"model": model, "form": form, "accs": accs, "mean": mean, "std": std, "n": len(accs),
                         "diverged": [s for s in seeds if s in runs and runs[s]["diverged_at"] is not None],
                         "seconds_per_run": round(seconds, 1), "cpu_seconds_per_run": round(cpu, 1)})
            cells = [f"{100 * runs[s]['acc']:.1f}" + (" (diverged)" if runs[s]["diverged_at"] is not None else "")
                     if s in runs else "" for s in seeds]
            spread = f"{mean:.1f} ± {std:.1f} (n={len(accs)})" if len(accs) > 1 else f"{mean:.1f} (n=1)"
            lines.append(f"| {model} | {form} | " + " | ".join(cells) + f" | {spread} | {seconds:.0f} ({cpu:.0f}) |")
    means = {(r["model"], r["form"]): r["mean"] for r in rows}
    gaps = [(m, means[(m, "adapted")] - means[(m, "normalised")]) for m in models
            if (m, "adapted") in means and (m, "normalised") in means]
    if gaps:
        lines += ["", "| model | adapted − normalised (points, of the means) |", "|---|---|"]
        lines += [f"| {m} | {g:+.1f} |" for m, g in gaps]
    return rows, "\n".join(lines)


def signal_table(models: list[str], variants: list[tuple[str, dict[str, object]]], vit_depth: int
                 ) -> tuple[list[dict[str, object]], str]:
    """The stream's RMS at each stage's output over the input's, at initialisation: each model as built
    (normalised, train mode) beside its adapted copy under each variant (a column label and the options of
    fixup.adapt: a trunk rule, or a method); one batch of 8 N(0, 1) images. A variant the model refuses is shown as
    refused, with adapt's reason kept in the rows."""
    from fixup import AdaptError
    from fixup.lab.signal import compare_signal

    rows = []
    lines = ["| model | normalised | " + " | ".join(label for label, _ in variants) + " |",
             "|---|---|" + "---|" * len(variants)]
    for name in models:
        torch.manual_seed(0)
        model = build(Cell(name, "normalised", 0, vit_depth=vit_depth))
        x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        forms: dict[str, object] = {}
        refused: dict[str, str] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, options in variants:
                try:
                    got = compare_signal(model, x, generator=torch.Generator().manual_seed(0), **options)
                except AdaptError as err:
                    refused[label] = str(err)
                    continue
                forms.setdefault("normalised", got["normalised"])
                forms[label] = got["adapted"]
        ratios = {k: [float(f"{r.ratio:.3g}") for r in v.stages] for k, v in forms.items()}
        rows.append({"model": name, **ratios, "refused": refused})
        cells = [" ".join(f"{r:.2g}" for r in ratios[k]) if k in ratios else "refused"
                 for k in ["normalised", *(label for label, _ in variants)]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return rows, "\n".join(lines)


def train_table(args: argparse.Namespace, options: tuple[tuple[str, object], ...], command: str,
                log: RecordLog | None = None) -> dict[str, object]:
    """The training table: every (model, form, seed) at --lr, or at the rate its --lrs search chose."""
    def cell(model: str, form: str, seed: int, lr: float, val_fraction: float = 0.0) -> Cell:
        return Cell(model, form, seed, args.steps, lr, args.scalar_lr_mult, args.clip, args.clip_value, options,
                    args.vit_depth, args.resnet18_width, args.threads, args.recipe, val_fraction)

    models, start = sorted(args.models, key=_cost), time.time()
    search: list[dict[str, object]] = []
    rates = {(m, f): args.lr for m in models for f in args.forms}
    if args.lrs:
        search = run_cells([cell(m, f, s, lr, args.val_fraction) for m in models for f in args.forms
                            for lr in args.lrs for s in args.search_seeds], args.jobs, log)
        while more := edge_rates(search, args.lrs, args.extend):
            search += run_cells([cell(m, f, s, lr, args.val_fraction) for (m, f), lr in more.items()
                                 for s in args.search_seeds], args.jobs, log)
        rates = chosen_rates(search)
        for (m, f), lr in rates.items():
            print(f"  {m} {f}: rate {lr:g} chosen on the held-out part", file=sys.stderr, flush=True)
    cells = [cell(m, f, s, rates[(m, f)]) for m in models for f in args.forms for s in args.seeds]
    runs = run_cells(cells, args.jobs, log)
    rows, table = training_table(runs, args.models, args.forms, args.seeds)
    for row in rows:
        row["lr"] = rates[(row["model"], row["form"])]
    print(table)
    print(f"\n{len(cells)} runs (and {len(search)} in the search), {time.time() - start:.0f} s wall; command: "
          f"{command}")
    return {"runs": runs, "rows": rows, "markdown": table, "search": search,
            "chosen_rates": [{"model": m, "form": f, "lr": lr} for (m, f), lr in rates.items()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("accounting", "training", "signal"), default=None)
    p.add_argument("--trunk-rules", nargs="+", default=["none", "fan_in", "lsuv"],
                   help="signal: the trunk rules of fixup.adapt to compare")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help="signal: compare these methods of fixup.adapt (each at its default trunk) instead of the "
                        "trunk rules; METHOD:KEY=VALUE,... adds options (dyt:alpha0=fitted)")
    p.add_argument("--models", nargs="+", default=list(TIMM),
                   help=f"models to train: of {list(TIMM + TIMM_MORE)} (timm), {OURS!r}, or names of "
                        "tests/adapt_zoo.py's ZOO")
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds to run (n = how many)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--recipe", choices=list(RECIPES), default="sgd",
                   help="the own loop's optimiser and schedule, the same for both forms: sgd (the README's) or vit "
                        "(AdamW, weight decay 0.05, warm-up over a tenth of the steps, cosine decay)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak rate of the weights (scalars: fixup.param_groups); default the recipe's "
                        "(0.1 sgd, 1e-3 vit)")
    p.add_argument("--lrs", nargs="+", type=float, default=None, metavar="LR",
                   help="search these rates per (model, form) instead of one --lr: each trains on the training set "
                        "less a held-out part (--val-fraction) with --search-seeds, the best mean held-out accuracy "
                        "picks the rate, and --seeds then train at it on the whole training set (test accuracy)")
    p.add_argument("--extend", type=int, default=2,
                   help="with --lrs: where the chosen rate is the largest (smallest) tried, search on one grid step "
                        "beyond it, at most this many times each way (0: the grid only)")
    p.add_argument("--val-fraction", type=float, default=0.2, help="with --lrs: of each class, held out")
    p.add_argument("--search-seeds", nargs="+", type=int, default=[0], help="with --lrs: the search's seeds")
    p.add_argument("--scalar-lr-mult", type=float, default=0.1, help="the scalars' rate over lr (0: held fixed)")
    p.add_argument("--clip", choices=CLIPS, default="norm",
                   help="before each step: clip the global gradient norm (norm, at 1), adaptive gradient clipping "
                        "(agc: fixup.adaptive_clip_grad_(model)), or nothing")
    p.add_argument("--clip-value", type=float, default=None,
                   help="norm: the max norm (1); agc: lambda (the library's default)")
    p.add_argument("--adapt-option", action="append", type=parse_option, default=[], metavar="KEY=VALUE",
                   help="forwarded to fixup.adapt for the adapted form (repeatable; int, float, bool or string)")
    p.add_argument("--vit-depth", type=int, default=VIT_BLOCKS,
                   help="blocks of vit_tiny_patch16_224 (12 as registered)")
    p.add_argument("--resnet18-width", type=int, default=16, help=f"base width of {OURS!r} and the zoo's ResNet-18")
    p.add_argument("--threads", type=int, default=1, help="torch threads per cell (with --jobs 1)")
    p.add_argument("--jobs", type=int, default=1, help="run the cells in this many processes, one thread each")
    p.add_argument("--json", default=None, help="write the settings, every run and the tables as JSON")
    p.add_argument("--runs", default=None, metavar="PATH",
                   help="the run store (default: JSON.runs.jsonl beside --json): each training run is appended as "
                        "it ends and read back instead of trained again, so a stopped command resumes")
    args = p.parse_args()
    for name in ("steps", "threads", "jobs", "vit_depth"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lrs and args.lr is not None:
        p.error(f"--lr {args.lr:g} sets one rate and --lrs searches {args.lrs}: give one of them")
    if not 0.0 < args.val_fraction < 1.0:
        p.error(f"--val-fraction must lie strictly between 0 and 1 (e.g. 0.2), got {args.val_fraction}")
    torch.set_num_threads(args.threads)
    if args.only in (None, "training"):
        from adapt_zoo import ZOO
        unknown = [m for m in args.models if m not in TIMM + TIMM_MORE and m != OURS and m not in ZOO]
        if unknown:
            p.error(f"--models: unknown {unknown}; use names of {list(TIMM + TIMM_MORE)} (timm), {OURS!r} or of "
                    "tests/adapt_zoo.py's ZOO")
    options = tuple(args.adapt_option)
    recipe = RECIPES[args.recipe]
    args.lr = float(recipe["lr"]) if args.lr is None else args.lr
    out: dict[str, object] = {"settings": {
        "steps": args.steps, "seeds": args.seeds, "batch": 64, "lr": args.lr, "lrs": args.lrs,
        "extend": args.extend if args.lrs else None, "val_fraction": args.val_fraction if args.lrs else None,
        "search_seeds": args.search_seeds if args.lrs else None,
        "scalar_lr_mult": args.scalar_lr_mult,
        "recipe": {"name": args.recipe, **recipe, "lr": args.lr}, "image_size": 32, "clip": args.clip,
        "clip_value": args.clip_value,
        "adapt_options": dict(options), "vit_depth": args.vit_depth, "threads": args.threads, "jobs": args.jobs,
        "command": " ".join(sys.argv)}}
    if args.only in (None, "accounting"):
        out["accounting"] = rows = accounting()
        for r in rows:
            print(f"| {r['model']} | {r['source']} | {r['result']} | {r.get('L', '')} | {r.get('m', '')} | "
                  f"{r.get('factor', '')} | {r.get('nonlinearities', '')} | {r.get('norms', '')} |", flush=True)
    if args.only in (None, "signal"):
        variants = ([(f"`{m}`", method_options(m)) for m in args.methods] if args.methods else
                    [(f"trunk `{r}`", {"trunk": r}) for r in args.trunk_rules])
        rows, table = signal_table([m for m in args.models if m in TIMM + TIMM_MORE or m in _zoo_names()],
                                   variants, args.vit_depth)
        out["signal"] = {"rows": rows, "markdown": table}
    if args.only in (None, "training"):
        log = RecordLog.beside(args.json, ("cell",), args.runs)
        for note in log.notes:
            print(note, file=sys.stderr)
        out["training"] = train_table(args, options, out["settings"]["command"], log)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
