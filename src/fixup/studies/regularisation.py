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

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..groups import SCALAR_LR_MULT
from . import paper
from ._common import image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import ClaimRow, Protocol, clearly_above, clearly_below, judge, not_run
from .evidence import COMPLETED, Cells, cells_from_results, ci_halfwidth, difference_text, interval_text, outcome_of
from .grid import Grid
from .rows import image_protocol, model_label
from .stats import group_records
from .store import Store

__all__ = ["EQUIVALENCE", "MIXUP_ALPHA", "STUDY", "best_stable_lr", "error_entry", "format_error", "points"]

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
    stable = {lr: r["train_loss"] for lr, r in results.items()
              if outcome_of(r) == COMPLETED and r["train_loss"] is not None}
    if not stable:
        lr = min(results)
        return lr, f"every searched rate failed (diverged or collapsed); using the smallest, {lr:g}"
    lr = min(stable, key=lambda k: stable[k])
    return lr, (f"best stable rate {lr:g} (lowest final training loss {stable[lr]:.3f}; "
                f"{len(results) - len(stable)} of {len(results)} rates failed)")


def _seeds(grid: Grid) -> int:
    """Seeds of every cell but the He search's: the study's own count where it sets one, else the grid's."""
    return grid.regularisation.seeds or grid.seeds


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
            for seed in range(_seeds(grid)):
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
    for method in ("fixup", "batchnorm"):  # Appendix C: the Wide-ResNet with Mixup + Cutout
        for seed in range(_seeds(grid)):
            fields = {"model": "wide_resnet", "depth": g.wrn_depth, "width": g.wrn_width,
                      "weight_decay": g.weight_decay, "batch_size": g.batch_size, "epochs": g.wrn_epochs, "lr": g.lr,
                      "mixup_alpha": MIXUP_ALPHA[method], "cutout": g.cutout}
            if method == "fixup":
                fields["scalar_lr_mult"] = g.strong_scalar_lr_mult
            cost = image_cost(grid, g.wrn_depth, g.wrn_epochs) * g.wrn_width ** 2
            cell = Cell("regularisation", method, {"reg": "mixup+cutout", "net": _wrn(grid)}, seed, cost=cost,
                        config={"train": image_train(grid, method, seed, **fields)})
            tasks.append(Task(cell, train_cell))
    return Plan(tasks, waiting)


def _wrn(grid: Grid) -> str:
    return f"wrn-{grid.regularisation.wrn_depth}-{grid.regularisation.wrn_width}"


def error_entry(recs: list[dict[str, Any]], planned: int) -> dict[str, Any]:
    results = [r["result"] for r in recs]

    def err(key: str):
        return lambda r: None if r.get(key) is None else 1 - r[key]

    return {"test_error": cells_from_results(results, planned, err("test_acc")).to_dict(),
            "train_error": cells_from_results(results, planned, err("train_acc")).to_dict(),
            "train_loss": cells_from_results(results, planned, lambda r: r.get("train_loss")).to_dict(),
            "runs": [{"seed": r["seed"], "outcome": outcome_of(r["result"]), "test_acc": r["result"].get("test_acc")}
                     for r in recs],
            "lr": recs[0]["config"]["train"]["lr"]}


