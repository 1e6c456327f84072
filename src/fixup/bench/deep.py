"""Very deep CIFAR ResNets: construction time, step time and peak memory against depth.

Each case (depth, batch, checkpoint segments) runs in a fresh Python process, so that its peak
resident memory (``ru_maxrss``: everything the process held at its worst moment, model, gradients,
optimiser state, activations, allocator caches and the interpreter) is that case's alone; this is
the figure that says whether a training step *fits* in a given amount of memory. A case builds and
Fixup-initialises the model (timed), then runs ``steps`` training steps (forward, cross-entropy,
backward, SGD with momentum) on one random batch.

Depths must be 6n+2: 998, 2000, 5000 and 9998 (the 10,000-layer network of the paper's figure 1 is
not 6n+2; 9998 is the nearest, 4998 residual blocks of two convolutions plus the stem and the head).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["DeepCase", "auto_segments", "format_deep_table", "run_case", "run_case_in_subprocess", "sweep"]


@dataclass
class DeepCase:
    """One measurement: a CIFAR ResNet of ``depth`` trained for ``steps`` steps at ``batch``."""

    depth: int  # 6n+2
    batch: int = 8  # images per step
    segments: int = 0  # checkpoint segments over the whole network; 0 = no checkpointing
    steps: int = 2  # training steps; the first includes one-off allocation, later ones are reported
    image_size: int = 32
    lean: bool = True  # the lean Fixup path (fixup.perf.ops); False = the straightforward one
    threads: int = 1  # torch.set_num_threads in the child process
    seed: int = 0


def auto_segments(depth: int) -> int:
    """About the square root of the number of residual blocks, (depth - 2) / 2: the least memory."""
    return max(1, round(math.sqrt((depth - 2) / 2)))


def run_case(case: DeepCase) -> dict[str, Any]:
    """Run ``case`` in this process; returns its figures (peak RSS is this process's whole life)."""
    from ..models import create_model
    from ..perf.checkpointing import enable_checkpointing
    from ..perf.ops import set_lean

    torch.set_num_threads(case.threads)
    gen = torch.Generator().manual_seed(case.seed)
    start = time.perf_counter()
    model = create_model("resnet_cifar", depth=case.depth, norm="fixup", generator=gen)
    build_s = time.perf_counter() - start
    set_lean(model, case.lean)
    if case.segments:
        enable_checkpointing(model, case.segments)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(case.batch, 3, case.image_size, case.image_size, generator=gen)
    y = torch.randint(0, 10, (case.batch,), generator=gen)
    step_s, loss = [], float("nan")
    for _ in range(case.steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = F.cross_entropy(model(x), y)
        out.backward()
        opt.step()
        step_s.append(time.perf_counter() - t)
        loss = float(out)
    return {
        **asdict(case),
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_and_init_s": build_s,
        "step_s": step_s,
        "step_s_reported": min(step_s[1:]) if len(step_s) > 1 else step_s[0],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "loss": loss,
    }


def run_case_in_subprocess(case: DeepCase, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``case`` in a fresh interpreter importing this same package; errors are returned as data."""
    src = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(case.threads)}
    cmd = [sys.executable, "-m", "fixup.bench.deep", "--case", json.dumps(asdict(case))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {**asdict(case), "error": f"timed out after {timeout_s} s"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        reason = "killed (out of memory?)" if proc.returncode in (-9, 137) else tail[0]
        return {**asdict(case), "error": reason}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sweep(depths: list[int], batch: int = 8, segments: list[str] | None = None, steps: int = 2,
          timeout_s: float | None = None, progress: Any = None) -> dict[str, Any]:
    """Every depth with every segment setting (``"0"``: none, ``"auto"``: sqrt(blocks), or a number)."""
    from ..models.resnet_cifar import check_cifar_depth

    for depth in depths:
        check_cifar_depth(depth)
    rows = []
    for depth in depths:
        for seg in segments or ["0", "auto"]:
            n = auto_segments(depth) if seg == "auto" else int(seg)
            case = DeepCase(depth=depth, batch=batch, segments=n, steps=steps)
            if progress:
                progress(f"depth {depth}, segments {n or 'none'}")
            rows.append(run_case_in_subprocess(case, timeout_s))
    return {"torch": torch.__version__, "memory_method": "peak resident set size (ru_maxrss) of a fresh process "
            "per case: model, gradients, SGD momentum, activations, allocator caches and interpreter",
            "rows": rows}


def format_deep_table(result: dict[str, Any]) -> str:
    head = f"{'depth':>6} {'blocks':>6} {'segments':>8} {'params':>8} {'build s':>8} {'step s':>8} {'peak RSS GiB':>12}"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        blocks = (r["depth"] - 2) // 2
        seg = str(r["segments"] or "none")
        if "error" in r:
            lines.append(f"{r['depth']:>6} {blocks:>6} {seg:>8}   {r['error']}")
            continue
        lines.append(f"{r['depth']:>6} {blocks:>6} {seg:>8} {r['parameters'] / 1e6:>7.1f}M "
                     f"{r['build_and_init_s']:>8.1f} {r['step_s_reported']:>8.1f} {r['peak_rss_bytes'] / 2**30:>12.2f}")
    lines.append(f"batch {result['rows'][0]['batch'] if result['rows'] else '-'}; memory: {result['memory_method']}")
    return "\n".join(lines)


def _command(args: argparse.Namespace) -> int:
    from .._checks import check_numbers
    from .._io import write_json

    check_numbers(args, positive=("batch", "steps", "timeout"))
    for seg in args.segments:
        if seg != "auto" and not (seg.isdigit()):
            raise ValueError(f"--segments takes 0 (none), auto (sqrt of blocks) or a whole number of segments, "
                             f"got {seg!r}")

    result = sweep(args.depths, args.batch, args.segments, args.steps, args.timeout,
                   progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_deep_table(result))
    if args.json:
        write_json(args.json, result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-deep", help="very deep CIFAR ResNets: build time, step time and peak memory vs depth, "
                                          "with and without activation checkpointing")
    p.add_argument("--depths", type=int, nargs="+", default=[998, 2000, 5000, 9998],
                   help="CIFAR ResNet depths to measure (each 6n+2)")
    p.add_argument("--batch", type=int, default=8, help="images per training step")
    p.add_argument("--segments", nargs="+", default=["0", "auto"],
                   help="checkpoint segments per case: 0 (none), auto (sqrt of blocks) or a number")
    p.add_argument("--steps", type=int, default=2, help="training steps per case (the first is not reported)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per case (default None: no limit)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to this file")
    p.set_defaults(func=_command)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="run one DeepCase (internal: used by run_case_in_subprocess)")
    parser.add_argument("--case", required=True, help="DeepCase fields as JSON")
    print(json.dumps(run_case(DeepCase(**json.loads(parser.parse_args().case)))))
