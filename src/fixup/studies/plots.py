"""The studies' figures (PNG), each with the data it was drawn from beside it (``NAME.data.json``).

matplotlib is imported inside each function, never at import time. Every figure shows what happened:
mean with error bars (± std over seeds), n in the legend or on the bar, and failed cells (diverged,
collapsed, ...) marked as such, never drawn as ordinary values. The data file holds exactly what was
drawn, so a reader (or a test) can check a figure against the report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._plotting import pyplot
from ._common import chance
from .evidence import Cells

__all__ = ["plot_against_batch", "plot_bars", "plot_compare", "plot_curves", "plot_depth", "plot_learning_curves",
           "plot_loglog"]

_MARKERS = {"diverged": "x", "collapsed": "v"}


def _save(fig: Any, path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    path.with_name(path.stem + ".data.json").write_text(json.dumps(data, indent=1) + "\n")
    return path


def _point(c: Cells, scale: float) -> dict[str, Any]:
    s = c.stat
    return {"mean": None if s.mean is None else s.mean * scale, "std": None if s.std is None else s.std * scale,
            "n": len(c.values), "planned": c.planned, "failed": dict(c.failed)}


def _n_label(points: Sequence[dict[str, Any]]) -> str:
    ns = sorted({(p["n"], p["planned"]) for p in points})
    return ", ".join(f"n={n}" if n == planned else f"n={n} of {planned}" for n, planned in ns)


def plot_depth(summary: Mapping[str, Any], labels: Mapping[str, str], path: Path) -> Path:
    """Accuracy against depth (log axis), mean ± std per method; failed cells as markers at chance, with k/n."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    chance = 100 * summary["chance"]
    drawn: dict[str, Any] = {"chance": chance, "series": {}}
    for i, (method, cells) in enumerate(summary["methods"].items()):
        color = f"C{i % 10}"
        pts = [{"depth": int(d), **_point(Cells.from_dict(e["test_acc"]), 100)} for d, e in cells.items()]
        pts.sort(key=lambda p: p["depth"])
        good = [p for p in pts if p["mean"] is not None]
        label = f"{labels.get(method, method)} ({_n_label(pts)})"
        if good:
            ax.errorbar([p["depth"] for p in good], [p["mean"] for p in good], yerr=[p["std"] or 0 for p in good],
                        color=color, marker="o", capsize=3, label=label)
        shown = bool(good)
        for p in pts:
            for outcome, k in p["failed"].items():
                ax.scatter([p["depth"]], [chance], marker=_MARKERS.get(outcome, "s"), s=70, color=color,
                           label=None if shown else label)
                shown = True
                ax.annotate(f"{k}/{p['planned']} {outcome}", (p["depth"], chance), fontsize=6, color=color,
                            xytext=(4, 4 + 8 * i), textcoords="offset points")
        drawn["series"][method] = pts
    ax.axhline(chance, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("depth (layers)")
    ax.set_ylabel("test accuracy after the first epoch (%)")
    ax.set_title("mean ± std over seeds; x diverged, v collapsed (k/n, drawn at chance)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: no line hidden
    fig.set_size_inches(10.0, 4.6)
    fig.tight_layout()
    return _save(fig, path, drawn)


def plot_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], ylabel: str, path: Path, *,
                labels: Mapping[str, str] | None = None, log: bool = False, scale: float = 1.0) -> Path:
    """Mean ± std per epoch for each method (``curves[method][epoch]`` is a :class:`Cells` dict).

    A method with failed cells has them named in its legend entry (k of n); the line is over the rest.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    drawn: dict[str, Any] = {"ylabel": ylabel, "series": {}}
    for method, per_epoch in curves.items():
        pts = [{"epoch": e + 1, **_point(Cells.from_dict(c), scale)} for e, c in enumerate(per_epoch)]
        good = [p for p in pts if p["mean"] is not None]
        failed: dict[str, int] = {}
        for p in pts[-1:]:
            failed = p["failed"]
        note = "".join(f", {k}/{pts[-1]['planned']} {o}" for o, k in failed.items()) if pts else ""
        label = f"{(labels or {}).get(method, method)} ({_n_label(pts)}{note})" if pts else method
        if good:
            ax.errorbar([p["epoch"] for p in good], [p["mean"] for p in good], yerr=[p["std"] or 0 for p in good],
                        marker="o", ms=3, capsize=2, label=label)
        else:
            ax.plot([], [], marker="x", ls="none", label=label + ": no completed cell")
        drawn["series"][method] = pts
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel + " (mean ± std over seeds)")
    ax.legend(fontsize=7)
    return _save(fig, path, drawn)


def plot_learning_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], panels: Mapping[str, str],
                         path: Path, title: str | None = None, xlabel: str = "updates") -> Path:
    """One panel per metric (``panels``: key -> axis label) against ``xlabel`` (updates, or the epochs ``step``
    counts): the mean over seeds as a line, ± std as a band. ``curves[series]`` is a list of
    ``{"step": s, key: Cells dict, ...}`` (the translation study's).
    A point where some seeds failed or had no value keeps its n of planned in the data file and in the legend."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    drawn: dict[str, Any] = {"x": xlabel, "panels": dict(panels), "series": {}}
    for i, (name, points) in enumerate(curves.items()):
        drawn["series"][name] = {}
        for ax, (key, ylabel) in zip(axes[0], panels.items()):
            pts = [{"step": int(p["step"]), **_point(Cells.from_dict(p[key]), 1.0)} for p in points if key in p]
            good = [p for p in pts if p["mean"] is not None]
            x = [p["step"] for p in good]
            mean = [p["mean"] for p in good]
            std = [p["std"] or 0.0 for p in good]
            ax.plot(x, mean, color=f"C{i % 10}", marker="o", ms=2.5, label=f"{name} ({_n_label(pts)})")
            ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=f"C{i % 10}", alpha=0.2, lw=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{ylabel} (mean ± std over seeds)")
            drawn["series"][name][key] = pts
    for ax in axes[0]:
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path, drawn)


