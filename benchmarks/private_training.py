"""Private training (DP-SGD through Opacus) of residual networks without normalisation, beside the GroupNorm route.

    # the table (issue 36, item 2): two architectures x five routes x epsilon 8 and 1 x seeds 0-2
    PYTHONPATH=src python benchmarks/private_training.py --json benchmarks/results/private_training.json
    # ResNet-20 on 8x8 digits at epsilon 8 (about an hour on one core): the committed table
    PYTHONPATH=src python benchmarks/private_training.py --archs resnet20 --image-size 0 --channels 0 \\
        --epsilons 8 --lrs 0.1 0.2 0.5 1 --json benchmarks/results/private_training_resnet20_search.json
    # the clipping bound searched with the rate (rates as products lr x C), Fixup and GroupNorm at epsilon 8
    PYTHONPATH=src python benchmarks/private_training.py --archs resnet20 --image-size 0 --channels 0 \\
        --epsilons 8 --routes fixup groupnorm --lrs 0.2 0.5 1 --max-grad-norms 0.1 0.3 1 --lr-times-bound \\
        --json benchmarks/results/private_training_resnet20_clip_search.json
    # the non-private control: the same runs and search without DP, what privacy costs each route
    PYTHONPATH=src python benchmarks/private_training.py --archs resnet20 --image-size 0 --channels 0 \\
        --non-private --routes fixup groupnorm --lrs 0.02 0.05 0.1 0.2 0.5 \\
        --json benchmarks/results/private_training_resnet20_non_private.json
    # step time only: every route side by side in one process (ratios to GroupNorm)
    PYTHONPATH=src python benchmarks/private_training.py --archs resnet20 --image-size 0 --channels 0 --timing 15 \\
        --json benchmarks/results/private_step_time_resnet20.json
    # smoke test: WRN-10-1 on 8x8 digits, one epoch, epsilon 8, seed 0, rate 0.5
    PYTHONPATH=src python benchmarks/private_training.py --quick

Every run is ``fixup.train.fit`` with ``dp=True`` (the engine's private training, fixup.train.private: Poisson
sampling, each example's gradient clipped to the bound C, Gaussian noise solved so that the run's steps
spend ``--epsilons`` at ``--delta`` under the RDP accountant) on digits (1,437 train / 360 test, the library's fixed
split), by default upsampled to 32x32 with three channels so that timm's ResNet-18 keeps spatial extent. SGD over
``fixup.param_groups`` (scalars at their own rate), cosine schedule, no weight decay, evaluation after the last
epoch. The seed fixes initialisation, sampling and noise.

The rate and the clipping bound: each (architecture, epsilon, route) trains at its own peak rate and per-example
clipping bound C, chosen jointly on a validation split and never on the test set. A stratified ``--val-fraction`` of
the training set (fixed by the split seed) is held out; each pair of a bound of ``--max-grad-norms`` (default: 1
alone, the tables before the bound was searched) and a rate of ``--lrs`` (with ``--lr-times-bound``: ``--lrs`` are
products lr x C, and bound C trains at each product / C) trains on the rest with ``--search-seeds`` and is scored by
its mean validation accuracy (a failed run scores 0; ties go to the smaller rate, then the smaller bound); where the
best pair's rate is the largest (smallest) searched at its bound, the search goes on at that bound at a rate twice as
large (small), at most twice each way. The chosen pair then trains on the whole training set with ``--seeds`` and
is measured on the test set. ``--lr`` instead sets one rate for every route (no search; one bound). As usual in the
DP literature (De et al. 2022 tune the bound with the rate), the search's own privacy cost is not counted in the
epsilon reported.

Architectures (``--archs``): ``resnet20`` (fixup-lab's CIFAR ResNet-20), ``timm-resnet18`` (timm's ResNet-18 class,
``timm.create_model("resnet18", num_classes=10)``, built offline), ``wrn10-1`` (fixup-lab's Wide-ResNet-10-1: the
smoke test's). Routes (``--routes``), each on every architecture:

- ``fixup``: Fixup (fixup-lab's own model at ``norm="fixup"``; timm's through ``fixup.adapt``);
- ``skipinit`` / ``rezero``: the same with SkipInit's / ReZero's gates;
- ``nf_resnet``: the NF-ResNet of the same depth (scaled weight standardisation, the authors' zero-started skip
  gains; ``norm="none", init="nf_resnet"``; timm's through ``fixup.adapt(method="nf_resnet")``): normalisation-free
  and, like GroupNorm,
  insensitive to its convolutions' scale, which DP-SGD's noise inflates;
- ``groupnorm``, the reference route: the same architecture with GroupNorm where it had BatchNorm and no in-place
  addition on a module's output. fixup-lab's models at ``norm="groupnorm"``; timm's ResNet-18 as Opacus's
  ``ModuleValidator.fix`` makes it (each BatchNorm becomes ``GroupNorm(min(32, C), C)``), its ReLUs out of place
  and its blocks adding the shortcut out of place (``OutOfPlaceBasicBlock``, the same computation);
- ``he``: He initialisation without normalisation and without scalars (fixup-lab's ``norm="none"``; timm's with
  each BatchNorm removed, its convolutions as timm draws them, Kaiming-normal fan-out).

Memory: Opacus keeps one gradient per example of every parameter; timm's ResNet-18 has 11.2M, 45 MB per example in
fp32, so its expected batch of 239 (``--batch-size 256``) needs about 11 GB for them alone: run it on a GPU, or
lower ``--batch-size`` on a CPU. Under dp the adapted models are measured on noise of the images' shape, not on
training images (fixup.train.image_task). Per run: test accuracy, the epsilon spent, the median seconds per
optimiser step (from the second step; data, forward, per-example backward, clipping, noise, update), and peak
memory: CUDA's peak allocated bytes, or on the CPU the process's peak resident set (each run in a fresh process; the
resident set before training is recorded beside it). A run that fails (Opacus refusing a model, an in-place
operation breaking its hooks, ...) is a row carrying the error's first line; the table goes on. The published
anchor, for direction only: De et al. 2022 reach 81.4% on CIFAR-10 at epsilon 8 with GroupNorm and weight
standardisation.

The run store: with --json PATH (or --runs STORE) each run is appended to PATH.runs.jsonl as it ends, and a rerun of
the command reads the runs found there instead of training them (the rate search included: its choices follow from
the stored runs), so a grid of hour-long runs (timm's ResNet-18 on a CPU) resumes across sessions.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fixup._io import RecordLog

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "src" / "fixup").is_dir():
    sys.path.insert(0, str(_ROOT / "src"))
sys.path.insert(0, str(_ROOT / "tests"))

ARCHS = ("resnet20", "timm-resnet18", "wrn10-1")
ROUTES = ("fixup", "skipinit", "rezero", "nf_resnet", "groupnorm", "he")
_OURS = {"resnet20": {"model": "resnet_cifar", "depth": 20}, "wrn10-1": {"model": "wide_resnet", "depth": 10,
                                                                          "width": 1}}
# fixup-lab's models: the route as (norm, init) of fixup.create_model.
_OUR_ROUTES = {"fixup": ("fixup", ""), "skipinit": ("", "skipinit"), "rezero": ("", "rezero"),
               "nf_resnet": ("", "nf_resnet"), "groupnorm": ("groupnorm", ""), "he": ("none", "")}


# -- timm's ResNet-18 in the reference and He forms (loaded by the engine as --adapt THIS_FILE:factory) -------------
def _timm() -> Any:
    from _torchvision_shim import install

    install()  # timm imports torchvision; see tests/_torchvision_shim.py
    import timm

    return timm


def _out_of_place(model: nn.Module) -> nn.Module:
    """``model`` with no in-place operation on a module's output: ReLUs out of place, blocks adding out of place."""
    from timm.models.resnet import BasicBlock

    for module in model.modules():
        if hasattr(module, "inplace"):
            module.inplace = False
        if type(module) is BasicBlock:
            module.__class__ = _basic_block_class()
    return model


