"""Speed and memory of every model family under Fixup, its bare form and its normalised baseline, side by side.

``benchmark(config)`` builds each family (:mod:`fixup.perf.bench_families`) once per variant and, for each
execution mode (eager, ``torch.compile``) and thread count, measures in one process and interleaved
(every repetition times each variant once, in a rotating order, so that load from other processes falls
on all variants alike):

- the training step: forward, cross-entropy, backward and an SGD step (momentum 0.9);
- the forward pass (``torch.no_grad``, eval mode), which is also where the folded model is timed;
- peak memory of one training step (see :mod:`fixup.perf.memory`), once per family and mode.

Every ratio is to the bare network of the same family timed in the same repetition (the median of the
per-repetition ratios, with their min and max). Targets: a Fixup training step within
:data:`STEP_TARGET` of the bare one and its peak memory within :data:`MEMORY_TARGET`; the folded model's
forward within :data:`FOLD_TARGET`. Every cell that misses its target is profiled (one call of the Fixup
variant and one of the bare network under ``torch.profiler``) and the row names the operators where the
extra time or memory goes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from .._devices import check_device_name, resolve_device
from .bench_families import (
    FAMILIES,
    FLOOR,
    FORWARD_ONLY,
    SEQUENCE,
    VARIANTS,
    Family,
    build_variant,
    loss_fn,
    make_batch,
)
from .memory import MEMORY_METHOD, peak_step_memory
from .profiling import explain, op_profile

__all__ = ["FOLD_TARGET", "MEMORY_TARGET", "MODES", "STEP_TARGET", "BenchConfig", "benchmark", "format_table"]

STEP_TARGET = 1.05  # Fixup training step / bare training step
MEMORY_TARGET = 1.15  # Fixup peak memory / bare peak memory
FOLD_TARGET = 1.02  # folded Fixup forward / bare forward
MODES = ("eager", "compile")


@dataclass
class BenchConfig:
    """What to benchmark. Times in milliseconds, memory in bytes in the results."""

    families: tuple[str, ...] = tuple(FAMILIES)
    variants: tuple[str, ...] = ("none", "fixup", "fixup-plain", "norm", "fixup-folded")
    modes: tuple[str, ...] = ("eager",)  # add "compile" for torch.compile'd models (minutes to compile)
    threads: tuple[int, ...] = (1, 2)  # torch.set_num_threads for each pass
    batch: int | None = None  # examples per step; None: each family's default
    depth: int | None = None  # the CIFAR ResNet's depth (6n+2); None: the family's (20)
    image_size: int | None = None  # image side in pixels for the ResNets; None: each family's (32, 64)
    device: str = "cpu"  # cpu, cuda, cuda:N or auto (threads apply to the CPU)
    warmup: int = 1  # untimed calls per variant before timing (at least 1 when compiling)
    reps: int = 5  # timed repetitions per variant (interleaved)
    memory: bool = True  # also measure peak memory of one step
    explain: bool = True  # profile the cells that miss a target and name where the time goes
    seed: int = 0

    def __post_init__(self) -> None:
        def check(kind: str, given: tuple, valid: tuple) -> None:
            bad = [v for v in given if v not in valid]
            if bad:
                raise ValueError(f"unknown {kind}(s) {bad}; choose from {', '.join(map(str, valid))}")

        check("family", self.families, tuple(FAMILIES))
        check("variant", self.variants, VARIANTS)
        check("mode", self.modes, MODES)
        if FLOOR not in self.variants:
            raise ValueError(f"variants must include the floor {FLOOR!r} (ratios are taken to it), got {self.variants}")
        if self.reps < 1 or self.warmup < 0 or (self.batch is not None and self.batch < 1):
            raise ValueError(f"need reps >= 1, warmup >= 0, batch >= 1; got reps={self.reps}, warmup={self.warmup}, "
                             f"batch={self.batch}")
        if not self.threads or any(t < 1 for t in self.threads):
            raise ValueError(f"threads must be positive thread counts, got {self.threads}")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be >= 1 pixel, got {self.image_size}")
        if self.depth is not None:
            from ..models.resnet_cifar import check_cifar_depth

            check_cifar_depth(self.depth)
        check_device_name(self.device)


class _Runner:
    """One model with its optimiser and a fixed batch: ``step()`` trains once, ``forward()`` infers."""

    def __init__(self, model: nn.Module, inputs: tuple[torch.Tensor, ...], target: torch.Tensor,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], compile: bool,
                 device: torch.device) -> None:
        model = model.to(device)
        self.device = device
        self.model, self.loss = model, loss
        self.inputs, self.target = tuple(t.to(device) for t in inputs), target.to(device)
        self.run = torch.compile(model) if compile else model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(self) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.run(*self.inputs), self.target).backward()
        self.opt.step()

    def forward(self) -> None:
        self.model.eval()
        with torch.no_grad():
            self.run(*self.inputs)


def _interleaved(runners: dict[str, _Runner], method: str, reps: int, warmup: int) -> dict[str, list[float]]:
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            getattr(runners[name], method)()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each repetition
            runner = runners[name]
            _sync(runner.device)
            start = time.perf_counter()
            getattr(runner, method)()
            _sync(runner.device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _ratios(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    floor = times[FLOOR]
    return {name: _summary([t / f for t, f in zip(ts, floor)]) for name, ts in times.items()}


def _misses(row: dict[str, Any]) -> list[str]:
    out = []
    if row["variant"] == "fixup":
        if row.get("step_ratio") and row["step_ratio"]["median"] > STEP_TARGET:
            out.append("step")
        if row.get("peak_ratio") and row["peak_ratio"] > MEMORY_TARGET:
            out.append("memory")
    if row["variant"] == "fixup-folded" and row["forward_ratio"]["median"] > FOLD_TARGET:
        out.append("forward")
    return out


def _explain(row: dict[str, Any], runners: dict[str, _Runner]) -> str:
    """Profile the missing cell's variant against the bare network and name where the difference goes."""
    parts = []
    for miss in row["misses"]:
        method, what = {"step": ("step", "ms"), "memory": ("step", "bytes"), "forward": ("forward", "ms")}[miss]
        cand, floor = (op_profile(getattr(runners[v], method)) for v in (row["variant"], FLOOR))
        parts.append(f"{miss}: {explain(cand, floor, what)}")
    return " | ".join(parts)


