"""A Hugging Face GPT-2 (tiny config) on a generated copy task, as written (LayerNorm) and adapted by
``fixup.adapt(..., method=)`` ``fixup``, ``t_fixup`` and ``dyt`` (alpha0 0.5, ``"fitted"``, 4, 16 or 50): the same
model, data, steps and optimiser for all. ``--model bert`` runs a BERT-like encoder on the same task instead.

    OMP_NUM_THREADS=1 PYTHONPATH=src:tests python benchmarks/adapt_t_fixup.py --seeds 0 1 2

The task: 8 tokens drawn uniformly from 16, a separator, then the same 8 tokens; the model (GPT2LMHeadModel,
4 layers, width 64, 4 heads, dropout 0) learns next-token prediction on the copied half. Adam over
``fixup.param_groups(model, lr=1e-3)`` at a constant rate from the first step (no warm-up: T-Fixup's recipe, and the
same for every form), batch 64, the global gradient norm clipped at 1 (the engine's default), one thread. The seed
fixes the initialisation, the adapt draws and the batches; the copy accuracy is measured on 1,024 held-out sequences
(a fixed seed) after the last step. A run whose loss is not finite stops and is reported as failed. Writes
benchmarks/results/adapt_t_fixup.json (config, summary, every run).

``--model bert``: a Hugging Face ``BertForTokenClassification`` of the same size (4 layers, width 64, 4 heads,
feed-forward 256, dropout 0, one token type) sees the sequence with the copied half replaced by a mask token and
predicts, at each masked position, the token it hides: the same copy read bidirectionally, scored the same way.

``--lrs R1 R2 ...`` gives each form its own rate: the search seeds (``--search-seeds``) train at every rate and are
scored on 1,024 validation sequences drawn apart from the test set; the best rate by validation accuracy (ties to
the lower validation loss) is extended past the grid's edge, at most ``--extend`` times each way, while it lies
there; the seeds then train at each form's chosen rate and are scored on the test set.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import fixup
from _torchvision_shim import install as _install_torchvision_shim

OUT = Path(__file__).parent / "results" / "adapt_t_fixup.json"
# Each adapted form: fixup.adapt's options (layernorm is GPT-2 as written).
FORM_OPTIONS = {"fixup": {"method": "fixup"}, "t_fixup": {"method": "t_fixup"}, "dyt": {"method": "dyt"},
                "dyt_fitted": {"method": "dyt", "alpha0": "fitted"},
                **{f"dyt_{a:g}": {"method": "dyt", "alpha0": a} for a in (4.0, 16.0, 50.0)}}
FORMS = ("layernorm", *FORM_OPTIONS)
DEFAULT_FORMS = ("layernorm", "fixup", "t_fixup", "dyt")  # the table of docs/methods.md; the others by --forms
K, SYMBOLS, SEP = 8, 16, 1  # copied tokens, their alphabet (ids 2..17), the separator's id
TEST_SEED, VALIDATION_SEED = 99, 98  # the held-out sequences' generators: the test set and the rate search's
VOCAB = SYMBOLS + 2
MASK = VOCAB  # --model bert: the id that hides each copied token (its inputs' vocabulary is VOCAB + 1)
MODELS = ("gpt2", "bert")


def batch(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` sequences: K symbols, the separator, the same K symbols (shape n x (2K + 1))."""
    first = torch.randint(2, VOCAB, (n, K), generator=generator)
    return torch.cat([first, torch.full((n, 1), SEP), first], dim=1)


def build(seed: int, model: str = "gpt2") -> nn.Module:
    import transformers

    torch.manual_seed(seed)
    if model == "bert":
        return transformers.BertForTokenClassification(transformers.BertConfig(
            vocab_size=VOCAB + 1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=32, type_vocab_size=1,
            num_labels=VOCAB))
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=4, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=SEP,
                                     eos_token_id=SEP)
    return transformers.GPT2LMHeadModel(config)


