"""Speed and memory of one architecture under Fixup, BatchNorm and no normalisation, side by side.

``benchmark(config)`` builds the CIFAR ResNet of each depth once per variant and measures, in one
process and interleaved (every repetition times each variant once, in a rotating order, so that load
from other processes falls on all variants alike):

- the training step: forward, cross-entropy, backward and an SGD step (momentum 0.9);
- forward-only throughput (``torch.no_grad``, eval mode), in images per second;
- peak memory of one training step (see :data:`MEMORY_METHOD` and :mod:`fixup.memory`).

Times are reported as the median and the spread (min, max) over repetitions, and every variant's
ratio to the floor (``norm="none"``: no normalisation and no scalars) is the median of the
per-repetition ratios, which is steadier than a ratio of medians on a busy machine.

Variants: ``none`` (the floor), ``fixup`` (the lean path of :mod:`fixup.ops`), ``fixup-plain``
(the straightforward implementation with a new tensor per scalar, for comparison), ``batchnorm``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._devices import check_device_name, resolve_device
from .memory import MEMORY_METHOD, peak_step_memory

__all__ = ["VARIANTS", "BenchConfig", "benchmark", "build_variant", "format_table", "register"]

# name -> (norm, lean path?)
VARIANTS: dict[str, tuple[str, bool]] = {
    "none": ("none", True),
    "fixup": ("fixup", True),
    "fixup-plain": ("fixup", False),
    "batchnorm": ("batchnorm", True),
    "none-plain": ("none", False),
}
FLOOR = "none"
# Input formats: CPU default fp32 only; on CUDA also bfloat16 autocast, with and without channels_last.
FORMATS = ("fp32", "bf16", "bf16-channels-last", "channels-last")


@dataclass
class BenchConfig:
    """What to benchmark. Times in milliseconds, memory in bytes in the results."""

    depths: tuple[int, ...] = (20, 56, 110)  # CIFAR ResNet depths 6n+2; 1202 is slow on a CPU
    variants: tuple[str, ...] = ("none", "fixup", "fixup-plain", "batchnorm")
    batch: int = 128  # images per step
    image_size: int = 32  # CIFAR: 32x32
    warmup: int = 2  # untimed steps per variant before timing
    reps: int = 5  # timed repetitions per variant (interleaved)
    device: str = "auto"  # "auto" picks cuda when available, else cpu
    formats: tuple[str, ...] | None = None  # None: ("fp32",) on CPU; fp32, bf16, bf16-channels-last on CUDA
    memory: bool = True  # also measure peak memory of one step
    compile: bool = False  # wrap each model in torch.compile (measures compiled code; slow to start)
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
        if FLOOR not in self.variants:
            raise ValueError(f"variants must include the floor {FLOOR!r} (ratios are taken to it), "
                             f"got {self.variants}")
        bad = [f for f in (self.formats or ()) if f not in FORMATS]
        if bad:
            raise ValueError(f"unknown format(s) {bad}; choose from {', '.join(FORMATS)}")
        if self.reps < 1 or self.warmup < 0 or self.batch < 1 or self.image_size < 1:
            raise ValueError(f"need reps >= 1, warmup >= 0, batch >= 1, image_size >= 1; got reps={self.reps}, "
                             f"warmup={self.warmup}, batch={self.batch}, image_size={self.image_size}")
        from .models.resnet_cifar import check_cifar_depth

        for depth in self.depths:
            check_cifar_depth(depth)
        check_device_name(self.device)


def build_variant(variant: str, depth: int, *, seed: int = 0) -> nn.Module:
    """The CIFAR ResNet of ``depth`` in one benchmark variant.

    Every variant starts from the same Fixup-initialised weights (seed ``seed``): a bare network with
    He initialisation overflows within a few steps at depth 56 (outputs ~1e37, then inf and NaN), and
    arithmetic on such values is not timed like arithmetic on ordinary ones. The cost of the
    architecture does not depend on the weights' values, so all variants compute on sane numbers.
    """
    from .models import create_model
    from .ops import set_lean

    norm, lean = VARIANTS[variant]
    gen = torch.Generator().manual_seed(seed)
    model = create_model("resnet_cifar", depth=depth, norm=norm, generator=gen)
    if norm != "fixup":
        reference = create_model("resnet_cifar", depth=depth, norm="fixup",
                                 generator=torch.Generator().manual_seed(seed))
        shared = {k: v for k, v in reference.state_dict().items() if k in model.state_dict()}
        model.load_state_dict(shared, strict=False)
    return set_lean(model, lean)


class _Runner:
    """One model with its optimiser and a fixed batch: ``step()`` trains once, ``forward()`` infers."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, fmt: str, compile: bool) -> None:
        if "channels-last" in fmt:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        self.model, self.x, self.y = model, x, y
        self.run = torch.compile(model) if compile else model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        self.autocast = fmt.startswith("bf16")
        self.device_type = x.device.type

    def _loss(self) -> torch.Tensor:
        with torch.autocast(self.device_type, torch.bfloat16, enabled=self.autocast):
            return F.cross_entropy(self.run(self.x), self.y)

    def step(self) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        self._loss().backward()
        self.opt.step()

    def forward(self) -> None:
        self.model.eval()
        with torch.no_grad(), torch.autocast(self.device_type, torch.bfloat16, enabled=self.autocast):
            self.run(self.x)


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _interleaved(runners: dict[str, _Runner], method: str, reps: int, warmup: int,
                 device: torch.device) -> dict[str, list[float]]:
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            getattr(runners[name], method)()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each repetition
            times[name].append(_timed(getattr(runners[name], method), device))
    return times


