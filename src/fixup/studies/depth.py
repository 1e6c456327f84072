"""The depth study (the paper's Figure 3): first-epoch test accuracy against depth at learning rate 0.1.

Every method trains at the default BatchNorm rate 0.1 for one epoch on a geometric grid of depths
(paper: Wide-ResNet width 1 on CIFAR-10, 10 to 10,000 layers, batch 128, 64 at 10,000, weight decay
5e-4). A run whose loss stops being finite is recorded as diverged and plotted as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import paper
from ._common import chance_level, image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import NOT_RUN, ClaimRow, verdict
from .grid import Grid
from .stats import group_records, stat
from .store import Store

__all__ = ["STUDY"]

LABELS = {"fixup": "Fixup (stream biases budgeted: our default)", "fixup_paper": "Fixup, the authors' parameterisation",
          "fixup_batch_scaled": "Fixup, lr scaled with the batch (the authors' script)",
          "fixup_no_stream_bias": "Fixup, no stream bias (rule 3 literally)", "batchnorm": "BatchNorm", "lsuv": "LSUV",
          "sqrt2": "1/sqrt(2)", "he": "He, no normalisation", "fixup_no_depth_scale": "Fixup without rule 2",
          "fixup_scalars_fixed": "Fixup, scalars held fixed"}
# Variants of a method that differ only in training options. Every Fixup form trains its scalars at lr/10,
# as the authors' released CIFAR script (github.com/hongyi-zhang/Fixup, cifar/cifar_train.py) does; the
# same script scales the weights' rate with the batch (0.1 x batch / 128): `fixup_batch_scaled` runs that.
# Holding the scalars fixed for the epoch isolates rules 1-2 (the analysis of section 3 has no biases).
VARIANTS = {"fixup_batch_scaled": ("fixup", {"lr_reference_batch": 128}),
            "fixup_scalars_fixed": ("fixup", {"scalar_lr_mult": 0.0})}
# "Learning" in one epoch: test accuracy at least this far above chance (absolute).
LEARNING_MARGIN = 0.2
# "Tracks BatchNorm": within this much of BatchNorm's mean first-epoch accuracy (absolute).
TRACKING_MARGIN = 0.1


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.depth
    tasks = []
    for depth in g.depths:
        batch = g.batch_size_10000 if depth >= 10_000 else g.batch_size
        for method in g.methods:
            base, options = VARIANTS.get(method, (method, {}))
            for seed in range(grid.seeds):
                train = image_train(grid, base, seed, model=g.model, depth=depth, width=g.width, lr=g.lr,
                                    weight_decay=g.weight_decay, batch_size=batch, epochs=g.epochs,
                                    schedule="constant", checkpoint=False, **options)
                cell = Cell("depth", method, {"depth": depth}, seed, config={"train": train},
                            cost=image_cost(grid, depth, g.epochs))
                tasks.append(Task(cell, train_cell))
    return Plan(tasks)


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    methods: dict[str, dict[str, Any]] = {}
    for (method, depth), recs in group_records(records, "method", "depth").items():
        results = [r["result"] for r in recs]
        methods.setdefault(method, {})[str(depth)] = {
            "test_acc": stat(r["test_acc"] for r in results).to_dict(),
            "diverged": sum(bool(r["diverged"]) for r in results),
            "n": len(results),
            "runs": [None if r["diverged"] else r["test_acc"] for r in results],
        }
    depths = sorted({int(d) for m in methods.values() for d in m})
    return {"chance": chance_level(grid), "depths": depths, "methods": methods,
            "scale": _scale(grid, depths)}


def _scale(grid: Grid, depths: list[int]) -> str:
    g = grid.depth
    span = f"{min(depths)}-{max(depths)}" if depths else "none"
    per_example = g.lr / g.batch_size / (paper.DEPTH_PROTOCOL["lr"] / paper.DEPTH_PROTOCOL["batch"])
    return (f"{grid.describe_data()}, {g.model} width {g.width}, depths {span}, {g.epochs} epoch(s), "
            f"lr {g.lr} at batch {g.batch_size} ({per_example:g}x the paper's rate per example), scalars at lr/10, "
            f"{grid.seeds} seeds")


def _at(summary: dict[str, Any], method: str, depth: int) -> dict[str, Any] | None:
    return summary["methods"].get(method, {}).get(str(depth))


def _acc(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not run"
    from .stats import Stat

    s = Stat(**entry["test_acc"])
    div = f", {entry['diverged']}/{entry['n']} diverged" if entry["diverged"] else ""
    return s.format(1, 100, "%") + div


def _fails(entry: dict[str, Any] | None, chance: float) -> bool:
    """Did not learn: every seed diverged, or mean accuracy within LEARNING_MARGIN of chance."""
    if entry is None:
        return False
    mean = entry["test_acc"]["mean"]
    return entry["diverged"] == entry["n"] or mean is None or mean < chance + LEARNING_MARGIN


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    depths, chance, scale = summary["depths"], summary["chance"], summary["scale"]
    if not depths:
        return [ClaimRow(c, "", scale, NOT_RUN, "no depth-study cell has finished")
                for c in ("depth_fixup_trains_deep", "depth_baselines_fail", "no_norm_needs_small_rate")]
    deepest = max(depths)
    paper_scale = grid.data == "cifar10" and deepest >= 10_000
    rows = []
    fx, bn = _at(summary, "fixup", deepest), _at(summary, "batchnorm", deepest)
    if fx is None or bn is None:
        rows.append(ClaimRow("depth_fixup_trains_deep", "", scale, NOT_RUN, "Fixup or BatchNorm was not in the grid"))
    else:
        fx_mean, bn_mean = fx["test_acc"]["mean"], bn["test_acc"]["mean"]
        learns = not _fails(fx, chance) and fx["diverged"] == 0
        tracks = fx_mean is not None and bn_mean is not None and fx_mean >= bn_mean - TRACKING_MARGIN
        variants = {"fixup_paper": "", "fixup_batch_scaled": "", "fixup_no_stream_bias": "", "fixup_scalars_fixed": ""}
        extra = "".join(f"; {LABELS[v]}{note} {_acc(entry)}" for v, note in variants.items()
                        if (entry := _at(summary, v, deepest)) is not None)
        rows.append(ClaimRow(
            "depth_fixup_trains_deep", f"at {deepest} layers: Fixup {_acc(fx)} vs BatchNorm {_acc(bn)}{extra} "
            f"(chance {chance:.0%})", scale, verdict(learns and tracks, paper_scale),
            f"holds if Fixup never diverges, is >= {LEARNING_MARGIN:.0%} above chance and within "
            f"{TRACKING_MARGIN:.0%} of BatchNorm at the deepest depth; learns={learns}, tracks={tracks}"))
    beyond = [d for d in depths if d > 100]
    base = [m for m in ("lsuv", "sqrt2") if m in summary["methods"]]
    if not beyond or not base:
        rows.append(ClaimRow("depth_baselines_fail", "", scale, NOT_RUN,
                             "the grid has no depth beyond 100 layers or no LSUV/1/sqrt(2) run"))
    else:
        fail = all(_fails(_at(summary, m, d), chance) for m in base for d in beyond)
        ours = "; ".join(f"{LABELS[m]} at {d}: {_acc(_at(summary, m, d))}" for m in base for d in beyond)
        learners = [LABELS[m] for m in ("fixup", "batchnorm") for d in beyond
                    if m in summary["methods"] and not _fails(_at(summary, m, d), chance)]
        caveat = ("; at those depths " + ", ".join(sorted(set(learners))) + " learn" if learners else
                  "; but Fixup and BatchNorm do not learn there either at this budget, so the comparison does not "
                  "single these two out")
        rows.append(ClaimRow("depth_baselines_fail", ours, scale, verdict(fail, paper_scale),
                             f"holds if each diverges or stays below chance + {LEARNING_MARGIN:.0%} at every "
                             f"depth beyond 100{caveat}"))
    if "he" not in summary["methods"]:
        rows.append(ClaimRow("no_norm_needs_small_rate", "", scale, NOT_RUN, "He without normalisation not in grid"))
    else:
        he_deep = [d for d in depths if d >= 100] or depths
        fail = all(_fails(_at(summary, "he", d), chance) for d in he_deep)
        ours = "; ".join(f"He, no norm, lr {grid.depth.lr} at {d}: {_acc(_at(summary, 'he', d))}" for d in he_deep)
        rows.append(ClaimRow("no_norm_needs_small_rate", ours, scale,
                             verdict(fail, grid.data == "cifar10"),
                             "holds if He without normalisation diverges or does not learn at rate "
                             f"{grid.depth.lr} at every depth >= 100 (every depth, if the grid stops below)"))
    return rows


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    depths = summary["depths"]
    lines = [f"First-epoch test accuracy, mean ± std over seeds (n), at learning rate {grid.depth.lr} "
             f"({summary['scale']}). Chance is {summary['chance']:.0%}. Paper protocol: "
             f"{paper.DEPTH_PROTOCOL['architecture']}, {paper.DEPTH_PROTOCOL['data']}, depths "
             f"{', '.join(map(str, paper.DEPTH_PROTOCOL['depths']))} ({paper.DEPTH_PROTOCOL['source']}).", "",
             "| method | " + " | ".join(f"depth {d}" for d in depths) + " |",
             "|---|" + "---|" * len(depths)]
    for method, cells in summary["methods"].items():
        lines.append(f"| {LABELS.get(method, method)} | "
                     + " | ".join(_acc(cells.get(str(d))) for d in depths) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_depth

    if not summary["depths"]:
        return []
    return [plot_depth(summary, LABELS, folder / "depth.png")]


STUDY = Study("depth", "Depth: first-epoch accuracy at learning rate 0.1 (Figure 3)", train_cell, plan, summarise,
              claims, markdown, figures)
