"""Figures of the laboratory's records. matplotlib is imported here, only when a figure is drawn.

Each function takes the records a lab function returned and writes one PNG to ``path``. Non-finite
values (overflow, divergence) cannot be drawn on a log axis: they are marked with an ``x`` at the top
edge of the plot and counted in the legend, never dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._plotting import pyplot

__all__ = ["plot_coupling", "plot_forward_variance", "plot_layer_stats", "plot_scalar", "plot_scalars", "plot_signal",
           "plot_update"]


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _mark_nonfinite(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def _loglog_series(ax: Any, xs: Sequence[float], ys: Sequence[float], label: str) -> None:
    finite = [(a, b) for a, b in zip(xs, ys) if math.isfinite(b) and b > 0]
    bad = [a for a, b in zip(xs, ys) if not math.isfinite(b)]
    line = ax.plot([a for a, _ in finite], [b for _, b in finite], "o-", label=label + (
        f" ({len(bad)} inf/nan)" if bad else ""))[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    if bad:  # marked at the top edge once every series is drawn (see _save)
        ax._fixup_lab_nonfinite = [*getattr(ax, "_fixup_lab_nonfinite", []), (bad, line.get_color())]


def _mark_nonfinite(fig: Any) -> None:
    for ax in fig.axes:
        for xs, color in getattr(ax, "_fixup_lab_nonfinite", []):
            top = ax.get_ylim()[1]
            ax.plot(xs, [top] * len(xs), "x", color=color, markersize=9, clip_on=False)
            ax.set_ylim(top=top)


def plot_scalar(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Δf/eta of the first SGD step against L, one line per scheme (from :func:`fixup.lab.scalar_sweep`)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for scheme in dict.fromkeys(r["scheme"] for r in records):
        rs = [r for r in records if r["scheme"] == scheme]
        _loglog_series(ax, [r["L"] for r in rs], [r["df1_over_eta"] for r in rs], scheme)
    ax.set_xlabel("residual branches L")
    ax.set_ylabel("first-step |Δf| / η")
    ax.set_title(f"scalar network, m={records[0]['m']}, {records[0]['updates']} updates")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_update(result: dict[str, Any], path: str | Path) -> Path:
    """Measured Δf against L per method, one panel per step (from :func:`fixup.lab.update_sweep`)."""
    plt = pyplot()
    records = result["records"]
    steps = sorted({r["step"] for r in records})
    panels = [("df", s) for s in steps] + [("df_max", steps[-1])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (key, step) in zip(axes[0], panels):
        for method in dict.fromkeys(r["method"] for r in records):
            rs = [r for r in records if r["method"] == method and r["step"] == step]
            fit = result["fits"][method][f"{key}@{step}"]
            label = f"{method}: slope {fit['slope']:.2f} ± {fit['stderr']:.2f}"
            _loglog_series(ax, [r["L"] for r in rs], [r[key] for r in rs], label)
        ax.set_xlabel("residual branches L")
        ax.set_ylabel("|Δf| (RMS over the batch)")
        title = f"SGD step {step}" if key == "df" else f"largest step in the first {step}"
        ax.set_title(f"{title}, lr {result['config']['lr']}")
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_layer_stats(records: Sequence[dict[str, Any]], path: str | Path,
                     fields: Sequence[str] = ("std", "frac_zero", "grad_norm")) -> Path:
    """Per-module statistics in module order, train against eval (from :func:`fixup.lab.layer_stats`)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(fields), 1, figsize=(8, 2.6 * len(fields)), squeeze=False, sharex=True)
    for ax, field in zip(axes[:, 0], fields):
        for mode in dict.fromkeys(r["mode"] for r in records):
            rs = [r for r in records if r["mode"] == mode and r.get(field) is not None]
            ax.plot([r["index"] for r in rs], [r[field] for r in rs], ".-", label=mode)
        ax.set_ylabel(field)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("module index (execution order of definition)")
    return _save(fig, path)


