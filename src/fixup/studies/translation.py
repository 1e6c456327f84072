"""The translation study (the paper's Table 3): a Fixup Transformer (no LayerNorm) against the LayerNorm one.

Each method trains at every dropout of a small grid (the paper searched 0.3-0.6 for both systems,
section 4.3); the dropout is chosen per method on the validation set (lowest mean validation NLL
over seeds: never on test data), and the test BLEU (sacrebleu, detokenised) of the chosen dropout is
reported as mean ± std over seeds. Data: the embedded generated task, or real parallel files.
Training and decoding go through :func:`fixup.translation.run.train_and_evaluate` (the shared engine).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import paper
from .base import Plan, Study
from .cells import Cell, Task
from .claims import NOT_RUN, ClaimRow, clearly_below, verdict
from .grid import Grid
from .stats import Stat, group_records, stat
from .store import Store

__all__ = ["STUDY"]

LABELS = {"fixup": "Fixup", "layernorm": "LayerNorm"}


def run_cell(cell: Cell, work: Path) -> dict[str, Any]:
    from ..translation.evaluate import DecodeConfig
    from ..translation.run import train_and_evaluate
    from ..translation.task import translation_config

    c = cell.config
    config = translation_config(**c["train"])
    summary = train_and_evaluate(config, work, DecodeConfig(beam=c["beam"]), progress=False)
    status = summary["outcome"]["status"]
    if status == "interrupted":
        raise RuntimeError(f"cell {cell.key} was interrupted; rerun to resume it")
    final = summary.get("final", {})
    diverged = status == "diverged"
    return {"outcome": status, "diverged": diverged, "updates": summary["updates"],
            "test_bleu": None if diverged else summary["bleu"]["bleu"],
            "valid_nll": None if diverged else _finite(final.get("test_nll")),
            "copy_bleu": summary.get("copy_bleu"), "word_for_word_bleu": summary.get("word_for_word_bleu"),
            "bleu_signature": summary["bleu"]["signature"]}


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def plan(grid: Grid, store: Store) -> Plan:
    g = grid.translation
    tasks = []
    for method in g.methods:
        for dropout in g.dropouts:
            for seed in range(grid.seeds):
                extra = {"max_tokens": g.max_tokens, "bleu_limit": 0, **g.extra}
                train = {"model": g.model, "norm": method, "dropout": dropout, "seed": seed, "device": grid.device,
                         "max_updates": g.max_updates, "warmup_steps": g.warmup_steps, "lr": g.lr,
                         "checkpoint": True, "extra": extra}
                if g.data_dir:
                    train["data_dir"] = g.data_dir
                cell = Cell("translation", method, {"dropout": dropout}, seed, cost=g.cost_per_cell,
                            config={"train": train, "beam": g.beam})
                tasks.append(Task(cell, run_cell))
    return Plan(tasks)


def summarise(records: list[dict[str, Any]], grid: Grid) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    reference: dict[str, float | None] = {}
    for (method, dropout), recs in group_records(records, "method", "dropout").items():
        results = [r["result"] for r in recs]
        table.setdefault(method, {})[str(dropout)] = {
            "test_bleu": stat(r["test_bleu"] for r in results).to_dict(),
            "valid_nll": stat(r["valid_nll"] for r in results).to_dict(),
            "diverged": sum(bool(r["diverged"]) for r in results), "n": len(results)}
        first = results[0]
        reference = {"copy_bleu": first.get("copy_bleu"), "word_for_word_bleu": first.get("word_for_word_bleu")}
    chosen = {}
    for method, row in table.items():
        valid = {d: e["valid_nll"]["mean"] for d, e in row.items() if e["valid_nll"]["mean"] is not None}
        if valid:
            d = min(valid, key=lambda k: valid[k])
            chosen[method] = {"dropout": float(d), **row[d]}
    g = grid.translation
    data = g.data_dir or "the embedded generated task"
    scale = (f"{data}, {g.model}, {g.max_updates:,} updates, dropout grid {', '.join(map(str, g.dropouts))}, "
             f"{grid.seeds} seeds")
    return {"table": table, "chosen": chosen, "reference": reference, "scale": scale}


def claims(summary: dict[str, Any], grid: Grid) -> list[ClaimRow]:
    ch, scale = summary["chosen"], summary["scale"]
    if "fixup" not in ch or "layernorm" not in ch:
        return [ClaimRow("translation_iwslt", "", scale, NOT_RUN, "Fixup or LayerNorm has no finished cell")]
    fx, ln = Stat(**ch["fixup"]["test_bleu"]), Stat(**ch["layernorm"]["test_bleu"])
    floor = max((v for v in summary["reference"].values() if v is not None), default=0.0)
    learned = all(s.mean is not None and s.mean > floor for s in (fx, ln))
    holds = learned and not clearly_below(fx, ln)
    same = ch["fixup"]["dropout"] == ch["layernorm"]["dropout"]
    ours = (f"test BLEU Fixup {fx.format(2)} (dropout {ch['fixup']['dropout']:g}) vs LayerNorm {ln.format(2)} "
            f"(dropout {ch['layernorm']['dropout']:g}); same dropout chosen: {'yes' if same else 'no'}")
    paper_scale = bool(grid.translation.data_dir) and grid.translation.max_updates >= 200_000
    return [ClaimRow("translation_iwslt", ours, scale, verdict(holds, paper_scale),
                     "holds if both beat the copy and word-for-word reference BLEU (else the comparison says "
                     f"nothing; learned={learned}) and Fixup's BLEU is not clearly below LayerNorm's; dropout chosen "
                     "on validation NLL")]


def markdown(summary: dict[str, Any], grid: Grid) -> str:
    drops = [str(d) for d in grid.translation.dropouts]
    ref = summary["reference"]
    refs = ", ".join(f"{k.replace('_bleu', '').replace('_', '-')} {v:.2f}" for k, v in ref.items() if v is not None)
    lines = [f"Test BLEU (sacrebleu), mean ± std (n) per dropout ({summary['scale']}); **bold**: the dropout chosen "
             f"on validation NLL. Reference points on the same test set: {refs or 'none'}. Paper (IWSLT De-En): "
             f"{paper.IWSLT_DE_EN['layernorm'].format()} LayerNorm, {paper.IWSLT_DE_EN['fixup'].format()} Fixup, "
             f"dropout {paper.IWSLT_DE_EN['dropout'].format()} for both.", "",
             "| method | " + " | ".join(f"dropout {d}" for d in drops) + " |", "|---|" + "---|" * len(drops)]
    for method, row in summary["table"].items():
        chosen = summary["chosen"].get(method, {}).get("dropout")
        cells = []
        for d in drops:
            e = row.get(d)
            text = "not run" if e is None else Stat(**e["test_bleu"]).format(2)
            cells.append(f"**{text}**" if e is not None and chosen == float(d) else text)
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], folder: Path) -> list[Path]:
    from .plots import plot_bars

    if not summary["table"]:
        return []
    groups = {LABELS.get(m, m): {f"dropout {d}": (e["test_bleu"]["mean"], e["test_bleu"]["std"])
                                 for d, e in row.items()} for m, row in summary["table"].items()}
    return [plot_bars(groups, "test BLEU", folder / "translation.png")]


STUDY = Study("translation", "Translation: Fixup Transformer against LayerNorm (Table 3)", run_cell, plan, summarise,
              claims, markdown, figures)
