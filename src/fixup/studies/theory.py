"""The theory study: the first SGD step's functional change Δf against depth, in the paper's scalar network
and measured on real ResNets (through the laboratory, :mod:`fixup.lab`).

Scalar network (sections 2-3): L branches of m scalar weights; Δf of one exact SGD step at rate η,
for Fixup's factor L^(-1/(2m-2)), the unscaled branches, the sqrt(L)-motivated factor, all-zero
branches and Fixup x0.1 / x10. Inner weights equal the factor (the analysis' setting), so the scalar
network is deterministic: one run per scheme (n=1). Measured: the largest Δf of a CIFAR ResNet over
the first k SGD steps on a fixed random batch with Fixup's scalars held fixed (the analysis has no
biases), one network per seed (at step 1 only Fixup's zero
classifier moves, so Δf is the same at every depth; the branches move from step 2), and the log-log
slope of that Δf against the number of branches L.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .base import Plan, Study
from .cells import Cell, Task
from .claims import ClaimRow, Protocol, clearly_above, clearly_below, judge, not_run
from .evidence import Cells, cells_from_results
from .grid import Grid
from .rows import scalars_text
from .stats import Stat, group_records, stat
from .store import Store

__all__ = ["STUDY"]

# The scalar network's Fixup Δf/η counts as flat when its largest and smallest mean over depths differ
# by at most this ratio; the unscaled branches count as growing at this ratio or more (or non-finite).
FLAT_RATIO = 1.2
GROWTH_RATIO = 10.0
LAB_METHOD = {"he": "none"}  # the laboratory's name for He init without normalisation


def run_cell(cell: Cell, work: Path) -> dict[str, Any]:
    cfg = cell.config
    if cell.setting["part"] == "scalar":
        from ..lab.scalar import ScalarConfig, scalar_sweep

        records = scalar_sweep(cfg["depths"], [cell.method], ScalarConfig(m=cfg["m"], eta=cfg["lr"], draw="constant"))
        return {"points": [{"L": r["L"], "df1_over_eta": r["df1_over_eta"]} for r in records]}
    from ..lab.update import update_sweep

    out = update_sweep(cfg["model"], cfg["depths"], methods=[LAB_METHOD.get(cell.method, cell.method)],
                       lr=cfg["lr"], steps=(1, cfg["step"]), seed=cell.seed,
                       scalar_lr_factor=cfg.get("scalar_lr", 1.0))
    pts = [{"depth": r["depth"], "L": r["L"], "df": r["df_max"]} for r in out["records"] if r["step"] == cfg["step"]]
    fit = next(iter(out["fits"].values()))[f"df_max@{cfg['step']}"]
    return {"points": pts, "slope": fit["slope"]}


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.theory
    tasks = []
    for scheme in g.scalar_schemes:  # deterministic: one run
        cfg = {"depths": list(g.scalar_depths), "m": 2, "lr": g.lr}
        tasks.append(Task(Cell("theory", scheme, {"part": "scalar"}, 0, config=cfg, cost=1e4), run_cell))
    for seed in range(grid.seeds):
        for method in g.measured_methods:
            cfg = {"model": "resnet_cifar", "depths": list(g.measured_depths), "lr": g.lr, "step": g.measured_step,
                   "scalar_lr": g.measured_scalar_lr}
            cost = sum(g.measured_depths) * g.measured_step * 8 * 2
            tasks.append(Task(Cell("theory", method, {"part": "measured"}, seed, config=cfg, cost=cost), run_cell))
    return Plan(tasks)


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    scalar: dict[str, dict[str, Any]] = {}
    measured: dict[str, dict[str, Any]] = {}
    for (method, part), recs in group_records(records, "method", "part").items():
        xs = "L" if part == "scalar" else "depth"
        key = "df1_over_eta" if part == "scalar" else "df"
        by_x: dict[int, list[Any]] = {}
        for r in recs:
            for p in r["result"]["points"]:
                by_x.setdefault(p[xs], []).append(_finite(p[key]))
        entry = {str(x): stat(v).to_dict() for x, v in sorted(by_x.items())}
        if part == "scalar":
            scalar[method] = entry
        else:
            slopes = cells_from_results([r["result"] for r in recs], grid.seeds, lambda r: _finite(r["slope"]))
            measured[method] = {"points": entry, "slope": slopes.stat.to_dict(), "slopes": slopes.to_dict(),
                                "L": {str(p["depth"]): p["L"] for p in recs[0]["result"]["points"]}}
    g = grid.theory
    scale = (f"scalar network m=2, L {min(g.scalar_depths):,}-{max(g.scalar_depths):,}; CIFAR ResNet depths "
             f"{min(g.measured_depths)}-{max(g.measured_depths)} on a fixed random batch, Δf at step "
             f"{g.measured_step}, lr {g.lr}, Fixup's scalars at x{g.measured_scalar_lr:g} of it; {grid.seeds} seeds")
    return {"scalar": scalar, "measured": measured, "scale": scale, "step": g.measured_step}


def _ratio(entry: dict[str, Any]) -> float:
    means = [v["mean"] for v in entry.values()]
    if any(m is None for m in means) or not means:
        return math.inf
    low = min(means)
    return math.inf if low <= 0 else max(means) / low


def _protocol(grid: Grid) -> Protocol:
    g = grid.theory
    return Protocol(model=f"scalar network m=2 (L up to {max(g.scalar_depths):,}); CIFAR ResNets, depths "
                          f"{min(g.measured_depths)}-{max(g.measured_depths)}",
                    paper_model=f"scalar network m=2 (L up to {max(g.scalar_depths):,}); CIFAR ResNets, depths "
                                f"{min(g.measured_depths)}-{max(g.measured_depths)}",
                    data="a fixed random batch", steps=g.measured_step, n=grid.seeds,
                    scalars=scalars_text(g.measured_scalar_lr) + " while Δf is measured (the analysis has none)")


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    sc, me = summary["scalar"], summary["measured"]
    proto = _protocol(grid)
    if "fixup" not in sc or "unscaled" not in sc:
        return [not_run("theory_fixed_update", "Fixup or the unscaled scheme was not run", proto.describe())]
    fx_ratio, un_ratio = _ratio(sc["fixup"]), _ratio(sc["unscaled"])
    holds = fx_ratio <= FLAT_RATIO and un_ratio >= GROWTH_RATIO
    contrary = fx_ratio >= GROWTH_RATIO
    ours = (f"scalar network: Fixup Δf/η max/min over depths {fx_ratio:.2f}, unscaled "
            f"{'overflows' if math.isinf(un_ratio) else f'{un_ratio:.3g}x'}")
    rule = (f"holds if the scalar network's Fixup Δf/η varies by at most {FLAT_RATIO}x over depth while the unscaled "
            f"branches' grows {GROWTH_RATIO:g}x or more")
    groups: dict[str, Cells] = {}
    if "fixup" in grid.theory.measured_methods and "fixup_no_depth_scale" in grid.theory.measured_methods:
        planned = Cells(grid.seeds)
        a = Cells.from_dict(me["fixup"]["slopes"]) if "fixup" in me else planned
        b = Cells.from_dict(me["fixup_no_depth_scale"]["slopes"]) if "fixup_no_depth_scale" in me else planned
        groups = {"Fixup slope": a, "slope without rule 2": b}
        holds = holds and clearly_below(a, b)
        contrary = contrary or clearly_above(a, b)
        ours += (f"; measured log-log slope of Δf (first {summary['step']} steps) against L, "
                 f"{proto.scalars}: Fixup {a.format(2)}, without rule 2 {b.format(2)}")
        rule += ", and the measured slope is clearly lower with rule 2 than without (95% interval)"
    full = max(grid.theory.scalar_depths) >= 10_000
    j = judge(groups, holds=holds, contrary=contrary, paper_scale=full)
    return [ClaimRow.judged("theory_fixed_update", ours, proto, j, rule)]


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    lines = [f"Scalar network (m=2, deterministic, n=1): Δf/η of the first SGD step at rate {grid.theory.lr}.", ""]
    if summary["scalar"]:
        xs = list(next(iter(summary["scalar"].values())))
        lines += ["| scheme | " + " | ".join(f"L={int(x):,}" for x in xs) + " |", "|---|" + "---|" * len(xs)]
        for scheme, entry in summary["scalar"].items():
            lines.append(f"| {scheme} | " + " | ".join(_g(entry.get(x)) for x in xs) + " |")
    if summary["measured"]:
        xs = list(next(iter(summary["measured"].values()))["points"])
        lines += ["", "Measured on CIFAR ResNets (fixed random batch): the largest Δf over the first "
                  f"{summary['step']} SGD steps, mean ± std (n) over seeds; slope: log-log against L.",
                  "", "| method | " + " | ".join(f"depth {x}" for x in xs) + " | slope vs L |",
                  "|---|" + "---|" * (len(xs) + 1)]
        for method, e in summary["measured"].items():
            lines.append(f"| {method} | " + " | ".join(Stat(**e["points"][x]).format(3, sig=True) if x in e["points"]
                                                       else "" for x in xs) + f" | {Stat(**e['slope']).format(2)} |")
    return "\n".join(lines)


def _g(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return ""
    return "overflow" if entry["mean"] is None else f"{entry['mean']:.3g}"


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_loglog

    out = []
    if summary["scalar"]:
        series = {s: [(int(x), v) for x, v in e.items()] for s, e in summary["scalar"].items()}
        out.append(plot_loglog(series, "residual branches L", "Δf / η (first SGD step)", folder / "theory_scalar.png",
                               title="scalar network, m=2 (points missing: overflow or zero)"))
    if summary["measured"]:
        series = {m: [(e["L"][x], v) for x, v in e["points"].items()] for m, e in summary["measured"].items()}
        out.append(plot_loglog(series, "residual branches L", f"largest Δf over the first {summary['step']} steps",
                               folder / "theory_measured.png", title="CIFAR ResNet, fixed random batch"))
    return out


STUDY = Study("theory", "Theory: the functional update Δf against depth", run_cell, plan, summarise, claims,
              markdown, figures)