def plot_forward_variance(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """E[f^2]/x^2 at initialisation against L: standard init (exact and sampled) and Fixup."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    Ls = [r["L"] for r in records]
    _loglog_series(ax, Ls, [r["standard_exact"] for r in records], "standard, exact 2^L")
    _loglog_series(ax, Ls, [r["standard_mean_f2"] for r in records], "standard, sampled mean")
    _loglog_series(ax, Ls, [r["fixup_mean_f2"] for r in records], "Fixup (f = x)")
    ax.set_xlabel("residual branches L")
    ax.set_ylabel("E[f²] / x²")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_coupling(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Relative batch coupling per method and mode (from :func:`fixup.lab.batch_coupling`, with ``method``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r.get('method', '')} {r['mode']}".strip() for r in records]
    ax.bar(range(len(records)), [r["blocks_rel"] for r in records])
    ax.set_xticks(range(len(records)), labels, rotation=30, ha="right")
    ax.set_ylabel("largest relative change of a block output")
    return _save(fig, path)


def plot_signal(signals: dict[str, Any], path: str | Path, band: tuple[float, float] = (0.5, 2.0)) -> Path:
    """The stream's RMS (x the input's) at every block's output, one line per form (``compare_signal``'s result,
    or records as JSON dicts), with the band the stream should stay in shaded."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, sig in signals.items():
        blocks = sig["blocks"] if isinstance(sig, dict) else [vars(b) for b in sig.blocks]
        ys = [b["ratio"] for b in blocks]
        finite = [(i, y) for i, y in enumerate(ys) if math.isfinite(y) and y > 0]
        ax.plot([i for i, _ in finite], [y for _, y in finite], "o-", ms=3, label=label)
    ax.axhspan(*band, color="0.9", zorder=0, label=f"{band[0]}-{band[1]}x the input")
    ax.set_yscale("log")
    ax.set_xlabel("residual block (execution order)")
    ax.set_ylabel("stream RMS / input RMS")
    ax.set_title("signal propagation at initialisation")
    ax.legend()
    return _save(fig, path)


def plot_scalars(epochs: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Each kind of scalar over training, one panel per kind (from a run's records, :func:`fixup.train.read_scalars`).

    Per panel: the mean over the whole model (bold), its spread (mean ± std, shaded), its minimum and maximum
    (dotted), and each stage's mean (thin). Non-finite values (a diverged run) are left out and counted in the
    panel's title.
    """
    plt = pyplot()
    kinds = list(dict.fromkeys(r["kind"] for e in epochs for r in e["scalars"]))
    if not kinds:
        raise ValueError("these records hold no scalars (the model has no Fixup scalar and no gate: a BatchNorm or "
                         "plain network); nothing to plot")
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.6 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        series: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for e in epochs:
            for r in e["scalars"]:
                if r["kind"] == kind:
                    series.setdefault(r["stage"], []).append((e["epoch"], r))
        whole = series.pop("all", [])
        bad = sum(1 for _, r in whole if not all(math.isfinite(r[k]) for k in ("mean", "std", "min", "max")))
        whole = [(x, r) for x, r in whole if all(math.isfinite(r[k]) for k in ("mean", "std", "min", "max"))]
        for stage, rs in series.items():
            pts = [(x, r["mean"]) for x, r in rs if math.isfinite(r["mean"])]
            ax.plot([x for x, _ in pts], [y for _, y in pts], "-", lw=0.9, alpha=0.7, label=f"{stage} mean")
        if whole:
            xs = [x for x, _ in whole]
            mean = [r["mean"] for _, r in whole]
            ax.fill_between(xs, [r["mean"] - r["std"] for _, r in whole], [r["mean"] + r["std"] for _, r in whole],
                            color="0.8", label="all: mean ± std")
            ax.plot(xs, [r["min"] for _, r in whole], ":", color="0.3", label="all: min, max")
            ax.plot(xs, [r["max"] for _, r in whole], ":", color="0.3")
            ax.plot(xs, mean, "o-", color="k", ms=3, lw=2, label=f"all: mean (n={whole[-1][1]['count']})")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("epoch (0: at initialisation)")
        ax.set_ylabel("value")
        ax.set_title(kind + (f" ({bad} epochs non-finite)" if bad else ""))
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)
