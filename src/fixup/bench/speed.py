"""Speed and memory of every model family under Fixup, its bare form and its normalised baseline, side by side.

``benchmark(config)`` builds each family (:mod:`fixup.bench.families`) once per variant and execution
mode (:data:`MODES`: eager, ``torch.compile``, bfloat16 autocast, both) and, for each thread count, measures
in one process and interleaved (every repetition times each variant in each mode once, in a rotating order,
so that load from other processes falls on all of them alike; a repetition repeats a short call until it lasts
about ``rep_seconds``, the same number of calls for every variant, and records the time per call):

- the training step: forward, cross-entropy, backward and an SGD step (momentum 0.9);
- the forward pass (``torch.no_grad``, eval mode), which is also where the folded model is timed;
- peak memory of one training step (see :mod:`fixup.bench.memory`), once per family and mode.

Every ratio is to the bare network of the same family in the same mode timed in the same repetition (the
median of the per-repetition ratios, with their min and max; and the ratio of the fastest repetitions, which
steady load from other processes disturbs least); ``mode_ratio`` is a step's ratio to the same variant in
eager float32 mode, timed in the same repetition (what compiling or bf16 gains). Targets: a Fixup training step within
:data:`STEP_TARGET` of the bare one and its peak memory within :data:`MEMORY_TARGET`; the folded model's
forward within :data:`FOLD_TARGET`. Every cell that misses its target is profiled (one call of the Fixup
variant and one of the bare network under ``torch.profiler``) and the row names the operators where the
extra time or memory goes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch._dynamo
from torch import nn

from .._devices import check_device_name, resolve_device
from .families import (
    FAMILIES,
    FLOOR,
    FORWARD_ONLY,
    SEQUENCE,
    VARIANTS,
    Family,
    build_variant,
    family_options,
    loss_fn,
    make_batch,
)
from .memory import MEMORY_METHOD, peak_step_memory
from .profiling import explain, op_profile
from .tables import format_modes, format_table

__all__ = ["FOLD_TARGET", "MEMORY_TARGET", "MODES", "STEP_TARGET", "BenchConfig", "benchmark", "mode_parts"]

STEP_TARGET = 1.05  # Fixup training step / bare training step (issue 27)
MEMORY_TARGET = 1.10  # Fixup peak memory / bare peak memory (issue 27)
FOLD_TARGET = 1.02  # folded Fixup forward / bare forward
# Execution modes: eager float32, torch.compile (inductor), eager under bfloat16 autocast, compiled under it.
MODES = ("eager", "compile", "bf16", "compile-bf16")
_RECOMPILE_LIMIT = 64  # every variant x mode x train/eval is its own compiled entry of one forward's code


def mode_parts(mode: str) -> tuple[bool, torch.dtype | None]:
    """(compiled, autocast dtype or None) of an execution mode of :data:`MODES`."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return mode.startswith("compile"), (torch.bfloat16 if mode.endswith("bf16") else None)


@dataclass
class BenchConfig:
    """What to benchmark. Times in milliseconds, memory in bytes in the results."""

    families: tuple[str, ...] = tuple(FAMILIES)
    variants: tuple[str, ...] = ("none", "fixup", "fixup-plain", "norm", "fixup-folded")
    modes: tuple[str, ...] = ("eager",)  # of MODES; the compiled ones take minutes to compile on a CPU
    threads: tuple[int, ...] = (1, 2)  # torch.set_num_threads for each pass
    batch: int | None = None  # examples per step; None: each family's default
    depth: int | None = None  # the CIFAR ResNet's depth (6n+2); None: the family's (20)
    image_size: int | None = None  # image side in pixels for the ResNets; None: each family's (32, 64)
    width: int | None = None  # each family's width (families.family_options); None: the family's own
    device: str = "cpu"  # cpu, cuda, cuda:N or auto (threads apply to the CPU)
    warmup: int = 1  # untimed calls per variant before timing (at least 1 when compiling)
    reps: int = 5  # timed repetitions per variant (interleaved)
    rep_seconds: float = 0.25  # each repetition repeats a call until about this long (same count for every variant)
    memory: bool = True  # also measure peak memory of one step
    forward: bool = True  # also time the forward pass (eval, no_grad); False: training steps only (half the compiles)
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
        if not self.forward and all(v in FORWARD_ONLY for v in self.variants if v != FLOOR):
            raise ValueError(f"forward=False times training steps only, and variants {self.variants} has nothing to "
                             "train but the floor; add fixup or norm, or keep the forward timing")
        if FLOOR not in self.variants:
            raise ValueError(f"variants must include the floor {FLOOR!r} (ratios are taken to it), got {self.variants}")
        if self.reps < 1 or self.warmup < 0 or (self.batch is not None and self.batch < 1) or self.rep_seconds < 0:
            raise ValueError(f"need reps >= 1, warmup >= 0, batch >= 1, rep_seconds >= 0; got reps={self.reps}, "
                             f"warmup={self.warmup}, batch={self.batch}, rep_seconds={self.rep_seconds}")
        if not self.threads or any(t < 1 for t in self.threads):
            raise ValueError(f"threads must be positive thread counts, got {self.threads}")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be >= 1 pixel, got {self.image_size}")
        if self.width is not None and self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if self.depth is not None:
            from ..models.resnet_cifar import check_cifar_depth

            check_cifar_depth(self.depth)
        check_device_name(self.device)