def plot_against_batch(summary: Mapping[str, Any], labels: Mapping[str, str], path: Path) -> Path:
    """Test accuracy against batch size (log axis), mean ± std per method at its chosen rate, and BatchNorm with
    batch statistics dashed; failed cells as markers at chance, with k/n."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 4.6))
    chance = 100 * summary["chance"]
    drawn: dict[str, Any] = {"chance": chance, "series": {}}
    series = [(m, "test_acc", labels.get(m, m), "-") for m in summary["methods"]]
    if "batchnorm" in summary["methods"]:
        series.append(("batchnorm", "test_acc_batch_stats", f"{labels.get('batchnorm', 'batchnorm')}, batch statistics "
                       "at test", "--"))
    for i, (method, key, name, style) in enumerate(series):
        color = f"C{i % 10}"
        pts = [{"batch": int(b), **_point(Cells.from_dict(e[key]), 100)} for b, e in summary["methods"][method].items()
               if key in e]
        pts.sort(key=lambda p: p["batch"])
        good = [p for p in pts if p["mean"] is not None]
        label = f"{name} ({_n_label(pts)})" if pts else name
        if good:
            ax.errorbar([p["batch"] for p in good], [p["mean"] for p in good], yerr=[p["std"] or 0 for p in good],
                        color=color, marker="o", ls=style, capsize=3, label=label)
        for p in pts:
            for outcome, k in p["failed"].items():
                ax.scatter([p["batch"]], [chance], marker=_MARKERS.get(outcome, "s"), s=70, color=color,
                           label=None if good else label)
                ax.annotate(f"{k}/{p['planned']} {outcome}", (p["batch"], chance), fontsize=6, color=color,
                            xytext=(4, 4 + 8 * i), textcoords="offset points")
        drawn["series"][f"{method}:{key}"] = pts
    ax.axhline(chance, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    sizes = sorted({p["batch"] for pts in drawn["series"].values() for p in pts})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (equal examples seen at every size)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("mean ± std, each at its rate chosen on validation\nx diverged, v collapsed, square failed "
                 "(k/n, at chance)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path, drawn)


def plot_loglog(series: Mapping[str, Sequence[tuple[float, Mapping[str, Any]]]], xlabel: str, ylabel: str,
                path: Path, *, title: str = "") -> Path:
    """Log-log lines of (x, stat dict) points with ± std bars; points without a positive mean are left out
    of the line and listed in the data file (and the legend says how many)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    drawn: dict[str, Any] = {"series": {}}
    for name, pts in series.items():
        rows = [{"x": x, "mean": s.get("mean"), "std": s.get("std"), "n": s.get("n"), "n_total": s.get("n_total")}
                for x, s in pts]
        good = [r for r in rows if r["mean"] is not None and r["mean"] > 0]
        missing = len(rows) - len(good)
        ns = sorted({r["n"] for r in good})
        note = f"; {missing} point(s) not finite or 0" if missing else ""
        label = f"{name} (n={','.join(map(str, ns))}{note})"
        if good:
            ax.errorbar([r["x"] for r in good], [r["mean"] for r in good], yerr=[r["std"] or 0 for r in good],
                        marker="o", ms=3, capsize=2, label=label)
        drawn["series"][name] = rows
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path, drawn)


