"""Transfer without normalisation (issue 37, item 3): fine-tune a trained BatchNorm ResNet on a shifted task.

    PYTHONPATH=src OMP_NUM_THREADS=1 nice python benchmarks/transfer.py --json benchmarks/results/transfer.json
    PYTHONPATH=src python benchmarks/transfer.py --smoke          # every route and setting, a few steps: seconds

Task. Digits as stored (8x8, one channel; the fixed stratified split, 1,437 train / 360 test). The source task is
classes 0-4; the target task is classes 5-9, held out from pre-training (labels 0-4 again). The target's training
images are split once (stratified, seed 0) into 80% for fine-tuning and 20% for validation; every choice below is
made on validation, and the test images of classes 5-9 are used for the reported accuracy only.

Per seed: the library's BatchNorm ResNet (``resnet_cifar``, depth 20) is trained on the source task by the engine
(``fixup.train.fit``: SGD, lr 0.1, momentum 0.9, weight decay 5e-4, batch 32, cosine, --pretrain-steps steps). Its
classifier is replaced by a zero-initialised one with 5 outputs (as BiT does), and each route fine-tunes a copy
on the target task with the same budget, through the engine (``fit`` with the model handed in; SGD, momentum
0.9, no weight decay, cosine schedule, the engine's gradient clipping at global norm 1):

* ``converted``: ``fixup.convert`` (every BatchNorm folded exactly, Fixup's scalars at identity), trained without
  normalisation over ``fixup.param_groups``;
* ``bn_train``: the original, BatchNorm in train mode (batch statistics; running statistics for evaluation);
* ``bn_frozen``: BatchNorm with its running statistics frozen (eval statistics), its affine trained;
* ``groupnorm``: BatchNorm replaced by GroupNorm as Opacus's ``ModuleValidator.fix`` does (its own call): the
  trained convolutions kept, the norm new;
* ``adapt_scratch``: no transfer, ``fixup.adapt`` of a fresh BatchNorm ResNet-20 (Fixup from scratch).

Settings: ``b32`` (batch 32, --steps steps: 150), ``b2`` (batch 2, --steps-b2 steps: 300) and ``dp`` (DP-SGD
through the engine's ``--dp``: Poisson batches of 32 expected, per-example clipping at 1, epsilon 8 at delta 1e-5
over the run's --steps-dp steps: 100, RDP accountant). BatchNorm in train mode cannot run under Opacus: its row
records the engine's refusal. Each route's learning rate is chosen per setting from --lrs-* by the mean validation
accuracy over the seeds; for ``converted`` the recipe's other choices are searched one at a time at its chosen rate
(scalars at the weights' rate, ``scalar_lr_mult`` 1, instead of 0.1; no clipping instead of the global norm at 1; a
linear warm-up over 10% of the steps): :data:`VARIANTS`. Reported: test accuracy of the chosen configuration, mean,
std, n and a 95% interval (Student's t).

Budget (the whole command, n=3): 3 pre-trainings of 300 steps (about 12 s each), then per seed 5 routes x 4 rates
at b32 and b2, 4 x 4 under dp (BatchNorm in train mode: one refusal), and the variants of ``converted`` (3 at b32
and b2, 2 under dp): 192 fine-tunings of 100-300 steps at 8x8. On one thread of the shared 2-core machine a b32 or
b2 run takes about 5 s and a private one 10-15 s: 19 minutes in all, measured.

The run store: with --json PATH (or --runs STORE), each fine-tuning run is appended to PATH.runs.jsonl as it ends,
and a rerun reads the runs found there instead of training them (pre-training only the seeds it still needs). A
stopped command resumes by running it again, and a long grid can be split across processes that share one store
(``--routes`` or ``--seeds`` apart) and tabled by a last command over the whole grid that trains nothing new.

Architectures (``--arch``): ``resnet20`` (above, 8x8 digits as stored) or ``timm-resnet18``: timm's ResNet-18 class
(``timm.create_model("resnet18")``, 11.2M parameters, built offline; needs ``PYTHONPATH=src:tests`` for the
torchvision shim) on the digits upsampled to 32x32 with three channels, pre-trained from a seeded draw by the same
engine recipe; on every route its blocks add the shortcut out of place and its ReLUs are out of place (the same
function; Opacus needs it), the GroupNorm route as in benchmarks/private_training.py. A b32 run of it takes about
45 s on one thread, a b2 run about 15 s.
"""

