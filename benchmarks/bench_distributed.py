"""Scaling out on CPU: training throughput of ``torchrun --nproc-per-node N`` (gloo) against one process.

    python benchmarks/bench_distributed.py --depth 20 --batch 64 --steps 20 --procs 2

Runs the same training (CIFAR ResNet, Fixup, SGD, a fixed global batch of synthetic 32x32 images) as
one process with 1 thread, one process with N threads, and N processes of 1 thread each under torchrun
with DistributedDataParallel (gloo), each process taking 1/N of the global batch; ``--fsdp`` adds N
processes under FSDP2 (:func:`fixup.train.distributed.shard_model`). Each case runs in a fresh process;
the figure is global images per second over the timed steps (after ``--warmup`` untimed steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from fixup.models import create_model
    from fixup.train.distributed import setup, shard_model, teardown

    torch.set_num_threads(args.threads)
    runtime = setup("cpu")
    rank, world = runtime.shard.rank, runtime.shard.world_size
    model = create_model("resnet_cifar", depth=args.depth, generator=torch.Generator().manual_seed(0))
    if world > 1:
        model = shard_model(model, runtime) if args.fsdp else torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    share = args.batch // world
    x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if world > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"images_per_s": args.steps * share * world / elapsed, "step_s": elapsed / args.steps}))
    teardown(runtime)


def _run(cmd: list[str], threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(_SRC), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="global batch (split over the processes)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--fsdp", action="store_true", help="also run the processes under FSDP2")
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.batch % args.procs:
        p.error(f"--batch {args.batch} does not split evenly over --procs {args.procs}")
    common = [__file__, "--worker", "--depth", str(args.depth), "--batch", str(args.batch), "--steps",
              str(args.steps), "--warmup", str(args.warmup)]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.procs)]
    cases = {
        "1 process, 1 thread": ([sys.executable, *common, "--threads", "1"], 1),
        f"1 process, {args.procs} threads": ([sys.executable, *common, "--threads", str(args.procs)], args.procs),
        f"{args.procs} processes x 1 thread (DDP, gloo)": ([*launch, *common, "--threads", "1"], 1),
    }
    if args.fsdp:
        cases[f"{args.procs} processes x 1 thread (FSDP2, gloo)"] = ([*launch, *common, "--threads", "1", "--fsdp"], 1)
    results = {}
    for name, (cmd, threads) in cases.items():
        print(f"running: {name}", file=sys.stderr, flush=True)
        results[name] = _run(cmd, threads)
    base = results["1 process, 1 thread"]["images_per_s"]
    print(f"CIFAR ResNet-{args.depth}, global batch {args.batch}, {args.steps} timed steps, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'case':<42} {'images/s':>9} {'vs 1 process, 1 thread':>24}")
    for name, r in results.items():
        print(f"{name:<42} {r['images_per_s']:>9.1f} {r['images_per_s'] / base:>24.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
