"""bfloat16 (or float16) autocast against float32: final accuracy (n seeds, paired) and epoch time, on the
embedded data.

Each run is a fresh ``fixup train`` / ``fixup translate`` process (one torch thread, ``nice -n 5``, at most
``--parallel`` at a time) with ``--precision fp32`` or the low precision (``--low``: ``bf16``, or ``fp16``,
which the engine runs with a gradient scaler), every other option the same; the
two precisions of one seed start from the same weights and batches, so their accuracies are compared per seed.
Per run it keeps the final test accuracy (token accuracy on the valid split for the Transformer, and its
test BLEU), the median epoch time, and how far the Fixup scalars moved from their initial values (multipliers
from 1, biases from 0; the engine's scalar summary), which says whether their small updates survive the low
precision.

    python benchmarks/bench_precision.py --cases resnet56 wrn100 transformer --seeds 0 1 2 --json prec.json
    python benchmarks/bench_precision.py --low fp16 --cases resnet56 --seeds 0 1 2 --json prec_fp16.json

See docs/performance.md ("bfloat16 autocast").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Every case: the command's arguments (after ``python -m fixup``), all but precision, seed and folders.
CASES: dict[str, list[str]] = {
    "resnet56": ["train", "--depth", "56", "--epochs", "15"],
    "wrn100": ["train", "--model", "wide_resnet", "--depth", "100", "--width", "1", "--epochs", "10"],
    "wrn40": ["train", "--model", "wide_resnet", "--depth", "40", "--width", "1", "--epochs", "10"],
    "transformer": ["translate", "--norm", "fixup", "--max-updates", "200", "--beam", "1", "--bleu-limit", "100"],
}
_SRC = Path(__file__).resolve().parents[1] / "src"


def run_one(case: str, precision: str, seed: int, out: Path) -> dict[str, Any]:
    """One training run in a fresh process; its figures, or the error."""
    name = f"{case}-{precision}-s{seed}"
    force = ["--force"] if CASES[case][0] == "train" else []  # translate starts a fresh folder or resumes it
    cmd = ["nice", "-n", "5", sys.executable, "-m", "fixup", *CASES[case], "--precision", precision, "--seed",
           str(seed), "--no-progress", *force, "--out-dir", str(out / name), "--json", str(out / f"{name}.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")]))}
    row: dict[str, Any] = {"case": case, "precision": precision, "seed": seed, "command": " ".join(cmd[3:])}
    if not (out / f"{name}.json").exists():  # a finished run is read back, not repeated
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            return {**row, "error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    result = json.loads((out / f"{name}.json").read_text())
    history = result.get("history") or result.get("train", {}).get("history")
    if not history:
        return {**row, "error": f"no history in {out / f'{name}.json'} (keys {sorted(result)})"}
    last = history[-1]
    outcome = result.get("outcome")
    row.update(outcome=outcome.get("status") if isinstance(outcome, dict) else outcome, test_acc=last["test_acc"],
               epoch_s=statistics.median(h["time_s"] for h in history), steps=last["step"],
               scalars=_scalar_moves(result.get("scalars") or []))
    if "bleu" in result:
        row["test_bleu"] = result["bleu"] if isinstance(result["bleu"], (int, float)) else result["bleu"].get("bleu")
    return row


def _scalar_moves(records: list[dict]) -> dict[str, float]:
    """From the engine's last scalar summary: the multipliers' largest distance from 1 and the biases' mean |b|."""
    if not records:
        return {}
    final = records[-1]["scalars"]
    out = {}
    for r in final:
        if r["stage"] != "all" and r["kind"] == "scale":
            out["scale_max_move"] = max(out.get("scale_max_move", 0.0), abs(r["max"] - 1), abs(r["min"] - 1))
            out["scale_std"] = max(out.get("scale_std", 0.0), r["std"])
        if r["kind"] == "bias" and r["stage"].startswith("layer"):
            out["bias_mean_abs"] = max(out.get("bias_mean_abs", 0.0), r["mean_abs"])
    return out


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def _mean_of(values) -> float | None:
    xs = [x for x in values if x is not None]
    return statistics.mean(xs) if xs else None


def summarise(rows: list[dict], low: str = "bf16") -> list[dict]:
    """Per case: accuracy per precision (percent), the paired ``low`` - fp32 difference, the epoch-time ratio."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {(r["precision"], r["seed"]): r for r in rows if r["case"] == case and "error" not in r}
        seeds = sorted({s for p, s in by if ("fp32", s) in by and (low, s) in by})
        acc = {p: [100 * by[p, s]["test_acc"] for s in seeds] for p in ("fp32", low)}
        out.append({"case": case, "n": len(seeds), "fp32": _mean_std(acc["fp32"]), low: _mean_std(acc[low]),
                    f"{low}_minus_fp32": _mean_std([b - f for b, f in zip(acc[low], acc["fp32"])]),
                    "epoch_time_ratio": _mean_std([by[low, s]["epoch_s"] / by["fp32", s]["epoch_s"]
                                                   for s in seeds]),
                    # how far the scalars moved (the engine's summary): per precision, mean over seeds
                    **{f"{key}_{p}": _mean_of(by[p, s]["scalars"].get(key) for s in seeds)
                       for key in ("scale_max_move", "bias_mean_abs") for p in ("fp32", low)},
                    "errors": [r for r in rows if r["case"] == case and "error" in r]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["resnet56", "wrn100", "transformer"], choices=list(CASES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each (default: %(default)s)")
    p.add_argument("--out", default="runs/precision", help="run folders (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the runs and the summary as JSON")
    p.add_argument("--low", choices=["bf16", "fp16"], default="bf16",
                   help="the precision compared with fp32 (fp16: autocast, gradient scaler; default: %(default)s)")
    args = p.parse_args(argv)
    low = args.low
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, prec, s) for c in args.cases for s in args.seeds for prec in ("fp32", low)]
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        rows = list(pool.map(lambda job: run_one(*job, out), jobs))
    summary = summarise(rows, low)
    print(f"| case | n | fp32 acc % | {low} acc % | {low} - fp32 (paired) | {low} / fp32 epoch time | "
          f"multipliers' largest move from 1, fp32 / {low} | stage biases' mean abs, fp32 / {low} |")
    print("|---|---:|---|---|---|---|---|---|")
    for s in summary:
        moves = [f"{s[k]:.2g}" if s[k] is not None else "-" for k in
                 ("scale_max_move_fp32", f"scale_max_move_{low}", "bias_mean_abs_fp32", f"bias_mean_abs_{low}")]
        print(f"| {s['case']} | {s['n']} | {s['fp32']} | {s[low]} | {s[f'{low}_minus_fp32']} | "
              f"{s['epoch_time_ratio']} | {moves[0]} / {moves[1]} | {moves[2]} / {moves[3]} |")
        for e in s["errors"]:
            print(f"  error: {e['precision']} seed {e['seed']}: {e['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