from __future__ import annotations

import argparse
import copy
import math
import shlex
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import fixup
from fixup._convert import ChannelAffine
from fixup._io import RecordLog, atomic_write, write_json
from fixup.data.images import ImageData, TensorImages, load_digits
from fixup.train import TrainConfig, fit
from fixup.train.image_task import ImageClassification

ROUTES = ("converted", "bn_train", "bn_frozen", "groupnorm", "adapt_scratch")
SETTINGS = ("b32", "b2", "dp")
NORMALISED = ("bn_train", "bn_frozen", "groupnorm")  # the normalised alternatives of the target
# The converted route's recipe, searched one choice at a time at its chosen rate (config changes to TrainConfig).
VARIANTS: dict[str, dict[str, Any]] = {"scalars at lr (scalar_lr_mult 1)": {"scalar_lr_mult": 1.0},
                                       "no clipping": {"clip": "none"},
                                       "warm-up 10%": {"warmup_steps": -10}}  # negative: percent of the run's steps
# what identifies a run in the run store: the architecture, the budgets, and the run's own choices
RUN_KEYS = ("arch", "depth", "pretrain_steps", "steps", "route", "setting", "lr", "seed", "variant")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


# --- data -------------------------------------------------------------------------------------------------------

@dataclass
class Split:
    """The source task, and the target task with its test images or its validation images as ``test``."""

    source: ImageData
    target_val: ImageData
    target_test: ImageData


def split_digits(val_fraction: float = 0.2, size: int = 0, channels: int = 0) -> Split:
    """Digits 0-4 (source) and 5-9 (target, relabelled 0-4; its training images split into fine-tune/validation),
    as stored or resized to ``size`` with ``channels`` channels."""
    from sklearn.model_selection import train_test_split

    d = load_digits(size=size, channels=channels)
    (xtr, ytr), (xte, yte) = (s.batch(torch.arange(len(s))) for s in (d.train, d.test))

    def part(x: Tensor, y: Tensor, classes: range) -> TensorImages:
        keep = (y >= classes.start) & (y < classes.stop)
        return TensorImages(x[keep], y[keep] - classes.start)

    src_train, src_test = part(xtr, ytr, range(0, 5)), part(xte, yte, range(0, 5))
    tgt, tgt_test = part(xtr, ytr, range(5, 10)), part(xte, yte, range(5, 10))
    ft, va = train_test_split(range(len(tgt)), test_size=val_fraction, random_state=0, stratify=tgt.labels.numpy())
    ft, va = torch.tensor(sorted(ft)), torch.tensor(sorted(va))
    tgt_train, tgt_val = (TensorImages(tgt.images[i], tgt.labels[i]) for i in (ft, va))

    def data(name: str, train: TensorImages, test: TensorImages) -> ImageData:
        return ImageData(name, train, test, num_classes=5, in_channels=d.in_channels, image_size=d.image_size,
                         mean=d.mean, std=d.std, source="scikit-learn digits")

    return Split(data("digits 0-4", src_train, src_test), data("digits 5-9 (validation)", tgt_train, tgt_val),
                 data("digits 5-9 (test)", tgt_train, tgt_test))


class _Given(ImageClassification):
    """Image classification on ``data`` with a model built beforehand (the route's), handed to the engine."""

    def __init__(self, config: TrainConfig, data: ImageData, model: nn.Module | None) -> None:
        super().__init__(config, data)
        self.model = model

    def build_model(self, config: TrainConfig) -> nn.Module:
        if self.model is None:
            self.model = super().build_model(config)
        return self.model


