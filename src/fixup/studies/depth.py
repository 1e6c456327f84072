"""The depth study (the paper's Figure 3): first-epoch test accuracy against depth at learning rate 0.1.

Every method trains at the default BatchNorm rate 0.1 for one epoch on a geometric grid of depths
(paper: Wide-ResNet width 1 on CIFAR-10, 10 to 10,000 layers, batch 128, 64 at 10,000, weight decay
5e-4). A run whose loss stops being finite is recorded as diverged and plotted as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..groups import SCALAR_LR_MULT
from . import paper
from ._common import chance_level, image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import ClaimRow, Protocol, judge, not_run
from .evidence import Cells, cells_from_results, ci_halfwidth, outcome_of
from .grid import Grid
from .rows import image_protocol
from .stats import group_records
from .store import Store

__all__ = ["STUDY"]

LABELS = {"fixup": "Fixup (stream biases budgeted: our default)", "fixup_paper": "Fixup, the authors' parameterisation",
          "fixup_batch_scaled": "Fixup, lr scaled with the batch (the authors' script)",
          "fixup_no_stream_bias": "Fixup, no stream bias (rule 3 literally)", "batchnorm": "BatchNorm", "lsuv": "LSUV",
          "sqrt2": "1/sqrt(2)", "he": "He, no normalisation", "fixup_no_depth_scale": "Fixup without rule 2",
          "fixup_scalars_fixed": "Fixup, scalars held fixed", "skipinit": "SkipInit (gain at 0)",
          "rezero": "ReZero (alpha at 0)", "rezero_slow_gates": "ReZero, gates at lr/10",
          "nf_resnet": "NF-ResNet (zero skip gain, AGC: the authors' recipe)",
          "nf_resnet_nozero": "NF-ResNet without the zero skip gain (AGC)", "skipinit_he": "SkipInit on He's draw"}
# Variants of a method that differ only in training options. Every Fixup form trains its scalars at lr/10,
# as the authors' released CIFAR script (github.com/hongyi-zhang/Fixup, cifar/cifar_train.py) does; the
# same script scales the weights' rate with the batch (0.1 x batch / 128): `fixup_batch_scaled` runs that.
# Holding the scalars fixed for the epoch isolates rules 1-2 (the analysis of section 3 has no biases).
VARIANTS = {"fixup_batch_scaled": ("fixup", {"lr_reference_batch": 128}),
            "fixup_scalars_fixed": ("fixup", {"scalar_lr_mult": 0.0}),
            "rezero_slow_gates": ("rezero", {"gate_lr_mult": 0.1})}
# "Learning" in one epoch: test accuracy at least this far above chance (absolute).
LEARNING_MARGIN = 0.2
# "Tracks BatchNorm": within this much of BatchNorm's mean first-epoch accuracy (absolute).
TRACKING_MARGIN = 0.1


def figure3_train(grid: Grid, method: str, seed: int, depth: int) -> dict[str, Any]:
    """The training config of a Figure 3 cell: ``method`` at ``depth`` layers under the depth grid's protocol (the
    ablation study's rows at depth train by it too)."""
    g = grid.depth
    batch = g.batch_size_10000 if depth >= 10_000 else g.batch_size
    base, options = VARIANTS.get(method, (method, {}))
    # checkpoint=True: the cell trains in segments, each ending in a checkpoint (see train_cell)
    return image_train(grid, base, seed, model=g.model, depth=depth, width=g.width, lr=g.lr,
                       weight_decay=g.weight_decay, batch_size=batch, epochs=g.epochs, schedule="constant",
                       checkpoint=True, collapse_patience=g.collapse_patience, **options)


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.depth
    tasks = []
    for depth in g.depths:
        # seed by seed: a run taken in plan order (the deep tier's, cheapest first) has every method at n=1
        # before any at n=2
        for seed in range(grid.seeds):
            for method in g.methods:
                train = figure3_train(grid, method, seed, depth)
                cell = Cell("depth", method, {"depth": depth}, seed, config={"train": train},
                            cost=image_cost(grid, depth, g.epochs))
                tasks.append(Task(cell, train_cell))
    return Plan(tasks)


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    methods: dict[str, dict[str, Any]] = {}
    for (method, depth), recs in group_records(records, "method", "depth").items():
        results = [r["result"] for r in recs]
        methods.setdefault(method, {})[str(depth)] = {
            "test_acc": cells_from_results(results, grid.seeds, lambda r: r.get("test_acc")).to_dict(),
            "runs": [{"seed": r["seed"], "outcome": outcome_of(r["result"]), "test_acc": r["result"].get("test_acc")}
                     for r in recs],
        }
    # every planned depth, finished or not: the verdicts rest on the grid's deepest depth, never on the deepest
    # one that happens to have finished (an unfinished depth reads "k of n planned seeds finished")
    depths = sorted({int(d) for m in methods.values() for d in m} | set(grid.depth.depths))
    return {"chance": chance_level(grid), "depths": depths, "methods": methods, "planned_seeds": grid.seeds,
            "scale": _protocol(grid, "fixup").describe(), "curves": loss_curves(records, grid.seeds),
            "no_curve": sorted(f"{LABELS.get(r['method'], r['method'])} at {r['setting']['depth']:,} layers, seed "
                               f"{r['seed']} ({_why_no_curve(r['result'])})"
                               for r in records if not _step_losses(r["result"]))}