@functools.cache
def _basic_block_class() -> type:
    from timm.models.resnet import BasicBlock

    class OutOfPlaceBasicBlock(BasicBlock):
        """timm's BasicBlock computing the same function with ``x = x + shortcut`` in place of ``x += shortcut``."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shortcut = x
            x = self.aa(self.act1(self.drop_block(self.bn1(self.conv1(x)))))
            x = self.bn2(self.conv2(x))
            if self.se is not None:
                x = self.se(x)
            if self.drop_path is not None:
                x = self.drop_path(x)
            if self.downsample is not None:
                shortcut = self.downsample(shortcut)
            return self.act2(x + shortcut)

    return OutOfPlaceBasicBlock


def timm_resnet18(num_classes: int, in_channels: int) -> nn.Module:
    """timm's ResNet-18 as registered (BatchNorm): what fixup.adapt receives on the fixup/skipinit/rezero routes."""
    return _timm().create_model("resnet18", pretrained=False, num_classes=num_classes, in_chans=in_channels)


def timm_resnet18_groupnorm(num_classes: int, in_channels: int) -> nn.Module:
    """The reference route: BatchNorm -> GroupNorm(min(32, C), C) by Opacus's ModuleValidator.fix, out of place."""
    from opacus.validators import ModuleValidator

    return _out_of_place(ModuleValidator.fix(timm_resnet18(num_classes, in_channels)))