def accuracy(model: nn.Module, data: ImageData) -> float:
    from fixup.data import normalize

    x, y = data.test.batch(torch.arange(len(data.test)))
    model.eval()
    with torch.no_grad():
        return (model(normalize(x, data.mean, data.std)).argmax(1) == y).float().mean().item()


# --- the architectures ------------------------------------------------------------------------------------------

ARCHS = ("resnet20", "timm-resnet18")
_INPUT = {"resnet20": (1, 8), "timm-resnet18": (3, 32)}  # (channels, image size) each is trained on


def _private_training() -> Any:
    """benchmarks/private_training.py, for its timm ResNet-18 helpers (loaded by path: benchmarks is no package)."""
    import importlib.util

    name = "private_training_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("private_training.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def fresh_model(arch: str, depth: int, seed: int) -> nn.Module | None:
    """A freshly drawn BatchNorm model of ``arch`` with 5 classes, seeded; ``None`` for resnet20, which the engine
    builds from its config (as the committed runs did)."""
    if arch == "resnet20":
        return None
    if arch == "timm-resnet18":
        torch.manual_seed(seed)
        return _private_training().timm_resnet18(5, _INPUT[arch][0])
    raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")


def _out_of_place(model: nn.Module, arch: str) -> nn.Module:
    return _private_training()._out_of_place(model) if arch == "timm-resnet18" else model


# --- the routes -------------------------------------------------------------------------------------------------

class FrozenStatistics(nn.Module):
    """``(x - mean) / sqrt(var + eps)`` per channel with fixed statistics (buffers), in train mode too."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        super().__init__()
        self.eps = bn.eps
        self.register_buffer("mean", bn.running_mean.detach().clone())
        self.register_buffer("var", bn.running_var.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean[:, None, None]) * torch.rsqrt(self.var[:, None, None] + self.eps)


def freeze_batchnorm(model: nn.Module) -> nn.Module:
    """Each BatchNorm2d as its eval-mode function: frozen statistics, then its affine, trainable (ChannelAffine)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.BatchNorm2d):
            affine = ChannelAffine(child.num_features)
            with torch.no_grad():
                affine.weight.copy_(child.weight)
                affine.bias.copy_(child.bias)
            setattr(model, name, nn.Sequential(FrozenStatistics(child), affine))
        else:
            freeze_batchnorm(child)
    return model


def new_head(pretrained: nn.Module, classes: int) -> nn.Module:
    """A copy of the pre-trained model with a zero-initialised classifier of ``classes`` outputs, in eval mode."""
    model = copy.deepcopy(pretrained)
    model.fc = nn.Linear(model.fc.in_features, classes)
    nn.init.zeros_(model.fc.weight)
    nn.init.zeros_(model.fc.bias)
    return model.eval()


def route_model(route: str, pretrained: nn.Module, depth: int, seed: int, arch: str = "resnet20") -> nn.Module:
    """The model a route fine-tunes, in train mode, from the pre-trained BatchNorm model (its classifier replaced)."""
    return _route_model(route, pretrained, depth, seed, arch).train()


def _route_model(route: str, pretrained: nn.Module, depth: int, seed: int, arch: str) -> nn.Module:
    model = copy.deepcopy(pretrained)
    channels, size = _INPUT[arch]
    example = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        if route == "converted":
            model, report = fixup.convert(model.eval(), example)
            if not report.exact:
                raise RuntimeError(f"the conversion was not exact: {report}")
            return model
        if route == "bn_train":
            return _out_of_place(model, arch)
        if route == "bn_frozen":
            return _out_of_place(freeze_batchnorm(model), arch)
        if route == "groupnorm":
            from opacus.validators import ModuleValidator

            return _out_of_place(ModuleValidator.fix(model), arch)
        if route == "adapt_scratch":
            fresh = fresh_model(arch, depth, seed)
            if fresh is None:
                torch.manual_seed(seed)
                fresh = fixup.create_model("resnet_cifar", depth=depth, norm="batchnorm", num_classes=5,
                                           in_channels=1)
            model, _ = fixup.adapt(fresh, example)
            return model
    raise ValueError(f"unknown route {route!r}; choose one of {', '.join(ROUTES)}")


