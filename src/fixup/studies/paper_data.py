"""The paper's rows on SVHN (Appendix C) and ImageNet (Table 2), run in full mode where ``--data-dir`` holds them.

SVHN: Appendix C's Wide-ResNet with Mixup and Cutout, Fixup against BatchNorm (the paper: 1.4% each).
ImageNet: ResNet-50 with BatchNorm, without normalisation (Xavier) and with Fixup, each with and without
Mixup, and ResNet-101 as Table 2 lists it. Every cell carries its own data set in its train config; the
scale (networks, epochs, rates) is :class:`fixup.studies.grid.SvhnGrid` and
:class:`fixup.studies.grid.ImageNetGrid`, which say where they follow the paper and where the choice is
ours. Where a data set was not found nothing is planned for it, and its claim rows say which folder under
``--data-dir`` was missing.

The claims are judged by :func:`fixup.studies.claims.judge`:

- ``svhn_wrn``: Fixup matches BatchNorm: the 95% interval of Fixup's error minus BatchNorm's lies below
  :data:`fixup.studies.regularisation.EQUIVALENCE` (the rule of Appendix C's CIFAR-10 row).
- ``imagenet_resnet50``: Fixup's error is clearly below Xavier-without-normalisation's and Mixup clearly
  lowers Fixup's; the paper's effects are 3.9 and 3.6 points.
- ``imagenet_resnet101``: Fixup + Mixup matches GroupNorm + Mixup (the equivalence rule above).

Mixup alpha per method is the paper's (section 4.2); it gives none for the unnormalised network, which
gets BatchNorm's, as in the regularisation study.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..groups import SCALAR_LR_MULT
from . import paper
from ._common import image_cost, image_train, train_cell
from .base import Plan, Study
from .cells import Cell, Task
from .claims import ClaimRow, Protocol, clearly_below, judge, not_run
from .evidence import Cells, ci_halfwidth, difference_text, interval_text
from .grid import Grid, ImageNetGrid, SvhnGrid
from .regularisation import EQUIVALENCE, error_entry, format_error, points
from .regularisation import LABELS as _METHOD_LABELS
from .regularisation import MIXUP_ALPHA as _ALPHA
from .rows import model_label, scalars_text, steps
from .stats import group_records
from .store import Store

__all__ = ["MIXUP_ALPHA", "STUDY"]

NAME = "paper_data"
LABELS = {**_METHOD_LABELS, "xavier": "Xavier, no normalisation", "mixup": "Mixup"}
MIXUP_ALPHA = {**_ALPHA, "xavier": paper.MIXUP_ALPHA["batchnorm"]}  # xavier: our choice, see module doc
FOLDER = "folder"  # the ImageNet-style data set's name in fixup.data.DATASETS


def _wrn(g: SvhnGrid) -> str:
    return f"wrn-{g.depth}-{g.width}"


def _resnets(g: ImageNetGrid) -> dict[int, tuple[str, ...]]:
    """The planned rows ("method" or "method+mixup") per ResNet depth."""
    return {50: g.resnet50, 101: g.resnet101}


def _svhn_tasks(grid: Grid) -> list[Task]:
    g = grid.svhn
    if not g.data_dir:
        return []
    tasks = []
    for method in g.methods:
        fields: dict[str, Any] = {"model": g.model, "depth": g.depth, "width": g.width, "lr": g.lr,
                                  "weight_decay": g.weight_decay, "batch_size": g.batch_size, "epochs": g.epochs,
                                  "mixup_alpha": MIXUP_ALPHA[method], "cutout": g.cutout}
        if method == "fixup":  # section 4.2: scalar rate /10 under strong regularisation
            fields["scalar_lr_mult"] = g.strong_scalar_lr_mult
        cost = image_cost(grid, g.depth, g.epochs, data="svhn", model=g.model, width=g.width)
        for seed in range(grid.seeds):
            cell = Cell(NAME, method, {"data": "svhn", "net": _wrn(g), "reg": "mixup+cutout"}, seed, cost=cost,
                        config={"train": image_train(grid, method, seed, data="svhn", data_dir=g.data_dir,
                                                     **fields)})
            tasks.append(Task(cell, train_cell))
    return tasks


def _imagenet_tasks(grid: Grid) -> list[Task]:
    g = grid.imagenet
    if not g.data_dir:
        return []
    tasks = []
    for depth, rows in _resnets(g).items():
        cost = image_cost(grid, depth, g.epochs, data=FOLDER, image_size=g.image_size, model=g.model, width=g.width)
        for row in rows:
            method, _, reg = row.partition("+")
            fields: dict[str, Any] = {"model": g.model, "depth": depth, "image_size": g.image_size,
                                      "lr": g.xavier_lr if method == "xavier" else g.lr,
                                      "weight_decay": g.weight_decay, "batch_size": g.batch_size, "epochs": g.epochs,
                                      "milestones": list(g.milestones), "num_workers": g.num_workers}
            if g.width:
                fields["width"] = g.width
            if reg == "mixup":
                fields["mixup_alpha"] = MIXUP_ALPHA[method]
                if method == "fixup":
                    fields["scalar_lr_mult"] = g.strong_scalar_lr_mult
            for seed in range(grid.seeds):
                cell = Cell(NAME, method, {"data": "imagenet", "net": f"resnet-{depth}", "reg": reg or "none"}, seed,
                            cost=cost, config={"train": image_train(grid, method, seed, data=FOLDER,
                                                                    data_dir=g.data_dir, **fields)})
                tasks.append(Task(cell, train_cell))
    return tasks


def plan(grid: Grid, store: Store) -> Plan:
    return Plan(_svhn_tasks(grid) + _imagenet_tasks(grid))


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    svhn: dict[str, Any] = {}
    imagenet: dict[str, dict[str, Any]] = {}
    for (data, net, method, reg), recs in group_records(records, "data", "net", "method", "reg").items():
        if data == "svhn" and net == _wrn(grid.svhn):
            svhn[method] = error_entry(recs, grid.seeds)
        elif data == "imagenet":
            imagenet.setdefault(net, {})[method if reg == "none" else f"{method}+{reg}"] = error_entry(recs, grid.seeds)
    return {"svhn": svhn, "imagenet": imagenet, "svhn_data": grid.svhn.data_dir, "svhn_missing": grid.svhn.missing,
            "imagenet_data": grid.imagenet.data_dir, "imagenet_missing": grid.imagenet.missing,
            "mixup_alpha": MIXUP_ALPHA, "planned_seeds": grid.seeds}


def _cells(table: dict[str, Any], row: str, planned: int) -> Cells:
    return Cells.from_dict(table[row]["test_error"]) if row in table else Cells(planned)


def _label(row: str) -> str:
    return " + ".join(LABELS.get(part, part) for part in row.split("+"))


def _gap(a: Cells, b: Cells) -> tuple[float, float]:
    """Mean of ``a`` minus mean of ``b`` (nan where either is missing) and the 95% half-width."""
    sa, sb = a.stat, b.stat
    diff = sa.mean - sb.mean if sa.mean is not None and sb.mean is not None else math.nan
    return diff, ci_halfwidth(a, b)


def _matches(claim: str, ours: str, a: tuple[str, Cells], b: tuple[str, Cells], protocol: Protocol,
             paper_scale: bool) -> ClaimRow:
    """The equivalence rule: the 95% interval of a's error minus b's lies below EQUIVALENCE."""
    diff, ci = _gap(a[1], b[1])
    j = judge(dict((a, b)), holds=diff + ci < EQUIVALENCE, contrary=diff - ci > EQUIVALENCE, paper_scale=paper_scale,
              ci=ci, must_succeed=(a[0],), match=(diff, EQUIVALENCE), fmt=points)
    return ClaimRow.judged(claim, f"{ours}; difference {difference_text(diff, ci, points)}", protocol, j,
                           f"holds if the 95% interval of {a[0]}'s error minus {b[0]}'s lies below "
                           f"{100 * EQUIVALENCE:g} point (the paper calls a 0.7-point gap on par)")


def _svhn_claim(summary: dict[str, Any], grid: Grid) -> ClaimRow:
    g = grid.svhn
    if not g.data_dir:
        return not_run("svhn_wrn", f"SVHN not run: {g.missing}")
    if not {"fixup", "batchnorm"} <= set(g.methods):
        return not_run("svhn_wrn", "Fixup or BatchNorm not in the SVHN grid")
    full = SvhnGrid()
    protocol = Protocol(model=model_label(g.model, g.depth, g.width),
                        paper_model=model_label(full.model, full.depth, full.width),
                        data=f"SVHN ({g.data_dir}), {g.epochs} epochs", steps=steps(grid, g.batch_size, g.epochs,
                                                                                    data="svhn"),
                        n=grid.seeds, lr=g.lr, batch=g.batch_size, scalars=scalars_text(g.strong_scalar_lr_mult))
    fx, bn = (_cells(summary["svhn"], m, grid.seeds) for m in ("fixup", "batchnorm"))
    ours = (f"{model_label(g.model, g.depth, g.width)}, {g.epochs} epochs, Mixup + Cutout {g.cutout} px, test error: "
            f"Fixup {format_error(fx)} vs BatchNorm {format_error(bn)} (the paper's WRN size is not in our sources: "
            f"{model_label(full.model, full.depth, full.width)} is our choice)")
    paper_scale = g.depth >= full.depth and g.width >= full.width and g.epochs >= full.epochs
    return _matches("svhn_wrn", ours, ("Fixup", fx), ("BatchNorm", bn), protocol, paper_scale)


def _imagenet_protocol(grid: Grid, depth: int) -> Protocol:
    g = grid.imagenet
    return Protocol(model=model_label(g.model, depth, g.width or None), paper_model=model_label(g.model, depth),
                    data=f"ImageNet-style folder {g.data_dir} at {g.image_size}x{g.image_size}, {g.epochs} epochs",
                    steps=steps(grid, g.batch_size, g.epochs, data=FOLDER), n=grid.seeds, lr=g.lr,
                    batch=g.batch_size, paper_lr=paper.IMAGENET_PROTOCOL["lr"],
                    paper_batch=paper.IMAGENET_PROTOCOL["batch"], scalars=scalars_text(SCALAR_LR_MULT))


def _imagenet_paper_scale(g: ImageNetGrid) -> bool:
    return g.width in (0, 64) and g.image_size >= 224 and g.epochs >= paper.IMAGENET_PROTOCOL["epochs"]


def _errors(table: dict[str, Any], rows: tuple[str, ...], grid: Grid) -> str:
    """Every planned row's test error, with the unnormalised network's rate."""
    lr = f" (lr {grid.imagenet.xavier_lr:g})"
    return "; ".join(f"{_label(r)}{lr if r.startswith('xavier') else ''} {format_error(_cells(table, r, grid.seeds))}"
                     for r in rows)


def _resnet50_claim(summary: dict[str, Any], grid: Grid) -> ClaimRow:
    g = grid.imagenet
    if not g.data_dir:
        return not_run("imagenet_resnet50", f"ImageNet not run: {g.missing}")
    if not {"fixup", "xavier", "fixup+mixup"} <= set(g.resnet50):
        return not_run("imagenet_resnet50", "Fixup, Xavier or Fixup + Mixup not in the ResNet-50 grid")
    table = summary["imagenet"].get("resnet-50", {})
    fx, xv, fxm = (_cells(table, r, grid.seeds) for r in ("fixup", "xavier", "fixup+mixup"))
    beats, mixup_helps = clearly_below(fx, xv), clearly_below(fxm, fx)
    p = paper.IMAGENET_RESNET50
    if not beats:  # the comparison that fails decides the effect tested
        effect, ci = (p["none"].value - p["fixup"].value) / 100, ci_halfwidth(fx, xv)
    else:
        effect, ci = (p["fixup"].value - p["fixup+mixup"].value) / 100, ci_halfwidth(fxm, fx)
    j = judge({"Fixup": fx, "Xavier, no norm": xv, "Fixup + Mixup": fxm}, holds=beats and mixup_helps,
              paper_scale=_imagenet_paper_scale(g), effect=effect, ci=ci, must_succeed=("Fixup", "Fixup + Mixup"),
              fmt=points)
    return ClaimRow.judged("imagenet_resnet50", f"top-1 test error: {_errors(table, g.resnet50, grid)}; 95% interval "
                           f"of the tested difference {interval_text(ci, points)}", _imagenet_protocol(grid, 50), j,
                           "holds if Fixup's error is clearly below Xavier-without-normalisation's and Mixup clearly "
                           "lowers Fixup's; the paper's effects are 3.9 and 3.6 points")


def _resnet101_claim(summary: dict[str, Any], grid: Grid) -> ClaimRow:
    g = grid.imagenet
    if not g.data_dir:
        return not_run("imagenet_resnet101", f"ImageNet not run: {g.missing}")
    if not {"fixup+mixup", "groupnorm+mixup"} <= set(g.resnet101):
        return not_run("imagenet_resnet101", "Fixup + Mixup or GroupNorm + Mixup not in the ResNet-101 grid")
    table = summary["imagenet"].get("resnet-101", {})
    fxm, gnm = (_cells(table, r, grid.seeds) for r in ("fixup+mixup", "groupnorm+mixup"))
    return _matches("imagenet_resnet101", f"top-1 test error: {_errors(table, g.resnet101, grid)}",
                    ("Fixup + Mixup", fxm), ("GroupNorm + Mixup", gnm), _imagenet_protocol(grid, 101),
                    _imagenet_paper_scale(g))


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    return [_svhn_claim(summary, grid), _resnet50_claim(summary, grid), _resnet101_claim(summary, grid)]


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    lines = [f"Test error, mean ± std (n of planned; failed cells named by outcome). Mixup alpha per method: "
             f"{', '.join(f'{LABELS.get(m, m)} {a}' for m, a in MIXUP_ALPHA.items())}.", ""]
    s, g = grid.svhn, grid.imagenet
    if s.data_dir:
        lines += [f"SVHN ({s.data_dir}): {model_label(s.model, s.depth, s.width)}, Mixup + Cutout {s.cutout} px, "
                  f"{s.epochs} epochs.", "", "| method | test error |", "|---|---|"]
        lines += [f"| {_label(m)} | {format_error(_cells(summary['svhn'], m, grid.seeds))} |" for m in s.methods]
    else:
        lines.append(f"SVHN not run: {s.missing}.")
    lines.append("")
    if g.data_dir:
        lines += [f"ImageNet ({g.data_dir}) at {g.image_size}x{g.image_size}, {g.epochs} epochs, top-1 test error; "
                  f"the unnormalised network at lr {g.xavier_lr:g}.", "", "| network | row | test error |",
                  "|---|---|---|"]
        for depth, rows in _resnets(g).items():
            table = summary["imagenet"].get(f"resnet-{depth}", {})
            lines += [f"| {model_label(g.model, depth, g.width or None)} | {_label(r)} | "
                      f"{format_error(_cells(table, r, grid.seeds))} |" for r in rows]
    else:
        lines.append(f"ImageNet not run: {g.missing}.")
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    return []  # the rows are few: the tables above carry them


STUDY = Study(NAME, "SVHN and ImageNet: the paper's other image data sets (Appendix C, Table 2)", train_cell, plan,
              summarise, claims, markdown, figures)
