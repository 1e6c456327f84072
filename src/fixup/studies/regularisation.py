"""The regularisation study (the paper's CIFAR and ImageNet tables, Appendix C): test error with and without
Mixup and Cutout, for Fixup, BatchNorm (GroupNorm) and He initialisation without normalisation.

Protocol choices, as the paper made them (section 4.2): Mixup's alpha per method (0.2 BatchNorm, 0.1
GroupNorm, 0.7 Fixup); under Mixup, Fixup's scalar biases and multipliers learn at a tenth of the
rate. He without normalisation cannot use rate 0.1 (Table 1 says so of Xavier): it gets the best
stable rate of a small search first (lowest final training loss among runs that did not diverge;
chosen on training loss, never on test data), and the report says so. The paper gives no Mixup
alpha for the unnormalised network; we use BatchNorm's 0.2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import paper
from ._common import image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import NOT_RUN, ClaimRow, clearly_above, clearly_below, verdict
from .grid import Grid
from .stats import Stat, group_records, stat
from .store import Store

__all__ = ["STUDY", "best_stable_lr"]

LABELS = {"fixup": "Fixup", "batchnorm": "BatchNorm", "groupnorm": "GroupNorm", "he": "He, no normalisation"}
MIXUP_ALPHA = {**paper.MIXUP_ALPHA, "he": paper.MIXUP_ALPHA["batchnorm"]}  # he: our choice, see module doc
SEARCH = "he_lr_search"


def _search_cells(grid: Grid) -> list[Cell]:
    g = grid.regularisation
    return [Cell("regularisation", SEARCH, {"lr": lr}, 0, cost=image_cost(grid, g.depth, g.he_search_epochs), config={
        "train": image_train(grid, "he", 0, model=g.model, depth=g.depth, lr=lr, weight_decay=g.weight_decay,
                             batch_size=g.batch_size, epochs=g.he_search_epochs)}) for lr in g.he_lr_search]


def best_stable_lr(results: dict[float, dict[str, Any]]) -> tuple[float, str]:
    """The rate with the lowest final training loss among runs that did not diverge, and why."""
    stable = {lr: r["train_loss"] for lr, r in results.items() if not r["diverged"] and r["train_loss"] is not None}
    if not stable:
        lr = min(results)
        return lr, f"every searched rate diverged; using the smallest, {lr:g}"
    lr = min(stable, key=lambda k: stable[k])
    return lr, (f"best stable rate {lr:g} (lowest final training loss {stable[lr]:.3f}; "
                f"{len(results) - len(stable)} of {len(results)} rates diverged)")


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.regularisation
    search = _search_cells(grid)
    tasks = [Task(c, train_cell) for c in search] if "he" in g.methods else []
    he_lr: float | None = None
    if tasks:
        done = {c.setting["lr"]: store.load(c) for c in search}
        if all(done.values()):
            he_lr, _ = best_stable_lr({lr: rec["result"] for lr, rec in done.items()})
    waiting = 0
    for method in g.methods:
        for reg in g.regularisers:
            for seed in range(grid.seeds):
                if method == "he" and he_lr is None:
                    waiting += 1
                    continue
                fields: dict[str, Any] = {"model": g.model, "depth": g.depth, "weight_decay": g.weight_decay,
                                          "batch_size": g.batch_size, "epochs": g.epochs,
                                          "lr": he_lr if method == "he" else g.lr}
                if "mixup" in reg:
                    fields["mixup_alpha"] = MIXUP_ALPHA[method]
                    if method == "fixup":  # section 4.2: scalar rate /10 under strong regularisation
                        fields["scalar_lr_mult"] = g.strong_scalar_lr_mult
                if "cutout" in reg:
                    fields["cutout"] = g.cutout
                cell = Cell("regularisation", method, {"reg": reg}, seed, cost=image_cost(grid, g.depth, g.epochs),
                            config={"train": image_train(grid, method, seed, **fields)})
                tasks.append(Task(cell, train_cell))
    return Plan(tasks, waiting)


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    g = grid.regularisation
    search = {r["setting"]["lr"]: r["result"] for r in records if r["method"] == SEARCH}
    table: dict[str, dict[str, Any]] = {}
    for (method, reg), recs in group_records([r for r in records if r["method"] != SEARCH], "method", "reg").items():
        results = [r["result"] for r in recs]
        table.setdefault(method, {})[reg] = {
            "test_error": stat(None if r["test_acc"] is None else 1 - r["test_acc"] for r in results).to_dict(),
            "train_error": stat(None if r["train_acc"] is None else 1 - r["train_acc"] for r in results).to_dict(),
            "train_loss": stat(r["train_loss"] for r in results).to_dict(),
            "diverged": sum(bool(r["diverged"]) for r in results), "n": len(results),
            "lr": recs[0]["config"]["train"]["lr"],
        }
    he = None
    if search:
        lr, why = best_stable_lr(search)
        he = {"chosen_lr": lr, "why": why, "searched": {str(k): {"train_loss": v["train_loss"],
                                                                 "diverged": v["diverged"]}
                                                        for k, v in sorted(search.items())}}
    scale = (f"{grid.describe_data()}, {g.model}-{g.depth}, {g.epochs} epochs, batch {g.batch_size}, "
             f"{grid.seeds} seeds")
    return {"table": table, "he_search": he, "scale": scale, "mixup_alpha": MIXUP_ALPHA}


def _err(summary: dict[str, Any], method: str, reg: str) -> Stat | None:
    e = summary["table"].get(method, {}).get(reg)
    return None if e is None else Stat(**e["test_error"])


def _f(s: Stat | None) -> str:
    return "not run" if s is None else s.format(1, 100, "%")


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    scale = summary["scale"]
    g = grid.regularisation
    paper_scale = grid.data == "cifar10" and g.depth >= 110 and g.epochs >= 200
    rows = []
    fx, bn, he = (_err(summary, m, "none") for m in ("fixup", "batchnorm", "he"))
    if fx is None or bn is None or he is None:
        rows.append(ClaimRow("cifar10_resnet110", "", scale, NOT_RUN, "Fixup, BatchNorm or He not run unregularised"))
    else:
        holds = clearly_below(fx, he) and not clearly_below(fx, bn)
        he_lr = summary["he_search"]["chosen_lr"] if summary["he_search"] else "?"
        rows.append(ClaimRow("cifar10_resnet110", f"test error: BatchNorm {_f(bn)}, He no norm (lr {he_lr}) {_f(he)}, "
                             f"Fixup {_f(fx)}", scale, verdict(holds, paper_scale),
                             "holds if Fixup's error is clearly below He-without-normalisation's and not clearly "
                             "below BatchNorm's"))
    fxe, bne = (summary["table"].get(m, {}).get("none") for m in ("fixup", "batchnorm"))
    if fxe is None or bne is None:
        rows.append(ClaimRow("fixup_fits_training_set", "", scale, NOT_RUN, "Fixup or BatchNorm not run unregularised"))
    else:
        ftl, btl = Stat(**fxe["train_loss"]), Stat(**bne["train_loss"])
        holds = not clearly_above(ftl, btl) and not clearly_below(fx, bn)
        rows.append(ClaimRow("fixup_fits_training_set",
                             f"final training loss Fixup {ftl.format(3)} vs BatchNorm {btl.format(3)}; "
                             f"test error {_f(fx)} vs {_f(bn)}", scale, verdict(holds, paper_scale),
                             "holds if Fixup's training loss is not clearly above BatchNorm's while its test error "
                             "is not clearly below"))
    fxm = _err(summary, "fixup", "mixup")
    if fx is None or fxm is None:
        rows.append(ClaimRow("mixup_closes_gap", "", scale, NOT_RUN, "Fixup with and without Mixup not both run"))
    else:
        rows.append(ClaimRow("mixup_closes_gap", f"Fixup test error {_f(fx)} -> with Mixup "
                             f"(alpha {MIXUP_ALPHA['fixup']}) {_f(fxm)}; BatchNorm + Mixup "
                             f"{_f(_err(summary, 'batchnorm', 'mixup'))}", scale,
                             verdict(clearly_below(fxm, fx), paper_scale),
                             "holds if Mixup clearly lowers Fixup's test error"))
    fxr, bnr = _err(summary, "fixup", "mixup+cutout"), _err(summary, "batchnorm", "mixup+cutout")
    if fxr is None or bnr is None:
        rows.append(ClaimRow("wrn_mixup_cutout", "", scale, NOT_RUN, "Fixup/BatchNorm with Mixup + Cutout not run"))
    else:
        rows.append(ClaimRow("wrn_mixup_cutout", f"Mixup + Cutout test error: Fixup {_f(fxr)} vs BatchNorm {_f(bnr)}",
                             scale, verdict(not clearly_above(fxr, bnr), paper_scale and "wide" in g.model),
                             "holds if Fixup's error is not clearly above BatchNorm's"))
    return rows


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    regs = grid.regularisation.regularisers
    alphas = ", ".join(f"{LABELS.get(m, m)} {a}" for m, a in MIXUP_ALPHA.items())
    lines = [f"Test error, mean ± std (n) ({summary['scale']}). Mixup alpha per method: {alphas} (the paper's "
             "choices; it gives none for the unnormalised network, so it gets BatchNorm's). Under Mixup, Fixup's "
             f"scalar parameters learn at {grid.regularisation.strong_scalar_lr_mult}x the rate.", ""]
    if summary["he_search"]:
        s = summary["he_search"]
        tried = ", ".join(f"{lr}: {'diverged' if v['diverged'] else format(v['train_loss'], '.3f')}"
                          for lr, v in s["searched"].items())
        lines += [f"He without normalisation cannot use rate {grid.regularisation.lr}: its rate comes from a "
                  f"small search (one seed, final training loss per rate: {tried}); {s['why']}.", ""]
    lines += ["| method (lr) | " + " | ".join(regs) + " |", "|---|" + "---|" * len(regs)]
    for method, row in summary["table"].items():
        lr = next(iter(row.values()))["lr"]
        cells = []
        for reg in regs:
            e = row.get(reg)
            cells.append("not run" if e is None else _f(Stat(**e["test_error"]))
                         + (f", {e['diverged']}/{e['n']} diverged" if e["diverged"] else ""))
        lines.append(f"| {LABELS.get(method, method)} ({lr:g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_bars

    if not summary["table"]:
        return []
    groups = {LABELS.get(m, m): {reg: (None if e["test_error"]["mean"] is None else 100 * e["test_error"]["mean"],
                                       None if e["test_error"]["std"] is None else 100 * e["test_error"]["std"])
                                 for reg, e in row.items()} for m, row in summary["table"].items()}
    return [plot_bars(groups, "test error (%)", folder / "regularisation.png")]


STUDY = Study("regularisation", "Regularisation: Mixup and Cutout per method (Tables 1-2, Appendix C)", train_cell,
              plan, summarise, claims, markdown, figures)
