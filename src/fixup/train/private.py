"""Private training in the engine: DP-SGD (Abadi et al. 2016) through Opacus, used by :func:`fixup.train.fit` when
``config.dp`` is set. Opacus is imported here only, and only then: the engine imports without it.

Before training, :func:`prepare_model` makes the model ready for Opacus's hooks (:mod:`fixup.private`). What a
private run does, per optimiser step (the Sampled Gaussian Mechanism, as Opacus's ``make_private`` sets it
up): the task draws the batch by Poisson sampling (each training example independently with probability
``q = 1 / steps_per_epoch``, :func:`fixup.train.task.poisson_batches`), Opacus's ``GradSampleModule`` computes
each example's gradient, :class:`opacus.optimizers.DPOptimizer` clips each to ``max_grad_norm``, sums them, adds
Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` and divides by the expected batch size
``int(N * q)``; then the wrapped optimiser (with fixup's parameter groups, each at its own rate) steps, and the
accountant records ``(noise_multiplier, q)``. With ``target_epsilon`` the noise multiplier is solved so that the
run's ``total_steps`` spend exactly that budget (Opacus's ``get_noise_multiplier``).

Physical batches (``config.dp_physical_batch`` N): a Poisson batch of more than N examples is processed in chunks of
at most N, cut as Opacus's ``BatchMemoryManager`` cuts them (its ``BatchSplittingSampler``: near-equal chunks), which
also tells the DP optimiser that each chunk but the last is a skipped step: its per-example gradients are clipped and
added to the running sum, and only the last chunk's step draws the noise, divides by the expected batch, updates the
weights and is recorded by the accountant. So the step is that of the whole batch (up to float rounding of the sum)
while per-example gradients are held for N examples at a time. (``BatchMemoryManager`` itself wraps a DataLoader; the
engine's batches come from the task, so the engine drives its sampler directly: :meth:`PrivateTraining.
physical_batches`.)

Resume: the accountant's history and the noise generator's state go into the checkpoint (:meth:`PrivateTraining.
state_dict`), so a resumed run spends the same epsilon and draws the same noise as an uninterrupted one. The noise
comes from a ``torch.Generator`` seeded from ``config.seed``: reproducible, not cryptographically secure (Opacus's
``secure_mode``, which needs torchcsprng, is for a released model).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from .config import TrainConfig
from .task import seeded_generator

__all__ = ["OPACUS_MISSING", "PrivateTraining", "prepare_model", "require_opacus"]

OPACUS_MISSING = ("dp=True needs Opacus, which is not installed: pip install 'fixup-lab[dp]' "
                  "(or pip install 'opacus>=1.5')")
_NOISE_KEY = 0x6E6F6973  # mixes the noise generator's seed away from the data's generators ("nois")


def require_opacus() -> Any:
    """The ``opacus`` module, or a ValueError naming the extra to install."""
    try:
        return importlib.import_module("opacus")
    except ImportError as err:
        raise ValueError(OPACUS_MISSING) from err


def prepare_model(model: nn.Module, example: torch.Tensor) -> dict[str, Any]:
    """Make ``model`` ready for Opacus in place, by :mod:`fixup.private`: the one place the engine does this.

    Registers the grad samplers of fixup's scalars (Bias, Scale, Gate), then :func:`fixup.private.prepare` calls
    shared modules once, moves ``fixup.adapt``'s hook scalars into wrappers and, from one forward pass of
    ``example``, wraps every module whose output the code after it changes in place. Returns its report
    (run.json); what it cannot mend is a ValueError naming it.
    """
    from ..private import prepare, register_grad_samplers

    register_grad_samplers()
    report = prepare(model, example)
    if not report.ready:
        raise ValueError("this model cannot train privately: " + "; ".join(report.problems))
    return report.to_dict()


def _examples(batch: Any) -> int:
    """The number of examples of a batch: the length of its first tensor (in a tuple, list or dict)."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    items = batch.values() if isinstance(batch, dict) else batch
    return next(_examples(b) for b in items if isinstance(b, (torch.Tensor, tuple, list, dict)))


def _split_batch(batch: Any, part: slice) -> Any:
    """``batch`` with each tensor (in tuples, lists and dicts; anything else, e.g. None, kept) cut to ``part`` along
    its first dimension, the examples."""
    if isinstance(batch, torch.Tensor):
        return batch[part]
    if isinstance(batch, dict):
        return {k: _split_batch(v, part) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_split_batch(b, part) for b in batch)
    return batch


