"""The ablation study: Fixup against each of its rules removed or changed, over a fixed training budget.

Methods (the models issue's ``init=`` values): rule 2's factor removed, the factor x0.1 and x10,
every branch weight zero, no scalar biases, no multiplier. All at the same rate, schedule, epochs and
seeds as full Fixup (scalars at ``AblationGrid.scalar_lr_mult`` of the rate, as the authors'
released code); the figures are training-loss and test-accuracy curves and final accuracy.

The deep tier runs them at depth instead, under Figure 3's protocol (:mod:`fixup.studies.ablation_depth`):
where the grid plans such rows, each claim is judged on them, at the deepest depth at which the grid runs the
ablation and Fixup, and never on the budget rows.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from . import ablation_depth as at_depth
from . import paper
from ._common import image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import UNRESOLVED, ClaimRow, Judgement, Protocol, clearly_above, clearly_below, judge, not_run
from .evidence import Cells, cells_from_results, ci_halfwidth, interval_text, outcome_of
from .grid import Grid
from .rows import image_protocol, model_label
from .stats import group_records
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
    return Plan(tasks + at_depth.plan_tasks(grid))


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    methods = {}
    epochs, planned = grid.ablation.epochs, grid.seeds
    budget = [r for r in records if not at_depth.is_row(r)]
    value = at_depth.history_value
    for (method,), recs in group_records(budget, "method").items():
        results = [r["result"] for r in recs]
        methods[method] = {
            "test_acc": cells_from_results(results, planned, lambda r: r.get("test_acc")).to_dict(),
            "train_loss": cells_from_results(results, planned, lambda r: r.get("train_loss")).to_dict(),
            "first_epoch_train_loss": cells_from_results(results, planned, value("train_loss", 0)).to_dict(),
            "curve_train_loss": [cells_from_results(results, planned, value("train_loss", e)).to_dict()
                                 for e in range(epochs)],
            "curve_test_acc": [cells_from_results(results, planned, value("test_acc", e)).to_dict()
                               for e in range(epochs)],
            "runs": [{"seed": r["seed"], "outcome": outcome_of(r["result"]), "test_acc": r["result"].get("test_acc")}
                     for r in recs],
        }
    return {"methods": methods, "planned_seeds": planned, "scale": _protocol(grid).describe(),
            "at_depth": at_depth.summarise(records, grid)}


def _protocol(grid: Grid) -> Protocol:
    g = grid.ablation
    return image_protocol(grid, model=model_label(g.model, g.depth), paper_model="ResNet-110 (resnet_cifar)",
                          batch=g.batch_size, epochs=g.epochs, lr=g.lr, scalar_lr_mult=g.scalar_lr_mult)


def _cells(summary: dict[str, Any], method: str, key: str = "test_acc") -> Cells | None:
    e = summary["methods"].get(method)
    return None if e is None else Cells.from_dict(e[key])


def _fmt(c: Cells | None, key: str = "test_acc") -> str:
    if c is None:
        return "not run"
    return c.format(1, 100, "%") if key == "test_acc" else c.format(3)


# Rule 2 is about "extremely deep" networks (section 3): below this many layers its absence may not show.
DEEP = 1000

# claim id -> (method, what must hold against Fixup): "worse" (fails, or clearly lower test accuracy) or "slower"
# (fails, or clearly higher first-epoch training loss: the claim is about optimisation)
_RULES = {
    "ablation_rule2_necessary": ("fixup_no_depth_scale", "worse"),
    "ablation_scale_x0.1": ("fixup_scale_x0.1", "slower"),
    "ablation_scale_x10": ("fixup_scale_x10", "worse"),
    "ablation_zero_branch": ("fixup_zero_branch", "worse"),
    "ablation_no_bias": ("fixup_no_bias", "worse"),
    "ablation_no_scale": ("fixup_no_scale", "worse"),
}


def _compare(kind: str, fx: Cells, ab: Cells) -> tuple[bool, bool]:
    """(the claim holds, the opposite holds): any failed seed of the ablation counts for the claim."""
    if kind == "slower":  # a higher loss is the claimed effect
        return ab.n_failed > 0 or clearly_above(ab, fx), clearly_below(ab, fx)
    return ab.n_failed > 0 or clearly_below(ab, fx), clearly_above(ab, fx)


def _points(x: float) -> str:
    return f"{round(100 * x, 1) + 0.0:.1f} points"  # + 0.0: no "-0.0"


def _detectable(j: Judgement, cid: str, kind: str, when: str, fx: Cells, ab: Cells, limit: str = "") -> Judgement:
    """An unresolved row names the smallest difference its setting can detect, beside the paper's effect (after the
    limit it states, or in place of the bare "no difference" of :func:`judge`)."""
    if j.verdict != UNRESOLVED:
        return j
    ci = ci_halfwidth(fx, ab)
    what = f"{when} training loss" if kind == "slower" else f"{when} test accuracy"
    size = interval_text(ci, "{:.3f}".format if kind == "slower" else _points)
    detect = (f"this setting detects a difference in {what} of {size} (the 95% half-width of Fixup against the "
              f"ablation, n={fx.stat.n} and {ab.stat.n}); the paper's effect: no size given, "
              f"{paper.claim(cid).paper_text()}")
    return replace(j, why=f"{j.why}; {detect}" if limit else f"no difference beyond the 95% interval: {detect}")


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    g = grid.ablation
    proto = _protocol(grid)
    paper_scale = grid.data == "cifar10" and g.depth >= 110 and g.epochs >= 200
    rows = []
    for cid, (method, kind) in _RULES.items():
        depth = at_depth.deepest(grid, method)
        if depth is not None:
            rows.append(_claim_at_depth(cid, method, kind, depth, summary, grid))
            continue
        if "fixup" not in g.methods or method not in g.methods:
            rows.append(not_run(cid, f"{LABELS[method]} or Fixup not in the ablation grid", proto.describe()))
            continue
        key = "first_epoch_train_loss" if kind == "slower" else "test_acc"
        fx = _cells(summary, "fixup", key) or Cells(grid.seeds)
        ab = _cells(summary, method, key) or Cells(grid.seeds)
        if kind == "slower":
            ours = (f"first-epoch training loss {LABELS[method]} {_fmt(ab, key)} vs Fixup {_fmt(fx, key)}; "
                    f"final test accuracy {_fmt(_cells(summary, method))} vs {_fmt(_cells(summary, 'fixup'))}")
            rule = "fails or has clearly higher training loss after the first epoch"
        else:
            ours = f"final test accuracy {LABELS[method]} {_fmt(ab)} vs Fixup {_fmt(fx)}"
            rule = "fails or ends with clearly lower test accuracy"
        holds, contrary = _compare(kind, fx, ab)
        limit = ""
        if method == "fixup_no_depth_scale" and g.depth < DEEP:
            limit = (f"at {g.depth} layers rule 2's factor is mild; the claim concerns extremely deep networks "
                     f"(>= {DEEP} layers here: the deep tier's rows, fixup study ablation --deep)")
        j = judge({"Fixup": fx, LABELS[method]: ab}, holds=holds, contrary=contrary, paper_scale=paper_scale,
                  ci=ci_halfwidth(ab, fx), must_succeed=("Fixup",), limit=limit, sizes=False)
        j = _detectable(j, cid, kind, "first-epoch" if kind == "slower" else "final", fx, ab, limit)
        rows.append(ClaimRow.judged(cid, ours, proto, j, f"holds if the ablation {rule} than Fixup (beyond the 95% "
                                                          "interval of the difference); the paper gives no size"))
    return rows


def _claim_at_depth(cid: str, method: str, kind: str, depth: int, summary: dict[str, Any], grid: Grid) -> ClaimRow:
    """The claim judged on the rows at ``depth`` (the deepest where the grid runs the ablation and Fixup)."""
    key = "train_loss" if kind == "slower" else "test_acc"
    fx = at_depth.cells(summary, grid, "fixup", depth, key)
    ab = at_depth.cells(summary, grid, method, depth, key)
    holds, contrary = _compare(kind, fx, ab)
    # Never the paper's scale: the paper's ablations train ResNet-110 on CIFAR-10, not one epoch of a Wide-ResNet.
    j = judge({"Fixup": fx, LABELS[method]: ab}, holds=holds, contrary=contrary, paper_scale=False,
              ci=ci_halfwidth(ab, fx), must_succeed=("Fixup",))
    j = _detectable(j, cid, kind, "first-epoch", fx, ab)
    depths = sorted(int(d) for d in summary.get("at_depth", {}).get(method, {}))
    parts = []
    for d in depths:
        acc = {m: at_depth.cells(summary, grid, m, d, "test_acc").format(1, 100, "%") for m in (method, "fixup")}
        loss = {m: at_depth.cells(summary, grid, m, d, "train_loss").format(3) for m in (method, "fixup")}
        parts.append(f"at {d:,} layers, first-epoch test accuracy {LABELS[method]} {acc[method]} vs Fixup "
                     f"{acc['fixup']}, training loss {loss[method]} vs {loss['fixup']}")
    what = "fails on any seed (diverged, collapsed) or has clearly " + (
        "higher first-epoch training loss" if kind == "slower" else "lower first-epoch test accuracy")
    rule = (f"at {depth:,} layers (Figure 3's protocol), holds if the ablation {what} than Fixup (beyond the 95% "
            "interval of the difference) while Fixup fails on no seed; the paper gives no size")
    return ClaimRow.judged(cid, "; ".join(parts), at_depth.protocol(grid, depth, ab.planned), j, rule)


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    parts = []
    if grid.ablation.methods or summary["methods"]:
        lines = [f"Fixup and its ablations, all at the same protocol ({summary['scale']}); mean ± std (n of planned; "
                 "failed cells named by outcome).", "",
                 "| method | final test accuracy | final training loss | first-epoch training loss |",
                 "|---|---|---|---|"]
        for method in summary["methods"]:
            lines.append(f"| {LABELS.get(method, method)} | {_fmt(_cells(summary, method))} | "
                         f"{_fmt(_cells(summary, method, 'train_loss'), 'loss')} | "
                         f"{_fmt(_cells(summary, method, 'first_epoch_train_loss'), 'loss')} |")
        parts.append("\n".join(lines))
    if summary.get("at_depth"):
        parts.append(at_depth.markdown(summary, grid, LABELS))
    return "\n\n".join(parts)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_curves

    methods = summary["methods"]
    if not methods:
        return []
    loss = {m: e["curve_train_loss"] for m, e in methods.items()}
    acc = {m: e["curve_test_acc"] for m, e in methods.items()}
    return [plot_curves(loss, "training loss", folder / "ablation_train_loss.png", labels=LABELS, log=True),
            plot_curves(acc, "test accuracy (%)", folder / "ablation_test_acc.png", labels=LABELS, scale=100)]


STUDY = Study("ablation", "Ablation: Fixup's rules removed one at a time", train_cell, plan, summarise, claims,
              markdown, figures)
