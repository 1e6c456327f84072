"""The studies' figures (PNG). matplotlib is imported inside each function, never at import time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._plotting import pyplot

__all__ = ["plot_bars", "plot_curves", "plot_depth", "plot_loglog"]


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_depth(summary: Mapping[str, Any], labels: Mapping[str, str], path: Path) -> Path:
    """Accuracy against depth (log axis), mean ± std per method; diverged runs as crosses at chance."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    chance = summary["chance"]
    for i, (method, cells) in enumerate(summary["methods"].items()):
        color = f"C{i}"
        depths = sorted(int(d) for d in cells)
        pts = [(d, cells[str(d)]["test_acc"]) for d in depths if cells[str(d)]["test_acc"]["mean"] is not None]
        if pts:
            ax.errorbar([d for d, _ in pts], [100 * s["mean"] for _, s in pts],
                        yerr=[100 * (s["std"] or 0) for _, s in pts], color=color, marker="o", capsize=3,
                        label=labels.get(method, method))
        div = [d for d in depths for _ in range(cells[str(d)]["diverged"])]
        if div:
            ax.scatter(div, [100 * chance] * len(div), marker="x", s=70, color=color,
                       label=None if pts else labels.get(method, method))
    ax.axhline(100 * chance, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("depth (layers)")
    ax.set_ylabel("test accuracy after the first epoch (%)")
    ax.set_title("x: diverged run (drawn at chance)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_curves(curves: Mapping[str, Sequence[float | None]], ylabel: str, path: Path, *,
                labels: Mapping[str, str] | None = None, log: bool = False) -> Path:
    """One line per method against epoch (None: not available, e.g. after divergence)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, ys in curves.items():
        xs = [i + 1 for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [y for y in ys if y is not None], marker="o", ms=3, label=(labels or {}).get(method, method))
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_loglog(series: Mapping[str, Sequence[tuple[float, float | None]]], xlabel: str, ylabel: str, path: Path,
                *, title: str = "") -> Path:
    """Log-log lines of (x, y) points; points with y None or <= 0 are left out."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, pts in series.items():
        good = [(x, y) for x, y in pts if y is not None and y > 0]
        if good:
            ax.plot([x for x, _ in good], [y for _, y in good], marker="o", ms=3, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_bars(groups: Mapping[str, Mapping[str, tuple[float | None, float | None]]], ylabel: str,
              path: Path) -> Path:
    """Grouped bars with error bars: ``groups[group][bar] = (mean, std)``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(groups)
    bars = sorted({b for g in groups.values() for b in g}, key=lambda b: list(next(iter(groups.values()))).index(b)
                  if b in next(iter(groups.values())) else 99)
    width = 0.8 / max(1, len(bars))
    for j, bar in enumerate(bars):
        xs, ys, es = [], [], []
        for i, g in enumerate(names):
            mean, std = groups[g].get(bar, (None, None))
            if mean is not None:
                xs.append(i + (j - (len(bars) - 1) / 2) * width)
                ys.append(mean)
                es.append(std or 0.0)
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=bar)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return _save(fig, path)
