"""The task protocol: a task that is not image classification trains through the same engine."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixup.train import Shard, Task, TrainConfig, fit, lr_factor
from fixup.train.task import seeded_generator


class TokenTask:
    """A toy sequence task with dict batches, token-weighted sums and a non-additive report metric."""

    vocab, length, examples = 7, 5, 96

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        g = torch.Generator().manual_seed(123)
        self.src = torch.randint(0, self.vocab, (self.examples, self.length), generator=g)

    def build_model(self, config: TrainConfig) -> nn.Module:
        return nn.Sequential(nn.Embedding(self.vocab, 16), nn.Linear(16, self.vocab))

    def steps_per_epoch(self, shard: Shard) -> int:
        return self.examples // self.config.batch_size

    def train_batches(self, epoch: int, shard: Shard):
        order = torch.randperm(self.examples, generator=seeded_generator(self.config.seed, epoch))
        b = self.config.batch_size // shard.world_size
        for k in range(self.steps_per_epoch(shard)):
            idx = order[k * self.config.batch_size:(k + 1) * self.config.batch_size][shard.rank::shard.world_size]
            assert len(idx) == b
            yield {"src": self.src[idx], "tgt": (self.src[idx] + 1) % self.vocab}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = model(batch["src"]).flatten(0, 1)
        target = batch["tgt"].flatten()
        loss = F.cross_entropy(logits, target, label_smoothing=self.config.label_smoothing)
        n = torch.tensor(float(target.numel()))
        return loss, {"loss": loss.detach() * n, "acc": (logits.argmax(1) == target).sum().float(), "n": n}

    def evaluate(self, model: nn.Module, shard: Shard) -> dict[str, torch.Tensor]:
        logits = model(self.src).flatten(0, 1)
        target = ((self.src + 1) % self.vocab).flatten()
        return {"loss": F.cross_entropy(logits, target, reduction="sum"), "n": torch.tensor(float(target.numel()))}

    def report(self, model: nn.Module) -> dict[str, float]:
        return {"exact_match": float((model(self.src).argmax(-1) == (self.src + 1) % self.vocab).all(1).float().mean())}

    def first_batch(self) -> Any:
        return self.src[: self.config.batch_size]

    def describe(self) -> dict[str, Any]:
        return {"task": "toy tokens", "examples": self.examples}


def test_translation_style_config_on_a_custom_task(tmp_path) -> None:
    cfg = TrainConfig(task="toy", optimizer="adam", betas=(0.9, 0.98), lr=0.05, weight_decay=0.0,
                      schedule="inverse_sqrt", warmup_steps=4, label_smoothing=0.1, grad_clip=1.0,
                      batch_size=16, epochs=10, max_updates=20)
    task = TokenTask(cfg)
    assert isinstance(task, Task)
    result = fit(cfg, task=task, out_dir=tmp_path, progress=False)
    assert result.outcome == "completed" and result.outcome.step == 20
    assert [h["step"] for h in result.history] == [6, 12, 18, 20]  # max_updates ends the fourth epoch early
    last = result.history[-1]
    assert {"train_loss", "train_acc", "test_loss", "exact_match"} <= set(last)
    assert last["test_loss"] < result.history[0]["test_loss"]
    assert last["lr"] == pytest.approx(0.05 * lr_factor(19, 20, cfg))
    assert result.param_groups[0]["name"] == "weights" and len(result.param_groups) == 1
    assert result.task == {"task": "toy tokens", "examples": 96}
