"""Transfer without normalisation, text side (issue 37): a trained LayerNorm Transformer converted by
``fixup.convert`` and fine-tuned on a shifted translation task, beside the LayerNorm model fine-tuned alike.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/transfer_text.py --json benchmarks/results/transfer_text.json
    PYTHONPATH=src python benchmarks/transfer_text.py --smoke      # every route, a few updates of a tiny model

Tasks (``fixup.data.synthetic_translation``, seed 0: the same two invented languages and the same source sentences
in both). **A**, the source task: the generated task as ``fixup translate`` trains on it (target verb-second in main
clauses, adjectives after the noun). **B**, the shifted task: the same source sentences translated with the target's
word order changed (``main_order="verb-final"``, ``adjective_order="before"``: the finite verb of every clause last,
the adjectives between the determiner and the noun). Every word of B is a word of A, so the vocabulary learnt on A
(sentencepiece, kept with the pre-trained model) serves B, and only the rules move: a model trained on A scores 23.9 ±
0.6 greedy BLEU on B against 91.4 ± 1.3 on A (n = 3).

Per seed: the post-norm LayerNorm ``transformer_tiny`` is trained on A by the engine with the ``tiny`` recipe
(``fixup translate``'s default: AdamW (0.9, 0.98), lr 3e-3, inverse square root after 100 warm-up steps, batches of
2,048 tokens, dropout 0.1, label smoothing 0.1) for --pretrain-updates updates. Then each route fine-tunes on B for
--updates updates through the engine (the same optimiser; a cosine schedule after a 10% linear warm-up; the global
gradient norm clipped at 1; the rate from --lrs):

* ``layernorm``: the trained model as it is (LayerNorm kept, handed to the engine);
* ``affine``, ``dyt``: ``fixup.convert(per_example_norms=...)`` fitted on --calibration batches of A's training
  pairs (sequential fit, the default), saved by ``fixup.save_converted`` and fine-tuned through the engine's
  ``extra["converted"]`` (``fixup translate --extra '{"converted": FILE, "vocab_dir": ...}'``);
* ``scratch``: no transfer: the library's Fixup Transformer (``norm="fixup"``) trained on B from initialisation
  for the same updates and with the same choices.

Reported per route: the conversion's function change (``report.rms_change``/``max_change``: the logits' RMS and
largest change over their RMS, on 64 validation pairs of A, eval mode), greedy BLEU on A's test split after the
conversion, greedy BLEU on B's test split before and after fine-tuning. The rate: a stated small search, each route's
rate chosen from --lrs by greedy BLEU on B's *validation* split on the --search-seeds (seed 0), then every other seed
runs at that rate; the test split is used for the reported figures only. BLEU: sacrebleu on the whole 1,000-sentence
split, greedy decoding. Mean ± std over the seeds, with n.

Budget (measured on the shared 2-core machine, one thread, loaded): a pre-training of 600 updates 4-6 minutes, a
fine-tuning of 300 updates about 2 minutes, the Dynamic Tanh fit about 45 s on 4 calibration batches; 3 seeds with the
search on seed 0: 3 pre-trainings and 20 fine-tunings, 59 minutes. The JSON is rewritten after every run, so an
interrupted run leaves what it measured.
"""

from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fixup
from fixup.data.text import collate, token_batches
from fixup.train import TrainConfig, fit
from fixup.translation.evaluate import DecodeConfig, corpus_bleu, evaluate_bleu
from fixup.translation.task import TranslationTask, translation_config

ROUTES = ("layernorm", "affine", "dyt", "scratch")
CONVERTED = ("affine", "dyt")
SHIFT = {"main_order": "verb-final", "adjective_order": "before"}  # task B's rules (task A: the defaults)
GREEDY = DecodeConfig(beam=1)


# --- tasks ------------------------------------------------------------------------------------------------------

class _Given(TranslationTask):
    """The translation task with a model built beforehand (the route's), handed to the engine."""

    def __init__(self, config: TrainConfig, work_dir: Path, model: nn.Module | None) -> None:
        super().__init__(config, work_dir=work_dir)
        self.model = model

    def build_model(self, config: TrainConfig) -> nn.Module:
        return self.model if self.model is not None else super().build_model(config)


def task_extra(args: argparse.Namespace, shifted: bool, **more: Any) -> dict[str, Any]:
    """``config.extra`` of task A (``shifted=False``) or B; both read the vocabulary learnt on A."""
    extra: dict[str, Any] = {"synthetic_train": args.train_pairs, "synthetic_eval": args.eval_pairs,
                             "max_tokens": args.max_tokens, "bleu_limit": 0, "model": args.model_overrides}
    if shifted:
        extra.update(synthetic_main_order=SHIFT["main_order"], synthetic_adjective_order=SHIFT["adjective_order"],
                     vocab_dir=str(Path(args.work_dir) / "source" / "vocab"))
    return {**extra, **more}


