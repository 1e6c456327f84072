"""The ablation study's rows at depth (the deep tier): Fixup and its ablations under Figure 3's protocol.

A row of :attr:`fixup.studies.grid.AblationGrid.at_depth` runs its methods at one depth, each for its seeds,
trained exactly as a Figure 3 cell (:func:`fixup.studies.depth.figure3_train`: Wide-ResNet width 1, one epoch at
lr 0.1, batch 32 on digits, no clipping, a collapse called after five dead steps). The cells are
``ablation/<method>/depth=<d>,protocol=figure3/seed<N>``; each records the epoch's test accuracy and its mean
training loss (the engine's history, :func:`fixup.studies._common.train_cell`), and an outcome other than
``completed`` (diverged, collapsed) is counted by name. The ablation claims read these rows where the grid
plans them (:func:`deepest`), and the budget rows otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..groups import SCALAR_LR_MULT
from ._common import image_cost, train_cell
from .cells import Cell, Task
from .claims import Protocol
from .depth import figure3_train
from .evidence import Cells, cells_from_results, ci_halfwidth, difference_text, outcome_of
from .grid import Grid
from .rows import image_protocol, model_label
from .stats import group_records

__all__ = ["PROTOCOL", "cells", "deepest", "history_value", "is_row", "markdown", "plan_tasks", "planned", "protocol",
           "summarise"]

PROTOCOL = "figure3"  # the cells' setting says which protocol they ran: {"depth": d, "protocol": "figure3"}


def history_value(key: str, epoch: int) -> Callable[[Mapping[str, Any]], float | None]:
    """A cell result's ``key`` (``train_loss``, ``test_acc``) in epoch ``epoch`` of its history."""
    def get(r: Mapping[str, Any]) -> float | None:
        h = r.get("history") or []
        return h[epoch].get(key) if len(h) > epoch else None
    return get


def planned(grid: Grid) -> dict[tuple[str, int], int]:
    """(method, depth) -> seeds, for every row at depth the grid plans (in the grid's order)."""
    out: dict[tuple[str, int], int] = {}
    for row in grid.ablation.at_depth:
        for method in row.methods:
            if (method, row.depth) in out:
                raise ValueError(f"the ablation grid lists {method} at {row.depth} layers in two rows of at_depth; "
                                 "list each method once per depth (a row's seeds apply to all its methods)")
            out[(method, row.depth)] = row.seeds or grid.seeds
    return out


def plan_tasks(grid: Grid) -> list[Task]:
    """The cells of the rows at depth: shallowest first, Fixup first at each depth, seed by seed (a run taken in
    plan order has every row at n=1 before any at n=2)."""
    rows = planned(grid)
    tasks = []
    for depth in sorted({d for _, d in rows}):
        here = sorted(((m, n) for (m, d), n in rows.items() if d == depth), key=lambda mn: mn[0] != "fixup")
        for seed in range(max(n for _, n in here)):
            for method, n in here:
                if seed < n:
                    cell = Cell("ablation", method, {"depth": depth, "protocol": PROTOCOL}, seed,
                                config={"train": figure3_train(grid, method, seed, depth)},
                                cost=image_cost(grid, depth, grid.depth.epochs))
                    tasks.append(Task(cell, train_cell))
    return tasks


def is_row(record: Mapping[str, Any]) -> bool:
    """A finished cell of a row at depth (not of the budget rows)."""
    return record.get("setting", {}).get("protocol") == PROTOCOL


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    """method -> str(depth) -> first-epoch test accuracy and training loss (Cells), and each seed's outcome; every
    planned row is there, finished or not (an unfinished one reads "not finished k of n")."""
    rows = planned(grid)
    groups = group_records([r for r in records if is_row(r)], "method", "depth")
    out: dict[str, dict[str, Any]] = {}
    for method, depth in [*rows, *(k for k in groups if k not in rows)]:
        recs = groups.get((method, depth), [])
        results = [r["result"] for r in recs]
        n = rows.get((method, depth), grid.seeds)
        out.setdefault(method, {})[str(depth)] = {
            "test_acc": cells_from_results(results, n, lambda r: r.get("test_acc")).to_dict(),
            "train_loss": cells_from_results(results, n, history_value("train_loss", 0)).to_dict(),
            "runs": [{"seed": r["seed"], "outcome": outcome_of(r["result"]), "test_acc": r["result"].get("test_acc"),
                      "train_loss": history_value("train_loss", 0)(r["result"])} for r in recs],
        }
    return out


