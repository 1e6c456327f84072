"""One training engine for images and translation: ``fit(config)`` and the ``fixup train`` command.

>>> from fixup.train import TrainConfig, fit
>>> result = fit(TrainConfig(depth=8, epochs=1), progress=False)   # doctest: +SKIP
>>> result.outcome.status, result.final["test_acc"]                 # doctest: +SKIP

See docs/training.md. The pieces: :mod:`.config` (the typed config), :mod:`.task` (the protocol a
task implements), :mod:`.image_task` (image classification), :mod:`.optim` (parameter groups and
schedules), :mod:`.regularisers` (Mixup, Cutout, label smoothing), :mod:`.checkpoint`,
:mod:`.distributed`, :mod:`.ema` (a moving average of the weights), :mod:`.runlog`, :mod:`.scalars` (the
method's scalars over training), :mod:`.private` (private training through Opacus, imported only under
``dp``), :mod:`.engine` (the loop).
"""

from .checkpoint import CheckpointError
from .config import TrainConfig
from .engine import StepInfo, fit
from .image_task import ImageClassification
from .optim import build_optimizer, config_groups, lr_factor
from .regularisers import cutout, mixup, soft_targets
from .result import EXIT_CODES, Outcome, TrainResult
from .scalars import read_scalars, scalar_stats
from .task import TASKS, Shard, Task

__all__ = [
    "EXIT_CODES",
    "TASKS",
    "CheckpointError",
    "ImageClassification",
    "Outcome",
    "Shard",
    "StepInfo",
    "Task",
    "TrainConfig",
    "TrainResult",
    "build_optimizer",
    "config_groups",
    "cutout",
    "fit",
    "lr_factor",
    "mixup",
    "read_scalars",
    "scalar_stats",
    "soft_targets",
]
