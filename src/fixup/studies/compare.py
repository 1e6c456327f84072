"""``fixup compare``: one registered model trained under several methods, side by side, over several seeds.

Each (method, seed) is one cell of the studies' store (:mod:`fixup.studies.store`), trained by the engine
(:func:`fixup.train.fit`) with the engine's own recipe (SGD, lr 0.1, momentum 0.9, the step schedule, global-norm
clipping at 1), changed for every method alike by ``train`` options. Cells are resumable as a study's are: a
finished cell is never run again, an interrupted one continues from its checkpoint. Each cell trains with one
torch thread, whether in this process or in ``jobs`` worker processes, so that parallel cells do not fight over
the cores.

The report (``compare.md``) gives, per method, each seed's test accuracy after the last epoch, the mean ± std
with its n, and runs that diverged or collapsed named as such (never averaged in); ``compare.json`` holds the same
figures and each run's final scalars (gates, multipliers, biases; see :mod:`fixup.train.scalars`), and
``compare.png`` draws the accuracy per method, one point per seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import write_json, write_text
from ..method import as_method
from ._common import method_model_args, train_cell
from .cells import Cell, Task
from .evidence import COMPLETED, cells_from_results, outcome_of
from .runner import ProgressFn, run_tasks
from .store import Store

__all__ = ["CompareConfig", "CompareResult", "compare", "compare_cell", "compare_table"]

STUDY = "compare"
# TrainConfig fields that compare sets itself, from its own options; `train` may not set them.
OWN_FIELDS = ("task", "model", "norm", "init", "seed", "depth", "width", "epochs", "dataset", "data_dir", "device")


@dataclass(frozen=True)
class CompareConfig:
    """What to compare: one model, its methods, the seeds and the training every run shares."""

    model: str  # a registered model name (fixup.list_models())
    methods: tuple[str, ...] = ("fixup", "skipinit", "rezero", "batchnorm")  # names of fixup.METHODS
    seeds: tuple[int, ...] = (0, 1, 2)  # one run per method and seed
    depth: int = 0  # layers, for models that take a depth (0 = the builder's default)
    width: int = 0  # base width in channels, for models that take one (0 = the builder's default)
    epochs: int = 3  # passes over the training set
    dataset: str = "digits"  # digits (embedded) | cifar10 | cifar100 | svhn | folder (these read data_dir)
    data_dir: str = ""  # local archive/folder of the data set
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda | cuda:N
    train: Mapping[str, Any] = field(default_factory=dict)  # further fixup.train.TrainConfig fields, e.g. {"lr": 0.05}

    def validate(self) -> CompareConfig:
        from ..models import list_models
        from ..train import TrainConfig

        if self.model not in list_models():
            import difflib

            close = difflib.get_close_matches(self.model, list_models(), n=3)
            raise ValueError(f"unknown model {self.model!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
                             + " (fixup list shows every registered model)")
        if not self.methods or not self.seeds:
            raise ValueError(f"give at least one method and one seed, got methods={list(self.methods)}, "
                             f"seeds={list(self.seeds)}")
        for name, values in (("methods", self.methods), ("seeds", self.seeds)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice: {list(values)}; give each once")
        for method in self.methods:
            as_method(method)  # an unknown name is a ValueError listing the methods
        own = sorted(set(self.train) & set(OWN_FIELDS))
        if own:
            raise ValueError(f"train options {', '.join(own)} are compare's own; give them as its options "
                             "(--methods, --seeds, --depth, --width, --epochs, --data, --data-dir, --device)")
        for method in self.methods:  # every field and value checked before any cell starts
            TrainConfig.from_dict(self.train_config(method, self.seeds[0]))
        return self

    def train_config(self, method: str, seed: int) -> dict[str, Any]:
        """The :class:`fixup.train.TrainConfig` fields of one run (flat)."""
        fields: dict[str, Any] = {"task": "images", "model": self.model, "dataset": self.dataset, "seed": seed,
                                  "epochs": self.epochs, "device": self.device, **method_model_args(method)}
        for name in ("depth", "width", "data_dir"):
            if getattr(self, name):
                fields[name] = getattr(self, name)
        return {**fields, **dict(self.train)}

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {**data, "methods": list(self.methods), "seeds": list(self.seeds), "train": dict(self.train)}


def compare_cell(cell: Cell, work: Path) -> dict[str, Any]:
    """Train one (method, seed) with one torch thread; its outcome (and the 0-based epoch and the step where it
    ended), history and final scalars (per kind, whole model). Module-level, so that worker processes import it."""
    import json

    import torch

    from ..train.scalars import ALL, read_scalars

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train_cell(cell, work)
    finally:
        torch.set_num_threads(threads)
    epochs = read_scalars(work) if (work / "scalars.jsonl").is_file() else []
    result["scalars"] = [r for r in epochs[-1]["scalars"] if r["stage"] == ALL] if epochs else []
    ended = json.loads((work / "result.json").read_text())["outcome"]  # the engine's: status, epoch, step, reason
    result["ended"] = {"epoch": ended["epoch"], "step": ended["step"]}
    return result


def _cells(config: CompareConfig) -> list[Cell]:
    setting: dict[str, Any] = {"model": config.model}
    setting.update({k: getattr(config, k) for k in ("depth", "width") if getattr(config, k)})
    return [Cell(STUDY, method, setting, seed, {"train": config.train_config(method, seed)}, cost=1.0)
            for method in config.methods for seed in config.seeds]


@dataclass
class CompareResult:
    """What :func:`compare` did and wrote."""

    summary: dict[str, Any]  # the figures of compare.json
    table: str  # the markdown of compare.md
    report: Path  # OUT/compare.md
    results: Path  # OUT/compare.json
    plot: Path | None  # OUT/compare.png (None with plots=False)
    ran: list[str]  # cells trained in this call
    resumed: list[str]  # cells found finished, not trained again
    failed: dict[str, str]  # cells whose function raised: key -> traceback (they are retried by the next call)
    seconds: float


def _run_text(run: Mapping[str, Any]) -> str:
    """A seed's cell of the table: its test accuracy in %, or how it ended."""
    if run["outcome"] == COMPLETED:
        acc = run["test_acc"]
        return "no value" if acc is None else f"{100 * acc:.1f}"
    ended = run.get("ended") or {}
    if run["outcome"] in ("missing", "error") or "step" not in ended:
        return run["outcome"]
    return f"{run['outcome']} (epoch {ended['epoch'] + 1}, step {ended['step']})"