def _measure_family(family: Family, mode: str, config: BenchConfig, device: torch.device,
                    progress: Callable[[str], None]) -> list[dict]:
    if config.image_size is not None and not family.text:
        family = dataclasses.replace(family, image=config.image_size)
    batch = config.batch or family.batch
    inputs, target = make_batch(family, batch, config.seed)
    compile = mode == "compile"
    warmup = max(config.warmup, 1) if compile else config.warmup
    runners = {v: _Runner(build_variant(family, v, seed=config.seed, depth=config.depth), inputs, target,
                          loss_fn(family), compile, device) for v in config.variants}
    trainable = {v: r for v, r in runners.items() if v not in FORWARD_ONLY}
    mem = {}
    rows = []
    for threads in config.threads:
        torch.set_num_threads(threads)
        progress(f"{family.name} {mode} {threads} thread(s): training steps")
        step = _interleaved(trainable, "step", config.reps, warmup)
        progress(f"{family.name} {mode} {threads} thread(s): forward passes")
        fwd = _interleaved(runners, "forward", config.reps, warmup)
        if config.memory and not mem:
            progress(f"{family.name} {mode}: peak memory")
            mem = {v: peak_step_memory(r.step, r.model, device) for v, r in trainable.items()}
        step_ratio, fwd_ratio = _ratios(step), _ratios(fwd)
        for v in config.variants:
            label = family.norm if v == "norm" else v
            row: dict[str, Any] = {"family": family.name, "mode": mode, "threads": threads, "variant": v,
                                   "label": label, "forward_ms": _summary(fwd[v]), "forward_ratio": fwd_ratio[v],
                                   "forward_examples_per_s": batch / (statistics.median(fwd[v]) / 1e3)}
            if v in step:
                row.update(step_ms=_summary(step[v]), step_ratio=step_ratio[v])
            if v in mem:
                row.update(peak_bytes=mem[v]["peak_bytes"], peak_ratio=mem[v]["peak_bytes"] / mem[FLOOR]["peak_bytes"])
            row["misses"] = _misses(row)
            if row["misses"] and config.explain:
                progress(f"{family.name} {mode} {threads} thread(s): profiling {v} ({', '.join(row['misses'])})")
                row["reason"] = _explain(row, runners)
            rows.append(row)
    return rows


def _family_record(family: Family, config: BenchConfig) -> dict[str, Any]:
    """What a family's rows measured: its builder, options, batch and input size (numbers under names)."""
    options = dict(family.kwargs, **({"depth": config.depth} if config.depth and family.name == "cifar" else {}))
    record = {"model": family.model, "options": options, "batch": config.batch or family.batch}
    if family.text:
        record["tokens"] = SEQUENCE
    else:
        record["image_size"] = config.image_size or family.image
    return record


