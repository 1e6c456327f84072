"""Image classification as a training task: the engine's default (see :mod:`fixup.train.task`).

Batches are ``(images, labels, soft_targets_or_None)``: images normalised ``(B, C, H, W)``, labels
``(B,)`` (under Mixup, the label with the larger weight), and soft targets ``(B, K)`` when Mixup or
label smoothing is on. Augmentation runs on whole batches with a generator seeded by
``(seed, epoch, rank)``, so an epoch's stream is reproducible and resumable at any step. Under ``dp``
(private training, :mod:`fixup.train.private`) the batches are Poisson-sampled from a generator seeded the same way,
and may be empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..data import ImageData, TensorImages, load_images, normalize, random_crop, random_flip
from .config import TrainConfig
from .recipe import config_method
from .regularisers import cutout, mixup, soft_targets
from .task import Shard, poisson_batches, seeded_generator, shard_order

__all__ = ["ImageClassification"]

# Standard augmentation per data set: random-crop padding (pixels) and horizontal flips (He et al.
# 2016, section 4.2 for CIFAR). SVHN is customarily trained without augmentation (Zagoruyko &
# Komodakis 2016; DeVries & Taylor 2017 add only Cutout); digits are too small to crop.
_CROP = {"digits": 0, "cifar10": 4, "cifar100": 4, "svhn": 0, "folder": 4}
_FLIP = {"digits": False, "cifar10": True, "cifar100": True, "svhn": False, "folder": True}
_POISSON_KEY = 0x706F6973  # separates the Poisson sampler's generator from augmentation's ("pois")
_ADAPT_KEY = 0x61646170  # the generator of the stand-in images fixup.adapt measures under dp ("adap")


class ImageClassification:
    """Classify images with a registered model, cross-entropy loss and accuracy."""

    def __init__(self, config: TrainConfig, data: ImageData | None = None) -> None:
        self.config = config
        self.data = data if data is not None else load_images(
            config.dataset, data_dir=config.data_dir or None, image_size=config.image_size, resize=config.resize,
            channels=config.channels, split_seed=config.split_seed, test_fraction=config.test_fraction)
        self.crop = _CROP[config.dataset] if config.crop_padding < 0 else config.crop_padding
        self.flip = _FLIP[config.dataset] if config.hflip == "auto" else config.hflip == "on"
        self.soft = config.mixup_alpha > 0 or config.label_smoothing > 0

    # -- model ------------------------------------------------------------------------------------
    def build_model(self, config: TrainConfig) -> nn.Module:
        if config.extra.get("converted"):
            return self._converted_model(config)
        if config.adapt:
            return self._adapted_model(config)
        return self._registered_model(config, config.norm)

    def _registered_model(self, config: TrainConfig, norm: str) -> nn.Module:
        from ..models import create_model

        kwargs: dict[str, Any] = {"norm": norm, "num_classes": self.data.num_classes,
                                  "in_channels": self.data.in_channels}
        for name in ("depth", "width", "dropout", "drop_path", "head_dropout"):
            if getattr(config, name):
                kwargs[name] = getattr(config, name)
        if kwargs.get("drop_path") == -1:  # a config the engine's recipe has not resolved: the method's rate
            kwargs["drop_path"] = config_method(config).drop_path
            if not kwargs["drop_path"]:
                del kwargs["drop_path"]
        if config.init:
            kwargs["init"] = config.init
        try:
            return create_model(config.model, **kwargs)
        except TypeError as err:
            raise ValueError(f"model {config.model!r} does not take one of the options {sorted(kwargs)} ({err}); "
                             "leave depth/width/dropout/drop_path/head_dropout at 0 for models without them") from err

    def _adapted_model(self, config: TrainConfig) -> nn.Module:
        """The user's model from ``config.adapt`` (``module:factory``; the factory may take ``num_classes`` and
        ``in_channels``), adapted on two training images by the method ``init`` names (``fixup``, ``skipinit``,
        ``rezero``; :func:`fixup.adapt` refuses the others, naming what works), by the norm's own method when
        ``init`` is empty and adapt applies it (``Method.adapt``: Fixup under ``norm="fixup"``), else trained as
        built."""
        from ..external import adapt

        model = self._factory_model(config)
        method = config_method(config)
        if config.init or method.adapt:  # a method named explicitly, or the norm's own that adapt applies (fixup)
            example, _ = next(self._load(self.data.train, [[0, 1]]))
            if config.dp:  # no training image may shape the model outside the accounting: noise of their shape
                example = torch.randn(example.shape, generator=seeded_generator(config.seed, _ADAPT_KEY))
            model, _ = adapt(model, example, method=method.name, **config.adapt_options)
        return model

    def _factory_model(self, config: TrainConfig) -> nn.Module:
        """The model ``config.adapt``'s factory returns (``module:factory``; it may take ``num_classes`` and
        ``in_channels``), as built."""
        import inspect

        from ..external import load_factory

        factory = load_factory(config.adapt)
        offered = {"num_classes": self.data.num_classes, "in_channels": self.data.in_channels}
        params = inspect.signature(factory).parameters
        made = factory(**{k: v for k, v in offered.items() if k in params})
        model = made[0] if isinstance(made, tuple) else made
        if not isinstance(model, nn.Module):
            raise ValueError(f"--adapt {config.adapt}: the factory returned {type(model).__name__}, not an nn.Module")
        return model

    def _converted_model(self, config: TrainConfig) -> nn.Module:
        """The converted model saved by :func:`fixup.save_converted` at ``extra["converted"]``, to fine-tune as saved.

        :func:`fixup.load_converted` replays the conversion on the original architecture: the model ``--adapt``'s
        factory returns, else the registered ``--model`` built with BatchNorm (``--depth``/``--width`` as for
        training it). Its weights do not matter; the file's are loaded (``weights_only=True``). Nothing is
        re-initialised or adapted, so the first step starts from the converted, trained function.
        """
        from .._convert import load_converted

        path = config.extra["converted"]
        if not isinstance(path, str):
            raise ValueError(f'extra "converted" must be the path of a file written by fixup.save_converted, got '
                             f"{path!r}")
        if config.norm not in ("fixup", "none") or config.init:
            raise ValueError(f'extra "converted" fine-tunes a converted model as saved, without normalisation; '
                             f"norm={config.norm!r}, init={config.init!r} would build another model: leave --norm "
                             "and --init at their defaults (or --norm none)")
        build = self._factory_model(config) if config.adapt else self._registered_model(config, "batchnorm")
        try:
            model, _ = load_converted(path, build)
        except FileNotFoundError as err:
            raise ValueError(f'extra "converted": no file {path} (write one with fixup.save_converted)') from err
        return model.train()  # it keeps the modes it was saved in (convert takes an eval-mode model)

    # -- data -------------------------------------------------------------------------------------
    def _per_rank_batch(self, shard: Shard) -> int:
        if self.config.batch_size % shard.world_size:
            raise ValueError(f"batch_size={self.config.batch_size} must be divisible by the {shard.world_size} "
                             "processes so that each takes the same share")
        return self.config.batch_size // shard.world_size

    def steps_per_epoch(self, shard: Shard) -> int:
        n = -(-len(self.data.train) // shard.world_size)  # DistributedSampler pads to equal shares
        b = self._per_rank_batch(shard)
        return n // b if self.config.drop_last else -(-n // b)

    def _load(self, dataset: Any, batches: list[list[int]]) -> Iterator[tuple[Tensor, Tensor]]:
        if isinstance(dataset, TensorImages):
            for idx in batches:
                yield dataset.batch(torch.tensor(idx, dtype=torch.long))
            return
        if any(not idx for idx in batches):  # Poisson sampling (dp) can draw an empty batch: DataLoader cannot
            shape = next(self._load(dataset, [[0]]))[0].shape[1:]
            for idx in batches:
                yield (next(self._load(dataset, [idx])) if idx else
                       (torch.zeros((0, *shape)), torch.zeros(0, dtype=torch.long)))
            return
        # Files are decoded in worker processes; all randomness stays in this process.
        yield from DataLoader(dataset, batch_sampler=batches, num_workers=self.config.num_workers,
                              generator=torch.Generator().manual_seed(0))

    def train_batches(self, epoch: int, shard: Shard) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        cfg, data = self.config, self.data
        if cfg.dp:  # each example in each batch with probability 1 / steps (the privacy accounting assumes it)
            batches = poisson_batches(len(data.train), self.steps_per_epoch(shard),
                                      seeded_generator(cfg.seed, epoch, shard.rank, _POISSON_KEY))
        else:
            order = shard_order(len(data.train), epoch, cfg.seed, shard)
            b = self._per_rank_batch(shard)
            batches = [order[i:i + b] for i in range(0, len(order), b)][: self.steps_per_epoch(shard)]
        gen = seeded_generator(cfg.seed, epoch, shard.rank)
        for x, y in self._load(data.train, batches):
            if self.crop:
                x = random_crop(x, self.crop, gen)
            if self.flip:
                x = random_flip(x, gen)
            x = normalize(x, data.mean, data.std)
            if cfg.cutout:
                x, _ = cutout(x, cfg.cutout, gen)
            targets = soft_targets(y, data.num_classes, cfg.label_smoothing) if self.soft else None
            if cfg.mixup_alpha > 0:
                x, targets, _ = mixup(x, targets, cfg.mixup_alpha, gen)
                y = targets.argmax(1)  # the label carrying the larger weight
            yield x, y, targets

    def first_batch(self) -> Tensor:
        n = min(len(self.data.train), self.config.batch_size)
        order = shard_order(len(self.data.train), 0, self.config.seed, Shard())[:n]
        x, _ = next(self._load(self.data.train, [order]))
        return normalize(x, self.data.mean, self.data.std)

    # -- loss and evaluation ---------------------------------------------------------------------
    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor, Tensor | None]) -> tuple[Tensor, dict[str, Tensor]]:
        x, y, targets = batch
        if not y.numel():  # an empty Poisson batch (dp): no forward, a zero loss; the engine still takes the noisy step
            zero = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            return zero, {"loss": zero.detach(), "acc": zero.detach(), "n": zero.detach()}
        logits = model(x)
        loss = F.cross_entropy(logits, targets if targets is not None else y)
        with torch.no_grad():
            stats = {"loss": loss.detach().float() * y.numel(), "acc": (logits.argmax(1) == y).sum().float(),
                     "n": torch.tensor(float(y.numel()), device=y.device)}
        return loss, stats

    def evaluate(self, model: nn.Module, shard: Shard) -> dict[str, Tensor]:
        device = next(model.parameters()).device
        test = self.data.test
        idx = list(range(shard.rank, len(test), shard.world_size))
        b = self.config.eval_batch_size
        total = torch.zeros(3, dtype=torch.float64, device=device)
        for x, y in self._load(test, [idx[i:i + b] for i in range(0, len(idx), b)]):
            x, y = normalize(x, self.data.mean, self.data.std).to(device), y.to(device)
            logits = model(x).float()
            total += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum(),
                                  torch.tensor(y.numel(), device=device)]).double()
        return {"loss": total[0], "acc": total[1], "n": total[2]}

    def describe(self) -> dict[str, Any]:
        d = self.data
        return {"dataset": d.name, "source": d.source, "train_examples": len(d.train), "test_examples": len(d.test),
                "num_classes": d.num_classes, "in_channels": d.in_channels, "image_size": d.image_size,
                "mean": list(d.mean), "std": list(d.std), "crop_padding": self.crop, "hflip": self.flip}