# --- runs -------------------------------------------------------------------------------------------------------

def finetune_config(setting: str, lr: float, steps: dict[str, int], seed: int, **changes: Any) -> TrainConfig:
    """The engine's config for one fine-tuning run of a setting (the model is handed in, so norm is 'none')."""
    batch, total = (2 if setting == "b2" else 32), steps[setting]
    base = {"norm": "none", "optimizer": "sgd", "lr": lr, "momentum": 0.9, "weight_decay": 0.0,
            "schedule": "cosine", "batch_size": batch, "epochs": 10_000, "max_updates": total, "seed": seed,
            "eval_every": 10_000, "checkpoint": False, "collapse_patience": 0}
    if setting == "dp":
        base.update(dp=True, target_epsilon=8.0, delta=1e-5, max_grad_norm=1.0)
    if changes.get("warmup_steps", 0) < 0:
        changes = {**changes, "warmup_steps": max(1, round(-changes["warmup_steps"] / 100 * total))}
    return TrainConfig(**{**base, **changes}).validate()


def pretrain(split: Split, depth: int, steps: int, seed: int, arch: str = "resnet20",
             cache: Path | None = None) -> tuple[nn.Module, float]:
    """The BatchNorm ResNet trained on the source task by the engine; its source test accuracy. With ``cache`` (a
    folder), the trained weights are kept there and loaded (``weights_only``) by every later call, in this process
    or another: the first process to need a seed trains it, under a lock, and the others wait and load it."""
    config = TrainConfig(model="resnet_cifar", depth=depth, norm="batchnorm", lr=0.1, momentum=0.9,
                         weight_decay=5e-4, schedule="cosine", batch_size=32, epochs=10_000, max_updates=steps,
                         seed=seed, eval_every=10_000, checkpoint=False).validate()
    task = _Given(config, split.source, fresh_model(arch, depth, seed))
    if cache is None:
        return _pretrained(config, task, seed)
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    file = cache / f"{arch}-depth{depth}-steps{steps}-seed{seed}.pt"
    with open(cache / f".{file.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if file.exists():
            model = task.build_model(config)
            model.load_state_dict(torch.load(file, weights_only=True))
            return model.eval(), accuracy(model, split.source)
        model, acc = _pretrained(config, task, seed)
        with atomic_write(file, "wb") as f:
            torch.save(model.state_dict(), f)
        return model, acc


def _pretrained(config: TrainConfig, task: _Given, seed: int) -> tuple[nn.Module, float]:
    result = fit(config, task=task, progress=False)
    if result.outcome != "completed":
        raise RuntimeError(f"pre-training seed {seed} ended {result.outcome}: {result.outcome.reason}")
    return task.model.eval(), accuracy(task.model, task.data)


def finetune(route: str, setting: str, pretrained: nn.Module, split: Split, config: TrainConfig,
             depth: int, arch: str = "resnet20") -> dict[str, Any]:
    """One fine-tuning run: validation and test accuracy, the outcome, epsilon under dp, seconds."""
    start = time.perf_counter()
    model = route_model(route, pretrained, depth, config.seed, arch)
    record: dict[str, Any] = {"route": route, "setting": setting, "seed": config.seed, "lr": config.lr}
    try:
        result = fit(config, task=_Given(config, split.target_val, model), progress=False)
    except ValueError as err:  # a route the engine refuses (BatchNorm under dp): the reason is the result
        return {**record, "refused": str(err)}
    record.update(outcome=str(result.outcome), val_acc=accuracy(model, split.target_val),
                  test_acc=accuracy(model, split.target_test), seconds=time.perf_counter() - start)
    if config.dp:
        record["epsilon"] = result.privacy.get("epsilon")
    return record


# --- statistics and the table -----------------------------------------------------------------------------------

def summary(values: list[float]) -> dict[str, Any]:
    """Mean, std, n and the 95% interval (Student's t) of accuracies in [0, 1], as percentages."""
    n = len(values)
    mean = 100 * statistics.mean(values)
    std = 100 * statistics.stdev(values) if n > 1 else 0.0
    half = T975.get(n - 1, 1.96) * std / math.sqrt(n) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "n": n, "ci95": [mean - half, mean + half], "values": [100 * v for v in values]}