def _check_model(model: nn.Module) -> None:
    """Refuse modules that Opacus's validator says break per-example gradients (BatchNorm left in a model, ...)."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        shown = "; ".join(str(e).strip().splitlines()[0] for e in errors[:3])
        why = (" BatchNorm mixes the examples of a batch, so per-example gradients are undefined: build the model "
               "without it (--norm fixup, --init skipinit, --init rezero, --norm groupnorm)"
               if "BatchNorm" in shown else "")
        raise ValueError(f"this model cannot train privately (Opacus's validator: {len(errors)} problem(s): "
                         f"{shown}).{why}")


class PrivateTraining:
    """The private parts of one run: the wrapped model, the DP optimiser, the accountant and the noise generator.

    Args:
        model: the (unwrapped) model; it is wrapped by Opacus's ``GradSampleModule`` (``net``).
        optimizer: the optimiser over fixup's parameter groups; wrapped by ``DPOptimizer`` (``optimizer``), which
            keeps its groups and their rates.
        config: the validated config (dp, target_epsilon or noise_multiplier, delta, max_grad_norm, accountant).
        steps_per_epoch: the task's batches per epoch; the sampling rate is its inverse.
        total_steps: the optimiser steps of the whole run (the budget is spread over them).
        train_examples: N, the training set's size.
        example: a training batch's input; only its shape is used (:func:`prepare_model` runs noise of it).
        device: where the model lives (the noise generator is made there).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, *,
                 steps_per_epoch: int, total_steps: int, train_examples: int, example: torch.Tensor,
                 device: torch.device) -> None:
        require_opacus()
        from opacus import GradSampleModule
        from opacus.accountants import create_accountant
        from opacus.accountants.utils import get_noise_multiplier
        from opacus.optimizers import DPOptimizer

        _check_model(model)
        # fixup.private runs one forward pass to find in-place changes: on noise of a batch's shape, not on data
        shape = (min(2, example.shape[0]), *example.shape[1:])
        noise = torch.randn(shape, generator=seeded_generator(config.seed, _NOISE_KEY, 1)).to(device)
        self.prepared = prepare_model(model, noise)
        self.config = config
        self.sample_rate = 1.0 / steps_per_epoch
        self.expected_batch_size = int(train_examples * self.sample_rate)  # as Opacus's make_private computes it
        if self.expected_batch_size < 1:
            raise ValueError(f"the expected private batch ({train_examples} examples / {steps_per_epoch} steps) is "
                             "below one example; raise batch_size")
        self.total_steps = total_steps
        self.accountant = create_accountant(mechanism=config.accountant)
        if config.target_epsilon > 0:
            self.noise_multiplier = float(get_noise_multiplier(
                target_epsilon=config.target_epsilon, target_delta=config.delta, sample_rate=self.sample_rate,
                steps=total_steps, accountant=config.accountant))
        else:
            self.noise_multiplier = config.noise_multiplier
        seed = seeded_generator(config.seed, _NOISE_KEY).initial_seed()
        self.generator = torch.Generator(device=device).manual_seed(seed)
        # a model handed over in eval mode (an --adapt factory's, a converted one) trains in train mode, as Opacus needs
        self.net = GradSampleModule(model.train(), batch_first=True, loss_reduction="mean")
        self.optimizer = DPOptimizer(optimizer, noise_multiplier=self.noise_multiplier,
                                     max_grad_norm=config.max_grad_norm,
                                     expected_batch_size=self.expected_batch_size, loss_reduction="mean",
                                     generator=self.generator)
        self.optimizer.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate=self.sample_rate))
        self._rdp_steps: dict[tuple[float, float], Any] = {}
        self._cached: tuple[tuple[tuple[Any, ...], ...], float] = ((), 0.0)  # (history, epsilon) last computed

    def empty_batch(self) -> None:
        """Give each parameter an empty set of per-example gradients, for a Poisson batch that drew no example (the
        task skips the forward): the optimiser then steps on the noise alone, and the accountant counts the step,
        as Opacus does for the empty batches of its own data loader."""
        for p in self.optimizer.params:
            p.grad_sample = p.new_zeros((0, *p.shape))

    def physical_batches(self, batch: Any) -> list[Any]:
        """One logical (Poisson) batch as the physical batches to run forward and backward, in order: ``[batch]``
        when ``dp_physical_batch`` is 0 or the batch fits, else near-equal chunks of at most that many examples. The
        DP optimiser is told (through Opacus's ``BatchSplittingSampler``, as ``BatchMemoryManager`` tells it) that
        the step after each chunk but the last only clips and sums: call ``optimizer.step()`` once after each chunk's
        backward; the last one adds the noise and updates."""
        limit, n = self.config.dp_physical_batch, _examples(batch)
        if not limit or n <= limit:
            return [batch]
        from opacus.utils.batch_memory_manager import BatchSplittingSampler

        chunks = BatchSplittingSampler(sampler=[list(range(n))], max_batch_size=limit, optimizer=self.optimizer)
        return [_split_batch(batch, slice(idx[0], idx[-1] + 1)) for idx in chunks]  # each chunk is a contiguous range

    @property
    def steps(self) -> int:
        """The noisy steps the accountant has recorded."""
        return sum(int(n) for _, _, n in self.accountant.history)

    def epsilon(self) -> float:
        """The epsilon spent so far at ``config.delta`` (0 before the first step), as the accountant computes it.

        RDP composes by addition, so the RDP of a step at each order is computed once per (noise, rate) and
        multiplied by the steps, as Opacus's ``compute_rdp`` does: the same numbers as ``RDPAccountant.get_epsilon``,
        without its 0.65 s per call (measured on one CPU thread; 151 orders, most fractional).
        """
        history = self.accountant.history
        if not history:
            return 0.0
        key = tuple(tuple(h) for h in history)
        if key == self._cached[0]:
            return self._cached[1]
        if self.config.accountant == "rdp":
            from opacus.accountants.analysis import rdp as analysis

            orders = self.accountant.DEFAULT_ALPHAS
            rdp = sum([self._rdp_step(float(s), float(q), orders) * int(n) for s, q, n in history])
            eps = float(analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=self.config.delta)[0])
        else:
            eps = float(self.accountant.get_epsilon(delta=self.config.delta))
        self._cached = (key, eps)
        return eps

    def progress_epsilon(self, every: int) -> float:
        """:meth:`epsilon` for the progress line: the PRV accountant's (0.1-0.5 s a call) at most every ``every``
        steps, the last value in between; RDP's always."""
        if self.config.accountant == "prv" and self._cached[0] and self.steps - sum(
                int(n) for _, _, n in self._cached[0]) < every:
            return self._cached[1]
        return self.epsilon()

    def _rdp_step(self, sigma: float, q: float, orders: list[float]) -> Any:
        """The RDP of one step of the Sampled Gaussian Mechanism at each order (cached)."""
        from opacus.accountants.analysis import rdp as analysis

        if (sigma, q) not in self._rdp_steps:
            self._rdp_steps[(sigma, q)] = analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
        return self._rdp_steps[(sigma, q)]

    def describe(self) -> dict[str, Any]:
        """The mechanism's settings (run.json): what was solved or given, and how batches are drawn."""
        cfg = self.config
        return {"mechanism": "DP-SGD (Opacus): Poisson sampling, per-example clipping, Gaussian noise",
                "accountant": cfg.accountant, "target_epsilon": cfg.target_epsilon or None, "delta": cfg.delta,
                "noise_multiplier": self.noise_multiplier,
                "noise_from": "target_epsilon" if cfg.target_epsilon > 0 else "noise_multiplier",
                "max_grad_norm": cfg.max_grad_norm, "physical_batch": cfg.dp_physical_batch or None,
                "sample_rate": self.sample_rate,
                "expected_batch_size": self.expected_batch_size, "total_steps": self.total_steps,
                "secure_rng": False, "prepared": self.prepared}

    def summary(self) -> dict[str, Any]:
        """The settings with what was spent: ``epsilon`` at ``delta`` after ``steps`` noisy steps (result.json)."""
        return {**self.describe(), "epsilon": self.epsilon(), "steps": self.steps}

    def state_dict(self) -> dict[str, Any]:
        """The accountant's history and the noise generator's state: what a resumed run needs to continue exactly."""
        return {"accountant": {"mechanism": self.accountant.mechanism(),
                               "history": [list(h) for h in self.accountant.history]},
                "noise_rng": self.generator.get_state(), "noise_multiplier": self.noise_multiplier}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a mismatched mechanism or noise is a ValueError)."""
        acc = state["accountant"]
        if acc["mechanism"] != self.accountant.mechanism():
            raise ValueError(f"accountant {acc['mechanism']!r} in the checkpoint, {self.accountant.mechanism()!r} now")
        if float(state["noise_multiplier"]) != self.noise_multiplier:
            raise ValueError(f"noise multiplier {state['noise_multiplier']} in the checkpoint, "
                             f"{self.noise_multiplier} now")
        self.accountant.history = [(float(s), float(q), int(n)) for s, q, n in acc["history"]]
        self.generator.set_state(state["noise_rng"])