def plot_bars(groups: Mapping[str, Mapping[str, Mapping[str, Any]]], ylabel: str, path: Path, *,
              scale: float = 1.0) -> Path:
    """Grouped bars, mean ± std (``groups[group][bar]`` is a :class:`Cells` dict), each labelled with its n;
    a bar with failed cells is hatched and says so (k/n diverged); one with no completed cell is an empty
    outlined slot that says what happened."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    names = list(groups)
    bars: list[str] = []
    for g in groups.values():
        bars += [b for b in g if b not in bars]
    width = 0.8 / max(1, len(bars))
    drawn: dict[str, Any] = {"ylabel": ylabel, "bars": []}
    top = max([p["mean"] + (p["std"] or 0) for g in groups.values() for c in g.values()
               if (p := _point(Cells.from_dict(c), scale))["mean"] is not None] or [1.0])
    for j, bar in enumerate(bars):
        for i, g in enumerate(names):
            if bar not in groups[g]:
                continue
            p = _point(Cells.from_dict(groups[g][bar]), scale)
            x = i + (j - (len(bars) - 1) / 2) * width
            failed = ", ".join(f"{k}/{p['planned']} {o}" for o, k in p["failed"].items())
            text = f"n={p['n']}" + ("" if p["n"] == p["planned"] else f"/{p['planned']}") + (f"\n{failed}" if failed
                                                                                           else "")
            if p["mean"] is None:
                ax.bar([x], [top * 0.05], width, color="none", edgecolor=f"C{j}", ls="--",
                       label=bar if i == 0 else None)
                y = top * 0.05
            else:
                ax.bar([x], [p["mean"]], width, yerr=[p["std"] or 0], capsize=3, color=f"C{j}",
                       hatch="//" if failed else None, label=bar if i == 0 else None)
                y = p["mean"] + (p["std"] or 0)
            ax.annotate(text, (x, y), ha="center", va="bottom", fontsize=6, xytext=(0, 2), textcoords="offset points")
            drawn["bars"].append({"group": g, "bar": bar, "x": x, **p})
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel + " (mean ± std over seeds)")
    ax.set_title("hatched: some cells failed (k/n named); dashed: none completed", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path, drawn)


def plot_compare(summary: Mapping[str, Any], path: Path) -> Path:
    """Test accuracy per method (``fixup compare``'s summary): each seed a point, the mean ± std a bar with caps;
    a run that failed (diverged, collapsed, ...) is a marker at chance, labelled with how it ended."""

    plt = pyplot()
    methods = summary["methods"]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(methods) + 2), 4.4))
    level = 100 * chance(summary["config"]["dataset"])
    floor = level if level == level else 0.0  # NaN: a data set of unknown class count
    drawn: dict[str, Any] = {"chance": level, "methods": {}}
    for i, (method, entry) in enumerate(methods.items()):
        color = f"C{i % 10}"
        runs = entry["runs"]
        offsets = [-0.1 + (j - (len(runs) - 1) / 2) * 0.06 for j in range(len(runs))]  # the seeds left, the mean right
        done = [(i + o, 100 * r["test_acc"]) for o, r in zip(offsets, runs)
                if r["outcome"] == "completed" and r["test_acc"] is not None]
        ax.scatter([x for x, _ in done], [y for _, y in done], color=color, s=22, zorder=3)
        stat = entry["test_acc"]
        if stat["mean"] is not None:
            ax.errorbar([i + 0.15], [100 * stat["mean"]], yerr=[100 * (stat["std"] or 0.0)], color=color, marker="_",
                        ms=22, capsize=6, lw=1.5, zorder=2)
        for o, r in zip(offsets, runs):
            if r["outcome"] != "completed":
                ax.scatter([i + o], [floor], marker=_MARKERS.get(r["outcome"], "s"), color=color, s=55, zorder=3)
                ax.annotate(f"seed {r['seed']}: {r['outcome']}", (i + o, floor), fontsize=6, color=color,
                            rotation=90, xytext=(0, 6), textcoords="offset points", ha="center")
        drawn["methods"][method] = {"points": [y for _, y in done], "stat": stat,
                                    "failed": [{"seed": r["seed"], "outcome": r["outcome"]} for r in runs
                                               if r["outcome"] != "completed"]}
    if level == level:
        ax.axhline(level, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(methods)), [f"{m}\n{e['text']}" for m, e in methods.items()], fontsize=7)
    cfg = summary["config"]
    ax.set_ylabel(f"test accuracy after {cfg['epochs']} epoch(s) (%)")
    model = cfg["model"] + (f"-{cfg['depth']}" if cfg["depth"] else "")
    ax.set_xlim(-0.6, len(methods) - 0.4)
    ax.set_title(f"{model} on {cfg['dataset']}: each seed a point, beside it mean ± std\n"
                 "x diverged, v collapsed (drawn at chance)", fontsize=8)
    return _save(fig, path, drawn)