def _why_no_curve(result: dict[str, Any]) -> str:
    if result.get("restored"):
        return "restored from a summary that kept only its outcome and accuracy"
    return f"{outcome_of(result)} before its first step" if outcome_of(result) != "completed" else "no loss recorded"


def _step_losses(result: dict[str, Any]) -> dict[int, float]:
    """A cell's training loss by step (``step_loss``: every step its process ran; none in a cell restored from a
    summary, which kept only the outcome and the accuracy)."""
    record = result.get("step_loss") or {}
    first = int(record.get("first_step") or 0)
    return {first + i: v for i, v in enumerate(record.get("loss") or []) if v is not None}


def loss_curves(records: list[dict[str, Any]], planned: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per depth and method, the training loss at each step over the seeds (a completed cell without the step's
    loss counts as 'no value'; a failed one by its outcome): the data of the depth_loss_<depth> figures."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (method, depth), recs in group_records(records, "method", "depth").items():
        per_cell = [(r["result"], _step_losses(r["result"])) for r in recs]
        steps = sorted({s for _, losses in per_cell for s in losses})
        if steps:
            out.setdefault(str(depth), {})[method] = [
                {"step": s, "loss": cells_from_results([dict(res, _loss=losses.get(s)) for res, losses in per_cell],
                                                       planned, lambda r: r["_loss"]).to_dict()} for s in steps]
    return out


def _protocol(grid: Grid, method: str) -> Protocol:
    g = grid.depth
    deepest = max(g.depths)
    deepest_paper = max(paper.DEPTH_PROTOCOL["depths"])
    _, options = VARIANTS.get(method, (method, {}))
    return image_protocol(grid, model=f"Wide-ResNet width {g.width}, depths {min(g.depths)}-{deepest:,}",
                          paper_model=f"Wide-ResNet width 1, depths 10-{deepest_paper:,}", batch=g.batch_size,
                          epochs=g.epochs, lr=g.lr, scalar_lr_mult=options.get("scalar_lr_mult", SCALAR_LR_MULT))


def _at(summary: dict[str, Any], method: str, depth: int) -> Cells | None:
    entry = summary["methods"].get(method, {}).get(str(depth))
    return None if entry is None else Cells.from_dict(entry["test_acc"])


def _acc(c: Cells | None) -> str:
    return "not run" if c is None else c.format(1, 100, "%")


def _learns(c: Cells | None, chance: float) -> bool:
    """Learned in the epoch: no failed seed, and mean accuracy at least LEARNING_MARGIN above chance."""
    if c is None or c.n_failed:
        return False
    mean = c.stat.mean
    return mean is not None and mean >= chance + LEARNING_MARGIN


def _planned(grid: Grid) -> Cells:
    return Cells(grid.seeds)  # a figure the grid has but no cell finished: rule 1 says "not run"


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    depths, chance = summary["depths"], summary["chance"]
    proto = _protocol(grid, "fixup")
    if not summary["methods"]:
        return [not_run(c, "no depth-study cell has finished", proto.describe())
                for c in ("depth_fixup_trains_deep", "depth_baselines_fail", "no_norm_needs_small_rate")]
    deepest = max(depths)
    paper_scale = grid.data == "cifar10" and deepest >= 10_000
    steps_text = f"{proto.steps} steps"
    rows = []
    fx, bn = _at(summary, "fixup", deepest), _at(summary, "batchnorm", deepest)
    if "fixup" not in grid.depth.methods or "batchnorm" not in grid.depth.methods:
        rows.append(not_run("depth_fixup_trains_deep", "Fixup or BatchNorm was not in the grid", proto.describe()))
    else:
        fx, bn = fx or _planned(grid), bn or _planned(grid)
        tracks = (fx.stat.mean is not None and bn.stat.mean is not None
                  and fx.stat.mean >= bn.stat.mean - TRACKING_MARGIN)
        bn_mean = bn.stat.mean
        j = judge({"Fixup": fx, "BatchNorm": bn}, holds=_learns(fx, chance) and tracks, paper_scale=paper_scale,
                  effect=None if bn_mean is None else bn_mean - chance, ci=ci_halfwidth(fx, bn),
                  must_succeed=("Fixup",),
                  limit="" if _learns(bn, chance) else f"BatchNorm itself does not learn at {deepest} layers in "
                                                        f"{steps_text}: Fixup's side of the claim is tested, the "
                                                        "tracking is not")
        variants = {"fixup_paper": "", "fixup_batch_scaled": "", "fixup_no_stream_bias": "", "fixup_scalars_fixed": ""}
        extra = "".join(f"; {LABELS[v]}{note} {_acc(c)}" for v, note in variants.items()
                        if (c := _at(summary, v, deepest)) is not None)
        rows.append(ClaimRow.judged(
            "depth_fixup_trains_deep", f"at {deepest} layers: Fixup (scalars trained) {_acc(fx)} vs BatchNorm "
            f"{_acc(bn)}{extra} (chance {chance:.0%})", proto, j,
            f"holds if Fixup never fails, is >= {LEARNING_MARGIN:.0%} above chance and within {TRACKING_MARGIN:.0%} "
            "of BatchNorm at the deepest depth; the paper's effect is BatchNorm's height above chance"))
    beyond = [d for d in depths if d > 100]
    base = [m for m in ("lsuv", "sqrt2") if m in grid.depth.methods]
    if not beyond or not base:
        rows.append(not_run("depth_baselines_fail", "the grid has no depth beyond 100 layers or no LSUV/1/sqrt(2) run",
                            proto.describe()))
    else:
        groups = {f"{LABELS[m]} at {d}": _at(summary, m, d) or _planned(grid)
                  for m in (*base, "fixup", "batchnorm") for d in beyond}
        fail = all(not _learns(groups[f"{LABELS[m]} at {d}"], chance) for m in base for d in beyond)
        # the reference is a network of the same depth trained at the same rate and budget: Fixup learning there shows
        # that the budget allows it, so the failure is LSUV's and 1/sqrt(2)'s own
        fixup_learns = all(_learns(groups[f"{LABELS['fixup']} at {d}"], chance) for d in beyond)
        bn_short = [d for d in beyond if not _learns(groups[f"{LABELS['batchnorm']} at {d}"], chance)]
        contrary = any(_learns(groups[f"{LABELS[m]} at {d}"], chance) for m in base for d in beyond)
        holds = fail and fixup_learns
        limit = ""
        if not fixup_learns:
            limit = ("Fixup does not learn beyond 100 layers either at this budget, so the comparison cannot single "
                     "out LSUV and 1/sqrt(2)")
        elif holds and bn_short:
            limit = (f"BatchNorm itself does not learn at {' and '.join(f'{d:,}' for d in bn_short)} layers in "
                     f"{steps_text}: the failure is read against Fixup alone")
        j = judge(groups, holds=holds, paper_scale=paper_scale, contrary=contrary and fixup_learns, limit=limit)
        ours = "; ".join(f"{label}: {_acc(c)}" for label, c in groups.items())
        rows.append(ClaimRow.judged("depth_baselines_fail", ours, proto, j,
                                    f"holds if LSUV and 1/sqrt(2) fail or stay below chance + {LEARNING_MARGIN:.0%} at "
                                    "every depth beyond 100 while Fixup, at the same depth, rate and budget, learns "
                                    "there; BatchNorm's row is named where it does not learn"))
    if "he" not in grid.depth.methods:
        rows.append(not_run("no_norm_needs_small_rate", "He without normalisation not in grid", proto.describe()))
    else:
        he_deep = [d for d in depths if d >= 100] or depths
        groups = {f"{name} at {d}": _at(summary, m, d) or _planned(grid)
                  for m, name in (("he", "He, no norm"), ("batchnorm", "BatchNorm")) for d in he_deep}
        fail = all(not _learns(groups[f"He, no norm at {d}"], chance) for d in he_deep)
        bn_learns = [d for d in he_deep if _learns(groups[f"BatchNorm at {d}"], chance)]
        contrary = all(_learns(groups[f"He, no norm at {d}"], chance) for d in he_deep)
        j = judge(groups, holds=fail and bool(bn_learns), paper_scale=grid.data == "cifar10", contrary=contrary,
                  limit="" if bn_learns else "BatchNorm does not learn at these depths either at this budget")
        ours = "; ".join(f"{label}, lr {grid.depth.lr}: {_acc(c)}" for label, c in groups.items())
        rows.append(ClaimRow.judged("no_norm_needs_small_rate", ours, proto, j,
                                    "holds if He without normalisation fails or does not learn at rate "
                                    f"{grid.depth.lr} "
                                    "at every depth >= 100 (every depth, if the grid stops below) where BatchNorm "
                                    "learns at that rate"))
    return rows


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    depths = summary["depths"]
    lines = [f"First-epoch test accuracy, mean ± std over seeds (n), at learning rate {grid.depth.lr} "
             f"({summary['scale']}). Chance is {summary['chance']:.0%}. Paper protocol: "
             f"{paper.DEPTH_PROTOCOL['architecture']}, {paper.DEPTH_PROTOCOL['data']}, depths "
             f"{', '.join(map(str, paper.DEPTH_PROTOCOL['depths']))} ({paper.DEPTH_PROTOCOL['source']}).", "",
             "| method | " + " | ".join(f"depth {d}" for d in depths) + " |",
             "|---|" + "---|" * len(depths)]
    for method in summary["methods"]:
        lines.append(f"| {LABELS.get(method, method)} | "
                     + " | ".join(_acc(_at(summary, method, d)) for d in depths) + " |")
    curves = summary.get("curves", {})
    if curves:
        lines += ["", "Training loss at every step of the epoch, per depth (figures `depth_loss_<depth>.png`: the mean "
                  "over the completed seeds as a line, ± std as a band, n in the legend; a failed cell is counted by "
                  "its outcome): " + "; ".join(f"{int(d):,} layers, {len(curves[d])} methods" for d in
                                              sorted(curves, key=int)) + "."]
    if summary.get("no_curve"):
        lines += ["", f"Cells without a per-step loss ({len(summary['no_curve'])}): "
                  + "; ".join(summary["no_curve"]) + "."]
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_depth, plot_learning_curves

    if not summary["methods"]:
        return []
    curves = summary.get("curves", {})
    return [plot_depth(summary, LABELS, folder / "depth.png")] + [
        plot_learning_curves({LABELS.get(m, m): points for m, points in curves[d].items()},
                             {"loss": "training loss"}, folder / f"depth_loss_{d}.png",
                             title=f"Wide-ResNet-{int(d):,}, first epoch: n = completed seeds")
        for d in sorted(curves, key=int)]


STUDY = Study("depth", "Depth: first-epoch accuracy at learning rate 0.1 (Figure 3)", train_cell, plan, summarise,
              claims, markdown, figures)