def epoch_curve(recs: list[dict[str, Any]], planned: int) -> list[dict[str, Any]]:
    """Training loss and test error at every epoch over the seeds (``step`` counts epochs): a seed that failed counts
    by its outcome at every epoch, one without the epoch's figure as 'no value'."""
    per_cell = [(r["result"], {int(h["epoch"]): h for h in r["result"].get("history") or [] if "epoch" in h})
                for r in recs]
    epochs = sorted({e for _, hist in per_cell for e in hist})

    def at(epoch: int, key: str, flip: bool = False) -> dict[str, Any]:
        def value(r: dict[str, Any]) -> float | None:
            v = r["_row"].get(key)
            return None if v is None else (1 - v if flip else v)
        return cells_from_results([dict(res, _row=hist.get(epoch, {})) for res, hist in per_cell], planned,
                                  value).to_dict()

    return [{"step": e, "train_loss": at(e, "train_loss"), "test_error": at(e, "test_acc", flip=True)}
            for e in epochs]


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    search = {r["setting"]["lr"]: r["result"] for r in records if r["method"] == SEARCH}
    table: dict[str, dict[str, Any]] = {}
    wrn: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, Any]] = {}
    cells = [r for r in records if r["method"] != SEARCH]
    for (method, reg, net), recs in group_records(cells, "method", "reg", "net").items():
        if net is None:
            table.setdefault(method, {})[reg] = error_entry(recs, _seeds(grid))
            curves.setdefault(reg, {})[LABELS.get(method, method)] = epoch_curve(recs, _seeds(grid))
        elif net == _wrn(grid):
            wrn[method] = error_entry(recs, _seeds(grid))
            curves.setdefault(reg, {})[f"{LABELS.get(method, method)}, {_wrn_label(grid).split(' (')[0]}"] = \
                epoch_curve(recs, _seeds(grid))
    he = None
    if search:
        lr, why = best_stable_lr(search)
        he = {"chosen_lr": lr, "why": why, "searched": {str(k): {"train_loss": v["train_loss"],
                                                                 "outcome": outcome_of(v)}
                                                        for k, v in sorted(search.items())}}
    return {"table": table, "wrn": wrn, "wrn_model": _wrn_label(grid), "he_search": he,
            "scale": _protocol(grid, "fixup", "none").describe(), "mixup_alpha": MIXUP_ALPHA,
            "planned_seeds": _seeds(grid), "curves": curves}


def _wrn_label(grid: Grid) -> str:
    g = grid.regularisation
    return model_label("wide_resnet", g.wrn_depth, g.wrn_width)


def _protocol(grid: Grid, method: str, reg: str, *, wrn: bool = False, lr: float | None = None) -> Protocol:
    g = grid.regularisation
    mult = (g.strong_scalar_lr_mult if "mixup" in reg else SCALAR_LR_MULT) if method == "fixup" else None
    if wrn:
        return image_protocol(grid, model=_wrn_label(grid), paper_model="Wide-ResNet-28 width 10 (wide_resnet)",
                              batch=g.batch_size, epochs=g.wrn_epochs, lr=g.lr, scalar_lr_mult=mult, n=_seeds(grid))
    return image_protocol(grid, model=model_label(g.model, g.depth), paper_model="ResNet-110 (resnet_cifar)",
                          batch=g.batch_size, epochs=g.epochs, lr=g.lr if lr is None else lr, scalar_lr_mult=mult,
                          n=_seeds(grid))


def _cells(summary: dict[str, Any], method: str, reg: str, key: str = "test_error") -> Cells | None:
    e = summary["table"].get(method, {}).get(reg)
    return None if e is None else Cells.from_dict(e[key])


def format_error(c: Cells | None) -> str:
    return "not run" if c is None else c.format(1, 100, "%")


def points(x: float) -> str:
    return f"{100 * x:.2f} points" if math.isfinite(x) else "inf"


# "Matches" (an equivalence claim) holds when the 95% interval of the error difference lies below this
# many points of error. Our choice: the paper calls a 0.7-point gap on par (ImageNet ResNet-50 with Mixup:
# Fixup 24.0% against BatchNorm 23.3%, Table 2).
EQUIVALENCE = 0.01

# A network has fitted its training set when its last epoch's running training error is at most this (digits: 14 of
# 1,437 examples). Our choice: the regularisation claims concern networks at the end of their schedule (the paper's
# 90-200 epochs), and on a data set this small that end is where the training set is fitted; a shorter run whose
# networks fitted it may test them, a run of any length whose networks did not may not.
FITTED = 0.01