class _Runner:
    """One model with its optimiser and a fixed batch in one mode: ``step()`` trains once, ``forward()`` infers.

    Under autocast the parameters, their gradients and the optimiser state stay float32 (autocast casts
    each operation's inputs, not the parameters); the loss is computed inside the autocast region, as a
    training loop does.
    """

    def __init__(self, model: nn.Module, inputs: tuple[torch.Tensor, ...], target: torch.Tensor,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], mode: str,
                 device: torch.device) -> None:
        compile, self.dtype = mode_parts(mode)
        model = model.to(device)
        self.device = device
        self.model, self.loss = model, loss
        self.inputs, self.target = tuple(t.to(device) for t in inputs), target.to(device)
        self.run = torch.compile(model) if compile else model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.loss(self.run(*self.inputs), self.target)
        loss.backward()
        self.opt.step()

    def forward(self) -> None:
        self.model.eval()
        with torch.no_grad(), self._autocast():
            self.run(*self.inputs)


MAX_CALLS = 64  # calls per repetition at most (rep_seconds)


def _timed(runner: _Runner, method: str, calls: int) -> float:
    """Milliseconds per call of ``calls`` back-to-back calls."""
    _sync(runner.device)
    start = time.perf_counter()
    for _ in range(calls):
        getattr(runner, method)()
    _sync(runner.device)
    return (time.perf_counter() - start) * 1e3 / calls