def pretrain_config(args: argparse.Namespace, seed: int) -> TrainConfig:
    return translation_config("tiny", norm="layernorm", seed=seed, max_updates=args.pretrain_updates,
                              checkpoint=False, device="cpu", extra=task_extra(args, shifted=False))


def finetune_config(args: argparse.Namespace, route: str, lr: float, seed: int, converted: str = "") -> TrainConfig:
    """The engine's config of one fine-tuning run on B (``converted``: the saved converted model's path)."""
    norm = "layernorm" if route == "layernorm" else "fixup"
    extra = task_extra(args, shifted=True, **({"converted": converted} if converted else {}))
    return translation_config("tiny", norm=norm, seed=seed, lr=lr, max_updates=args.updates, schedule="cosine",
                              warmup_steps=max(1, args.updates // 10), clip="norm", grad_clip=1.0, checkpoint=False,
                              device="cpu", eval_every=10_000, extra=extra)


# --- the routes -------------------------------------------------------------------------------------------------

def calibration_batches(task: TranslationTask, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` training batches of A as the forward's inputs ``(src, tgt_in)``, drawn by ``seed``."""
    pairs = task.data.pairs["train"]
    chosen = token_batches(pairs, task.options.max_tokens, shuffle=True, seed=seed)[:count]
    return [(b.src, b.tgt_in) for b in (collate(pairs, i) for i in chosen)]


def held_out_batch(task: TranslationTask, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    b = collate(task.data.pairs["valid"], list(range(min(size, len(task.data.pairs["valid"])))))
    return b.src, b.tgt_in


def convert_route(model: nn.Module, option: str, source: TranslationTask, count: int,
                  seed: int) -> tuple[nn.Module, Any, float]:
    """The trained model converted with ``per_example_norms=option``: (model, report, seconds)."""
    start = time.perf_counter()
    calibration = calibration_batches(source, count, seed)
    example = tuple(t[:2] for t in calibration[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)
        converted, report = fixup.convert(copy.deepcopy(model).eval(), example, per_example_norms=option,
                                          calibration=calibration, held_out=held_out_batch(source))
    return converted, report, time.perf_counter() - start


def bleu(model: nn.Module, task: TranslationTask, split: str) -> float:
    return evaluate_bleu(model, task.data, split, GREEDY)[0].bleu


# --- one seed ---------------------------------------------------------------------------------------------------

def pretrain(args: argparse.Namespace, seed: int) -> tuple[nn.Module, TranslationTask, dict[str, Any]]:
    """The LayerNorm Transformer trained on A by the engine, task A, and what it scores."""
    start = time.perf_counter()
    config = pretrain_config(args, seed)
    task = _Given(config, Path(args.work_dir) / "source", None)
    result = fit(config, task=task, progress=False)
    if result.outcome != "completed":
        raise RuntimeError(f"pre-training seed {seed} ended {result.outcome}: {result.outcome.reason}")
    model = result.model.eval()
    return model, task, {"outcome": str(result.outcome), "source_test_bleu": bleu(model, task, "test"),
                         "seconds": time.perf_counter() - start}


def starting_points(args: argparse.Namespace, seed: int, model: nn.Module, source: TranslationTask,
                    target: TranslationTask) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Each converted model saved for the engine; per route its figures before fine-tuning."""
    paths: dict[str, str] = {}
    before: dict[str, dict[str, Any]] = {"layernorm": {"source_test_bleu": bleu(model, source, "test"),
                                                       "target_test_bleu": bleu(model, target, "test")}}
    for option in CONVERTED:
        converted, report, seconds = convert_route(model, option, source, args.calibration, seed)
        paths[option] = str(Path(args.work_dir) / f"converted_{option}_seed{seed}.pt")
        fixup.save_converted(paths[option], converted, report)
        before[option] = {"rms_change": report.rms_change, "max_change": report.max_change,
                          "norm_changes": {n.name: n.change for n in report.norms},
                          "source_test_bleu": bleu(converted, source, "test"),
                          "target_test_bleu": bleu(converted, target, "test"), "convert_seconds": seconds}
    torch.manual_seed(seed)
    fresh = target.build_model(finetune_config(args, "scratch", args.lrs[0], seed))
    before["scratch"] = {"target_test_bleu": bleu(fresh, target, "test"), "note": "at initialisation"}
    return paths, before


def finetune(args: argparse.Namespace, route: str, lr: float, seed: int, model: nn.Module,
             paths: dict[str, str]) -> dict[str, Any]:
    """One fine-tuning run on B through the engine: BLEU on B's validation and test splits after it."""
    start = time.perf_counter()
    config = finetune_config(args, route, lr, seed, paths.get(route, ""))
    given = copy.deepcopy(model).train() if route == "layernorm" else None
    task = _Given(config, Path(args.work_dir) / "target", given)
    result = fit(config, task=task, progress=False)
    tuned = result.model.eval()
    return {"route": route, "seed": seed, "lr": lr, "outcome": str(result.outcome),
            "val_bleu": bleu(tuned, task, "valid"), "test_bleu": bleu(tuned, task, "test"),
            "final_valid_nll": result.final.get("test_nll"), "seconds": time.perf_counter() - start}


# --- summaries --------------------------------------------------------------------------------------------------

def summary(values: list[float]) -> dict[str, Any]:
    """Mean, std and n (std 0 for n = 1)."""
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def choose_rates(runs: list[dict[str, Any]], search_seeds: list[int]) -> dict[str, float]:
    """Per route, the rate with the best mean validation BLEU on B over the search seeds."""
    chosen = {}
    for route in ROUTES:
        by_lr: dict[float, list[float]] = {}
        for r in runs:
            if r["route"] == route and r["seed"] in search_seeds:
                by_lr.setdefault(r["lr"], []).append(r["val_bleu"])
        if by_lr:
            chosen[route] = max(by_lr, key=lambda lr: statistics.mean(by_lr[lr]))
    return chosen


def rows(runs: list[dict[str, Any]], seeds: dict[int, dict[str, Any]], rates: dict[str, float]) -> list[dict]:
    """One row per route: the conversion's change, BLEU on A after conversion, BLEU on B before and after."""
    out = []
    for route in ROUTES:
        before = [s["before"][route] for s in seeds.values() if route in s.get("before", {})]
        tuned = [r for r in runs if r["route"] == route and r["lr"] == rates.get(route)]
        row: dict[str, Any] = {"route": route, "lr": rates.get(route), "outcomes": [r["outcome"] for r in tuned]}
        for key in ("rms_change", "max_change", "source_test_bleu", "target_test_bleu"):
            values = [b[key] for b in before if key in b]
            if values:
                row[key] = summary(values)
        if tuned:
            row["finetuned_test_bleu"] = summary([r["test_bleu"] for r in tuned])
            row["finetuned_val_bleu"] = summary([r["val_bleu"] for r in tuned])
        out.append(row)
    return out


LABELS = {"layernorm": "LayerNorm kept", "affine": "converted, affine", "dyt": "converted, Dynamic Tanh",
          "scratch": "Fixup from scratch on B (no transfer)"}


def table(table_rows: list[dict[str, Any]]) -> str:
    def cell(row: dict[str, Any], key: str, fmt: str = ".1f") -> str:
        s = row.get(key)
        return "" if s is None else f"{s['mean']:{fmt}} ± {s['std']:{fmt}} (n={s['n']})"

    lines = ["| route | function change, RMS (max) | BLEU on A (as converted) | BLEU on B before fine-tuning | "
             "BLEU on B after fine-tuning | rate |", "|---|---|---|---|---|---|"]
    for row in table_rows:
        change = "0 (kept)" if row["route"] == "layernorm" else ""
        if "rms_change" in row:
            change = f"{cell(row, 'rms_change', '.2f')} ({row['max_change']['mean']:.1f})"
        bad = [o for o in row["outcomes"] if o != "completed"]
        after = cell(row, "finetuned_test_bleu") + (f"; not completed: {', '.join(bad)}" if bad else "")
        rate = "" if row["lr"] is None else f"{row['lr']:g}"
        lines.append(f"| {LABELS[row['route']]} | {change} | {cell(row, 'source_test_bleu')} | "
                     f"{cell(row, 'target_test_bleu')} | {after} | {rate} |")
    return "\n".join(lines)


def paired(runs: list[dict[str, Any]], rates: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each route's BLEU on B after fine-tuning minus the LayerNorm model's, seed by seed (each seed's routes start
    from the same pre-trained model), at the chosen rates."""
    after = {(r["route"], r["seed"]): r["test_bleu"] for r in runs if r["lr"] == rates.get(r["route"])}
    out = {}
    for route in ROUTES:
        seeds = sorted(s for (k, s) in after if k == route and ("layernorm", s) in after)
        if route != "layernorm" and seeds:
            out[route] = summary([after[route, s] - after["layernorm", s] for s in seeds])
    return out


# --- main -------------------------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    import json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--search-seeds", nargs="+", type=int, default=[0], help="seeds every rate of --lrs runs on")
    p.add_argument("--pretrain-updates", type=int, default=600, help="updates on task A (the tiny recipe's)")
    p.add_argument("--updates", type=int, default=300, help="fine-tuning updates on task B, every route")
    p.add_argument("--lrs", nargs="+", type=float, default=[3e-4, 1e-3, 3e-3], help="fine-tuning rates searched")
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--calibration", type=int, default=4, help="batches of A's training pairs the conversion fits on")
    p.add_argument("--train-pairs", type=int, default=30000, help="training pairs of each generated task")
    p.add_argument("--eval-pairs", type=int, default=1000, help="validation and test pairs of each generated task")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    p.add_argument("--model-overrides", type=json.loads, default={}, help="TransformerConfig fields, JSON")
    p.add_argument("--work-dir", default="runs/transfer_text", help="data, vocabulary and converted models")
    p.add_argument("--smoke", action="store_true", help="a tiny model, tiny tasks, a few updates: seconds")
    p.add_argument("--json", default=None, help="write the command, settings, every run and the table")
    p.add_argument("--summarise", default=None, metavar="JSON",
                   help="train nothing: print the table of a results file and each route's paired difference")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.search_seeds, args.lrs = args.seeds[:1], args.seeds[:1], args.lrs[:1]
        args.pretrain_updates, args.updates, args.calibration = 3, 2, 1
        args.train_pairs, args.eval_pairs, args.max_tokens = 300, 20, 512
        args.model_overrides = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1}
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.summarise:
        import json

        saved = json.loads(Path(args.summarise).read_text())
        diffs = paired(saved["runs"], saved["rates"])
        print(table(saved["rows"]))
        for route, d in diffs.items():
            print(f"{LABELS[route]} minus LayerNorm kept, BLEU on B after fine-tuning, paired by seed: "
                  f"{d['mean']:+.2f} ± {d['std']:.2f} (n={d['n']})")
        return {"table": table(saved["rows"]), "paired": diffs}
    torch.set_num_threads(1)
    command = "PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/transfer_text.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    started, runs, seeds = time.perf_counter(), [], {}
    target_task: TranslationTask | None = None
    order = sorted(args.seeds, key=lambda s: (s not in args.search_seeds, s))
    rates: dict[str, float] = {}
    for seed in order:
        model, source, seeds[seed] = pretrain(args, seed)
        log(f"seed {seed}: pre-trained, BLEU on A {seeds[seed]['source_test_bleu']:.1f}", started)
        if target_task is None:
            target_task = TranslationTask(finetune_config(args, "scratch", args.lrs[0], seed),
                                          work_dir=Path(args.work_dir) / "target")
        paths, seeds[seed]["before"] = starting_points(args, seed, model, source, target_task)
        log(f"seed {seed}: converted, " + ", ".join(f"{k} BLEU on B {v['target_test_bleu']:.1f}"
                                                   for k, v in seeds[seed]["before"].items()), started)
        if seed not in args.search_seeds and not rates:
            rates = choose_rates(runs, args.search_seeds)
        for route in args.routes:
            for lr in (args.lrs if seed in args.search_seeds else [rates[route]]):
                runs.append(finetune(args, route, lr, seed, model, paths))
                log(f"seed {seed} {route} lr {lr:g}: {runs[-1]['outcome']}, BLEU on B valid "
                    f"{runs[-1]['val_bleu']:.1f} test {runs[-1]['test_bleu']:.1f}", started)
                write(args, command, runs, seeds, started, target_task)
    return write(args, command, runs, seeds, started, target_task, final=True)


def log(message: str, started: float) -> None:
    print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)


def write(args: argparse.Namespace, command: str, runs: list[dict[str, Any]], seeds: dict[int, dict[str, Any]],
          started: float, target: TranslationTask, final: bool = False) -> dict[str, Any]:
    """The results so far (the rates chosen on what the search seeds have run), to --json."""
    rates = choose_rates(runs, args.search_seeds)
    table_rows = rows(runs, seeds, rates)
    out = {"command": command, "complete": final,
           "settings": {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")},
           "tasks": {"source": "synthetic_translation seed 0, the default rules",
                     "target": f"synthetic_translation seed 0, {SHIFT}",
                     "pairs": {k: len(v) for k, v in target.data.pairs.items()},
                     "target_copy_bleu": corpus_bleu(target.data.sources["test"],
                                                     target.data.references["test"]).bleu},
           "pretrained": {s: {k: v for k, v in d.items() if k != "before"} for s, d in seeds.items()},
           "before": {s: d.get("before", {}) for s, d in seeds.items()},
           "runs": runs, "rates": rates, "rows": table_rows, "table": table(table_rows),
           "paired_with_layernorm": paired(runs, rates),
           "seconds": time.perf_counter() - started}
    if final:
        print(out["table"])
    if args.json:
        from fixup._io import write_json

        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