def benchmark(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns a JSON-ready dict with the environment, config and one row per cell."""
    say = progress or (lambda _msg: None)
    device = resolve_device(config.device)
    old_threads = torch.get_num_threads()
    rows = []
    try:
        for mode in config.modes:
            for name in config.families:
                rows.extend(_measure_family(FAMILIES[name], mode, config, device, say))
    finally:
        torch.set_num_threads(old_threads)
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
                        "machine": platform.machine(), "cpus": os.cpu_count(), "load_average": load},
        "config": asdict(config),
        "families": {name: _family_record(FAMILIES[name], config) for name in config.families},
        "targets": {"step": STEP_TARGET, "memory": MEMORY_TARGET, "folded_forward": FOLD_TARGET},
        "memory_method": MEMORY_METHOD[device.type] if config.memory else None,
        "timing_method": "median and (min, max) over interleaved repetitions after warm-up; ratio = median of "
                         "per-repetition ratios to the bare network timed in the same repetition",
        "rows": rows,
    }


def _cell(ratio: dict[str, float] | None) -> str:
    return "-" if ratio is None else f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def format_table(result: dict[str, Any], markdown: bool = False) -> str:
    """The rows as a table: times and ratios to the bare network of the same family; misses marked."""
    head = ["family", "mode", "threads", "variant", "step ms", "step x (min-max)", "fwd ms", "fwd x (min-max)",
            "peak MiB", "mem x", "misses"]
    body = []
    for r in result["rows"]:
        step = r.get("step_ms")
        body.append([r["family"], r["mode"], str(r["threads"]), r["label"],
                     "-" if step is None else f"{step['median']:.1f}", _cell(r.get("step_ratio")),
                     f"{r['forward_ms']['median']:.1f}", _cell(r["forward_ratio"]),
                     f"{r['peak_bytes'] / 2**20:.1f}" if "peak_bytes" in r else "-",
                     f"{r['peak_ratio']:.2f}" if "peak_ratio" in r else "-", ", ".join(r["misses"]) or "-"])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in [head, *body]]
    reasons = [f"- {r['family']} {r['mode']} {r['threads']} thread(s) {r['label']}: {r['reason']}"
               for r in result["rows"] if r.get("reason")]
    if reasons:
        lines += ["", "Where the difference goes (torch.profiler, self CPU time or memory, vs the bare network):",
                  *reasons]
    env = result["environment"]
    lines.append(f"\ntorch {env['torch']}, {env['cpus']} CPUs, load average {env['load_average']}; x = ratio to the "
                 f"bare network (norm none) of the same family. Targets: step <= {STEP_TARGET}, memory <= "
                 f"{MEMORY_TARGET}, folded forward <= {FOLD_TARGET}. Memory: {result['memory_method']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``fixup bench`` and ``benchmarks/bench_models.py``)."""
    d = BenchConfig()
    p.add_argument("--families", nargs="+", default=list(d.families), choices=list(FAMILIES),
                   help="model families to measure (default: %(default)s)")
    p.add_argument("--variants", nargs="+", default=list(d.variants), choices=list(VARIANTS),
                   help="variants side by side; 'none' (the bare network) is the floor ratios refer to, 'norm' the "
                        "family's BatchNorm or LayerNorm (default: %(default)s)")
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=list(MODES),
                   help="eager and/or compile (torch.compile; minutes to compile on a CPU) (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="shorthand for --modes eager compile (default: off)")
    p.add_argument("--threads", type=int, nargs="+", default=list(d.threads),
                   help="torch thread counts to measure, one pass each (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None,
                   help="examples per step (default: None, each family's: 64, 32, 64, 32)")
    p.add_argument("--depth", type=int, default=None,
                   help="the CIFAR ResNet's depth, 6n+2 (default: None, which is 20)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side in pixels for the ResNet families (default: None, each family's: 32 or 64)")
    p.add_argument("--warmup", type=int, default=d.warmup,
                   help="untimed calls per variant before timing, at least 1 when compiling (default: %(default)s)")
    p.add_argument("--reps", type=int, default=d.reps, help="timed repetitions per variant, interleaved "
                                                            "(default: %(default)s)")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto (default: %(default)s)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement (default: measure)")
    p.add_argument("--no-explain", action="store_true",
                   help="do not profile the cells that miss a target (default: profile them)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (default: plain text)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the weights and the batch (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to this file (default: none)")


def run_command(args: argparse.Namespace) -> int:
    import sys

    from .._io import check_output_file, write_json

    if args.json:
        check_output_file(args.json)
    modes = ("eager", "compile") if args.compile else tuple(args.modes)
    config = BenchConfig(families=tuple(args.families), variants=tuple(args.variants), modes=modes,
                         threads=tuple(args.threads), batch=args.batch, depth=args.depth, image_size=args.image_size,
                         device=args.device, warmup=args.warmup, reps=args.reps, memory=not args.no_memory,
                         explain=not args.no_explain, seed=args.seed)
    result = benchmark(config, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_table(result, markdown=args.markdown))
    if args.json:
        write_json(args.json, result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="training-step time, forward time and peak memory of every model family: "
                                     "Fixup vs its bare form vs BatchNorm/LayerNorm, eager and compiled")
    add_arguments(p)
    p.set_defaults(func=run_command)
