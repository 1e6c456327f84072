"""Scaling out: two CPU processes (gloo) under DDP and under FSDP2 reach the weights of one process with the
full batch. The workers run both strategies in one spawn (importing torch twice costs ~5-10 s here)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from fixup.models import create_model

STEPS, BATCH, LR = 3, 8, 0.05


def _model() -> torch.nn.Module:
    model = create_model("resnet_cifar", depth=8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # off the initial values, so that every layer gets a gradient from the first step
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(2)
    return [(torch.randn(BATCH, 3, 8, 8, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
            for _ in range(STEPS)]


def _train(net: torch.nn.Module, params, batches, rank: int = 0, world: int = 1) -> None:
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    share = BATCH // world
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[rank * share:(rank + 1) * share]), y[rank * share:(rank + 1) * share]).backward()
        opt.step()


def _worker(rank: int, world: int, store: str, out: str) -> None:
    from fixup.train.distributed import Runtime, shard_model
    from fixup.train.task import Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        runtime = Runtime(Shard(rank, world), torch.device("cpu"))
        ddp_model = _model()
        ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
        _train(ddp, ddp_model.parameters(), _batches(), rank, world)
        sharded = shard_model(_model(), runtime)
        local = {n: p.to_local().numel() for n, p in sharded.named_parameters()}
        _train(sharded, sharded.parameters(), _batches(), rank, world)
        full = {n: p.full_tensor().detach() for n, p in sharded.named_parameters()}
        if rank == 0:
            torch.save({"ddp": {n: p.detach() for n, p in ddp_model.named_parameters()}, "fsdp": full,
                        "local": local}, out)
    finally:
        dist.destroy_process_group()


def test_two_processes_ddp_and_fsdp2_match_one_process_full_batch(tmp_path):
    out = tmp_path / "weights.pt"
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old
    got = torch.load(out, weights_only=True)
    reference = _model()
    _train(reference, reference.parameters(), _batches())
    before = dict(_model().named_parameters())
    for name, p in reference.named_parameters():
        moved = (p - before[name]).abs().max().item()
        for strategy in ("ddp", "fsdp"):
            torch.testing.assert_close(got[strategy][name], p.detach(), rtol=1e-4, atol=1e-6 + 1e-4 * moved,
                                       msg=lambda m, s=strategy, n=name: f"{s} {n}: {m}")
    # FSDP2 really shards: rank 0 holds about half of each large parameter
    conv = "layer3.0.conv2.weight"
    assert got["local"][conv] == pytest.approx(reference.get_parameter(conv).numel() / 2, rel=0.1)