def scaled_effect(paper_points: float, paper_error_points: float, ours: Cells) -> float:
    """The paper's effect on an error rate, as the same fraction of our error (a fraction, not points).

    An error difference does not carry over in points between tasks whose errors differ several-fold: Mixup's
    3.6 points on ImageNet (27.6% -> 24.0%) cannot show on digits where Fixup's whole error is about 2%. As a
    fraction of the error it carries over (13% of it); where our error has no mean, the points are kept."""
    if ours.stat.mean is None or paper_error_points <= 0:
        return paper_points / 100
    return paper_points / paper_error_points * ours.stat.mean


def fitted(summary: dict[str, Any], methods: tuple[str, ...] = ("fixup", "batchnorm")) -> tuple[bool, str]:
    """Whether every completed seed of each method without a regulariser ends at a training error of at most
    :data:`FITTED`, and the figures that say so (failed seeds are the claims' concern, not this test's)."""
    ok, parts = True, []
    for method in methods:
        c = _cells(summary, method, "none", "train_error")
        if c is None or not c.values:
            ok = False
            parts.append(f"{LABELS.get(method, method)} has no finished seed")
            continue
        worst = max(c.values)
        ok = ok and worst <= FITTED
        parts.append(f"{LABELS.get(method, method)} at most {100 * worst:.2f}%")
    return ok, "final training error " + ", ".join(parts)


def _limit(summary: dict[str, Any], epochs: int, paper_epochs: int, about: str,
           methods: tuple[str, ...] = ("fixup", "batchnorm")) -> str:
    """No limit at the paper's schedule or where the networks fitted the training set (:func:`fitted`); else the
    epochs and the training error that make the claim untestable here."""
    ok, text = fitted(summary, methods)
    if epochs >= paper_epochs or ok:
        return ""
    return f"{epochs} epochs, the training set not fitted ({text}; fitted: at most {100 * FITTED:g}%): {about}"


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    g = grid.regularisation
    ctx = _ClaimContext(summary, grid, Cells(_seeds(grid)), set(g.methods),
                        paper_scale=grid.data == "cifar10" and g.depth >= 110 and g.epochs >= 200)
    return [_claim_beats_he(ctx), _claim_fits(ctx), _claim_mixup(ctx), _claim_wrn(ctx)]


@dataclass(frozen=True)
class _ClaimContext:
    """What every claim row reads: the study's summary, its grid, the cells planned for a method never run, the
    methods in the grid and whether the setting is the paper's."""

    summary: dict[str, Any]
    grid: Grid
    planned: Cells
    methods: set[str]
    paper_scale: bool

    def cells(self, method: str, regulariser: str, key: str = "test_error") -> Cells:
        return _cells(self.summary, method, regulariser, key) or self.planned


def _claim_beats_he(ctx: _ClaimContext) -> ClaimRow:
    proto = _protocol(ctx.grid, "fixup", "none")
    if not {"fixup", "batchnorm", "he"} <= ctx.methods:
        return not_run("cifar10_resnet110", "Fixup, BatchNorm or He not in the grid", proto.describe())
    fx, bn, he = (ctx.cells(m, "none") for m in ("fixup", "batchnorm", "he"))
    beats, behind = clearly_below(fx, he), not clearly_below(fx, bn)
    paper_t = paper.CIFAR10_RESNET110
    if not beats:  # the comparison that fails decides the effect tested
        effect = scaled_effect(paper_t["none"].value - paper_t["fixup"].value, paper_t["fixup"].value, fx)
        ci = ci_halfwidth(fx, he)
    else:
        effect = scaled_effect(paper_t["fixup"].value - paper_t["batchnorm"].value, paper_t["fixup"].value, fx)
        ci = ci_halfwidth(fx, bn)
    j = judge({"Fixup": fx, "BatchNorm": bn, "He, no norm": he}, holds=beats and behind,
              paper_scale=ctx.paper_scale, effect=effect, ci=ci, must_succeed=("Fixup",), fmt=points)
    he_lr = ctx.summary["he_search"]["chosen_lr"] if ctx.summary["he_search"] else "?"
    return ClaimRow.judged(
        "cifar10_resnet110", f"test error: BatchNorm {format_error(bn)}, He no norm (lr {he_lr}) "
        f"{format_error(he)}, Fixup {format_error(fx)}; 95% interval of the tested difference "
        f"{interval_text(ci, points)}",
        proto, j,
        "holds if Fixup's error is clearly below He-without-normalisation's and not clearly below BatchNorm's; "
        "the paper's effects are 0.54 points (Xavier - Fixup) and 0.63 (Fixup - BatchNorm) at Fixup's 7.24% "
        "error, tested as the same fractions of ours")


