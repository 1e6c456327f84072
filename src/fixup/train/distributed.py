"""Multi-process training under ``torchrun``: process group, device choice, reductions.

Run the same command as ``torchrun --nproc_per_node N -m fixup train ...``: each process reads
RANK / WORLD_SIZE / LOCAL_RANK from the environment torchrun sets, joins a process group (gloo on
CPU, NCCL on GPU), wraps the model in ``DistributedDataParallel`` and takes its share of every batch.
Fixup has no batch statistics to synchronise; the BatchNorm baseline converts to
``SyncBatchNorm`` when asked.

For a model larger than one machine's memory, :func:`shard_model` applies FSDP2
(``torch.distributed.fsdp.fully_shard``) to every residual block and then to the whole model: each
process holds 1/N of every parameter, gradient and optimiser state, and a block's parameters are
gathered only while it runs. Fixup needs nothing more than that: its scalars are ordinary parameters
of their blocks, and a block's lean forward still runs (FSDP2 hooks the block, not its layers).
tests/test_distributed_scaling.py checks, with 2 CPU processes (gloo), that N steps under DDP and
under FSDP2 give the weights of one process with the full batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._devices import resolve_device
from .task import Shard

__all__ = ["Runtime", "all_reduce_sums", "any_rank", "setup", "shard_model", "teardown", "wrap_model"]


@dataclass
class Runtime:
    """Where this process runs: its shard, its device, and whether it created the process group."""

    shard: Shard
    device: torch.device
    owns_group: bool = False

    @property
    def distributed(self) -> bool:
        return self.shard.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.shard.rank == 0


def setup(device: str = "auto") -> Runtime:
    """Join torchrun's process group when WORLD_SIZE > 1 (or reuse one already set up)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if dist.is_available() and dist.is_initialized():
        return Runtime(Shard(dist.get_rank(), dist.get_world_size()), dev)
    if world <= 1:
        return Runtime(Shard(), dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Runtime(Shard(dist.get_rank(), dist.get_world_size()), dev, owns_group=True)


def teardown(runtime: Runtime) -> None:
    if runtime.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, runtime: Runtime, sync_bn: bool) -> nn.Module:
    """``DistributedDataParallel`` around ``model`` (with SyncBatchNorm when asked) or the model itself."""
    if not runtime.distributed:
        return model
    if sync_bn:
        if runtime.device.type != "cuda":
            raise ValueError("sync_bn=True needs CUDA devices (PyTorch's SyncBatchNorm runs on GPUs only); on CPU "
                             "drop --sync-bn and each process normalises with its own share of the batch")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def shard_model(model: nn.Module, runtime: Runtime, *, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 for ``model``: ``fully_shard`` each residual block (a module with ``residual_branches``), then the root.

    Parameters become DTensors sharded over the processes (dim 0); build the optimiser after this call, from
    ``model.parameters()`` or :func:`fixup.param_groups` (both see the sharded parameters). ``p.full_tensor()``
    gathers a parameter. Returns ``model`` (changed in place), or ``model`` untouched in a single process.
    ``reshard_after_forward=False`` keeps gathered parameters until backward (more memory, fewer collectives).
    """
    if not runtime.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(runtime.device.type, (runtime.shard.world_size,))
    blocks = [m for m in model.modules() if m is not model and callable(getattr(m, "residual_branches", None))]
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def all_reduce_sums(stats: dict[str, Tensor], runtime: Runtime) -> dict[str, float]:
    """Sum each statistic over all processes (one collective) and return plain floats."""
    keys = sorted(stats)
    if not keys:
        return {}
    flat = torch.stack([torch.as_tensor(stats[k], dtype=torch.float64, device=runtime.device).reshape(())
                        for k in keys])
    if runtime.distributed:
        dist.all_reduce(flat)
    return dict(zip(keys, flat.tolist()))


def any_rank(flag: bool, runtime: Runtime) -> bool:
    """True on every process when ``flag`` is true on any of them."""
    if not runtime.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=runtime.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)
