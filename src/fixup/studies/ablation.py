"""The ablation study: Fixup against each of its rules removed or changed, over a fixed training budget.

Methods (the models issue's ``init=`` values): rule 2's factor removed, the factor x0.1 and x10,
every branch weight zero, no scalar biases, no multiplier. All at the same rate, schedule, epochs and
seeds as full Fixup (scalars at ``AblationGrid.scalar_lr_mult`` of the rate, as the authors'
released code); the figures are training-loss and test-accuracy curves and final accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._common import image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import NOT_RUN, ClaimRow, clearly_above, clearly_below, verdict
from .grid import Grid
from .stats import Stat, group_records, stat
from .store import Store

__all__ = ["STUDY"]

LABELS = {"fixup": "Fixup", "fixup_no_depth_scale": "no rule-2 factor", "fixup_scale_x0.1": "factor x0.1",
          "fixup_scale_x10": "factor x10", "fixup_zero_branch": "all-zero branches",
          "fixup_no_bias": "no scalar biases", "fixup_no_scale": "no multiplier"}


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.ablation
    tasks = []
    for method in g.methods:
        for seed in range(grid.seeds):
            train = image_train(grid, method, seed, model=g.model, depth=g.depth, lr=g.lr,
                                weight_decay=g.weight_decay, batch_size=g.batch_size, epochs=g.epochs,
                                scalar_lr_mult=g.scalar_lr_mult)
            tasks.append(Task(Cell("ablation", method, {"depth": g.depth}, seed, config={"train": train},
                                   cost=image_cost(grid, g.depth, g.epochs)), train_cell))
    return Plan(tasks)


def _curve(results: list[dict[str, Any]], key: str, epochs: int) -> list[dict[str, Any]]:
    out = []
    for e in range(epochs):
        vals = [r["history"][e].get(key) if len(r["history"]) > e and not r["diverged"] else None for r in results]
        out.append(stat(vals).to_dict())
    return out


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    methods = {}
    epochs = grid.ablation.epochs
    for (method,), recs in group_records(records, "method").items():
        results = [r["result"] for r in recs]
        methods[method] = {
            "test_acc": stat(r["test_acc"] for r in results).to_dict(),
            "train_loss": stat(r["train_loss"] for r in results).to_dict(),
            "first_epoch_train_loss": stat(r["history"][0].get("train_loss") if r["history"] and not r["diverged"]
                                           else None for r in results).to_dict(),
            "diverged": sum(bool(r["diverged"]) for r in results), "n": len(results),
            "curve_train_loss": _curve(results, "train_loss", epochs),
            "curve_test_acc": _curve(results, "test_acc", epochs),
        }
    g = grid.ablation
    scale = (f"{grid.describe_data()}, {g.model}-{g.depth}, lr {g.lr} (scalars x{g.scalar_lr_mult:g}), "
             f"{g.epochs} epochs, batch {g.batch_size}, {grid.seeds} seeds")
    return {"methods": methods, "scale": scale}


def _fmt(entry: dict[str, Any], key: str = "test_acc") -> str:
    s = Stat(**entry[key])
    text = s.format(1, 100, "%") if key == "test_acc" else s.format(3)
    return text + (f", {entry['diverged']}/{entry['n']} diverged" if entry["diverged"] else "")


# claim id -> (method, what must hold against Fixup, description of the rule)
_RULES = {
    "ablation_rule2_necessary": ("fixup_no_depth_scale", "worse", "diverges or ends with clearly lower test accuracy"),
    "ablation_scale_x0.1": ("fixup_scale_x0.1", "slower", "clearly higher training loss after the first epoch"),
    "ablation_scale_x10": ("fixup_scale_x10", "worse", "diverges or ends with clearly lower test accuracy"),
    "ablation_zero_branch": ("fixup_zero_branch", "worse", "diverges or ends with clearly lower test accuracy"),
    "ablation_no_bias": ("fixup_no_bias", "worse", "diverges or ends with clearly lower test accuracy"),
    "ablation_no_scale": ("fixup_no_scale", "worse", "diverges or ends with clearly lower test accuracy"),
}


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    methods, scale = summary["methods"], summary["scale"]
    paper_scale = grid.data == "cifar10" and grid.ablation.depth >= 110 and grid.ablation.epochs >= 200
    rows = []
    for cid, (method, kind, rule) in _RULES.items():
        if "fixup" not in methods or method not in methods:
            rows.append(ClaimRow(cid, "", scale, NOT_RUN, f"{LABELS[method]} or Fixup not in the ablation grid"))
            continue
        fx, ab = methods["fixup"], methods[method]
        if kind == "slower":
            a, b = Stat(**ab["first_epoch_train_loss"]), Stat(**fx["first_epoch_train_loss"])
            holds = ab["diverged"] > 0 or clearly_above(a, b)
            ours = (f"first-epoch training loss {LABELS[method]} {a.format(3)} vs Fixup {b.format(3)}; "
                    f"final test accuracy {_fmt(ab)} vs {_fmt(fx)}")
        else:
            holds = ab["diverged"] > 0 or clearly_below(Stat(**ab["test_acc"]), Stat(**fx["test_acc"]))
            ours = f"final test accuracy {LABELS[method]} {_fmt(ab)} vs Fixup {_fmt(fx)}"
        rows.append(ClaimRow(cid, ours, scale, verdict(holds, paper_scale),
                             f"holds if the ablation {rule} than Fixup (beyond the seeds' combined std)"))
    return rows


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    lines = [f"Fixup and its ablations, all at the same protocol ({summary['scale']}); mean ± std (n).", "",
             "| method | final test accuracy | final training loss | first-epoch training loss |",
             "|---|---|---|---|"]
    for method, e in summary["methods"].items():
        lines.append(f"| {LABELS.get(method, method)} | {_fmt(e)} | {Stat(**e['train_loss']).format(3)} | "
                     f"{Stat(**e['first_epoch_train_loss']).format(3)} |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_curves

    methods = summary["methods"]
    if not methods:
        return []
    loss = {m: [c["mean"] for c in e["curve_train_loss"]] for m, e in methods.items()}
    acc = {m: [None if c["mean"] is None else 100 * c["mean"] for c in e["curve_test_acc"]] for m, e in methods.items()}
    return [plot_curves(loss, "training loss (mean over seeds)", folder / "ablation_train_loss.png", labels=LABELS,
                        log=True),
            plot_curves(acc, "test accuracy (%, mean over seeds)", folder / "ablation_test_acc.png", labels=LABELS)]


STUDY = Study("ablation", "Ablation: Fixup's rules removed one at a time", train_cell, plan, summarise, claims,
              markdown, figures)