# Table 2 without regularisation: Fixup's test error and its gap to BatchNorm, in points
_PAPER_FX = paper.IMAGENET_RESNET50["fixup"].value
_PAPER_GAP = _PAPER_FX - paper.IMAGENET_RESNET50["batchnorm"].value


def _claim_fits(ctx: _ClaimContext) -> ClaimRow:
    proto = _protocol(ctx.grid, "fixup", "none")
    if not {"fixup", "batchnorm"} <= ctx.methods:
        return not_run("fixup_fits_training_set", "Fixup or BatchNorm not in the grid", proto.describe())
    fx, bn = (ctx.cells(m, "none") for m in ("fixup", "batchnorm"))
    ftl, btl = (ctx.cells(m, "none", "train_loss") for m in ("fixup", "batchnorm"))
    fits, tests_worse = not clearly_above(ftl, btl), clearly_above(fx, bn)
    # where Fixup fits no worse, the test-error gap decides: the paper's, as the same fraction of our error
    effect = scaled_effect(_PAPER_GAP, _PAPER_FX, fx) if fits else None
    j = judge({"Fixup": fx, "BatchNorm": bn}, holds=fits and tests_worse, paper_scale=ctx.paper_scale,
              effect=effect, ci=ci_halfwidth(fx, bn), contrary=not fits, must_succeed=("Fixup",), fmt=points,
              limit=_limit(ctx.summary, ctx.grid.regularisation.epochs, 200,
                           "the claim concerns networks trained to the end of a full schedule, where the "
                           "training set is fitted"))
    return ClaimRow.judged("fixup_fits_training_set",
                           f"final training loss Fixup {ftl.format(3)} vs BatchNorm {btl.format(3)}; "
                           f"test error {format_error(fx)} vs {format_error(bn)}", proto, j,
                           "holds if Fixup's training loss is not clearly above BatchNorm's while its test "
                           f"error is clearly above; the paper's test-error gap is {_PAPER_GAP:.1f} points at "
                           f"Fixup's {_PAPER_FX:.1f}% (ImageNet ResNet-50, Table 2), tested as the same fraction "
                           f"({_PAPER_GAP / _PAPER_FX:.0%}) of ours")


def _claim_mixup(ctx: _ClaimContext) -> ClaimRow:
    if "fixup" not in ctx.methods or "mixup" not in ctx.grid.regularisation.regularisers:
        return not_run("mixup_closes_gap", "Fixup with and without Mixup not both in the grid",
                       _protocol(ctx.grid, "fixup", "none").describe())
    fx, fxm = ctx.cells("fixup", "none"), ctx.cells("fixup", "mixup")
    gap = paper.IMAGENET_RESNET50
    j = judge({"Fixup": fx, "Fixup + Mixup": fxm}, holds=clearly_below(fxm, fx), paper_scale=ctx.paper_scale,
              effect=scaled_effect(gap["fixup"].value - gap["fixup+mixup"].value, gap["fixup"].value, fx),
              ci=ci_halfwidth(fxm, fx), must_succeed=("Fixup", "Fixup + Mixup"), fmt=points,
              limit=_limit(ctx.summary, ctx.grid.regularisation.epochs, 90,
                           "a regulariser pays off once a network overfits, late in the paper's 90-200-epoch "
                           "schedules", ("fixup",)))
    return ClaimRow.judged("mixup_closes_gap", f"Fixup test error {format_error(fx)} -> with Mixup (alpha "
                           f"{MIXUP_ALPHA['fixup']}) {format_error(fxm)}; BatchNorm + Mixup "
                           f"{format_error(_cells(ctx.summary, 'batchnorm', 'mixup'))}",
                           _protocol(ctx.grid, "fixup", "mixup"), j,
                           "holds if Mixup clearly lowers Fixup's test error; the paper's effect is 3.6 "
                           "points at Fixup's 27.6% error (ImageNet ResNet-50), tested as the same fraction "
                           "(13%) of ours")


