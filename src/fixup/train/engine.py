"""The training engine: :func:`fit` runs one training for any task (images, translation).

One loop serves every task (see :mod:`fixup.train.task` for what a task supplies). Per optimiser step:
forward under autocast when asked, divergence check (a non-finite loss, or one above ``max_loss``,
ends the run as a recorded outcome), backward, gradient clipping (``clip="auto"``: the method's own recipe, e.g.
AGC for NF-ResNets; :mod:`fixup.train.recipe`), the optimiser, the
per-step schedule and the collapse watch (a network with no live unit for ``collapse_patience`` steps
ends as ``collapsed``; see :mod:`fixup.train.collapse`). Per epoch: metrics reduced over processes,
evaluation, the distribution of the method's scalars (:mod:`fixup.train.scalars`; also once at
initialisation, as epoch 0), the run folder and an atomic checkpoint. SIGINT/SIGTERM finish the current step, write a
checkpoint of the exact position and end the run as ``interrupted``; calling :func:`fit` again with the
same ``out_dir`` continues bit-exactly. Under ``config.dp`` the model, the optimiser and the batches are those of
private training (:mod:`fixup.train.private`): per-example clipping and noise replace the clipping above, and the
epsilon spent is in the progress line, each epoch's record, run.json, result.json and the checkpoint. With
``ema_decay`` a moving average of the weights (:mod:`fixup.train.ema`) is evaluated beside the live weights and
returned as the run's model.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._io import remove_stale_temporaries
from .._signals import SIGNALS, Interrupted
from ..clip import adaptive_clip_grad_, agc_rule
from . import distributed as D
from .checkpoint import (
    CheckpointError,
    CheckpointWarning,
    check_compatible,
    get_rng_state,
    resume_state,
    save_checkpoint,
    set_rng_state,
)
from .collapse import CollapseWatch
from .config import TrainConfig
from .ema import WeightAverage
from .optim import build_optimizer, build_scheduler
from .recipe import Recipe, apply_recipe
from .result import Outcome, TrainResult
from .runlog import RunLog
from .scalars import scalar_stats
from .task import Task, create_task, move_to

__all__ = ["StepInfo", "fit"]

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class StepInfo:
    """What ``on_step`` hooks see after each optimiser step."""

    epoch: int  # 0-based epoch
    batch: int  # batches of this epoch done
    step: int  # optimiser steps done in total
    loss: float  # this step's training loss (this process)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[list[str]]:
    """Turn SIGINT/SIGTERM into a request (the returned list gets the signal's name) while inside.

    The run stops cleanly after the current step; a second signal aborts at once (:class:`fixup._signals.
    Interrupted`, a KeyboardInterrupt). A signal ignored on entry (SIG_IGN, as in background jobs) stays ignored.
    """
    requested: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum: int, _frame: Any) -> None:
        if requested:
            raise Interrupted(signum, kept="a second signal: aborted without writing a checkpoint")
        requested.append(signal.Signals(signum).name)

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s, h in previous.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield requested
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _data_init(model: nn.Module, task: Task, config: TrainConfig, device: torch.device) -> None:
    """Data-dependent initialisation (LSUV) from the first training batch, where the method has one."""
    from ..init import data_init_

    data_init_(model, move_to(task.first_batch(), device))  # a no-op for methods without a data-dependent step


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def fit(config: TrainConfig, *, out_dir: str | Path | None = None, task: Task | None = None, progress: bool = True,
        on_step: Callable[[StepInfo], bool | None] | None = None) -> TrainResult:
    """Train as ``config`` says and return the history and the outcome.

    Args:
        config: what to train (validated here).
        out_dir: the run folder (config, metrics, checkpoint, result); ``None`` keeps everything in memory.
        task: the task; by default the one named by ``config.task`` (image classification).
        progress: draw a progress bar (main process only).
        on_step: called after every optimiser step; returning True stops the run like SIGINT does.

    The global RNGs (torch, numpy, random) are seeded from ``config.seed``. Divergence and
    interruption are outcomes in the result, not exceptions. A run folder holding a
    checkpoint is resumed (``config.resume``); one whose run already ended returns that result.
    """
    config, recipe = apply_recipe(config.validate())  # clip="auto" -> the method's clipping (recorded with why)
    runtime = D.setup(config.device)
    try:
        return _Run(config, out_dir, task, progress, on_step, runtime, recipe).run()
    finally:
        D.teardown(runtime)


class _Run:
    def __init__(self, config: TrainConfig, out_dir: str | Path | None, task: Task | None, progress: bool,
                 on_step: Callable[[StepInfo], bool | None] | None, runtime: D.Runtime, recipe: Recipe) -> None:
        self.config, self.runtime, self.on_step, self.recipe = config, runtime, on_step, recipe
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress and runtime.is_main
        _seed_everything(config.seed)
        self.task = task if task is not None else create_task(config)
        model = self.task.build_model(config)
        model.to(runtime.device)
        _data_init(model, self.task, config, runtime.device)
        if config.checkpoint_segments:  # keep activations of segment inputs only; recompute the rest in backward
            from ..perf.checkpointing import enable_checkpointing

            enable_checkpointing(model, config.checkpoint_segments)
        if config.dp and runtime.distributed:
            raise ValueError("dp=True is implemented for one process; run without torchrun (Opacus's distributed "
                             "Poisson sampling is not wired into the engine)")
        if runtime.distributed:  # the same model everywhere (DDP broadcasts it), independent dropout per process
            torch.manual_seed(config.seed + 1_000_003 * runtime.shard.rank)
        self.net = D.wrap_model(model, runtime, config.sync_bn)
        self.model = self.net.module if runtime.distributed else self.net
        self.optimizer, self.groups = build_optimizer(self.model, config)
        self.steps_per_epoch = self.task.steps_per_epoch(runtime.shard)
        if self.steps_per_epoch <= 0:
            raise ValueError(f"an epoch has no training batches (batch_size={config.batch_size}, "
                             f"drop_last={config.drop_last}); lower the batch size")
        self.total = config.epochs * self.steps_per_epoch
        if config.max_updates:
            self.total = min(self.total, config.max_updates)
        self.scheduler = build_scheduler(self.optimizer, self.total, config)
        self.private: Any = None  # fixup.train.private.PrivateTraining under dp
        if config.dp:  # Opacus wraps the model (per-example gradients) and the optimiser (clipping, noise)
            from .private import PrivateTraining

            self.private = PrivateTraining(self.model, self.optimizer, config, steps_per_epoch=self.steps_per_epoch,
                                           total_steps=self.total,
                                           train_examples=int(self.task.describe()["train_examples"]),
                                           example=self.task.first_batch(), device=runtime.device)
            self.net, self.optimizer = self.private.net, self.private.optimizer
        self.ema = WeightAverage(self.model, config.ema_decay) if config.ema_decay else None
        self.watch = CollapseWatch(self.model, config.collapse_patience)
        self.scaler = torch.amp.GradScaler(runtime.device.type, enabled=config.precision == "fp16")
        self.epoch, self.batch, self.step = 0, 0, 0
        self.stopped_by = ""  # the signal that stopped the run (SIGINT, SIGTERM), if one did
        self.partial: dict[str, Tensor] = {}
        self.history: list[dict[str, Any]] = []
        self.scalars: list[dict[str, Any]] = []  # per epoch (0: at initialisation) the scalars' distribution
        self.outcome: Outcome | None = None
        self.already_ended = False  # the run folder held a run that had already ended; nothing was trained
        self.ckpt = self.out_dir / CHECKPOINT if self.out_dir is not None and config.checkpoint else None
        if self.ckpt is not None and runtime.is_main:
            remove_stale_temporaries(self.out_dir)  # left by a process killed while writing
        if self.ckpt is not None and config.resume:
            found = resume_state(self.ckpt)
            if found is not None:
                state, path, note = found
                if note:
                    warnings.warn(note, CheckpointWarning, stacklevel=2)
                self._restore(state, path)
                self.already_ended = self.outcome is not None

    # -- checkpoints ------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "rng": get_rng_state(),
                "config": self.config.to_dict(),
                "position": {"epoch": self.epoch, "batch": self.batch, "step": self.step},
                "partial": {k: v.detach().cpu() for k, v in self.partial.items()}, "history": self.history,
                "scalars": self.scalars,
                "outcome": None if self.outcome is None else self.outcome.to_dict(),
                **({"privacy": self.private.state_dict()} if self.private is not None else {}),
                **({"ema": self.ema.state_dict()} if self.ema is not None else {})}

    def _save(self) -> bool:
        """Write the checkpoint (main process); a model with non-finite weights never replaces a good one."""
        if self.ckpt is None or not self.runtime.is_main:
            return False
        if not _finite(self.model):
            return False
        save_checkpoint(self.ckpt, self._state(), keep_previous=True)
        return True

    def _keep(self) -> None:
        """With ``keep_checkpoints`` N: this epoch's model weights as checkpoint_step{S}.pt; only the last N stay
        (fairseq keeps per-epoch checkpoints the same way, for checkpoint averaging)."""
        n = self.config.keep_checkpoints
        if not n or self.ckpt is None or not self.runtime.is_main or not _finite(self.model):
            return
        save_checkpoint(self.ckpt.with_name(f"checkpoint_step{self.step}.pt"),
                        {"model": self.model.state_dict(), "step": self.step, "epoch": self.epoch})
        kept = sorted(self.ckpt.parent.glob("checkpoint_step*.pt"),
                      key=lambda p: int(p.stem.removeprefix("checkpoint_step")))
        for old in kept[:-n]:
            old.unlink()

    def _restore(self, state: dict[str, Any], path: Path) -> None:
        """Continue from ``state`` (read from ``path`` on the CPU: RNG states must stay CPU tensors)."""
        if not isinstance(state["config"], dict):
            raise CheckpointError(f"checkpoint {path} has no readable config; use another --out-dir or --no-resume")
        check_compatible(state["config"], self.config.to_dict(), path)
        field = "model"  # the field being restored, for the error
        try:
            self.model.load_state_dict(state["model"])
            field = "optimizer"
            self.optimizer.load_state_dict(state["optimizer"])
            field = "scheduler"
            self.scheduler.load_state_dict(state["scheduler"])
            field = "scaler"
            self.scaler.load_state_dict(state["scaler"])
            field = "position"
            pos = state["position"]
            self.epoch, self.batch, self.step = int(pos["epoch"]), int(pos["batch"]), int(pos["step"])
            if min(self.epoch, self.batch, self.step) < 0 or self.step > self.total:
                raise ValueError(f"position {pos} lies outside this run of {self.total} steps")
            field = "partial"
            self.partial = {k: v.to(self.runtime.device) for k, v in state.get("partial", {}).items()}
            field = "history"
            self.history = list(state.get("history", []))
            field = "scalars"
            self.scalars = list(state.get("scalars", []))  # checkpoints written before the record have none
            field = "outcome"
            if state.get("outcome") and state["outcome"]["status"] != "interrupted":
                self.outcome = Outcome(**state["outcome"])
            field = "rng"
            set_rng_state(state["rng"])
            if self.private is not None:  # the accountant's history and the noise generator
                field = "privacy"
                self.private.load_state_dict(state["privacy"])
            if self.ema is not None:
                field = "ema"
                self.ema.load_state_dict(state["ema"])
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError, AssertionError) as err:
            # two lines: load_state_dict's first only says "Error(s) in loading state_dict"; the second names the tensor
            first = " ".join(line.strip() for line in str(err).strip().splitlines()[:2])[:200]
            raise CheckpointError(f"checkpoint {path} does not fit this model/optimiser or has an edited '{field}' "
                                  f"field ({type(err).__name__}: {first}); use another --out-dir or --no-resume"
                                  ) from err

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        log = RunLog(self.out_dir, enabled=self.runtime.is_main, tensorboard=self.config.tensorboard)
        run_info = {"task": self.task.describe(), "param_groups": self.groups,
                    "world_size": self.runtime.shard.world_size,
                    "device": str(self.runtime.device), "steps_per_epoch": self.steps_per_epoch,
                    "total_steps": self.total, "parameters": sum(p.numel() for p in self.model.parameters()),
                    "recipe": self.recipe.to_dict()}
        if self.private is not None:
            run_info["privacy"] = self.private.describe()
        report = getattr(self.model, "init_report", None)
        if report is not None:
            run_info["init_report"] = report.to_dict()
        log.write_setup(self.config.to_dict(), run_info)
        try:
            if self.outcome is None:
                with _stop_on_signals() as signals:
                    self._train(log, signals)
            assert self.outcome is not None
            if self.ema is not None:  # the run delivers the weights it evaluated (the checkpoint keeps both)
                self.ema.copy_to_model()
            result = TrainResult(self.history, self.outcome, self.config.to_dict(), self.groups, self.task.describe(),
                                 None if self.out_dir is None else str(self.out_dir), self.model,
                                 already_ended=self.already_ended, stopped_by=self.stopped_by,
                                 scalars=self.scalars, recipe=self.recipe.to_dict(),
                                 privacy=self.private.summary() if self.private is not None else {})
            log.write_history(self.history)
            log.write_scalars(self.scalars)
            log.write_result(result.to_dict())
            return result
        finally:
            self.watch.close()
            log.close()

    def _train(self, log: RunLog, signals: list[str]) -> None:
        from tqdm.auto import tqdm

        cfg, rt = self.config, self.runtime
        n_epochs = math.ceil(self.total / self.steps_per_epoch)
        bar = tqdm(total=self.total, initial=self.step, disable=not self.progress, unit="step", dynamic_ncols=True)
        autocast = torch.autocast(rt.device.type, dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float16,
                                  enabled=cfg.precision != "fp32")
        every = max(1, self.steps_per_epoch // 20)
        if self.step == 0 and not self.scalars:  # epoch 0: the scalars as initialised (a resumed run has them)
            self._record_scalars()
        try:
            while self.epoch < n_epochs and self.outcome is None:
                bar.set_description(f"epoch {self.epoch + 1}/{n_epochs}")
                started = time.perf_counter()
                self.net.train()
                for i, batch in enumerate(self.task.train_batches(self.epoch, rt.shard)):
                    if i < self.batch:
                        continue  # resuming mid-epoch: these batches were trained on before the interruption
                    if self.step >= self.total:
                        break
                    loss, stats, value = self._forward(move_to(batch, rt.device), autocast)
                    reason = self._divergence(value)
                    if D.any_rank(bool(reason), rt):
                        self.outcome = Outcome("diverged", self.epoch, self.step,
                                               reason or "the training loss diverged on another process")
                        break
                    self._update(loss, empty=self.private is not None and float(stats["n"]) == 0)
                    for k, v in stats.items():
                        self.partial[k] = self.partial.get(k, 0) + v.detach()
                    self.batch, self.step = i + 1, self.step + 1
                    bar.update(1)
                    dead = self.watch.check(self.step)
                    if D.any_rank(bool(dead), rt):
                        self.outcome = Outcome("collapsed", self.epoch, self.step,
                                               dead or "the network collapsed on another process")
                        break
                    if self.step % every == 0:
                        bar.set_postfix(self._running(), refresh=False)
                    info = StepInfo(self.epoch, self.batch, self.step, value)
                    hook = bool(self.on_step(info)) if self.on_step else False
                    if D.any_rank(hook or bool(signals), rt):
                        self.stopped_by = signals[0] if signals else ""
                        self.outcome = Outcome("interrupted", self.epoch, self.step,
                                               f"stopped by {signals[0] if signals else 'request'} at epoch "
                                               f"{self.epoch}, batch {self.batch}")
                        break
                if self.outcome is not None:
                    self._save()
                    break
                self._end_epoch(log, started, n_epochs)
                bar.set_postfix({k: f"{v:.4g}" for k, v in self.history[-1].items()
                                 if k.startswith(("test_", "lr", "epsilon"))})
        finally:
            bar.close()

    def _forward(self, batch: Any, autocast: Any) -> tuple[Tensor, dict[str, Tensor], float]:
        """The loss of ``batch`` for :meth:`_update` to step on, its stats, and its mean as a float.

        Under dp with ``dp_physical_batch``, a larger Poisson batch is cut into physical batches
        (:meth:`~fixup.train.private.PrivateTraining.physical_batches`): each but the last is run forward and
        backward here and its clipped per-example gradients summed by the DP optimiser (a step that updates nothing);
        the last one's loss is returned, so :meth:`_update`'s step adds the noise once for the whole batch. The stats
        and the mean cover every chunk; a non-finite chunk makes the mean non-finite, and the run stops before the
        update. (The collapse watch sees the last chunk's classifier input.)
        """
        pieces = self.private.physical_batches(batch) if self.private is not None else [batch]
        totals: dict[str, Tensor] = {}
        weighted = 0.0
        for k, piece in enumerate(pieces):
            with autocast:
                loss, stats = self.task.loss(self.net, piece)
            for key, v in stats.items():
                totals[key] = totals.get(key, 0) + v
            if len(pieces) == 1:
                return loss, stats, float(loss.detach().float())
            weighted += float(loss.detach().float()) * float(stats["n"])
            if k < len(pieces) - 1:
                self.optimizer.zero_grad(set_to_none=True)  # after a skipped step: keeps the running clipped sum
                loss.backward()
                self.optimizer.step()  # clips this chunk's per-example gradients and adds them to the sum
        return loss, totals, weighted / float(totals["n"])

    def _divergence(self, value: float) -> str:
        where = f"at step {self.step} (epoch {self.epoch}, batch {self.batch})"
        if not math.isfinite(value):
            return f"training loss is {value} {where}"
        if self.config.max_loss and value > self.config.max_loss:
            return f"training loss {value:.4g} exceeds max_loss={self.config.max_loss:g} {where}"
        return ""

    def _update(self, loss: Tensor, empty: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if empty:  # dp: a Poisson batch with no example: no per-example gradient, only the noise
            self.private.empty_batch()
        cfg = self.config
        if cfg.clip == "agc":  # by the method's rule: an NF-ResNet's classifier unclipped (the authors'), a Fixup
            # model's zero-started tensors by the global norm (grad_clip; 0 leaves them unclipped)
            self.scaler.unscale_(self.optimizer)
            exempt_norm = cfg.grad_clip if agc_rule(self.model) == "zero_started" else None
            adaptive_clip_grad_(self.model, cfg.agc_clipping, exempt_max_norm=exempt_norm)
        elif cfg.clip == "norm" and cfg.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update()

    def _running(self) -> dict[str, str]:
        n = float(self.partial.get("n", 1.0))
        shown = {k: f"{float(v) / n:.4g}" for k, v in self.partial.items() if k != "n"}
        shown["lr"] = f"{self.optimizer.param_groups[0]['lr']:.3g}"
        if self.private is not None:
            shown["epsilon"] = f"{self.private.progress_epsilon(self.steps_per_epoch // 4):.3g}"
        return shown

    def _end_epoch(self, log: RunLog, started: float, n_epochs: int) -> None:
        rt = self.runtime
        train = D.all_reduce_sums(self.partial, rt)
        n = train.pop("n", 0.0) or 1.0
        record: dict[str, Any] = {"epoch": self.epoch + 1, "step": self.step,
                                  "lr": getattr(self, "last_lr", self.optimizer.param_groups[0]["lr"])}
        record.update({f"train_{k}": v / n for k, v in train.items()})
        last = self.epoch + 1 == n_epochs or self.step >= self.total
        if (self.epoch + 1) % self.config.eval_every == 0 or last:
            record.update(self._evaluate())
        record.update(self.watch.record())
        if self.private is not None:  # the budget spent by the end of this epoch, at config.delta
            record["epsilon"] = self.private.epsilon()
        if self.scaler.is_enabled():  # fp16: the gradient scaler's loss scale, halved at each skipped step
            record["loss_scale"] = float(self.scaler.get_scale())
        record["time_s"] = time.perf_counter() - started
        self.history.append(record)
        self.epoch, self.batch, self.partial = self.epoch + 1, 0, {}
        self._record_scalars()
        if last:
            self.outcome = Outcome("completed", self.epoch - 1, self.step)
        log.write_history(self.history)
        log.write_scalars(self.scalars)
        self._keep()
        self._save()

    def _record_scalars(self) -> None:
        """The scalars' distribution now, as the record of ``self.epoch`` (epochs finished; 0 before training)."""
        self.scalars.append({"epoch": self.epoch, "step": self.step, "scalars": scalar_stats(self.model)})

    def _evaluate(self) -> dict[str, float]:
        """The test metrics (``test_*``); with ``ema_decay`` those of the averaged weights, and ``live_test_*`` of
        the live ones."""
        if self.ema is None:
            return self._evaluate_model("test_")
        live = self._evaluate_model("live_test_")
        with self.ema.applied():
            return {**self._evaluate_model("test_"), **live}

    def _evaluate_model(self, prefix: str) -> dict[str, float]:
        rt, cfg = self.runtime, self.config
        self.model.eval()
        autocast = torch.autocast(rt.device.type, dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float16,
                                  enabled=cfg.precision != "fp32")
        with torch.no_grad(), autocast:
            sums = D.all_reduce_sums(self.task.evaluate(self.model, rt.shard), rt)
            extra = self.task.report(self.model) if rt.is_main and hasattr(self.task, "report") else {}
        self.net.train()
        n = sums.pop("n", 0.0) or 1.0
        extra = {k if prefix == "test_" else f"live_{k}": v for k, v in extra.items()}
        return {**{f"{prefix}{k}": v / n for k, v in sums.items()}, **extra}
