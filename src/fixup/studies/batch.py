"""The batch-size study: does a batch-independent network train where BatchNorm cannot? (issue 36)

The paper makes no batch-size experiment; the claim is the project's (DESIGN.md: users who drop
BatchNorm for small or variable batches). Fixup, BatchNorm, GroupNorm, SkipInit and NF-ResNet train a
CIFAR ResNet at each batch size of :class:`fixup.studies.grid.BatchGrid`, under three rules:

- **Equal examples.** Every cell makes the same number of passes over the training part, so a cell at
  batch B takes ``epochs x ceil(examples / B)`` steps.
- **The rate.** At batch B the searched peak rates are ``0.1 x sqrt(B / 128) x f`` for each factor f (1/3,
  1, 3): square-root scaling from the paper's rate at batch 128, a small search around it. Each (method,
  batch) keeps the rate with the highest mean *validation* accuracy over its seeds (a failed seed counts
  as 0), on a fixed stratified fifth of the training set that no cell trains on; ties go to the smaller
  rate. Where the best is the largest (smallest) rate searched, the search goes on with a rate 3 times
  larger (smaller), at most twice each way. The test set gives the chosen rate's figures only. A rate
  still at the edge of the searched range is marked: the search did not bracket that cell's best rate.
- **BatchNorm at any batch is a measured row.** Where a BatchNorm layer would see a single value per
  channel in training (batch 1 on 1x1 maps), torch refuses the step; the cell records the outcome
  ``failed`` with the layer and the shape, and runs nothing. Divergence and collapse are the engine's
  outcomes, as in every study.

BatchNorm's train/eval mismatch is measured on the test set with the same trained network twice: with
the running statistics (as deployed; the accuracy the table reports) and with each test batch's own
statistics at the training batch size (as it trained). Where the second is clearly above the first,
the running statistics no longer describe what the network learnt with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._batch_cell import batch_cell
from ._common import NATIVE_SIDE, TRAIN_SIZE, chance_level, image_train
from .base import Plan, Study
from .cells import Cell, Task
from .claims import ClaimRow, Protocol, clearly_above, judge, not_run
from .evidence import COMPLETED, Cells, cells_from_results, ci_halfwidth, difference_text, outcome_of
from .grid import Grid
from .rows import model_label
from .stats import group_records
from .store import Store

__all__ = ["EQUIVALENCE", "EXTEND", "MARGIN", "MAX_EXTENSIONS", "STUDY", "batch_cell", "choose_rate", "extension",
           "lr_grid", "train_examples"]

LABELS = {"fixup": "Fixup", "batchnorm": "BatchNorm", "groupnorm": "GroupNorm", "skipinit": "SkipInit",
          "nf_resnet": "NF-ResNet", "rezero": "ReZero"}
# "BatchNorm cannot": a batch-independent method's test accuracy above BatchNorm's by more than its 95% interval
# and by at least this much (our choice: a gap smaller than a point is not what users drop BatchNorm for).
MARGIN = 0.01
# "On par with GroupNorm": the 95% interval of GroupNorm's accuracy minus Fixup's lies below this (our choice, as the
# regularisation study's equivalence: the paper calls a 0.7-point gap on par, Table 2).
EQUIVALENCE = 0.01
# A training step costs about as much as this many more examples through the same layers (fixed costs per step:
# the optimiser, the parameter groups, Python; fitted to timed steps of ResNet-14 on digits at batch 1 and 128),
# which is what makes a small-batch epoch slow. For the duration estimate only.
STEP_EXAMPLES = 26
# Where the best rate on validation is the largest (smallest) searched, the search goes on with a rate this many
# times larger (smaller), at most MAX_EXTENSIONS times each way: a best rate at the edge says the search has not
# bracketed it (issue 36's quick tier: Fixup's best at batch 128 in 18 steps was the largest of the three).
EXTEND = 3.0
MAX_EXTENSIONS = 2


def lr_grid(grid: Grid, batch: int) -> list[float]:
    """The peak rates searched at ``batch`` (3 significant digits): sqrt scaling from the reference, times each
    factor."""
    g = grid.batch
    base = g.lr_reference * math.sqrt(batch / g.lr_reference_batch)
    return [float(f"{base * f:.3g}") for f in g.lr_factors]


def train_examples(grid: Grid) -> int:
    """Training examples a cell trains on: the training set less the validation part (and the tiny tier's limit)."""
    n = TRAIN_SIZE.get(grid.data, 50_000)
    n -= round(n * grid.batch.val_fraction)
    return min(n, grid.batch.train_limit) if grid.batch.train_limit else n


def _steps(grid: Grid, batch: int) -> int:
    return grid.batch.epochs * math.ceil(train_examples(grid) / batch)


def _cost(grid: Grid, batch: int) -> float:
    side = grid.image_size or NATIVE_SIDE.get(grid.data, 32)
    g = grid.batch
    return g.depth * (g.epochs * train_examples(grid) + STEP_EXAMPLES * _steps(grid, batch)) * (side / 8) ** 2


def _cell(grid: Grid, method: str, batch: int, lr: float, seed: int) -> Cell:
    g = grid.batch
    train = image_train(grid, method, seed, model=g.model, depth=g.depth, lr=lr, weight_decay=g.weight_decay,
                        batch_size=batch, epochs=g.epochs, schedule=g.schedule)
    config = {"train": train, "val_fraction": g.val_fraction, "train_limit": g.train_limit}
    return Cell("batch", method, {"batch": batch, "lr": lr}, seed, config=config, cost=_cost(grid, batch))


def extension(grid: Grid, batch: int, searched: Mapping[float, Cells]) -> float | None:
    """The next rate to search at ``batch``, or None: where every searched rate has finished and the best on
    validation is the largest (smallest) one, a rate :data:`EXTEND` times larger (smaller), at most
    :data:`MAX_EXTENSIONS` times each way beyond the grid's rates."""
    chosen = choose_rate(searched)
    if chosen is None or len(searched) < 2:
        return None
    base, lr = lr_grid(grid, batch), chosen[0]
    if lr == max(searched) and sum(r > max(base) for r in searched) < MAX_EXTENSIONS:
        return float(f"{lr * EXTEND:.3g}")
    if lr == min(searched) and sum(r < min(base) for r in searched) < MAX_EXTENSIONS:
        return float(f"{lr / EXTEND:.3g}")
    return None


def plan(grid: Grid, store: Store) -> Plan:
    """Every (method, batch, rate, seed) of the grid, and the rates the search extends to once those finish."""
    g = grid.batch
    tasks = []
    for batch in g.batch_sizes:
        for method in g.methods:
            rates = lr_grid(grid, batch)
            searched: dict[float, Cells] = {}
            while rates:
                for lr in rates:
                    cells = [_cell(grid, method, batch, lr, seed) for seed in range(grid.seeds)]
                    tasks += [Task(c, batch_cell) for c in cells]
                    done = [r["result"] for c in cells if (r := store.load(c)) is not None]
                    searched[lr] = _cells(done, grid.seeds, "val_acc")
                more = extension(grid, batch, searched)
                rates = [more] if more is not None and more not in searched else []
    return Plan(tasks)


# -- the rate chosen on validation, and the summary ---------------------------------------------------


def choose_rate(searched: Mapping[float, Cells]) -> tuple[float, str] | None:
    """The rate with the highest mean validation accuracy over its planned seeds (a failed seed counts as 0; ties
    go to the smaller rate), and why; None while a searched rate has unfinished seeds."""
    if not searched or any(not c.complete for c in searched.values()):
        return None
    score = {lr: sum(c.values) / c.planned for lr, c in searched.items()}
    best = max(sorted(score), key=lambda lr: score[lr])  # max keeps the first (smallest) of equal scores
    failed = {lr: c.n_failed for lr, c in searched.items() if c.n_failed}
    note = ("; failed seeds counted as 0: " + ", ".join(f"lr {lr:g} {k}" for lr, k in sorted(failed.items()))
            if failed else "")
    return best, f"mean validation accuracy {100 * score[best]:.1f}%{note}"


def _cells(results: Sequence[Mapping[str, Any]], planned: int, key: str) -> Cells:
    return cells_from_results(results, planned, lambda r: r.get(key))


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    planned = grid.seeds
    by_lr: dict[tuple[str, int], dict[float, list[dict[str, Any]]]] = {}
    for (method, batch, lr), recs in group_records(records, "method", "batch", "lr").items():
        by_lr.setdefault((method, int(batch)), {})[float(lr)] = [r["result"] for r in recs]
    methods: dict[str, dict[str, Any]] = {}
    for (method, batch), rates in by_lr.items():
        searched = {lr: _cells(res, planned, "val_acc") for lr, res in rates.items()}
        for lr in lr_grid(grid, batch):  # a rate of the grid with no finished cell keeps the search open
            searched.setdefault(lr, Cells(planned))
        chosen = choose_rate(searched)
        more = extension(grid, batch, searched)
        entry: dict[str, Any] = {"searched": {f"{lr:g}": c.to_dict() for lr, c in sorted(searched.items())},
                                 "steps": _steps(grid, batch), "lr": None, "why": "the rate search is not finished",
                                 "edge": False, "test_acc": Cells(planned).to_dict(), "reasons": []}
        if more is not None:
            entry["why"] = f"the best rate so far is at the edge of the search, which goes on at lr {more:g}"
        elif chosen is not None:
            lr, why = chosen
            res = rates.get(lr, [])
            entry.update(lr=lr, why=why, edge=len(searched) > 1 and lr in (min(searched), max(searched)),
                         test_acc=_cells(res, planned, "test_acc").to_dict(),
                         val_acc=searched[lr].to_dict(), train_acc=_cells(res, planned, "train_acc").to_dict(),
                         runs=[{"outcome": outcome_of(r), "test_acc": r.get("test_acc"), "reason": r.get("reason", "")}
                               for r in res],
                         reasons=sorted({r.get("reason", "") for r in res if outcome_of(r) != COMPLETED} - {""}))
            if any(r.get("test_acc_batch_stats") is not None for r in res) or method == "batchnorm":
                entry["test_acc_batch_stats"] = _cells(res, planned, "test_acc_batch_stats").to_dict()
        methods.setdefault(method, {})[str(batch)] = entry
    return {"methods": methods, "batch_sizes": sorted(grid.batch.batch_sizes), "chance": chance_level(grid),
            "planned_seeds": planned, "train_examples": train_examples(grid), "scale": _protocol(grid).describe(),
            "rates": {str(b): lr_grid(grid, b) for b in grid.batch.batch_sizes}}


def _protocol(grid: Grid) -> Protocol:
    g = grid.batch
    sizes = sorted(g.batch_sizes)
    model = (f"{model_label(g.model, g.depth)}, batch {sizes[0]}-{sizes[-1]}, {g.epochs} epochs of "
             f"{train_examples(grid):,} examples at every batch size ({_steps(grid, sizes[-1]):,} steps at batch "
             f"{sizes[-1]}, the steps below at batch {sizes[0]})")
    return Protocol(model=model, paper_model=model, data=f"{grid.describe_data()} (a fifth of the training set held "
                    "out for the rate search)" if g.val_fraction == 0.2 else grid.describe_data(),
                    steps=_steps(grid, sizes[0]), n=grid.seeds)


def _at(summary: Mapping[str, Any], method: str, batch: int, key: str = "test_acc") -> Cells | None:
    entry = summary["methods"].get(method, {}).get(str(batch))
    return None if entry is None or key not in entry else Cells.from_dict(entry[key])


def _acc(c: Cells | None) -> str:
    return "not run" if c is None else c.format(1, 100, "%")


def _points(x: float) -> str:
    return f"{100 * x:.1f} points" if math.isfinite(x) else "inf"


def _gap(a: Cells, b: Cells) -> tuple[float, float]:
    """mean(a) - mean(b) and its 95% interval's half-width (nan, inf without a mean on a side)."""
    if a.stat.mean is None or b.stat.mean is None:
        return math.nan, math.inf
    return a.stat.mean - b.stat.mean, ci_halfwidth(a, b)


def beats_batchnorm(other: Cells, bn: Cells) -> bool:
    """``other`` trains where BatchNorm cannot: every seed of ``other`` completed, and BatchNorm failed a seed or
    is below by more than the 95% interval and by at least :data:`MARGIN`."""
    if other.n_failed or other.stat.mean is None:
        return False
    if bn.n_failed:
        return True
    gap, ci = _gap(other, bn)
    return clearly_above(other, bn) and gap >= MARGIN and math.isfinite(ci)


def _independent(grid: Grid) -> list[str]:
    return [m for m in grid.batch.methods if m != "batchnorm"]


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    proto = _protocol(grid)
    sizes = summary["batch_sizes"]
    planned = Cells(grid.seeds)
    paper_scale = grid.data == "cifar10"
    rows = []
    methods = set(grid.batch.methods)
    if not {"fixup", "batchnorm"} <= methods:
        rows.append(not_run("batch_independent_trains", "Fixup or BatchNorm not in the grid", proto.describe()))
    else:
        fx = {b: _at(summary, "fixup", b) or planned for b in sizes}
        bn = {b: _at(summary, "batchnorm", b) or planned for b in sizes}
        wins = [b for b in sizes if beats_batchnorm(fx[b], bn[b])]
        smallest = sizes[0]
        contrary = clearly_above(bn[smallest], fx[smallest])
        groups = {**{f"Fixup at batch {b}": fx[b] for b in sizes}, **{f"BatchNorm at batch {b}": bn[b] for b in sizes}}
        j = judge(groups, holds=bool(wins), paper_scale=paper_scale, contrary=contrary,
                  ci=ci_halfwidth(bn[smallest], fx[smallest]), must_succeed=[f"Fixup at batch {b}" for b in sizes])
        others = []
        for m in _independent(grid):
            won = [b for b in sizes if (c := _at(summary, m, b)) is not None and beats_batchnorm(c, bn[b])]
            others.append(f"{LABELS.get(m, m)} {'at batch ' + ', '.join(map(str, won)) if won else 'nowhere'}")
        gaps = "; ".join(f"batch {b}: {difference_text(*_gap(fx[b], bn[b]), _points)}" for b in sizes)
        rows.append(ClaimRow.judged(
            "batch_independent_trains",
            f"Fixup minus BatchNorm test accuracy at each rate chosen on validation: {gaps}. Clearly above "
            f"BatchNorm: {'; '.join(others)}", proto, j,
            f"holds if at some batch size Fixup completes every seed and BatchNorm fails a seed or is below Fixup by "
            f"more than the 95% interval and by at least {100 * MARGIN:g} point; refuted if BatchNorm is clearly above "
            f"Fixup at the smallest batch size ({smallest})"))
    if not {"fixup", "groupnorm"} <= methods:
        rows.append(not_run("fixup_groupnorm_every_batch", "Fixup or GroupNorm not in the grid", proto.describe()))
    else:
        fx = {b: _at(summary, "fixup", b) or planned for b in sizes}
        gn = {b: _at(summary, "groupnorm", b) or planned for b in sizes}
        gaps = {b: _gap(gn[b], fx[b]) for b in sizes}
        within = all(g + ci < EQUIVALENCE for g, ci in gaps.values())
        behind = [b for b, (g, ci) in gaps.items() if g - ci > EQUIVALENCE]
        groups = {**{f"Fixup at batch {b}": fx[b] for b in sizes}, **{f"GroupNorm at batch {b}": gn[b] for b in sizes}}
        j = judge(groups, holds=within, paper_scale=paper_scale, contrary=bool(behind),
                  ci=max((ci for _, ci in gaps.values()), default=math.inf),
                  must_succeed=list(groups))
        text = "; ".join(f"batch {b}: {difference_text(g, ci, _points)}" for b, (g, ci) in gaps.items())
        rows.append(ClaimRow.judged(
            "fixup_groupnorm_every_batch", f"GroupNorm minus Fixup test accuracy: {text}"
            + (f"; GroupNorm ahead beyond the interval at batch {', '.join(map(str, behind))}" if behind else ""),
            proto, j, f"holds if at every batch size the 95% interval of GroupNorm's accuracy minus Fixup's lies below "
                      f"{100 * EQUIVALENCE:g} point; refuted if at some batch size it lies above"))
    return rows


def _mismatch(summary: Mapping[str, Any]) -> list[tuple[int, Cells, Cells, bool]]:
    """Per batch size: BatchNorm's test accuracy with running statistics and with batch statistics, and whether
    the running statistics cost it more than the 95% interval and at least MARGIN."""
    rows = []
    for b in summary["batch_sizes"]:
        run, own = _at(summary, "batchnorm", b), _at(summary, "batchnorm", b, "test_acc_batch_stats")
        if run is None or own is None:
            continue
        gap, _ = _gap(own, run)
        rows.append((b, run, own, clearly_above(own, run) and gap >= MARGIN))
    return rows


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    g = grid.batch
    sizes = summary["batch_sizes"]
    factors = ", ".join(f"{f:.3g}" for f in g.lr_factors)
    lines = [f"Test accuracy at each batch size, mean ± std over seeds (n), each (method, batch) at the rate chosen "
             f"on validation ({summary['scale']}). Not an experiment of the paper: issue 36's test of the claim that "
             f"a batch-independent network trains where BatchNorm cannot.", "",
             f"Rules. Equal examples: {g.epochs} epochs of the same {summary['train_examples']:,} training examples at "
             f"every batch size (steps = epochs x ceil(examples / batch), from "
             f"{_steps(grid, sizes[-1]):,} at batch {sizes[-1]} to "
             f"{_steps(grid, sizes[0]):,} at batch {sizes[0]}). Rates: at batch B the peak rates "
             f"{g.lr_reference:g} x sqrt(B / {g.lr_reference_batch}) x ({factors}), {g.schedule} schedule, momentum "
             f"0.9, weight decay {g.weight_decay:g}, no gradient clipping but each method's own recipe (AGC for "
             f"NF-ResNet; Fixup's scalars at a tenth of the rate); the rate with the highest mean validation accuracy "
             f"(a failed seed counts as 0; ties to the smaller rate) on {g.val_fraction:.0%} of the training set held "
             f"out is kept; where it is the largest (smallest) searched, the search goes on {EXTEND:g} times larger "
             f"(smaller), at most {MAX_EXTENSIONS} times each way; the test set gives that rate's figures only. * "
             "marks a rate still at the edge of the searched range. Chance is "
             f"{summary['chance']:.0%}.", "",
             "| method | " + " | ".join(f"batch {b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    notes: list[str] = []
    for method, entries in summary["methods"].items():
        cells = []
        for b in sizes:
            e = entries.get(str(b))
            if e is None:
                cells.append("not run")
                continue
            lr = "" if e["lr"] is None else f" (lr {_rate(e)})"
            cells.append(_acc(Cells.from_dict(e["test_acc"])) + lr)
            notes += [f"{LABELS.get(method, method)} at batch {b}: {r}" for r in e["reasons"]]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Failed cells: " + "; ".join(dict.fromkeys(notes)) + "."]
    if {"fixup", "groupnorm"} <= set(summary["methods"]):
        lines += ["", "Fixup against GroupNorm: test accuracy, GroupNorm minus Fixup with its 95% interval, and each "
                  "one's training accuracy over its last epoch (lower for Fixup too: it has not fitted the training "
                  "set in this budget; equal: the gap is in generalisation), with each one's chosen rate (* at the "
                  "edge of the search: a wider search might move it).", "",
                  "| batch | GroupNorm | Fixup | difference | training accuracy, GroupNorm / Fixup | rates |",
                  "|---|---|---|---|---|---|"]
        for b in sizes:
            fx, gn = _at(summary, "fixup", b), _at(summary, "groupnorm", b)
            if fx is None or gn is None:
                continue
            tg, tf = _at(summary, "groupnorm", b, "train_acc"), _at(summary, "fixup", b, "train_acc")
            rates = " / ".join(_rate(summary["methods"][m][str(b)]) for m in ("groupnorm", "fixup"))
            train = f"{_acc(tg)} / {_acc(tf)}" if tg is not None and tf is not None else "not finished"
            lines.append(f"| {b} | {_acc(gn)} | {_acc(fx)} | {difference_text(*_gap(gn, fx), _points)} | {train} | "
                         f"{rates} |")
    mismatch = _mismatch(summary)
    if mismatch:
        hurt = [b for b, *_, h in mismatch if h]
        where = (f"more than {100 * MARGIN:g} point beyond the 95% interval at batch {', '.join(map(str, hurt))}: "
                 f"the mismatch starts to hurt at batch {max(hurt)} and below" if hurt
                 else f"by more than {100 * MARGIN:g} point beyond the 95% interval at no batch size of the grid")
        lines += ["", "BatchNorm's train/eval mismatch: the same trained networks on the test set with the running "
                  "statistics (as deployed, the table above) and with each test batch's own statistics at the training "
                  f"batch size (as trained). The running statistics cost BatchNorm {where}.", "",
                  "| batch | running statistics | batch statistics | difference |", "|---|---|---|---|"]
        for b, run, own, _ in mismatch:
            lines.append(f"| {b} | {_acc(run)} | {_acc(own)} | {difference_text(*_gap(own, run), _points)} |")
    lines += ["", "The search: mean validation accuracy per rate (n finished of planned).", "",
              "| method | batch | " + " | ".join(f"rate {i + 1}" for i in range(len(g.lr_factors))) + " |",
              "|---|---|" + "---|" * len(g.lr_factors)]
    for method, entries in summary["methods"].items():
        for b in sizes:
            e = entries.get(str(b))
            if e is None:
                continue
            cells = [f"{lr}: {Cells.from_dict(c).format(1, 100, '%')}" for lr, c in e["searched"].items()]
            lines.append(f"| {LABELS.get(method, method)} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rate(entry: Mapping[str, Any]) -> str:
    return "?" if entry["lr"] is None else f"{entry['lr']:g}{'*' if entry['edge'] else ''}"


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_against_batch

    if not summary["methods"]:
        return []
    return [plot_against_batch(summary, LABELS, folder / "batch.png")]


STUDY = Study("batch", "Batch size: batch-independent networks against BatchNorm (issue 36)", batch_cell, plan,
              summarise, claims, markdown, figures)