def _claim_wrn(ctx: _ClaimContext) -> ClaimRow:
    summary, grid, g = ctx.summary, ctx.grid, ctx.grid.regularisation
    wrn = summary["wrn"]
    fxr = Cells.from_dict(wrn["fixup"]["test_error"]) if "fixup" in wrn else ctx.planned
    bnr = Cells.from_dict(wrn["batchnorm"]["test_error"]) if "batchnorm" in wrn else ctx.planned
    ci = ci_halfwidth(fxr, bnr)
    diff = (fxr.stat.mean - bnr.stat.mean) if fxr.stat.mean is not None and bnr.stat.mean is not None else math.nan
    paper_wrn = grid.data == "cifar10" and g.wrn_depth >= 28 and g.wrn_width >= 10 and g.wrn_epochs >= 200
    j = judge({"Fixup": fxr, "BatchNorm": bnr}, holds=diff + ci < EQUIVALENCE, contrary=diff - ci > EQUIVALENCE,
              paper_scale=paper_wrn, ci=ci, must_succeed=("Fixup",), limit=_wrn_limit(summary, grid),
              paper_effect=_PAPER_WRN_GAP, match=(diff, EQUIVALENCE), fmt=points)
    return ClaimRow.judged("wrn_mixup_cutout", f"{_wrn_label(grid)} with Mixup + Cutout, test error: Fixup "
                           f"{format_error(fxr)} vs BatchNorm {format_error(bnr)}; difference "
                           f"{difference_text(diff, ci, points)}",
                           _protocol(grid, "fixup", "mixup+cutout", wrn=True), j,
                           f"holds if the 95% interval of Fixup's error minus BatchNorm's lies below "
                           f"{100 * EQUIVALENCE:g} point (the paper calls a 0.7-point gap on par)")


_WRN_FX, _WRN_BN = paper.WRN_CIFAR10_REG["fixup"], paper.WRN_CIFAR10_REG["batchnorm"]
_PAPER_WRN_GAP = (f"Fixup - BatchNorm {_WRN_FX.value - _WRN_BN.value:+.2g} points ({_WRN_FX.format()} vs "
                  f"{_WRN_BN.format()} on CIFAR-10), on par")