def masked(ids: torch.Tensor) -> torch.Tensor:
    """--model bert's input: the copied half hidden behind MASK."""
    out = ids.clone()
    out[:, K + 1:] = MASK
    return out


def form_model(form: str, seed: int, model: str = "gpt2") -> nn.Module:
    net = build(seed, model)
    if form == "layernorm":
        return net
    example = batch(2, torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fixup.FixupWarning)  # Fixup unties lm_head from wte, and says so
        adapted, _ = fixup.adapt(net, masked(example) if model == "bert" else example, **FORM_OPTIONS[form],
                                 generator=torch.Generator().manual_seed(seed))
    return adapted


def copy_loss(net: nn.Module, ids: torch.Tensor, model: str = "gpt2") -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and accuracy of the predictions of the copied half (GPT-2: positions K .. 2K - 1 predict
    K + 1 ..; BERT: each masked position predicts the token it hides)."""
    logits = net(masked(ids)).logits[:, K + 1:] if model == "bert" else net(ids).logits[:, K:-1]
    target = ids[:, K + 1:]
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
    return loss, (logits.argmax(-1) == target).float().mean()


def run(form: str, seed: int, steps: int, lr: float, held_out: int = TEST_SEED, model: str = "gpt2"
        ) -> dict[str, object]:
    start = time.time()
    net = form_model(form, seed, model)
    opt = torch.optim.Adam(fixup.param_groups(net, lr=lr), lr=lr)
    data = torch.Generator().manual_seed(1000 + seed)
    net.train()
    status, failed_at, loss = "completed", None, torch.tensor(float("nan"))
    for step in range(steps):
        loss, _ = copy_loss(net, batch(64, data), model)
        if not math.isfinite(loss.item()):
            status, failed_at = "failed (loss not finite)", step
            break
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    net.eval()
    with torch.no_grad():
        test_loss, acc = copy_loss(net, batch(1024, torch.Generator().manual_seed(held_out)), model)
    return {"form": form, "seed": seed, "lr": lr, "status": status, "failed_at": failed_at, "train_loss": loss.item(),
            "test_loss": test_loss.item(), "copy_acc": acc.item() if status == "completed" else None,
            "seconds": round(time.time() - start, 1)}


def _score(runs: list[dict[str, object]]) -> tuple[float, float]:
    """A rate's score over its search runs: mean accuracy, then minus the mean loss (a failed run: 0 and -inf)."""
    accs = [r["copy_acc"] if r["status"] == "completed" else 0.0 for r in runs]
    losses = [r["test_loss"] if r["status"] == "completed" and math.isfinite(r["test_loss"]) else math.inf
              for r in runs]
    return statistics.mean(accs), -statistics.mean(losses)


def search_rate(form: str, args: argparse.Namespace) -> tuple[float, list[dict[str, object]]]:
    """The form's rate chosen on the validation sequences, and every search run (``"split": "validation"``)."""
    grid = sorted(args.lrs)
    runs: list[dict[str, object]] = []

    def at(lr: float) -> list[dict[str, object]]:
        done = [run(form, seed, args.steps, lr, VALIDATION_SEED, args.model) | {"split": "validation"}
                for seed in args.search_seeds]
        runs.extend(done)
        return done

    scores = {lr: _score(at(lr)) for lr in grid}
    for _ in range(2 * args.extend):
        best = max(scores, key=lambda lr: (scores[lr], -lr))
        rates = sorted(scores)
        if len(grid) > 1 and best == rates[-1] and sum(r > grid[-1] for r in rates) < args.extend:
            nxt = best * grid[-1] / grid[-2]
        elif len(grid) > 1 and best == rates[0] and sum(r < grid[0] for r in rates) < args.extend:
            nxt = best * grid[0] / grid[1]
        else:
            break
        scores[nxt] = _score(at(nxt))
    return max(scores, key=lambda lr: (scores[lr], -lr)), runs


