"""The task protocol: what the one training engine needs from a kind of training (images, translation).

:func:`fixup.train.fit` owns everything generic: devices, processes, the optimiser and its parameter
groups, the schedule, precision, divergence detection, checkpoints, resume, logs and progress. A
*task* owns what is specific to a problem: the data, the model and the loss. A task is any object
with these methods (:class:`Task` spells them out; :class:`~fixup.train.image_task.ImageClassification`
is the reference implementation)::

    build_model(config) -> nn.Module
        Build (and initialise) the model, e.g. with ``fixup.create_model(config.model, norm=config.norm,
        init=config.init or None, ...)``. Called once per process after ``torch.manual_seed(config.seed)``;
        the engine moves it to the device and wraps it for multi-process training.

    steps_per_epoch(shard) -> int
        How many batches ``train_batches(epoch, shard)`` yields (the same on every rank).

    train_batches(epoch, shard) -> Iterable[batch]
        This process's training batches for one epoch, on the CPU (the engine moves tensors found in
        tuples, lists and dicts to the device). It must be a pure function of ``(config.seed, epoch,
        shard)``: draw all randomness (order, augmentation, Mixup) from generators seeded by those, never
        from the global RNG. The engine resumes a run mid-epoch by skipping the first batches, so this
        is what makes resumed runs bit-exact. ``shard.rank`` / ``shard.world_size`` say which part of
        the data this process takes (see :func:`shard_order`); each process's batch is
        ``config.batch_size // shard.world_size`` examples.

    loss(model, batch) -> (loss, stats)
        ``loss`` is the scalar to minimise (called in train mode, under autocast when asked). ``stats``
        is a dict of detached *sums* over the batch plus ``"n"``, the number of examples (or tokens)
        they are summed over, e.g. ``{"loss": loss.detach() * B, "acc": correct, "n": B}``. The engine
        adds them up over the epoch and the processes and reports ``train_<key> = sum / n``. Under
        ``config.dp`` (private training) batches are Poisson-sampled (:func:`poisson_batches`) and may be
        empty: then return a zero loss that depends on the parameters, without calling the model, and
        ``n`` 0; the engine takes the step on the noise alone.

    evaluate(model, shard) -> stats
        Sums over this process's part of the held-out set, the same way (``{"loss": ..., "acc": ...,
        "n": ...}``); the engine calls it in eval mode under ``torch.no_grad()``, reduces over the
        processes and reports ``test_<key> = sum / n``.

    first_batch() -> model input
        A training batch's model input (e.g. images), on the CPU, for data-dependent initialisation
        (``fixup.init.data_init_``, e.g. LSUV).

    describe() -> dict
        JSON-able facts for the run log (data set sizes, classes, normalisation, ...).

Optional: ``report(model) -> dict[str, float]`` for metrics that are not sums (BLEU, say), called on
rank 0 only, after ``evaluate``, in eval mode; its keys are logged as they are.

Tasks are created by name from ``config.task`` through :data:`TASKS` (``"name": "module:factory"``,
``factory(config) -> Task``), or passed to ``fit(config, task=...)`` directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["TASKS", "Shard", "Task", "create_task", "move_to", "poisson_batches", "seeded_generator", "shard_order"]

# Task kinds by name: "module:factory" with factory(config) -> Task; imported only when used.
TASKS: dict[str, str] = {
    "images": "fixup.train.image_task:ImageClassification",
    "translation": "fixup.translation.task:TranslationTask",
}


@dataclass(frozen=True)
class Shard:
    """Which process this is: ``rank`` among ``world_size`` processes (0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1


@runtime_checkable
class Task(Protocol):
    """The methods the engine calls; see the module docstring for the contract of each."""

    def build_model(self, config: TrainConfig) -> nn.Module: ...

    def steps_per_epoch(self, shard: Shard) -> int: ...

    def train_batches(self, epoch: int, shard: Shard) -> Iterable[Any]: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]: ...

    def evaluate(self, model: nn.Module, shard: Shard) -> dict[str, Tensor]: ...

    def first_batch(self) -> Any: ...

    def describe(self) -> dict[str, Any]: ...


def create_task(config: TrainConfig) -> Task:
    """The task named by ``config.task``, built from the config."""
    if config.task not in TASKS:
        raise ValueError(f"unknown task {config.task!r}; choose one of {', '.join(sorted(TASKS))}")
    module, _, attr = TASKS[config.task].partition(":")
    return getattr(importlib.import_module(module), attr)(config)


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from a tuple of integers (e.g. ``(seed, epoch, rank)``), well mixed."""
    import numpy as np

    state = np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def shard_order(n: int, epoch: int, seed: int, shard: Shard, *, shuffle: bool = True) -> list[int]:
    """This process's example order for an epoch, as ``torch.utils.data.DistributedSampler`` gives it.

    One permutation of ``range(n)`` per (seed, epoch), padded to a multiple of the process count, of
    which rank r takes every ``world_size``-th index starting at r. With a per-process batch of
    ``B / world_size``, step k of all processes together covers exactly the examples of step k of a
    single process with batch B, which is why the two runs agree.
    """
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=shard.world_size, rank=shard.rank, shuffle=shuffle,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def poisson_batches(n: int, steps: int, generator: torch.Generator) -> list[list[int]]:
    """``steps`` batches of ``range(n)`` by Poisson sampling, as Opacus's ``UniformWithReplacementSampler`` draws them.

    In each batch every example is included independently with probability ``1 / steps`` (so an epoch holds
    ``n`` examples on average; a batch may be empty). Private training needs this sampling: the privacy
    accounting of DP-SGD (the Sampled Gaussian Mechanism) assumes it. Pass a generator seeded by
    ``(seed, epoch, ...)`` so that an epoch's batches can be drawn again when a run resumes.
    """
    rate = 1.0 / steps
    return [(torch.rand(n, generator=generator) < rate).nonzero().reshape(-1).tolist() for _ in range(steps)]


def move_to(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor inside tuples, lists and dicts moved to ``device``."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_to(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