def choose(runs: list[dict[str, Any]], route: str, setting: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The configuration of ``route`` in ``setting`` with the best mean validation accuracy, and its runs."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r["route"] == route and r["setting"] == setting and "val_acc" in r:
            groups.setdefault((r["lr"], r.get("variant", "")), []).append(r)
    if not groups:
        return {}, []
    key = max(groups, key=lambda k: (statistics.mean(r["val_acc"] for r in groups[k]), k[1] == ""))
    return {"lr": key[0], "variant": key[1] or "recipe base"}, groups[key]


def table(rows: list[dict[str, Any]], n: int) -> str:
    lines = [f"test accuracy (%), classes 5-9 after transfer from 0-4; mean ± std (n = {n} seeds), 95% interval; "
             "configuration chosen on validation",
             "| route | " + " | ".join(SETTINGS) + " |", "|---|" + "---|" * len(SETTINGS)]
    for route in ROUTES:
        cells = []
        for setting in SETTINGS:
            row = next(r for r in rows if r["route"] == route and r["setting"] == setting)
            if "refused" in row:
                why = next((part for part in row["refused"].split(". ") if "per-example gradients" in part),
                           row["refused"][:100])
                cells.append(f"refused by the engine: {why.split(': build')[0].strip(' .')}")
            elif "test" not in row:
                cells.append("")
            else:
                s = row["test"]
                chosen = f"lr {row['chosen']['lr']:g}" + ("" if row["chosen"]["variant"] == "recipe base"
                                                          else f", {row['chosen']['variant']}")
                cells.append(f"{s['mean']:.1f} ± {s['std']:.1f} [{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}] "
                             f"({chosen})")
        lines.append(f"| {route} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's target: converted within 1 point of the best normalised route at b32, ahead of each at b2 and dp."""
    out: dict[str, Any] = {}
    for setting in SETTINGS:
        mean = {r["route"]: r["test"]["mean"] for r in rows if r["setting"] == setting and "test" in r}
        if "converted" not in mean:
            continue
        others = {k: v for k, v in mean.items() if k in NORMALISED}
        if not others:
            continue
        best = max(others, key=others.get)
        gap = mean["converted"] - others[best]
        met = gap >= -1.0 if setting == "b32" else all(mean["converted"] > v for v in others.values())
        out[setting] = {"converted": mean["converted"], "best_normalised": best, "best_normalised_mean": others[best],
                        "difference": gap, "target": "within 1 point" if setting == "b32" else "ahead of every one",
                        "met": met}
    return out


def pooled(first: dict[str, Any], more: dict[str, Any]) -> str:
    """Each route at the rate ``first`` chose for it (its base recipe), over the seeds of both runs; and the
    converted route's lead over each normalised route, paired by seed (same pre-trained model), with its 95%
    interval. ``more`` is a run at the chosen rates on other seeds."""
    runs = [r for out in (first, more) for r in out["runs"] if "test_acc" in r and "variant" not in r]
    chosen = {(r["setting"], r["route"]): r["chosen"]["lr"] for r in first["rows"] if "chosen" in r}
    acc: dict[tuple[str, str], dict[int, float]] = {}
    for r in runs:
        if chosen.get((r["setting"], r["route"])) == r["lr"]:
            acc.setdefault((r["setting"], r["route"]), {})[r["seed"]] = r["test_acc"]
    lines = ["| setting | route (rate) | test accuracy, mean ± std [95%] | n | converted minus it, paired [95%] |",
             "|---|---|---|---|---|"]
    for setting in SETTINGS:
        conv = acc.get((setting, "converted"), {})
        for route in ("converted", *NORMALISED):
            cell = acc.get((setting, route))
            if not cell:
                continue
            s = summary(list(cell.values()))
            diff = ""
            if route != "converted":
                seeds = sorted(set(cell) & set(conv))
                d = summary([conv[k] - cell[k] for k in seeds])
                diff = f"{d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] (n = {d['n']})"
            lines.append(f"| {setting} | {route} ({chosen[setting, route]:g}) | {s['mean']:.1f} ± {s['std']:.1f} "
                         f"[{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}] | {s['n']} | {diff} |")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--arch", default="resnet20", choices=ARCHS,
                   help="the pre-trained model: fixup-lab's resnet_cifar at 8x8, or timm's ResNet-18 at 32x32x3")
    p.add_argument("--depth", type=int, default=20, help="resnet_cifar depth (6n+2)")
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--steps", type=int, default=150, help="fine-tuning steps at batch 32")
    p.add_argument("--steps-b2", type=int, default=300, help="fine-tuning steps at batch 2")
    p.add_argument("--lrs-b32", nargs="+", type=float, default=[0.03, 0.1, 0.3, 1.0])
    p.add_argument("--lrs-b2", nargs="+", type=float, default=[0.003, 0.01, 0.03, 0.1])
    p.add_argument("--steps-dp", type=int, default=100, help="fine-tuning steps under dp")
    p.add_argument("--lrs-dp", nargs="+", type=float, default=[0.01, 0.03, 0.1, 0.3])
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    p.add_argument("--no-variants", action="store_true", help="skip the converted route's recipe search")
    p.add_argument("--smoke", action="store_true", help="depth 8, a few steps, one seed and rate: seconds")
    p.add_argument("--json", default=None, help="write the command, settings, every run, the table and the verdict")
    p.add_argument("--runs", default=None, metavar="PATH",
                   help="the run store (default: JSON.runs.jsonl beside --json): each run is appended as it ends and "
                        "read back instead of trained again, so a stopped command resumes and processes given "
                        "different --routes or --seeds can share one grid")
    p.add_argument("--pool", nargs=2, metavar=("FIRST", "MORE"), default=None,
                   help="train nothing: pool two JSON files (the rates chosen in FIRST, more seeds in MORE) and print "
                        "each route over all seeds with the converted route's paired lead")
    args = p.parse_args(argv)
    if args.pool:
        import json

        first, more = (json.loads(Path(f).read_text()) for f in args.pool)
        print(pooled(first, more))
        return {"pooled": pooled(first, more)}
    if args.smoke:
        args.seeds, args.depth, args.pretrain_steps = args.seeds[:1], 8, 4
        args.steps = args.steps_b2 = args.steps_dp = 3
        args.lrs_b32, args.lrs_b2, args.lrs_dp = args.lrs_b32[:1], args.lrs_b2[:1], args.lrs_dp[:1]
    torch.set_num_threads(1)
    path = "src" if args.arch == "resnet20" else "src:tests"  # timm needs the torchvision shim of tests/
    command = f"PYTHONPATH={path} OMP_NUM_THREADS=1 python benchmarks/transfer.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    channels, size = _INPUT[args.arch] if args.arch != "resnet20" else (0, 0)  # resnet20: digits as stored
    split = split_digits(size=size, channels=channels)
    lrs = {"b32": args.lrs_b32, "b2": args.lrs_b2, "dp": args.lrs_dp}
    steps = {"b32": args.steps, "b2": args.steps_b2, "dp": args.steps_dp}
    # Opacus's notes (the RDP order range, a full backward hook on an input without grad) and torch's, not results
    warnings.filterwarnings("ignore", category=UserWarning, module=r"opacus\.|fixup\.train\.engine")
    store = RecordLog.beside(args.json, RUN_KEYS, args.runs)
    for note in store.notes:
        print(note, file=sys.stderr)
    pretrained: dict[int, dict[str, Any]] = {}  # pre-trained lazily: a resumed command may need none
    started = time.perf_counter()

    def source_model(seed: int) -> dict[str, Any]:
        if seed not in pretrained:
            model, acc = pretrain(split, args.depth, args.pretrain_steps, seed, args.arch,
                                  None if store.path is None else store.path.with_name(store.path.name + ".pretrained"))
            pretrained[seed] = {"model": new_head(model, 5), "source_test_acc": acc}
            print(f"seed {seed}: pre-trained on 0-4, test {100 * acc:.1f}%", file=sys.stderr, flush=True)
        return pretrained[seed]

    def run(route: str, setting: str, lr: float, seed: int, variant: str = "", **changes: Any) -> dict[str, Any]:
        key = {"arch": args.arch, "depth": args.depth, "pretrain_steps": args.pretrain_steps,
               "steps": steps[setting], "route": route, "setting": setting, "lr": lr, "seed": seed,
               **({"variant": variant} if variant else {})}
        found = store.get(**key)
        if found is not None:
            return found
        source = source_model(seed)
        config = finetune_config(setting, lr, steps, seed, **changes)
        record = finetune(route, setting, source["model"], split, config, args.depth, args.arch)
        if record.get("outcome") == "interrupted":  # a signal stopped the run: not a result, and not stored
            raise SystemExit(f"interrupted during {route} {setting} lr {lr:g} seed {seed}; the {len(store.records)} "
                             f"finished runs are in {store.path}: rerun the command to resume")
        return store.add({**key, **record, "source_test_acc": source["source_test_acc"]})

    runs: list[dict[str, Any]] = []
    for setting in args.settings:
        for route in args.routes:
            for lr in lrs[setting]:
                for seed in args.seeds:
                    runs.append(run(route, setting, lr, seed))
                    if "refused" in runs[-1]:
                        break
                if "refused" in runs[-1]:
                    break
            done = [r for r in runs if r["route"] == route and r["setting"] == setting]
            print(f"{setting} {route}: {len(done)} runs, {time.perf_counter() - started:.0f} s", file=sys.stderr,
                  flush=True)
        if "converted" in args.routes and not args.no_variants:
            base, _ = choose(runs, "converted", setting)
            for variant, changes in VARIANTS.items():
                if setting == "dp" and "clip" in changes:  # under dp per-example clipping replaces the engine's
                    continue
                for seed in args.seeds:
                    runs.append(run("converted", setting, base["lr"], seed, variant, **changes))
            print(f"{setting} converted variants: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for setting in args.settings:
        for route in args.routes:
            refused = next((r["refused"] for r in runs if r["route"] == route and r["setting"] == setting
                            and "refused" in r), None)
            if refused:
                rows.append({"route": route, "setting": setting, "refused": refused})
                continue
            chosen, chosen_runs = choose(runs, route, setting)
            rows.append({"route": route, "setting": setting, "chosen": chosen,
                         "val": summary([r["val_acc"] for r in chosen_runs]),
                         "test": summary([r["test_acc"] for r in chosen_runs]),
                         "outcomes": [r["outcome"] for r in chosen_runs]})
    for setting in SETTINGS:  # a setting not run gets empty cells
        for route in ROUTES:
            if not any(r["route"] == route and r["setting"] == setting for r in rows):
                rows.append({"route": route, "setting": setting})
    out = {"command": command, "settings": {k: v for k, v in vars(args).items() if k != "json"},
           "data": {"source": len(split.source.train), "source_test": len(split.source.test),
                    "target_finetune": len(split.target_val.train), "target_val": len(split.target_val.test),
                    "target_test": len(split.target_test.test)},
           "pretrained": {r["seed"]: {"source_test_acc": r["source_test_acc"]} for r in runs
                          if "source_test_acc" in r},
           "runs": runs, "rows": rows, "table": table(rows, len(args.seeds)), "verdict": verdict(rows),
           "seconds": time.perf_counter() - started}
    print(out["table"])
    for setting, v in out["verdict"].items():
        print(f"{setting}: converted {v['converted']:.1f} vs best normalised {v['best_normalised']} "
              f"{v['best_normalised_mean']:.1f} ({v['difference']:+.1f}); target {v['target']}: "
              f"{'met' if v['met'] else 'not met'}")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