def deepest(grid: Grid, method: str) -> int | None:
    """The deepest depth at which the grid runs ``method`` and Fixup under Figure 3's protocol: the depth its claim
    is judged at (None: the grid has no such row)."""
    rows = planned(grid)
    depths = [d for (m, d) in rows if m == method and ("fixup", d) in rows]
    return max(depths) if depths else None


def cells(summary: Mapping[str, Any], grid: Grid, method: str, depth: int, key: str) -> Cells:
    """The row's ``key`` (``test_acc`` or ``train_loss``) at ``depth``; an empty group of the planned seeds if none."""
    entry = summary.get("at_depth", {}).get(method, {}).get(str(depth))
    return Cells.from_dict(entry[key]) if entry else Cells(planned(grid).get((method, depth), grid.seeds))


def protocol(grid: Grid, depth: int, n: int) -> Protocol:
    g = grid.depth
    return image_protocol(grid, model=model_label(g.model, depth, g.width), paper_model="ResNet-110 (resnet_cifar)",
                          batch=g.batch_size_10000 if depth >= 10_000 else g.batch_size, epochs=g.epochs, lr=g.lr,
                          scalar_lr_mult=SCALAR_LR_MULT, n=n)


def _acc(c: Cells) -> str:
    return c.format(1, 100, "%")


def markdown(summary: Mapping[str, Any], grid: Grid, labels: Mapping[str, str]) -> str:
    rows = summary.get("at_depth", {})
    g = grid.depth
    lines = [f"Fixup and its ablations at depth, under Figure 3's protocol (Wide-ResNet width {g.width}, "
             f"{g.epochs} epoch at lr {g.lr:g}, batch {g.batch_size}, no clipping; {grid.describe_data()}): "
             "first-epoch test accuracy and mean training loss, mean ± std (n of planned; failed cells named by "
             "outcome). The difference columns give Fixup's advantage with the half-width of its 95% interval: the "
             "smallest difference these seeds can detect.", "",
             "| method | depth | test accuracy | training loss | Fixup − ablation, test accuracy (points) | "
             "ablation − Fixup, training loss |", "|---|---|---|---|---|---|"]
    for method, by_depth in rows.items():
        for depth in sorted(by_depth, key=int):
            d = int(depth)
            acc, loss = cells(summary, grid, method, d, "test_acc"), cells(summary, grid, method, d, "train_loss")
            gaps = ["", ""]
            if method != "fixup" and "fixup" in rows and depth in rows["fixup"]:
                fx_acc, fx_loss = cells(summary, grid, "fixup", d, "test_acc"), cells(summary, grid, "fixup", d,
                                                                                      "train_loss")
                gaps = [_gap(fx_acc, acc, lambda x: f"{round(100 * x, 1) + 0.0:.1f}"),
                        _gap(loss, fx_loss, lambda x: f"{round(x, 3) + 0.0:.3f}")]
            lines.append(f"| {labels.get(method, method)} | {d:,} | {_acc(acc)} | {loss.format(3)} | {gaps[0]} | "
                         f"{gaps[1]} |")
    return "\n".join(lines)


def _gap(a: Cells, b: Cells, fmt: Callable[[float], str]) -> str:
    """``mean(a) - mean(b)`` with its 95% interval; "—" where a side has no completed value."""
    ma, mb = a.stat.mean, b.stat.mean
    if ma is None or mb is None:
        return "—"
    return difference_text(ma - mb, ci_halfwidth(a, b), fmt)