def timm_resnet18_he(num_classes: int, in_channels: int) -> nn.Module:
    """He without normalisation: each BatchNorm removed (Identity), timm's Kaiming fan-out convolutions, no in-place
    operation."""
    model = timm_resnet18(num_classes, in_channels)
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    for name in norms:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, nn.Identity())
    return _out_of_place(model)


# -- one run --------------------------------------------------------------------------------------------------------
def config_for(arch: str, route: str, epsilon: float, seed: int, lr: float, opts: dict[str, Any]) -> dict[str, Any]:
    """The flat TrainConfig options of one run (``epsilon`` infinite: the non-private control, same budget)."""
    private = ({"dp": True, "target_epsilon": epsilon, "delta": opts["delta"], "max_grad_norm": opts["max_grad_norm"],
                "accountant": "rdp", **({"dp_physical_batch": opts["dp_physical_batch"]}
                                        if opts.get("dp_physical_batch") else {})}
               if math.isfinite(epsilon) else {})  # the control clips as the engine does by default (global norm 1)
    common = {"dataset": "digits", "image_size": opts["image_size"], "channels": opts["channels"],
              "batch_size": opts["batch_size"], "epochs": opts["epochs"], "lr": lr,
              "momentum": opts["momentum"], "weight_decay": 0.0, "schedule": "cosine", "eval_every": opts["epochs"],
              "checkpoint": False, "seed": seed, "device": opts["device"], **private,
              **({"max_updates": opts["max_updates"]} if opts.get("max_updates") else {}),
              **opts.get("overrides", {})}
    if arch in _OURS:
        norm, init = _OUR_ROUTES[route]
        return {**common, **_OURS[arch], "norm": norm, "init": init}
    here = str(Path(__file__).resolve())
    if route in ("fixup", "skipinit", "rezero", "nf_resnet"):
        return {**common, "adapt": f"{here}:timm_resnet18", "norm": "fixup" if route == "fixup" else "",
                "init": "" if route == "fixup" else route}
    factory = {"groupnorm": "timm_resnet18_groupnorm", "he": "timm_resnet18_he"}[route]
    return {**common, "adapt": f"{here}:{factory}", "norm": route if route == "groupnorm" else "none"}


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["scalar_lr_mult=1", "schedule=\"constant\""]`` as TrainConfig fields (each value JSON, else a string);
    a ValueError names an item without ``=`` or a field TrainConfig does not have."""
    import dataclasses

    from fixup.train import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a TrainConfig field (e.g. "
                             f"scalar_lr_mult=1){'' if not sep else f'; {key!r} is not one'}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one (arch, route, epsilon, seed); a failure is returned as a row with its error, never raised."""
    import warnings

    torch.set_num_threads(spec["threads"])
    row = {k: spec[k] for k in ("arch", "route", "epsilon", "seed", "lr")}
    row["max_grad_norm"] = spec.get("max_grad_norm", spec["opts"]["max_grad_norm"])
    row["split"] = "validation" if spec.get("val_fraction") else "test"
    rss_before = _rss_mb()
    cuda = spec["opts"]["device"] != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    stamps: list[float] = []

    def on_step(_info: Any) -> None:
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    try:
        from fixup.train import TrainConfig, fit

        opts = {**spec["opts"], "max_grad_norm": row["max_grad_norm"]}
        config = TrainConfig.from_dict(config_for(spec["arch"], spec["route"], spec["epsilon"], spec["seed"],
                                                  spec["lr"], opts))
        task = None
        if spec.get("val_fraction"):  # the rate search: train on the training part, evaluate on the validation part
            from fixup.data import load_images, split_validation
            from fixup.train.image_task import ImageClassification

            data = load_images(config.dataset, image_size=config.image_size, channels=config.channels,
                               split_seed=config.split_seed, test_fraction=config.test_fraction)
            task = ImageClassification(config, data=split_validation(data, spec["val_fraction"],
                                                                     seed=config.split_seed))
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus's and torch's hook warnings, once per process
            result = fit(config, progress=False, on_step=on_step, task=task)
        steps = [b - a for a, b in itertools.pairwise(stamps)]
        row.update({"status": str(result.outcome), "reason": result.outcome.reason,
                    "acc": result.final.get("test_acc"), "epsilon_spent": result.privacy.get("epsilon"),
                    "noise_multiplier": result.privacy.get("noise_multiplier"), "steps": result.outcome.step,
                    "s_per_step": statistics.median(steps) if steps else None,
                    "seconds": round(time.perf_counter() - started, 1)})
    except Exception as err:  # a failed route is a row of the table, not the end of it
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        row.update({"status": "failed", "error": f"{type(err).__name__}: {first[:300]}"})
    if cuda:
        row.update({"peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20, "memory": "cuda peak allocated"})
    else:
        row.update({"peak_memory_mb": _rss_mb(), "rss_before_mb": rss_before, "memory": "cpu peak resident set"})
    return row


# What identifies a run in the run store (--runs): the run's own choices and the protocol its result depends on.
RUN_KEYS = ("arch", "route", "epsilon", "seed", "lr", "max_grad_norm", "split", "val_fraction", "protocol")


def run_key(spec: dict[str, Any]) -> dict[str, Any]:
    """A run's key in the store: where the device or the physical batch differ the run is the same."""
    opts = {k: v for k, v in spec["opts"].items() if k not in ("device", "dp_physical_batch", "max_grad_norm")}
    return {"arch": spec["arch"], "route": spec["route"], "epsilon": spec["epsilon"], "seed": spec["seed"],
            "lr": spec["lr"], "max_grad_norm": spec.get("max_grad_norm", spec["opts"]["max_grad_norm"]),
            "split": "validation" if spec.get("val_fraction") else "test",
            "val_fraction": spec.get("val_fraction") or 0.0, "protocol": json.dumps(opts, sort_keys=True)}


def run_all(specs: list[dict[str, Any]], jobs: int, log: RecordLog) -> list[dict[str, Any]]:
    """Each run in a fresh process (its peak memory is its own), ``jobs`` at a time; a run already in ``log`` is
    read from it, and each new one is added to it as it ends."""
    os.environ["OMP_NUM_THREADS"] = str(specs[0]["threads"]) if specs else "1"
    found = [log.get(**run_key(spec)) for spec in specs]
    todo = [spec for spec, row in zip(specs, found, strict=True) if row is None]
    if len(todo) < len(specs):
        print(f"  {len(specs) - len(todo)} of {len(specs)} runs read from {log.path}", file=sys.stderr, flush=True)
    new = []
    with ProcessPoolExecutor(max(1, jobs), mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        for spec, row in zip(todo, pool.map(run_one, todo), strict=True):
            if row["status"] == "interrupted":  # a signal stopped the run: not a result, and not stored
                raise SystemExit(f"interrupted during {row['arch']} {row['route']} lr {row['lr']:g} seed "
                                 f"{row['seed']}; the finished runs are in {log.path}: rerun the command to resume")
            new.append(log.add({**run_key(spec), **row}))
            spent = f"epsilon {row['epsilon_spent']:.2f}" if row.get("epsilon_spent") else "non-private"
            shown = (f"{100 * row['acc']:.1f}%, {spent}, "
                     f"{1000 * (row['s_per_step'] or 0):.0f} ms/step" if row["status"] == "completed" else
                     row.get("error") or f"{row['status']}: {row.get('reason', '')}")
            print(f"  {row['arch']} {row['route']} eps {row['epsilon']:g} lr {row['lr']:g} "
                  f"C {row['max_grad_norm']:g} seed {row['seed']} "
                  f"({row['split']}): {shown}",
                  file=sys.stderr, flush=True)
    fresh = iter(new)
    return [row if row is not None else next(fresh) for row in found]


# -- step time, side by side -----------------------------------------------------------------------------------------
def time_steps(arch: str, routes: list[str], steps: int, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Milliseconds per private optimiser step of each route, measured side by side in one process: the models built
    as training builds them, each made private by fixup.private.make_private (Opacus: per-example gradients,
    clipping, noise), then stepped in turn, route after route, ``steps`` rounds on one fixed batch of the training
    run's expected size; the first two rounds are warm-up. Interleaving exposes every route to the same load, so the
    ratios hold on a busy machine where the training runs' own step times do not."""
    import warnings

    from fixup import param_groups
    from fixup.private import make_private
    from fixup.train import TrainConfig
    from fixup.train.image_task import ImageClassification

    torch.manual_seed(0)
    state = {}
    for route in routes:
        config = TrainConfig.from_dict(config_for(arch, route, 8.0, 0, 0.1, {**opts, "device": "cpu"}))
        task = ImageClassification(config)
        x = task.first_batch()
        y = torch.randint(0, task.data.num_classes, (x.shape[0],))
        model = task.build_model(config)
        optimizer = torch.optim.SGD(param_groups(model, 0.1), momentum=0.9)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=x.shape[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, _, _, _ = make_private(model, optimizer, loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                                     example=x[:2], poisson_sampling=False)
        state[route] = (model.train(), optimizer, x, y, [])
    for round_ in range(steps + 2):
        for model, optimizer, x, y, times in state.values():
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the hooks' warning on inputs without gradients
                nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if round_ >= 2:
                times.append(time.perf_counter() - started)
    ref = statistics.median(state["groupnorm"][4]) if "groupnorm" in state else None
    return [{"arch": arch, "route": route, "batch": int(x.shape[0]), "steps": steps,
             "ms_per_step": 1000 * statistics.median(times),
             "ratio_to_groupnorm": statistics.median(times) / ref if ref else None}
            for route, (_, _, x, _, times) in state.items()]


# -- the rate and the clipping bound, chosen on a validation split ---------------------------------------------------
EXTEND = 2.0  # a best rate at the edge of those searched at its bound: search this many times beyond it ...
MAX_EXTENSIONS = 2  # ... at most this many times each way
Setting = tuple[float, float]  # (peak rate, clipping bound C)


def _key(row: dict[str, Any]) -> tuple[str, float, str]:
    return row["arch"], row["epsilon"], row["route"]


def rate_grids(lrs: list[float], bounds: list[float], lr_times_bound: bool) -> dict[float, list[float]]:
    """The rates searched at each clipping bound: ``lrs`` as given, or (``lr_times_bound``) each divided by the bound,
    so that ``lrs`` are products lr x C: while every example is clipped a step is lr x C times the mean clipped
    direction plus noise of std lr x C x sigma / B, so the product, not the rate, sets the step."""
    return {c: [float(f"{r / c:.3g}") if lr_times_bound else r for r in lrs] for c in bounds}


def rate_scores(search: list[dict[str, Any]]) -> dict[tuple[str, float, str], dict[Setting, float]]:
    """Mean validation accuracy per (arch, epsilon, route) and (rate, bound) over the search seeds (a failed or
    diverged run counts as 0)."""
    acc: dict[tuple[str, float, str], dict[Setting, list[float]]] = {}
    for r in search:
        ok = r["status"] == "completed" and r.get("acc") is not None
        setting = (r["lr"], r.get("max_grad_norm", 1.0))
        acc.setdefault(_key(r), {}).setdefault(setting, []).append(r["acc"] if ok else 0.0)
    return {k: {st: statistics.fmean(v) for st, v in settings.items()} for k, settings in acc.items()}


def best_setting(scores: dict[Setting, float]) -> Setting:
    """The (rate, bound) with the highest validation accuracy; ties go to the smaller rate, then the smaller bound."""
    return max(sorted(scores), key=lambda st: scores[st])


def extension(scores: dict[Setting, float], grids: dict[float, list[float]]) -> Setting | None:
    """The next setting to search where the best rate is the largest (smallest) searched at its bound, or None."""
    lr, bound = best_setting(scores)
    rates, grid = [r for r, c in scores if c == bound], grids[bound]
    if lr == max(rates) and sum(r > max(grid) for r in rates) < MAX_EXTENSIONS:
        return float(f"{lr * EXTEND:.3g}"), bound
    if lr == min(rates) and sum(r < min(grid) for r in rates) < MAX_EXTENSIONS:
        return float(f"{lr / EXTEND:.3g}"), bound
    return None


def search_rates(base: list[dict[str, Any]], grids: dict[float, list[float]], seeds: list[int], val_fraction: float,
                 jobs: int, log: RecordLog) -> tuple[list[dict[str, Any]], dict[tuple[str, float, str], Setting]]:
    """Every (arch, epsilon, route) of ``base`` trained at each bound and each rate of its grid (and beyond a best
    rate at the edge of its bound's grid) on the training part, scored on the validation part; returns the search's
    rows and the chosen (rate, bound) of each."""
    def runs(b: dict[str, Any], lr: float, bound: float) -> list[dict[str, Any]]:
        return [{**b, "lr": lr, "max_grad_norm": bound, "seed": s, "val_fraction": val_fraction} for s in seeds]

    rows: list[dict[str, Any]] = []
    todo = [spec for b in base for bound, grid in grids.items() for lr in grid for spec in runs(b, lr, bound)]
    while todo:
        rows += run_all(todo, jobs, log)
        scores = rate_scores(rows)
        todo = []
        for b in base:
            more = extension(scores[_key(b)], grids)
            if more is not None and more not in scores[_key(b)]:
                todo += runs(b, *more)
    scores = rate_scores(rows)
    return rows, {k: best_setting(v) for k, v in scores.items()}


# -- the table ------------------------------------------------------------------------------------------------------
def _t95(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (arch, epsilon, route): accuracy mean, std, 95% interval (Student's t), n; ms per step; peak memory."""
    out = []
    keys = sorted({(r["arch"], r["epsilon"], r["route"]) for r in rows},
                  key=lambda k: (ARCHS.index(k[0]), -k[1], ROUTES.index(k[2])))
    for arch, eps, route in keys:
        cell = [r for r in rows if (r["arch"], r["epsilon"], r["route"]) == (arch, eps, route)]
        done = [r for r in cell if r["status"] != "failed"]
        accs = [r["acc"] for r in done if r["acc"] is not None]
        n = len(accs)
        mean = statistics.fmean(accs) if accs else None
        std = statistics.stdev(accs) if n > 1 else 0.0 if n else None
        half = _t95(n) * std / math.sqrt(n) if n > 1 else None
        times = [r["s_per_step"] for r in done if r.get("s_per_step")]
        out.append({"arch": arch, "epsilon": eps, "route": route, "lr": cell[0]["lr"],
                    "max_grad_norm": cell[0].get("max_grad_norm", 1.0), "n": n, "acc_mean": mean,
                    "acc_std": std,
                    "acc_ci95": None if half is None else [mean - half, mean + half],
                    "ms_per_step": 1000 * statistics.median(times) if times else None,
                    "peak_memory_mb": max((r["peak_memory_mb"] for r in done), default=None),
                    "epsilon_spent": max((r["epsilon_spent"] for r in done if r.get("epsilon_spent")), default=None),
                    "outcomes": sorted(r["status"] for r in cell),
                    "errors": sorted({r["error"] for r in cell if r.get("error")})})
    return out


def verdicts(summary: list[dict[str, Any]], epsilon: float = 8.0) -> list[dict[str, Any]]:
    """The issue's target per architecture at ``epsilon``: Fixup's mean at or above the GroupNorm route's 95% interval
    (its lower end), and fewer milliseconds per step."""
    out = []
    for arch in ARCHS:
        cells = {s["route"]: s for s in summary if s["arch"] == arch and s["epsilon"] == epsilon}
        fx, gn = cells.get("fixup"), cells.get("groupnorm")
        if not fx or not gn:
            continue
        if fx["acc_mean"] is None or gn["acc_mean"] is None:
            out.append({"arch": arch, "epsilon": epsilon, "verdict": "not measured: a route failed on every seed"})
            continue
        if min(fx["n"], gn["n"]) < 2:
            out.append({"arch": arch, "epsilon": epsilon, "verdict": f"not judged: n={min(fx['n'], gn['n'])} (a 95% "
                                                                    "interval needs two seeds or more)"})
            continue
        low = gn["acc_ci95"][0]
        faster = (fx["ms_per_step"] is not None and gn["ms_per_step"] is not None
                  and fx["ms_per_step"] < gn["ms_per_step"])
        out.append({"arch": arch, "epsilon": epsilon, "accurate": fx["acc_mean"] >= low, "faster": faster,
                    "fixup_acc": fx["acc_mean"], "groupnorm_ci95_low": low, "fixup_ms": fx["ms_per_step"],
                    "groupnorm_ms": gn["ms_per_step"], "n": min(fx["n"], gn["n"])})
    return out


def table(summary: list[dict[str, Any]], memory: str) -> str:
    lines = [f"| architecture | epsilon | route | rate | clipping bound | accuracy mean ± std (n) | 95% interval | "
             f"ms/step | peak MB ({memory}) | epsilon spent | outcomes |", "|---" * 11 + "|"]
    for s in summary:
        acc = (f"{100 * s['acc_mean']:.1f} ± {100 * s['acc_std']:.1f} ({s['n']})" if s["acc_mean"] is not None
               else "failed")
        ci = f"{100 * s['acc_ci95'][0]:.1f}-{100 * s['acc_ci95'][1]:.1f}" if s["acc_ci95"] else ""
        ms = f"{s['ms_per_step']:.0f}" if s["ms_per_step"] is not None else ""
        mem = f"{s['peak_memory_mb']:.0f}" if s["peak_memory_mb"] is not None else ""
        eps = f"{s['epsilon_spent']:.2f}" if s["epsilon_spent"] is not None else ""
        outcomes = ", ".join(f"{o} x{s['outcomes'].count(o)}" for o in sorted(set(s["outcomes"])))
        bound = f"{s['max_grad_norm']:g}" if math.isfinite(s["epsilon"]) else "global 1"
        lines.append(f"| {s['arch']} | {s['epsilon']:g} | {s['route']} | {s['lr']:g} | {bound} | "
                     f"{acc} | {ci} | {ms} | {mem} | {eps} | {outcomes} |")
        lines += [f"|  |  |  |  |  | error: {e[:120]} |  |  |  |  |  |" for e in s["errors"]]  # whole in the JSON
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", nargs="+", choices=ARCHS, default=["resnet20", "timm-resnet18"])
    p.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    p.add_argument("--epsilons", nargs="+", type=float, default=[8.0, 1.0], help="target epsilons (default 8 1)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=256, help="expected examples per step (Poisson: 1437 // steps)")
    p.add_argument("--lrs", nargs="+", type=float, default=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
                   help="SGD peak rates of the weights (cosine to 0) searched per (architecture, epsilon, route) on "
                        "the validation split, extended beyond a best rate at the edge (default 0.02 0.05 0.1 0.2 "
                        "0.5 1: at epsilon 1 Fixup learns only near 0.02)")
    p.add_argument("--lr", type=float, default=None, help="one rate for every route: no search")
    p.add_argument("--val-fraction", type=float, default=0.2, help="of the training set, held out for the search")
    p.add_argument("--search-seeds", nargs="+", type=int, default=[0], help="seeds of the search's runs")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--max-grad-norms", nargs="+", type=float, default=[1.0],
                   help="per-example clipping bounds C, searched jointly with the rate (default 1: one bound)")
    p.add_argument("--lr-times-bound", action="store_true",
                   help="read --lrs as products lr x C: at bound C the rates searched are --lrs / C (the step's size "
                        "while every example is clipped stays the product)")
    p.add_argument("--dp-physical-batch", type=int, default=0, metavar="N",
                   help="process each Poisson batch in chunks of at most N examples (0: whole)")
    p.add_argument("--max-updates", type=int, default=0, help="stop each run after this many steps (0: all epochs)")
    p.add_argument("--image-size", type=int, default=32, help="digits upsampled to this (0: as stored, 8x8)")
    p.add_argument("--channels", type=int, default=3, help="input channels (0: as stored, 1)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--quick", action="store_true", help="smoke test: wrn10-1 on 8x8 digits, 1 epoch, epsilon 8, "
                                                        "seed 0, batch 512")
    p.add_argument("--timing", type=int, default=0, metavar="N",
                   help="only measure step time: N interleaved private steps of each route per architecture, side by "
                        "side in one process (ratios to the GroupNorm route); no training")
    p.add_argument("--non-private", action="store_true",
                   help="the control: every run without DP (no per-example clipping and no noise: shuffled "
                        "batches, the engine's default clipping of the global gradient norm to 1; epsilon shown as "
                        "inf), the same budget, schedule and rate search; --epsilons is ignored")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="TrainConfig fields for every run, values as JSON (e.g. scalar_lr_mult=1 weight_decay=5e-4)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the settings, every run and the table")
    p.add_argument("--runs", default=None, metavar="PATH",
                   help="the run store (default: JSON.runs.jsonl beside --json): each run is appended as it ends and "
                        "read back instead of trained again, so a stopped command resumes by running it again")
    args = p.parse_args()
    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as err:
        p.error(str(err))
    if args.quick:
        args.archs, args.epsilons, args.seeds, args.epochs = ["wrn10-1"], [8.0], [0], 1
        args.image_size, args.channels, args.batch_size, args.lr = 0, 0, 512, 0.5
    if args.non_private:
        args.epsilons = [math.inf]
    opts = {k: getattr(args, k) for k in ("image_size", "channels", "batch_size", "epochs", "momentum", "delta",
                                          "device", "dp_physical_batch", "max_updates")}
    opts["overrides"] = overrides
    opts["max_grad_norm"] = args.max_grad_norms[0]
    if args.lr is not None and len(args.max_grad_norms) > 1:
        p.error(f"--lr {args.lr:g} sets one rate without a search, but --max-grad-norms gives "
                f"{len(args.max_grad_norms)} bounds to search; give one bound, or drop --lr to search both")
    if args.timing:
        torch.set_num_threads(args.threads)
        timed = [row for a in args.archs for row in time_steps(a, [r for r in args.routes if not (
            a not in _OURS and r == "nf_resnet")], args.timing, opts)]
        for row in timed:
            ratio = f", {row['ratio_to_groupnorm']:.2f}x GroupNorm's" if row["ratio_to_groupnorm"] else ""
            print(f"{row['arch']} {row['route']}: {row['ms_per_step']:.0f} ms per private step (batch {row['batch']}, "
                  f"median of {row['steps']}){ratio}")
        if args.json:
            command = "python benchmarks/private_training.py " + " ".join(sys.argv[1:])
            Path(args.json).write_text(json.dumps({"command": command, "threads": args.threads, "torch":
                                                   torch.__version__, "timing": timed}, indent=1) + "\n")
        return
    base = [{"arch": a, "route": r, "epsilon": e, "opts": opts, "threads": args.threads}
            for a in args.archs for e in args.epsilons for r in args.routes]
    log = RecordLog.beside(args.json, RUN_KEYS, args.runs)
    for note in log.notes:
        print(note, file=sys.stderr)
    start = time.time()
    search: list[dict[str, Any]] = []
    if args.lr is None:
        grids = rate_grids(args.lrs, args.max_grad_norms, args.lr_times_bound)
        search, chosen = search_rates(base, grids, args.search_seeds, args.val_fraction, args.jobs, log)
    else:
        chosen = {_key(b): (args.lr, args.max_grad_norms[0]) for b in base}
    rows = run_all([{**b, "lr": chosen[_key(b)][0], "max_grad_norm": chosen[_key(b)][1], "seed": s}
                    for b in base for s in args.seeds], args.jobs, log)
    summary = summarise(rows)
    memory = rows[0]["memory"] if rows else ""
    print(table(summary, memory))
    checks = verdicts(summary)
    for v in checks:
        if "verdict" in v:
            print(f"target ({v['arch']}, epsilon {v['epsilon']:g}): {v['verdict']}")
        else:
            print(f"target ({v['arch']}, epsilon {v['epsilon']:g}, n={v['n']}): Fixup {100 * v['fixup_acc']:.1f}% vs "
                  f"the GroupNorm route's 95% interval from {100 * v['groupnorm_ci95_low']:.1f}%: "
                  f"{'met' if v['accurate'] else 'not met'}; {v['fixup_ms']:.0f} vs {v['groupnorm_ms']:.0f} ms/step: "
                  f"{'faster' if v['faster'] else 'not faster'}")
    print("anchor (direction only): De et al. 2022, CIFAR-10 at epsilon 8 with GroupNorm and weight "
          "standardisation: 81.4%")
    command = "python benchmarks/private_training.py " + " ".join(sys.argv[1:])
    print(f"{len(rows)} runs (and {len(search)} in the search), {time.time() - start:.0f} s wall; command: {command}")
    if args.json:
        import opacus

        out = {"settings": {**vars(args), "command": command, "torch": torch.__version__,
                            "opacus": opacus.__version__, "cuda": torch.cuda.get_device_name()
                            if torch.cuda.is_available() else None},
               "search": search, "runs": rows, "summary": summary, "target": checks,
               "table": table(summary, memory)}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