def _wrn_limit(summary: dict[str, Any], grid: Grid) -> str:
    """Appendix C's network trains under Mixup + Cutout only, whose running training error says nothing of fitting:
    its schedule counts as the end of training where it is at least the ResNet's and the ResNets fitted under it."""
    g = grid.regularisation
    about = "the claim concerns regularised networks at the end of a 200-epoch schedule"
    if g.wrn_epochs >= 200:
        return ""
    if g.wrn_epochs < g.epochs:
        return f"{g.wrn_epochs} epochs, fewer than the ResNets' {g.epochs}: {about}"
    return _limit(summary, g.wrn_epochs, 200, f"{about} (the ResNets without a regulariser, {g.epochs} epochs)")


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    regs = grid.regularisation.regularisers
    alphas = ", ".join(f"{LABELS.get(m, m)} {a}" for m, a in MIXUP_ALPHA.items())
    lines = [f"Test error, mean ± std (n of planned; failed cells named by outcome) ({summary['scale']}). Mixup alpha "
             f"per method: {alphas} (the paper's choices; it gives none for the unnormalised network, so it gets "
             f"BatchNorm's). Under Mixup, Fixup's scalar parameters learn at "
             f"{grid.regularisation.strong_scalar_lr_mult}x the rate.", ""]
    if summary["he_search"]:
        s = summary["he_search"]
        tried = ", ".join(f"{lr}: {v['outcome'] if v['outcome'] != 'completed' else format(v['train_loss'], '.3f')}"
                          for lr, v in s["searched"].items())
        lines += [f"He without normalisation cannot use rate {grid.regularisation.lr}: its rate comes from a "
                  f"small search (one seed, final training loss per rate: {tried}); {s['why']}.", ""]
    basis = grid.regularisation.schedule_basis
    if basis:
        lines += [f"The schedule: {basis}", ""]
    ok, text = fitted(summary)
    lines += [f"Without a regulariser, {text}: the training set is {'' if ok else 'not '}fitted (at most "
              f"{100 * FITTED:g}%, the bar at which the claims about the end of training are tested here).", ""]
    lines += ["| method (lr) | " + " | ".join(regs) + " |", "|---|" + "---|" * len(regs)]
    for method, row in summary["table"].items():
        lr = next(iter(row.values()))["lr"]
        cells = [format_error(_cells(summary, method, reg)) for reg in regs]
        lines.append(f"| {LABELS.get(method, method)} ({lr:g}) | " + " | ".join(cells) + " |")
    if summary["wrn"]:
        lines += ["", f"Appendix C's network, {summary['wrn_model']}, with Mixup + Cutout:", "",
                  "| method | test error |", "|---|---|"]
        for method, e in summary["wrn"].items():
            lines.append(f"| {LABELS.get(method, method)} | {format_error(Cells.from_dict(e['test_error']))} |")
    lines += ["", "Final training loss (under Mixup, the loss on the mixed targets), mean ± std:", "",
              "| method | " + " | ".join(regs) + " |", "|---|" + "---|" * len(regs)]
    for method in summary["table"]:
        cells = [c.format(4) if (c := _cells(summary, method, reg, "train_loss")) else "not run" for reg in regs]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cells) + " |")
    if any(len(points) > 1 for series in summary.get("curves", {}).values() for points in series.values()):
        lines += ["", "Training loss and test error at every epoch, per regulariser (figures "
                  "`regularisation_curves_<regulariser>.png`: the mean over the seeds as a line, ± std as a band, n "
                  "in the legend): where a method's training loss sits lower while its test error sits higher, it "
                  "fits better and generalises worse."]
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_bars, plot_learning_curves

    if not summary["table"]:
        return []
    groups = {LABELS.get(m, m): {reg: e["test_error"] for reg, e in row.items()} for m, row in summary["table"].items()}
    for m, e in summary["wrn"].items():
        bar = f"{summary['wrn_model'].split(' (')[0]}, mixup+cutout"
        groups.setdefault(LABELS.get(m, m), {})[bar] = e["test_error"]
    paths = [plot_bars(groups, "test error (%)", folder / "regularisation.png", scale=100)]
    for reg, series in summary.get("curves", {}).items():
        if any(len(points) > 1 for points in series.values()):
            panels = {"train_loss": "training loss", "test_error": "test error (fraction)"}
            paths.append(plot_learning_curves(series, panels,
                                              folder / f"regularisation_curves_{reg.replace('+', '_')}.png",
                                              title=f"regulariser: {reg}; n = completed seeds", xlabel="epoch"))
    return paths


STUDY = Study("regularisation", "Regularisation: Mixup and Cutout per method (Tables 1-2, Appendix C)", train_cell,
              plan, summarise, claims, markdown, figures)