def _interleaved(runners: dict[str, _Runner], method: str, reps: int, warmup: int,
                 rep_seconds: float = 0.0) -> dict[str, list[float]]:
    """Per runner, ``reps`` times of one call (ms), every runner once per repetition in a rotating order.

    A repetition repeats the call until it lasts about ``rep_seconds`` (at most :data:`MAX_CALLS` calls; the
    same count for every runner, from one untimed call of the fastest) and records the time per call: a
    forward pass of 20 ms timed once varies by +-30% with the machine's scheduling, ten in a row far less.
    """
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            getattr(runners[name], method)()
    calls = 1
    if rep_seconds > 0:
        fastest = min(_timed(runners[name], method, 1) for name in names) / 1e3
        calls = max(1, min(MAX_CALLS, math.ceil(rep_seconds / max(fastest, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each repetition
            times[name].append(_timed(runners[name], method, calls))
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _key(mode: str, variant: str) -> str:
    return f"{mode}/{variant}"


def _ratios(times: dict[str, list[float]], mode: str, to: str = FLOOR) -> dict[str, dict[str, float]]:
    """Per variant of ``mode``: the per-repetition ratios to ``to`` in the same mode, summarised, and the ratio
    of the fastest repetitions (``fastest``)."""
    floor = times[_key(mode, to)]
    out = {}
    for key, ts in times.items():
        m, variant = key.split("/", 1)
        if m == mode:
            out[variant] = {**_summary([t / f for t, f in zip(ts, floor)]), "fastest": min(ts) / min(floor)}
    return out


def _mode_ratio(times: dict[str, list[float]], mode: str, variant: str) -> dict[str, float] | None:
    """``variant``'s times in ``mode`` over its eager float32 times of the same repetitions (None without them)."""
    base = times.get(_key("eager", variant))
    if base is None or mode == "eager":
        return None
    ts = times[_key(mode, variant)]
    return {**_summary([t / b for t, b in zip(ts, base)]), "fastest": min(ts) / min(base)}


def _misses(row: dict[str, Any], norm_step: dict[str, float] | None) -> list[str]:
    out = []
    if row["variant"] == "fixup":
        if row.get("step_ratio") and row["step_ratio"]["median"] > STEP_TARGET:
            out.append("step")
        if norm_step and row.get("step_ratio") and row["step_ratio"]["median"] > norm_step["median"]:
            out.append("slower than norm")
        if row.get("peak_ratio") and row["peak_ratio"] > MEMORY_TARGET:
            out.append("memory")
    if row["variant"] == "fixup-folded" and row.get("forward_ratio") and row["forward_ratio"]["median"] > FOLD_TARGET:
        out.append("forward")
    return out


def _explain(row: dict[str, Any], runners: dict[str, _Runner]) -> str:
    """Profile the missing cell's variant against the bare network and name where the difference goes."""
    parts = []
    for miss in row["misses"]:
        method, what = {"step": ("step", "ms"), "slower than norm": ("step", "ms"), "memory": ("step", "bytes"),
                        "forward": ("forward", "ms")}[miss]
        if miss == "slower than norm" and "step" in row["misses"]:
            continue  # the same profile as the step's
        cand, floor = (op_profile(getattr(runners[_key(row["mode"], v)], method)) for v in (row["variant"], FLOOR))
        parts.append(f"{miss}: {explain(cand, floor, what)}")
    return " | ".join(parts)


def _measure_family(family: Family, config: BenchConfig, device: torch.device,
                    progress: Callable[[str], None]) -> list[dict]:
    """Every variant of ``family`` in every mode of ``config``, all interleaved in the same repetitions."""
    if config.image_size is not None and not family.text:
        family = dataclasses.replace(family, image=config.image_size)
    batch = config.batch or family.batch
    inputs, target = make_batch(family, batch, config.seed)
    compiling = any(mode_parts(m)[0] for m in config.modes)
    warmup = max(config.warmup, 1) if compiling else config.warmup
    if compiling:
        torch._dynamo.reset()  # this family's entries only, within the raised recompile limit
    variants = [v for v in config.variants if config.forward or v not in FORWARD_ONLY]
    runners = {_key(m, v): _Runner(build_variant(family, v, seed=config.seed, depth=config.depth,
                                                 width=config.width), inputs, target,
                                   loss_fn(family), m, device) for m in config.modes for v in variants}
    trainable = {k: r for k, r in runners.items() if k.split("/", 1)[1] not in FORWARD_ONLY}
    mem: dict[str, dict] = {}
    rows = []
    for threads in config.threads:
        torch.set_num_threads(threads)
        progress(f"{family.name} {'+'.join(config.modes)} {threads} thread(s): training steps")
        step = _interleaved(trainable, "step", config.reps, warmup, config.rep_seconds)
        fwd: dict[str, list[float]] = {}
        if config.forward:
            progress(f"{family.name} {'+'.join(config.modes)} {threads} thread(s): forward passes")
            fwd = _interleaved(runners, "forward", config.reps, warmup, config.rep_seconds)
        if config.memory and not mem:
            progress(f"{family.name}: peak memory")
            mem = {k: peak_step_memory(r.step, r.model, device) for k, r in trainable.items()}
        for mode in config.modes:
            step_ratio = _ratios(step, mode)
            fwd_ratio = _ratios(fwd, mode) if fwd else {}
            norm_step = step_ratio.get("norm")
            for v in variants:
                k = _key(mode, v)
                label = family.norm if v == "norm" else v
                row: dict[str, Any] = {"family": family.name, "mode": mode, "threads": threads, "variant": v,
                                       "label": label}
                if fwd:
                    row.update(forward_ms=_summary(fwd[k]), forward_ratio=fwd_ratio[v],
                               forward_examples_per_s=batch / (statistics.median(fwd[k]) / 1e3))
                if k in step:
                    row.update(step_ms=_summary(step[k]), step_ratio=step_ratio[v])
                    row["mode_ratio"] = _mode_ratio(step, mode, v)
                if k in mem:
                    row.update(peak_bytes=mem[k]["peak_bytes"],
                               peak_ratio=mem[k]["peak_bytes"] / mem[_key(mode, FLOOR)]["peak_bytes"])
                row["misses"] = _misses(row, norm_step)
                if row["misses"] and config.explain:
                    progress(f"{family.name} {mode} {threads} thread(s): profiling {v} ({', '.join(row['misses'])})")
                    row["reason"] = _explain(row, runners)
                rows.append(row)
    return rows


def _family_record(family: Family, config: BenchConfig) -> dict[str, Any]:
    """What a family's rows measured: its builder, options, batch and input size (numbers under names)."""
    options = family_options(family, depth=config.depth, width=config.width)
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
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            for name in config.families:
                rows.extend(_measure_family(FAMILIES[name], config, device, say))
    finally:
        torch.set_num_threads(old_threads)
    rows.sort(key=lambda r: (config.families.index(r["family"]), config.modes.index(r["mode"]),
                             config.threads.index(r["threads"])))
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
        "timing_method": "median and (min, max) over interleaved repetitions (every variant in every mode once "
                         "per repetition, rotating order; a repetition repeats the call until about rep_seconds, "
                         "the same count for every variant, and records the time per call) after warm-up; "
                         "ratio = median of per-repetition ratios "
                         "to the bare network in the same mode timed in the same repetition; fastest = ratio of "
                         "the fastest repetitions; mode_ratio = the same variant's eager float32 step as the base",
        "rows": rows,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``fixup bench`` and ``benchmarks/bench_models.py``)."""
    d = BenchConfig()
    p.add_argument("--families", nargs="+", default=list(d.families), choices=list(FAMILIES),
                   help="model families to measure (default: %(default)s)")
    p.add_argument("--variants", nargs="+", default=list(d.variants), choices=list(VARIANTS),
                   help="variants side by side; 'none' (the bare network) is the floor ratios refer to, 'norm' the "
                        "family's BatchNorm or LayerNorm (default: %(default)s)")
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=list(MODES),
                   help="execution modes, all interleaved in one run: eager, compile (torch.compile; minutes to "
                        "compile on a CPU), bf16 (bfloat16 autocast), compile-bf16 (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="add the compiled mode(s) to --modes (default: off)")
    p.add_argument("--bf16", action="store_true",
                   help="add bfloat16 autocast: bf16, and compile-bf16 with --compile (default: off)")
    p.add_argument("--threads", type=int, nargs="+", default=list(d.threads),
                   help="torch thread counts to measure, one pass each (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None,
                   help="examples per step (default: None, each family's: 64, 32, 64, 32)")
    p.add_argument("--depth", type=int, default=None,
                   help="the CIFAR ResNet's depth, 6n+2 (default: None, which is 20)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side in pixels for the ResNet families (default: None, each family's: 32 or 64)")
    p.add_argument("--width", type=int, default=None,
                   help="each family's width: first-stage channels (cifar 16, bottleneck 16; 64 is the standard "
                        "ResNet-50), the Wide-ResNet's widening factor (2), the Transformer's model dimension (128, "
                        "its feed-forward layer twice it; IWSLT's is 512) (default: None, each family's)")
    p.add_argument("--warmup", type=int, default=d.warmup,
                   help="untimed calls per variant before timing, at least 1 when compiling (default: %(default)s)")
    p.add_argument("--reps", type=int, default=d.reps, help="timed repetitions per variant, interleaved "
                                                            "(default: %(default)s)")
    p.add_argument("--rep-seconds", type=float, default=d.rep_seconds,
                   help="each repetition repeats a call until it lasts about this long, the same count for every "
                        f"variant, at most {MAX_CALLS} calls; 0: one call (default: %(default)s)")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto (default: %(default)s)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement (default: measure)")
    p.add_argument("--no-forward", action="store_true",
                   help="time training steps only, not forward passes (half the compiles) (default: both)")
    p.add_argument("--no-explain", action="store_true",
                   help="do not profile the cells that miss a target (default: profile them)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (default: plain text)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the weights and the batch (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to this file (default: none)")


def _modes(given: list[str], compile: bool, bf16: bool) -> tuple[str, ...]:
    """``--modes`` with what ``--compile`` and ``--bf16`` add, in :data:`MODES` order."""
    modes = set(given)
    if compile:
        modes |= {"eager", "compile"}
    if bf16:
        modes |= {"eager", "bf16"} | ({"compile-bf16"} if "compile" in modes else set())
    return tuple(m for m in MODES if m in modes)


def run_command(args: argparse.Namespace) -> int:
    import sys

    from .._io import check_output_file, write_json

    if args.json:
        check_output_file(args.json)
    modes = _modes(args.modes, args.compile, args.bf16)
    config = BenchConfig(families=tuple(args.families), variants=tuple(args.variants), modes=modes,
                         threads=tuple(args.threads), batch=args.batch, depth=args.depth, image_size=args.image_size,
                         width=args.width, device=args.device, warmup=args.warmup, reps=args.reps,
                         rep_seconds=args.rep_seconds, memory=not args.no_memory, forward=not args.no_forward,
                         explain=not args.no_explain,
                         seed=args.seed)
    result = benchmark(config, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_table(result, markdown=args.markdown))
    if len(modes) > 1:
        print("\nModes side by side (training step):")
        print(format_modes(result, markdown=args.markdown))
    if args.json:
        write_json(args.json, result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="training-step time, forward time and peak memory of every model family: "
                                     "Fixup vs its bare form vs BatchNorm/LayerNorm, eager, compiled and bf16")
    add_arguments(p)
    p.set_defaults(func=run_command)