def _summary(ms: list[float]) -> dict[str, float]:
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def _ratios(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    floor = times[FLOOR]
    return {name: _summary([t / f for t, f in zip(ts, floor)]) for name, ts in times.items()}


def benchmark(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns a JSON-ready dict with the environment, config and one row per case."""
    device = resolve_device(config.device)
    cuda = device.type == "cuda"
    formats = config.formats or (("fp32", "bf16", "bf16-channels-last") if cuda else ("fp32",))
    rows = []
    for depth in config.depths:
        for fmt in formats:
            gen = torch.Generator().manual_seed(config.seed)
            x = torch.randn(config.batch, 3, config.image_size, config.image_size, generator=gen).to(device)
            y = torch.randint(0, 10, (config.batch,), generator=gen).to(device)
            runners = {v: _Runner(build_variant(v, depth, seed=config.seed).to(device), x, y, fmt,
                                  config.compile) for v in config.variants}
            if progress:
                progress(f"depth {depth} {fmt}: timing training steps")
            step = _interleaved(runners, "step", config.reps, config.warmup, device)
            if progress:
                progress(f"depth {depth} {fmt}: timing forward passes")
            fwd = _interleaved(runners, "forward", config.reps, config.warmup, device)
            step_ratio, fwd_ratio = _ratios(step), _ratios(fwd)
            mem = {}
            if config.memory:
                if progress:
                    progress(f"depth {depth} {fmt}: measuring memory")
                mem = {v: peak_step_memory(r.step, r.model, device) for v, r in runners.items()}
            for v in config.variants:
                row: dict[str, Any] = {
                    "depth": depth, "format": fmt, "variant": v,
                    "norm": VARIANTS[v][0], "lean": VARIANTS[v][1],
                    "step_ms": _summary(step[v]), "step_ratio": step_ratio[v],
                    "forward_ms": _summary(fwd[v]),
                    "forward_images_per_s": config.batch / (statistics.median(fwd[v]) / 1e3),
                    "forward_ratio": fwd_ratio[v],
                }
                if mem:
                    row["peak_bytes"] = mem[v]["peak_bytes"]
                    row["peak_ratio"] = mem[v]["peak_bytes"] / mem[FLOOR]["peak_bytes"]
                    row["memory"] = mem[v]
                rows.append(row)
            del runners
    return {
        "environment": {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
                        "python": platform.python_version(), "machine": platform.machine(),
                        "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor()},
        "config": asdict(config),
        "memory_method": MEMORY_METHOD[device.type] if config.memory else None,
        "timing_method": "median and (min, max) over interleaved repetitions after warm-up; "
                         "ratio = median of per-repetition ratios to the floor timed in the same repetition",
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    """The rows as a plain-text table with ratios to the floor."""
    head = (f"{'depth':>5} {'format':<8} {'variant':<12} {'step ms (min-max)':>22} {'step x (min-max)':>19} "
            f"{'fwd img/s':>10} {'fwd x':>6} {'peak MiB':>9} {'mem x':>6}")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        s, sr = r["step_ms"], r["step_ratio"]
        mem = f"{'-':>9} {'-':>6}"
        if "peak_bytes" in r:
            mem = f"{r['peak_bytes'] / 2**20:9.1f} {r['peak_ratio']:6.2f}"
        lines.append(f"{r['depth']:>5} {r['format']:<8} {r['variant']:<12} "
                     f"{s['median']:>8.1f} ({s['min']:.0f}-{s['max']:.0f}) "
                     f"{sr['median']:>6.3f} ({sr['min']:.2f}-{sr['max']:.2f}) {r['forward_images_per_s']:>10.0f} "
                     f"{r['forward_ratio']['median']:>6.3f} {mem}")
    env = result["environment"]
    lines.append(f"torch {env['torch']} on {env['device']} ({env['threads']} threads); "
                 f"x = ratio to norm=none. Memory: {result['memory_method']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``fixup bench`` and ``benchmarks/bench_models.py``)."""
    d = BenchConfig()
    p.add_argument("--depths", type=int, nargs="+", default=list(d.depths),
                   help="CIFAR ResNet depths to measure (each 6n+2)")
    p.add_argument("--variants", nargs="+", default=list(d.variants), choices=list(VARIANTS),
                   help="variants side by side; 'none' (no normalisation, no scalars) is the floor ratios refer to")
    p.add_argument("--batch", type=int, default=d.batch, help="images per training step")
    p.add_argument("--image-size", type=int, default=d.image_size, help="pixels per side of the random images")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed steps per variant before timing")
    p.add_argument("--reps", type=int, default=d.reps, help="timed repetitions per variant, interleaved")
    p.add_argument("--device", default=d.device, help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=None,
                   help="input formats to time (default None: fp32 on CPU; fp32, bf16, bf16-channels-last on CUDA)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--compile", action="store_true", help="time torch.compile'd models (slow to start)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads to use (default None: as torch chooses)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the weights and the random batch")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to this file")


def run_command(args: argparse.Namespace) -> int:
    import sys

    from ._io import write_json

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = BenchConfig(depths=tuple(args.depths), variants=tuple(args.variants), batch=args.batch,
                         image_size=args.image_size, warmup=args.warmup, reps=args.reps, device=args.device,
                         formats=tuple(args.formats) if args.formats else None, memory=not args.no_memory,
                         compile=args.compile, seed=args.seed)
    result = benchmark(config, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_table(result))
    if args.json:
        write_json(args.json, result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="training-step time, forward throughput and peak memory: "
                                     "fixup vs batchnorm vs no normalisation",
                       description="Time a training step and a forward pass and measure the peak memory of CIFAR "
                                   "ResNets under Fixup, BatchNorm and no normalisation, in one process, "
                                   "interleaved, with ratios to the floor (norm=none). See docs/performance.md.")
    add_arguments(p)
    p.set_defaults(func=run_command)
