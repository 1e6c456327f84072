"""Where the deep tier's translation cells plateau: one cell of the grid, run to a longer budget.

Takes the deep tier's own translation cell (``fixup reproduce --deep``: its recipe, data, dropout and
evaluation cadence, from ``fixup.studies.make_grid("deep")``) for one method, dropout and seed, and trains
it to ``--updates`` updates instead of the grid's budget; the inverse square-root schedule does not depend
on the budget, so the run's first updates are the cell's. It writes the learning curve (validation NLL and
greedy validation BLEU every ``eval_updates``) and the final test BLEU.

    OMP_NUM_THREADS=1 python benchmarks/translation_budget.py --method fixup --dropout 0.3 --seed 1 \
        --updates 1800 --json fixup-s1.json

See docs/translation.md ("The plateau comparison").
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any


def cell_config(method: str, dropout: float, seed: int) -> dict[str, Any]:
    """The deep tier's translation cell config for (method, dropout, seed)."""
    from fixup.studies import make_grid, translation
    from fixup.studies.store import Store

    grid = make_grid("deep")
    with tempfile.TemporaryDirectory() as empty:
        for task in translation.plan(grid, Store(empty)).tasks:
            c = task.cell
            if (c.method, c.setting["dropout"], c.seed) == (method, dropout, seed):
                return dict(c.config)
    raise ValueError(f"the deep grid has no translation cell for method {method!r}, dropout {dropout}, seed {seed}; "
                     f"its methods: {grid.translation.methods}, dropouts: {grid.translation.dropouts}, "
                     f"seeds: 0-{grid.translation.seeds - 1}")


def run(method: str, dropout: float, seed: int, updates: int, out_dir: str) -> dict[str, Any]:
    from fixup.translation.evaluate import DecodeConfig
    from fixup.translation.run import train_and_evaluate
    from fixup.translation.task import translation_config

    config = cell_config(method, dropout, seed)
    train = {**config["train"], "max_updates": updates}
    summary = train_and_evaluate(translation_config(**train), out_dir, DecodeConfig(beam=config["beam"]),
                                 progress=False)
    curve = [{"step": r["step"], "valid_nll": r.get("test_nll"), "valid_bleu": r.get("valid_bleu")}
             for r in summary["history"] if "test_nll" in r]
    return {"method": method, "dropout": dropout, "seed": seed, "updates": updates,
            "outcome": summary["outcome"]["status"], "test_bleu": summary["bleu"]["bleu"], "curve": curve}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="fixup", help="fixup, layernorm or t_fixup (default: fixup)")
    p.add_argument("--dropout", type=float, default=0.3, help="one of the grid's dropouts (default: 0.3)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--updates", type=int, default=1800, help="updates to train (default: 1800)")
    p.add_argument("--out-dir", default=None, help="run folder (default: a temporary one)")
    p.add_argument("--json", default=None, help="write the result here too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.method, args.dropout, args.seed, args.updates, args.out_dir or tmp)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
