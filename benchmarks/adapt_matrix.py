"""Every method of ``fixup.adapt`` on every real image model of the zoo, beside the same model normalised: the
matrix read from the committed runs of ``benchmarks/adapt_zoo.py --only training`` (the README's own loop, n=3),
and issue 38's targets checked on it (each adapted form within 5 points of the normalised mean; no seed below 50%
where the normalised form reaches 50%).

    PYTHONPATH=src python benchmarks/adapt_matrix.py            # the markdown table and the misses, from the files

Nothing is trained here: each source file names the command that made it (its ``settings.command``). A run
belongs to a method by the ``method`` of its adapt options (none: Fixup); a file given for a method contributes
only that method's adapted runs, and the normalised forms come from the files of ``NORMALISED`` in order, the first
with every seed of a model taken.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MODELS = ("resnet18", "regnetx_002", "efficientnet_b0", "mobilenetv3_small_050", "convnext_atto", "resnetv2_18",
          "mobilevit_xxs", "ghostnet_100 (timm GhostNet, concatenated ends)")
NORMALISED = ("adapt_training_normalised_rerun.json", "adapt_training_clip_norm.json",
              "adapt_training_preact_hybrid.json", "adapt_training_ghostnet.json")
# method label -> (adapt's method and the options that select the runs, the files holding them)
METHODS: dict[str, tuple[dict[str, object], tuple[str, ...]]] = {
    "fixup": ({}, ("adapt_training_clip_norm.json", "adapt_training_preact_hybrid.json",
                   "adapt_training_ghostnet.json")),
    "fixup, rescale 2": ({"rescale": 2}, ("adapt_training_regnet_rescale2.json",)),
    "skipinit": ({"method": "skipinit"}, ("adapt_training_skipinit.json",)),
    "rezero": ({"method": "rezero"}, ("adapt_training_rezero.json",)),
    "nf_resnet": ({"method": "nf_resnet"}, ("adapt_training_nf_resnet_zoo.json",
                                            "adapt_training_nf_resnet_norm.json")),
    "nf_resnet_nozero": ({"method": "nf_resnet_nozero"}, ("adapt_training_nf_resnet_nozero_norm.json",)),
    "dyt": ({"method": "dyt"}, ("adapt_training_dyt.json", "adapt_training_dyt_mobilevit.json")),
    "dyt, alpha0 fitted": ({"method": "dyt", "alpha0": "fitted"}, ("adapt_training_dyt_fitted.json",
                                                                   "adapt_training_dyt_fitted_mobilevit.json")),
}
WITHIN, FLOOR = 5.0, 0.5  # the targets: points of the normalised mean; the lowest seed where normalised reaches it


def runs_of(name: str, results: Path = RESULTS) -> list[dict[str, object]]:
    """A training file's runs: its JSON's, or its run store's where the command has not finished (no JSON yet)."""
    path = results / name
    if path.exists():
        return json.loads(path.read_text()).get("training", {}).get("runs", [])
    store = results / (name + ".runs.jsonl")
    if not store.exists():
        return []
    lines = [json.loads(line) for line in store.read_text().splitlines() if line.strip().endswith("}")]
    return [{k: v for k, v in r.items() if k != "cell"} for r in lines]


def accuracies(runs: list[dict[str, object]], model: str, form: str, options: dict[str, object] | None
               ) -> dict[int, float]:
    """Accuracy by seed of ``model`` in ``form`` (for "adapted", under exactly ``options``), the README's loop only."""
    out: dict[int, float] = {}
    for r in runs:
        if (r["model"], r["form"]) != (model, form) or r.get("recipe", "sgd") != "sgd" or r.get("clip") != "norm":
            continue
        if r.get("steps") != 150 or r.get("lr") != 0.1 or r.get("scalar_lr_mult", 0.1) != 0.1:
            continue
        if form == "adapted" and dict(r.get("adapt_options") or {}) != options:
            continue
        out.setdefault(int(r["seed"]), float(r["acc"]))
    return out


def matrix(seeds: tuple[int, ...] = (0, 1, 2), results: Path = RESULTS) -> dict[str, dict[str, object]]:
    """For each model: the normalised reference (its seeds and source) and each method's seeds, mean and gap."""
    out: dict[str, dict[str, object]] = {}
    for model in MODELS:
        row: dict[str, object] = {}
        for name in NORMALISED:
            accs = accuracies(runs_of(name, results), model, "normalised", None)
            if all(s in accs for s in seeds):
                row["normalised"] = {"accs": [accs[s] for s in seeds], "source": name}
                break
        for label, (options, files) in METHODS.items():
            accs: dict[int, float] = {}
            for name in files:
                for seed, acc in accuracies(runs_of(name, results), model, "adapted", options).items():
                    accs.setdefault(seed, acc)
            if all(s in accs for s in seeds):
                row[label] = {"accs": [accs[s] for s in seeds]}
        for entry in row.values():
            entry["mean"] = statistics.mean(entry["accs"])
            entry["std"] = statistics.stdev(entry["accs"]) if len(entry["accs"]) > 1 else 0.0
        ref = row.get("normalised")
        for label in METHODS:
            if label in row and ref:
                e = row[label]
                e["gap"] = e["mean"] - ref["mean"]
                e["misses"] = [m for m in (
                    f"{-100 * e['gap']:.1f} points below normalised" if e["gap"] < -WITHIN / 100 else "",
                    f"a seed at {100 * min(e['accs']):.1f}%" if min(e["accs"]) < FLOOR <= ref["mean"] else "") if m]
        out[model] = row
    return out


def markdown(rows: dict[str, dict[str, object]]) -> str:
    labels = ["normalised", *METHODS]
    lines = ["| model | " + " | ".join(f"`{lab}`" if lab != "normalised" else lab for lab in labels) + " |",
             "|---|" + "---|" * len(labels)]
    for model, row in rows.items():
        cells = []
        for label in labels:
            e = row.get(label)
            if e is None:
                cells.append("-")
                continue
            text = f"{100 * e['mean']:.1f} ± {100 * e['std']:.1f}"
            if "gap" in e:
                text += f" ({100 * e['gap']:+.1f})" + (" **miss**" if e["misses"] else "")
            cells.append(text)
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", type=Path, default=None, help="also write the matrix as JSON")
    args = p.parse_args()
    rows = matrix(tuple(args.seeds))
    print(markdown(rows))
    print(f"\ncells: mean ± std over seeds {args.seeds} (%), (adapted - normalised, points); '-': not run "
          "(or refused)")
    for model, row in rows.items():
        for label, e in row.items():
            for miss in e.get("misses", []):
                print(f"  miss: {model} under {label}: {miss}")
        if "normalised" in row:
            print(f"  {model}: normalised from {row['normalised']['source']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