def summarise(config: CompareConfig, store: Store, failed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per method, each seed's run (outcome, test accuracy, where a failed run ended, final scalars) and the
    accuracy's :class:`~fixup.studies.evidence.Cells` (``test_acc``) with its text (``text``)."""
    failed = failed or {}
    by_method: dict[str, Any] = {}
    for cell in _cells(config):
        record = store.load(cell)
        runs = by_method.setdefault(cell.method, {"runs": []})["runs"]
        if record is None:
            runs.append({"seed": cell.seed, "outcome": "error" if cell.key in failed else "missing", "test_acc": None})
            continue
        result = record["result"]
        runs.append({"seed": cell.seed, "outcome": outcome_of(result), "test_acc": result.get("test_acc"),
                     "reason": result.get("reason", ""), "ended": result.get("ended", {}),
                     "scalars": result.get("scalars", [])})
    for entry in by_method.values():
        finished = [r for r in entry["runs"] if r["outcome"] not in ("missing", "error")]
        cells = cells_from_results(finished, len(entry["runs"]), lambda r: r["test_acc"])
        entry["test_acc"] = cells.to_dict()
        entry["text"] = cells.format(1, 100, "%")
    return {"config": config.to_dict(), "methods": by_method}


def compare_table(summary: Mapping[str, Any], command: str = "") -> str:
    """The markdown report: the setting, the command, and one row per method (each seed, then mean ± std (n))."""
    cfg = summary["config"]
    seeds = cfg["seeds"]
    model = cfg["model"] + (f", depth {cfg['depth']}" if cfg["depth"] else "") + (
        f", width {cfg['width']}" if cfg["width"] else "")
    extra = ", ".join(f"{k}={v}" for k, v in cfg["train"].items())
    lines = [f"# fixup compare: {model} on {cfg['dataset']}", "",
             f"Test accuracy (%) after {cfg['epochs']} epoch(s), one run per method and seed; the engine's recipe"
             + (f" with {extra}" if extra else "") + ". A run that diverged or collapsed is named, with where it "
             "ended, and left out of the mean (its n says so).", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std (n) |",
              "|---|" + "---|" * len(seeds) + "---|"]
    for method, entry in summary["methods"].items():
        lines.append(f"| {method} | " + " | ".join(_run_text(r) for r in entry["runs"]) + f" | {entry['text']} |")
    return "\n".join(lines) + "\n"


def compare(config: CompareConfig, out: str | Path, *, jobs: int = 1, progress: ProgressFn | None = None,
            plots: bool = True, command: str = "", keep_checkpoints: bool = False) -> CompareResult:
    """Train ``config.model`` under each method and seed (resumably, in ``out``) and write the report.

    Writes ``out/compare.md`` (:func:`compare_table`), ``out/compare.json`` and, with ``plots``,
    ``out/compare.png`` (and its ``compare.data.json``). A cell whose function raised is listed in
    :attr:`CompareResult.failed` and shown as ``error``; running again retries it. A finished run's
    checkpoints are deleted unless ``keep_checkpoints``.
    """
    config.validate()
    out = Path(out)
    tasks = [Task(cell, compare_cell) for cell in _cells(config)]
    run = run_tasks(tasks, out, jobs=jobs, progress=progress, keep_checkpoints=keep_checkpoints)
    summary = summarise(config, Store(out), run.failed)
    summary["command"] = command
    table = compare_table(summary, command)
    report, results = out / "compare.md", out / "compare.json"
    write_text(report, table)
    write_json(results, summary)
    plot = None
    if plots:
        from .plots import plot_compare

        plot = plot_compare(summary, out / "compare.png")
    return CompareResult(summary, table, report, results, plot, run.ran, run.resumed, dict(run.failed), run.seconds)


def parse_train_options(items: Sequence[str]) -> dict[str, Any]:
    """``["lr=0.05", "clip=none"]`` as ``{"lr": 0.05, "clip": "none"}`` (values read as JSON where they parse)."""
    import json

    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE (a fixup train option, e.g. lr=0.05), got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        options[key.strip().replace("-", "_")] = value
    return options