def command(args: argparse.Namespace) -> str:
    """The command that reruns these runs."""
    text = "OMP_NUM_THREADS=1 PYTHONPATH=src:tests python benchmarks/adapt_t_fixup.py --seeds " + " ".join(
        map(str, args.seeds))
    if args.model != "gpt2":
        text += f" --model {args.model}"
    if args.steps != 1000:
        text += f" --steps {args.steps}"
    if args.lrs:
        text += " --lrs " + " ".join(f"{r:g}" for r in args.lrs) + " --search-seeds " + " ".join(
            map(str, args.search_seeds))
        if args.extend != 2:
            text += f" --extend {args.extend}"
    elif args.lr != 1e-3:
        text += f" --lr {args.lr:g}"
    if tuple(args.forms) != DEFAULT_FORMS:
        text += " --forms " + " ".join(args.forms)
    if args.out != OUT:
        text += f" --out {args.out.relative_to(Path.cwd()) if args.out.is_relative_to(Path.cwd()) else args.out}"
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="gpt2",
                   help="gpt2: GPT2LMHeadModel predicting the copy; bert: BertForTokenClassification reading it masked")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3, help="the rate of every form (without --lrs)")
    p.add_argument("--lrs", type=float, nargs="+", default=None, help="search each form's rate over these")
    p.add_argument("--search-seeds", type=int, nargs="+", default=[0])
    p.add_argument("--extend", type=int, default=2, help="rates tried past a best at the grid's edge, each way")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--forms", nargs="+", default=list(DEFAULT_FORMS), choices=FORMS)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    torch.set_num_threads(1)
    _install_torchvision_shim()  # transformers imports torchvision where it is installed (tests/_torchvision_shim.py)
    if args.lrs and (min(args.lrs) <= 0 or args.extend < 0):
        p.error(f"--lrs must be positive and --extend at least 0, got {args.lrs} and {args.extend}")
    rates, search = {form: args.lr for form in args.forms}, []
    if args.lrs:
        for form in args.forms:
            rates[form], tried = search_rate(form, args)
            search.extend(tried)
    runs = [run(form, seed, args.steps, rates[form], model=args.model) for seed in args.seeds for form in args.forms]
    summary = {}
    for form in args.forms:
        done = [r["copy_acc"] for r in runs if r["form"] == form and r["status"] == "completed"]
        summary[form] = {"lr": rates[form], "mean": statistics.mean(done) if done else None,
                         "std": statistics.stdev(done) if len(done) > 1 else 0.0, "n": len(done),
                         "failed": sum(1 for r in runs if r["form"] == form and r["status"] != "completed")}
        if args.lrs:
            summary[form]["validation"] = {f"{lr:g}": [r["copy_acc"] for r in search
                                                        if r["form"] == form and r["lr"] == lr]
                                           for lr in sorted({r["lr"] for r in search if r["form"] == form})}
    config = {"model": "BertForTokenClassification (4 layers, width 64, 4 heads, feed-forward 256, dropout 0), the "
                       "copied half masked" if args.model == "bert" else
                       "GPT2LMHeadModel (4 layers, width 64, 4 heads, dropout 0)", "task": f"copy {K} of {SYMBOLS}",
              "steps": args.steps, "batch": 64, "optimiser": "Adam over fixup.param_groups",
              "lr": args.lrs if args.lrs else args.lr, "search_seeds": args.search_seeds if args.lrs else None,
              "schedule": "constant, no warm-up", "clip": 1.0, "seeds": args.seeds, "threads": 1,
              "command": command(args)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": config, "summary": summary, "runs": runs, "search": search}, indent=1)
                        + "\n")
    for form, s in summary.items():
        mean = "-" if s["mean"] is None else f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}%"
        print(f"{form}: copy accuracy {mean} at lr {s['lr']:g} (n={s['n']}, failed {s['failed']})")


if __name__ == "__main__":
    main()
